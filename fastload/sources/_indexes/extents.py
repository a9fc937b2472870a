"""Samples that are byte ranges inside container files (tar shards, packed data files): `ExtentIndex`.

Its one responsibility is reading a batch's ranges cheaply. A batch's extents are sorted by (file,
offset) and neighbours closer than `gap` bytes are read with one `os.pread`; each sample is then
a zero-copy `memoryview` of that read, handed back in the batch's order (every decoder takes a
bytes-like object). Files are opened lazily, once per process (a forked worker opens its own: a
descriptor's readahead state is shared with the process it came from), with
`POSIX_FADV_SEQUENTIAL`.

Readahead (NOTE [extent readahead]): a block-shuffled batch takes a few samples of each of a few
runs, and the next batches of its window take the rest. When a batch touches several samples of
one stretch of a file, the index asks the kernel (`POSIX_FADV_WILLNEED`) to read that stretch
through the next `readahead` samples in the background, so the later batches find it cached.

Identity (NOTE [extent file identity]): an index may carry each file's identity as it was when
indexed (device, inode, size, mtime and ctime in ns). A process opening a file compares it (one
fstat per open, not per read) and refuses one that is not a regular file or is not the file
indexed: a shard replaced under a running loader (even with its size and mtime kept) fails the
batch with a DatasetError naming the file, instead of being read at the old scan's offsets with
the old scan's labels. Descriptors already open keep reading the file they opened (its old
inode, when it was replaced by a rename).
"""

from __future__ import annotations

import errno
import itertools
import os
import struct
import threading
import time
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fastload._errors import DatasetError, SourceChanged
from fastload._shm import Segment
from fastload.sources._indexes.sample_index import (
    SHARED_INDEX_TYPES,
    TARGET_DTYPES,
    ReadBuffer,
    ReadFailure,
    pack_strings,
)
from fastload.sources._storage.beneath import Beneath, open_file
from fastload.sources._storage.bounds import check_regular, clip, identity

if TYPE_CHECKING:
    from fastload.sources._storage.node_cache import NodeCache

DEFAULT_GAP = 64 << 10  # bytes between two extents still read as one
DEFAULT_READAHEAD = 32  # samples past a touched stretch to ask the kernel for
DEFAULT_READAHEAD_BYTES = 4 << 20  # ... but no more bytes than this past its last touched sample
MAX_OPEN_FILES = 128  # descriptors one process keeps open at once (least recently used closed)

# NOTE [extent readahead]: a full shuffle over a large file must not read ahead (every sample it
# touches is alone: 32 samples read for one would be a 32x read amplification), while a block
# shuffle's batch touches ~R / window samples of each of its runs. So readahead is asked only
# for a cluster of at least `_CLUSTER` samples of the batch lying within `readahead` samples of
# each other in the same file: from the cluster's first sample through `readahead` samples past
# its last one (at most `readahead_bytes` past it). Under a full shuffle of N samples, three of a
# batch of B within 2 x readahead of each other is rare (~B^3 (2 x 32 / N)^2 / 6: 7 batches in a
# thousand for ImageNet's 1.28 M and B = 256, each then asking for ~32 samples more).
#
# Asking again for pages already cached still costs the kernel a lookup per page (~2 ms a batch
# of 256 ~50 KB samples with window 8, measured warm; ~0.5 ms with what follows), so each
# process remembers the 1 MiB chunks it asked for in the last `_ADVISED_S` seconds (a window's
# runs are read within a few batches) and asks only for the rest. The memory is short because
# the page cache may drop those pages: a chunk read again an epoch later is asked for again.
_CLUSTER = 3
_CHUNK = 1 << 20
_ADVISED_S = 30.0
_ADVISED_CHUNKS = 16384  # at most (16 GiB asked for within _ADVISED_S)

_MAGIC = b"FLEXTNT2"
# Shared layout: magic, then (count, files, files blob bytes, key blob bytes, target width (0:
# class indices), target dtype code, gap, readahead, readahead bytes), then int64 offsets[n],
# sizes[n], key_offsets[n + 1], file_offsets[files + 1], targets, int32 file_ids[n], the files
# blob, the key blob, int64 file identities[files, 5] (all -1: not checked); every array at a
# multiple of 8 bytes.
_IDENTITY_FIELDS = 5
_MAX_FILE_BYTES = 1 << 50  # a container file may be any size; only its samples are bounded
_HEAD = struct.Struct("<8s9q")

_fork_lock = threading.Lock()


