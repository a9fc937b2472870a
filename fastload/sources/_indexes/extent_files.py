"""One process's reads of an `ExtentIndex`'s local container files (`extents.py`): its open
descriptors, least recently used first, what it lately asked the kernel to read ahead, and the
positioned reads themselves.

Its one responsibility is the descriptor side of a local read; which bytes to read, and when to
ask for readahead, is `ExtentIndex`'s.

NOTE [extent readahead], continued from `extents.py`: asking again for pages already cached still
costs the kernel a lookup per page (~2 ms a batch of 256 ~50 KB samples with window 8, measured
warm; ~0.5 ms with what follows), so each process remembers the 1 MiB chunks it asked for in the
last `_ADVISED_S` seconds (a window's runs are read within a few batches) and asks only for the
rest. The memory is short because the page cache may drop those pages: a chunk read again an
epoch later is asked for again.
"""

from __future__ import annotations

import errno
import os
import time

from fastload.sources._indexes.sample_index import ReadBuffer

MAX_OPEN_FILES = 128  # descriptors one process keeps open at once (least recently used closed)
_CHUNK = 1 << 20
_ADVISED_S = 30.0
_ADVISED_CHUNKS = 16384  # at most (16 GiB asked for within _ADVISED_S)


class Handles:
    """One process's open descriptors, by file id, least recently used first."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.fds: dict[int, int] = {}
        # (file id, chunk) -> when it was asked for, oldest first (NOTE [extent readahead])
        self.advised: dict[tuple[int, int], float] = {}

    def not_yet_advised(self, file_id: int, start: int, end: int) -> tuple[int, int] | None:
        """The part of [start, end) of the file to ask for: from its first chunk not asked for
        lately through its last; None when every chunk was. Records the chunks it touches (a
        chunk asked for in part counts: the kernel's own readahead covers the rest)."""
        now = time.monotonic()
        advised = self.advised
        while advised and (len(advised) > _ADVISED_CHUNKS or now - next(iter(advised.values())) > _ADVISED_S):
            del advised[next(iter(advised))]  # the oldest
        chunks = range(start // _CHUNK, (end - 1) // _CHUNK + 1)
        todo = [c for c in chunks if (file_id, c) not in advised]
        if not todo:
            return None
        for c in todo:
            advised[(file_id, c)] = now
        return max(start, todo[0] * _CHUNK), min(end, (todo[-1] + 1) * _CHUNK)

    def close(self) -> None:
        if self.pid == os.getpid():  # a forked child leaves its parent's alone
            for fd in self.fds.values():
                os.close(fd)
        self.fds.clear()


def pread_all(fd: int, length: int, offset: int, into: ReadBuffer | None = None) -> bytes | memoryview:
    """`length` bytes at `offset` (in `into`'s memory when given), fewer only at the end of the file."""
    if into is not None:
        view = into.take(length)
        got = 0
        while got < length:
            n = os.preadv(fd, [view[got:]], offset + got)
            if n == 0:
                break
            got += n
        return view[:got]
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def short_read(path: str, offset: int, size: int, got: int) -> OSError:
    """The error of a read that found fewer bytes than the index says the sample has."""
    return OSError(
        errno.EIO,
        f"{path} ends before the sample's {size} bytes at offset {offset} (read {max(got, 0)}): "
        "the file is truncated or changed since it was indexed",
    )