def _new_lock_in_child() -> None:
    global _fork_lock
    _fork_lock = threading.Lock()  # a lock held by another thread at fork would stay held here


os.register_at_fork(after_in_child=_new_lock_in_child)


class _Handles:
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


@dataclass(eq=False)
class ExtentIndex:
    """Samples stored as (file, offset, size) extents, with their keys and targets, in numpy
    arrays (never a Python object per sample): `files` the container paths, `file_ids` int32,
    `offsets` and `sizes` int64, `key_blob` + `key_offsets` each sample's key inside its file
    (a tar member's name without its extension), `labels` int64 (N,) or float32 (N, K).

    Reads coalesce extents closer than `gap` bytes; `readahead` samples (at most
    `readahead_bytes` bytes) past a stretch a batch reads several samples of are requested from
    the kernel ahead of time (0: never); see the module docstring.
    """

    root: str
    classes: tuple[str, ...]
    files: tuple[str, ...]
    file_ids: np.ndarray = field(repr=False)
    offsets: np.ndarray = field(repr=False)
    sizes: np.ndarray = field(repr=False)
    key_blob: np.ndarray = field(repr=False)
    key_offsets: np.ndarray = field(repr=False)
    labels: np.ndarray = field(repr=False)
    _: KW_ONLY
    gap: int = DEFAULT_GAP
    readahead: int = DEFAULT_READAHEAD
    readahead_bytes: int = DEFAULT_READAHEAD_BYTES
    # int64 (files, 5): each file's identity when indexed (NOTE [extent file identity]); None:
    # not checked
    file_identities: np.ndarray | None = field(default=None, repr=False)
    # Remote files (`remote_file` entries of `files`) are read through this node cache
    # (NOTE [node cache]): its directory (None: the default) and limit in bytes (None: the default).
    cache_dir: str | None = None
    cache_limit: int | None = None
    # A confined daemon's job opens its files beneath the daemon's roots (`_storage/beneath`); else by path.
    beneath: Beneath | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = int(self.labels.shape[0])
        expected = {
            "file_ids": (self.file_ids, np.int32, (n,)),
            "offsets": (self.offsets, np.int64, (n,)),
            "sizes": (self.sizes, np.int64, (n,)),
            "key_offsets": (self.key_offsets, np.int64, (n + 1,)),
            "key_blob": (self.key_blob, np.uint8, self.key_blob.shape),
        }
        for what, (array, dtype, shape) in expected.items():
            if array.dtype != dtype or array.shape != shape:
                raise ValueError(f"{what} must be {np.dtype(dtype)} {shape}, got {array.dtype} {array.shape}")
        if self.labels.dtype not in TARGET_DTYPES or self.labels.ndim not in (1, 2):
            raise ValueError(
                f"labels must be int64 (N,) or float32 (N, K), got {self.labels.dtype} {self.labels.shape}"
            )
        self.classes, self.files = tuple(self.classes), tuple(self.files)
        ids = self.file_identities
        if ids is not None and (ids.dtype != np.int64 or ids.shape != (len(self.files), _IDENTITY_FIELDS)):
            got = f"{ids.dtype} {ids.shape}"
            raise ValueError(f"file_identities must be int64 ({len(self.files)}, 5), got {got}")
        self._remote = tuple(remote_parts(f) for f in self.files)
        paths = [r[0] if r is not None else f for f, r in zip(self.files, self._remote, strict=True)]
        self._basenames = tuple(os.path.basename(p) for p in paths)
        # Readahead needs storage order: each file's samples consecutive, at increasing offsets.
        # `_file_end[f]`: one past the last sample of file f.
        self._file_end: np.ndarray | None = None
        local = all(r is None for r in self._remote)  # the kernel reads ahead local files only
        if self.readahead > 0 and n and local and self._in_storage_order():
            self._file_end = np.searchsorted(self.file_ids, np.arange(len(self.files)), side="right")
        self._handles = _Handles()

    def _in_storage_order(self) -> bool:
        ids, offsets = self.file_ids, self.offsets
        same = ids[1:] == ids[:-1]
        return bool(np.all(ids[1:] >= ids[:-1]) and np.all(offsets[1:][same] >= offsets[:-1][same]))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_handles"] = None  # descriptors stay in their process
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._handles = _Handles()

    def __del__(self) -> None:
        handles = getattr(self, "_handles", None)
        if handles is not None:
            handles.close()

    def close(self) -> None:
        """Close this process's descriptors (they are opened again when next read)."""
        with _fork_lock:
            self._handles.close()

    def key(self, index: int) -> str:
        start, end = int(self.key_offsets[index]), int(self.key_offsets[index + 1])
        return self.key_blob[start:end].tobytes().decode("utf-8", "surrogateescape")

    def name(self, index: int) -> str:
        """`FILE:KEY`, FILE the container's base name (`train-000003.tar:n01440764_10026`); KEY
        alone where it names its container already (a file list's object: `n00/img_000.JPEG`)."""
        key, base = self.key(index), self._basenames[int(self.file_ids[index])]
        return key if key == base or key.endswith("/" + base) else f"{base}:{key}"

    def _fd(self, file_id: int) -> int:
        handles = self._handles
        if handles.pid != os.getpid():  # forked: open our own (NOTE in the module docstring)
            with _fork_lock:
                if self._handles.pid != os.getpid():
                    self._handles.close()
                    self._handles = _Handles()
            handles = self._handles
        fd = handles.fds.pop(file_id, None)
        if fd is None:
            with _fork_lock:
                while len(handles.fds) >= MAX_OPEN_FILES:
                    os.close(handles.fds.pop(next(iter(handles.fds))))
                fd = self._open_checked(file_id)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        handles.fds[file_id] = fd  # now the most recently used
        return fd

    def _open_checked(self, file_id: int) -> int:
        """A descriptor of file `file_id`, when it is a regular file and the one indexed (NOTE
        [extent file identity]): OSError when it cannot be opened, DatasetError when it changed."""
        path = self.files[file_id]
        fd = open_file(path, self.beneath)  # non-blocking: a FIFO does not wait
        try:
            info = os.fstat(fd)
            check_regular(path, info, _MAX_FILE_BYTES, "container file")
            ids = self.file_identities
            if ids is not None and ids[file_id, 0] != -1 and tuple(ids[file_id].tolist()) != identity(info):
                was = int(ids[file_id, 2])
                how = (
                    f"truncated: {info.st_size:,} bytes, was {was:,}"
                    if info.st_size < was
                    else "another file, or rewritten: its inode, size or times differ"
                )
                raise SourceChanged(
                    f"{clip(path)} changed since it was indexed ({how}): its samples' places and labels "
                    "are not this file's; make the loader again to index it as it is now",
                    info.st_size,
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def files_of(self, indices: np.ndarray) -> list[str]:
        return [self.files[int(f)] for f in np.unique(self.file_ids[np.asarray(indices, np.int64)])]

    def read_sample(self, index: int) -> bytes:
        """One sample's bytes, through a descriptor of its own (safe from any thread)."""
        i = int(index)
        size, offset = int(self.sizes[i]), int(self.offsets[i])
        remote = self._remote[int(self.file_ids[i])]
        if remote is not None:
            return self._read_remote(remote, offset, offset + size)
        fd = self._open_checked(int(self.file_ids[i]))
        try:
            data = _pread_all(fd, size, offset)
        finally:
            os.close(fd)
        if len(data) < size:
            raise _short_read(self.files[int(self.file_ids[i])], offset, size, len(data))
        return bytes(data)

    def read(self, indices: np.ndarray, into: ReadBuffer | None = None) -> list[bytes | memoryview]:
        """The encoded bytes of `indices` in that order, as views of a few coalesced reads (into
        `into`'s memory when given)."""
        idx = np.asarray(indices, dtype=np.int64)
        n = len(idx)
        out: list[bytes | memoryview] = [b""] * n
        if n == 0:
            return out
        ids = self.file_ids[idx]
        starts = self.offsets[idx]
        ends = starts + self.sizes[idx]
        if self._file_end is not None:
            self._advise(np.unique(idx))
        order = np.lexsort((starts, ids)).tolist()
        ids_l, starts_l, ends_l = ids.tolist(), starts.tolist(), ends.tolist()
        k = 0
        while k < n:
            first = order[k]
            file_id, lo, hi = ids_l[first], starts_l[first], ends_l[first]
            j = k + 1
            while j < n and ids_l[order[j]] == file_id and starts_l[order[j]] <= hi + self.gap:
                hi = max(hi, ends_l[order[j]])
                j += 1
            group = order[k:j]
            try:
                remote = self._remote[file_id]
                data: bytes | memoryview = (
                    self._read_remote(remote, lo, hi)
                    if remote is not None
                    else _pread_all(self._fd(file_id), hi - lo, lo, into)
                )
            except SourceChanged as e:  # name a sample now past its end, if the file was cut
                past = [p for p in group if ends_l[p] > e.size]
                raise ReadFailure(min(past or group), e) from e
            except OSError as e:
                raise ReadFailure(min(group), e) from e
            view = memoryview(data)
            for p in group:
                if ends_l[p] - lo > len(data):
                    size, got = ends_l[p] - starts_l[p], len(data) + lo - starts_l[p]
                    raise ReadFailure(p, _short_read(self.files[file_id], starts_l[p], size, got))
                out[p] = view[starts_l[p] - lo : ends_l[p] - lo]
            k = j
        return out

    @property
    def remote(self) -> bool:
        """Whether any of its containers is a remote object (read through the node cache)."""
        return any(r is not None for r in self._remote)

    @property
    def remote_bytes(self) -> int:
        """The bytes of its remote containers (0 when all are local)."""
        return sum(r[1] for r in self._remote if r is not None)

    @property
    def remote_chunk_count(self) -> int:
        """The chunks its remote containers are cut into (NOTE [node cache])."""
        return sum(-(-r[1] // r[3]) for r in self._remote if r is not None)

    def remote_chunks(self, indices: np.ndarray) -> list[tuple[tuple[str, int, str, int], int]]:
        """The chunks of remote containers (NOTE [node cache]) these samples lie in, in the order
        of the samples' containers: ((url, size, version, chunk bytes), chunk number) each."""
        idx = np.asarray(indices, dtype=np.int64)
        found: list[tuple[tuple[str, int, str, int], int]] = []
        for file_id in np.unique(self.file_ids[idx]).tolist():
            remote = self._remote[file_id]
            if remote is None:
                continue
            chunk_bytes = remote[3]
            mine = idx[self.file_ids[idx] == file_id]
            starts, ends = self.offsets[mine], self.offsets[mine] + self.sizes[mine]
            chunks: set[int] = set()
            firsts, lasts = (starts // chunk_bytes).tolist(), ((ends - 1) // chunk_bytes).tolist()
            for lo, hi in zip(firsts, lasts, strict=True):
                chunks.update(range(lo, hi + 1))
            found.extend((remote, c) for c in sorted(chunks))
        return found

    def node_cache(self) -> NodeCache:
        """The node cache its remote containers are read through (`node_cache.NodeCache`)."""
        from fastload.sources._storage.node_cache import node_cache

        return node_cache(self.cache_dir, self.cache_limit)

    def _read_remote(self, remote: tuple[str, int, str, int], start: int, end: int) -> bytes:
        from fastload.sources._storage.node_cache import node_cache

        url, size, version, chunk_bytes = remote
        return node_cache(self.cache_dir, self.cache_limit).read(url, version, size, start, end, chunk_bytes)

    def _advise(self, touched: np.ndarray) -> None:
        """WILLNEED for the stretches a batch reads several samples of (NOTE [extent readahead])."""
        assert self._file_end is not None
        ids = self.file_ids[touched]
        # Clusters: sorted touched samples, split where the file changes or the next is too far.
        cut = np.flatnonzero((np.diff(touched) > self.readahead) | (ids[1:] != ids[:-1])) + 1
        bounds = np.concatenate(([0], cut, [len(touched)]))
        big = np.flatnonzero(np.diff(bounds) >= _CLUSTER)
        for c in big.tolist():
            first, last = int(touched[bounds[c]]), int(touched[bounds[c + 1] - 1])
            file_id = int(ids[bounds[c]])
            through = min(last + self.readahead, int(self._file_end[file_id]) - 1)
            start = int(self.offsets[first])
            end = int(self.offsets[through] + self.sizes[through])
            end = min(end, int(self.offsets[last] + self.sizes[last]) + self.readahead_bytes)
            try:
                fd = self._fd(file_id)
                stretch = self._handles.not_yet_advised(file_id, start, end)
                if stretch is not None:
                    os.posix_fadvise(fd, stretch[0], stretch[1] - stretch[0], os.POSIX_FADV_WILLNEED)
            except (OSError, DatasetError):
                return  # advice only: the read that follows reports what is wrong

    def to_segment(self) -> Segment:
        """Copy the index (file list included) into a new shared-memory segment."""
        files_blob, file_offsets = pack_strings([f.encode("utf-8", "surrogateescape") for f in self.files])
        n, nfiles = len(self), len(self.files)
        width = int(self.labels.shape[1]) if self.labels.ndim == 2 else 0
        dtype_code = TARGET_DTYPES.index(self.labels.dtype)
        head: tuple[object, ...] = (_MAGIC, n, nfiles, len(files_blob), len(self.key_blob), width, dtype_code)
        head += (self.gap, self.readahead, self.readahead_bytes)
        size = _HEAD.size + sum(_align8(_nbytes(shape, dtype)) for shape, dtype in _layout(head))
        segment = Segment.create(max(size, 8))
        _HEAD.pack_into(segment.buf, 0, *head)
        views = _shared_views(segment)
        sources = (self.offsets, self.sizes, self.key_offsets, file_offsets, self.labels, self.file_ids)
        ids = self.file_identities if self.file_identities is not None else np.full((nfiles, 5), -1, np.int64)
        for view, source in zip(views, (*sources, files_blob, self.key_blob, ids), strict=True):
            view[...] = source
        return segment

    @classmethod
    def from_segment(cls, segment: Segment, root: str = "", beneath: Beneath | None = None) -> ExtentIndex:
        """An index over a segment made by `to_segment` (views, no copy; the file list decoded),
        opening its files through `beneath` when given. It reads remote files through the
        attaching process's default node cache (a daemon's: NOTE [the daemon's cache] in
        `_daemon/sessions.py`); `cache_dir` and `cache_limit` do not travel."""
        head = _HEAD.unpack_from(segment.buf, 0)
        views = _shared_views(segment)
        offsets, sizes, key_offsets, file_offsets, labels, file_ids, files_blob, key_blob, ids = views
        raw = files_blob.tobytes()
        bounds = file_offsets.tolist()
        files = [raw[a:b].decode("utf-8", "surrogateescape") for a, b in itertools.pairwise(bounds)]
        gap, readahead, readahead_bytes = head[7:]
        return cls(
            root,
            (),
            tuple(files),
            file_ids,
            offsets,
            sizes,
            key_blob,
            key_offsets,
            labels,
            gap=gap,
            readahead=readahead,
            readahead_bytes=readahead_bytes,
            file_identities=ids,
            beneath=beneath,
        )


def remote_file(url: str, size: int, version: str, chunk_bytes: int) -> str:
    """An entry of `ExtentIndex.files` for an object at `url` (one version of it), read in chunks
    of `chunk_bytes` through the node cache."""
    return "\0".join((url, str(size), version.replace("\0", ""), str(chunk_bytes)))


def remote_parts(entry: str) -> tuple[str, int, str, int] | None:
    """(url, size, version, chunk bytes) of a `remote_file` entry; None for a local path."""
    if "\0" not in entry:
        return None
    url, size, version, chunk = entry.split("\0")
    return url, int(size), version, int(chunk)


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape)) * dtype.itemsize


def _layout(head: tuple[object, ...]) -> list[tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of each array a segment with header `head` holds, in order."""
    _, n, nfiles, files_len, keys_len, width, dtype_code = head[:7]
    assert isinstance(n, int) and isinstance(nfiles, int) and isinstance(width, int)
    assert isinstance(files_len, int) and isinstance(keys_len, int) and isinstance(dtype_code, int)
    i64, i32, u8 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.uint8)
    target_shape = (n, width) if width else (n,)
    return [
        ((n,), i64),
        ((n,), i64),
        ((n + 1,), i64),
        ((nfiles + 1,), i64),
        (target_shape, TARGET_DTYPES[dtype_code]),
        ((n,), i32),
        ((files_len,), u8),
        ((keys_len,), u8),
        ((nfiles, _IDENTITY_FIELDS), i64),
    ]


def _shared_views(segment: Segment) -> list[np.ndarray]:
    head = _HEAD.unpack_from(segment.buf, 0)
    if head[0] != _MAGIC:
        raise ValueError(f"segment {segment.name} does not hold an ExtentIndex")
    views, at = [], _HEAD.size
    for shape, dtype in _layout(head):
        views.append(np.ndarray(shape, dtype, buffer=segment.buf, offset=at))
        at += _align8(_nbytes(shape, dtype))
    return views


def _pread_all(fd: int, length: int, offset: int, into: ReadBuffer | None = None) -> bytes | memoryview:
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


def _short_read(path: str, offset: int, size: int, got: int) -> OSError:
    return OSError(
        errno.EIO,
        f"{path} ends before the sample's {size} bytes at offset {offset} (read {max(got, 0)}): "
        "the file is truncated or changed since it was indexed",
    )


SHARED_INDEX_TYPES["extents"] = ExtentIndex  # a daemon's workers attach it (`ImageJob.from_config`)
