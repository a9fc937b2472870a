"""One chunk of a remote object as the node cache keeps it: written whole with the digests of its
bytes, and read only through them (NOTE [chunk verification]).

NOTE [chunk verification]: a chunk file is the chunk's bytes as fetched, then a SHA-256 digest
(16 bytes kept) of each `BLOCK_BYTES` block of them, then a footer (magic, the chunk's length,
the block size). The digests are computed from the bytes the store sent, in the process that
fetched them, and written with them to a temporary file renamed into place, so a chunk file
never exists without them. A read checks the file's size against the length it expects (the
object's size and the chunk's place say it), the footer, and the digest of every block the read
touches, before handing out a byte: a file cut short, written by an older fastload, left half
written by a crash (a rename is not flushed), changed on disk, or not the chunk it is named as is
"damaged", and the node cache drops it and fetches the chunk again. Reads cost one `pread` more
than the bytes asked for (each end rounded out to a block) and the hash of those bytes: 0.6 ms a
MiB with SHA extensions (x86 SHA-NI, ARMv8), measured on the build machine; blake2b was 1.1 ms.
A whole object handed out as a file (`open_whole`, a tar shard to scan) is verified whole first.
Blocks are 64 KiB: a 110 KB JPEG reads and hashes ~170 KB, a few percent of its decode.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import secrets
import stat
import struct

BLOCK_BYTES = 64 << 10
DIGEST_BYTES = 16
_MAGIC = b"FLCHUNK1"
_FOOTER = struct.Struct("<8sQQ")  # magic, the chunk's bytes, block bytes
_VERIFY_PIECE = 8 << 20  # a whole file is verified this many bytes at a time
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO planted is not waited on


def file_bytes(length: int) -> int:
    """The size of the file of a chunk of `length` bytes."""
    return length + _blocks(length) * DIGEST_BYTES + _FOOTER.size


def write(dir_fd: int, name: str, data: bytes) -> None:
    """Keep `data` as chunk file `name` in the directory `dir_fd`: a temporary file with 64 random
    bits in its name, `O_EXCL|O_NOFOLLOW`, 0600, renamed into place (replacing what was there)."""
    view = memoryview(data)
    digests = b"".join(_digest(view[at : at + BLOCK_BYTES]) for at in range(0, len(view), BLOCK_BYTES))
    trailer = digests + _FOOTER.pack(_MAGIC, len(view), BLOCK_BYTES)
    temporary = f"{name}.{secrets.token_hex(8)}.part"
    fd = os.open(temporary, _WRITE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        try:
            for part in (view, memoryview(trailer)):
                while part:
                    part = part[os.write(fd, part) :]
        finally:
            os.close(fd)
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


def read(fd: int, length: int, offset: int, count: int) -> bytes | memoryview | None:
    """Bytes [offset, offset + count) of the chunk of `length` bytes open at `fd`, each block they
    lie in checked against its digest; None when the file is damaged (NOTE [chunk verification])."""
    if not _well_formed(fd, length) or not 0 <= offset <= offset + count <= length:
        return None
    if count == 0:
        return b""
    first, last = offset // BLOCK_BYTES, (offset + count - 1) // BLOCK_BYTES
    start, end = first * BLOCK_BYTES, min(length, (last + 1) * BLOCK_BYTES)
    digests = os.pread(fd, (last - first + 1) * DIGEST_BYTES, length + first * DIGEST_BYTES)
    data = _pread_exactly(fd, end - start, start)
    if data is None or not _matches(memoryview(data), digests):
        return None
    if start == offset and len(data) == count:
        return data
    return memoryview(data)[offset - start : offset - start + count]


def verify_whole(fd: int, length: int) -> bool:
    """Whether every block of the chunk of `length` bytes open at `fd` matches its digest."""
    if not _well_formed(fd, length):
        return False
    for start in range(0, length, _VERIFY_PIECE):
        end = min(length, start + _VERIFY_PIECE)
        first = start // BLOCK_BYTES
        digests = os.pread(fd, _blocks(end - start) * DIGEST_BYTES, length + first * DIGEST_BYTES)
        data = _pread_exactly(fd, end - start, start)
        if data is None or not _matches(memoryview(data), digests):
            return False
    return True


class WholeChunk(io.RawIOBase):
    """The bytes of a chunk file verified whole (`verify_whole`), as a read-only, seekable file of
    exactly the chunk's length (the digests after them are not part of it). No `fileno`: what it
    reads is bounded by the chunk, not by the file's size."""

    def __init__(self, fd: int, length: int) -> None:
        super().__init__()
        self._fd = fd
        self._length = length
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._at, os.SEEK_END: self._length}[whence]
        if base + offset < 0:
            raise OSError(f"seek to {base + offset}, before the start")
        self._at = base + offset
        return self._at

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._length - self._at))
        got = os.preadv(self._fd, [view[:n]], self._at) if n else 0
        self._at += got
        return got


def _blocks(length: int) -> int:
    return -(-length // BLOCK_BYTES)


def _digest(block: memoryview) -> bytes:
    return hashlib.sha256(block).digest()[:DIGEST_BYTES]


def _well_formed(fd: int, length: int) -> bool:
    """A regular file of the size a chunk of `length` bytes has, its footer saying so."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size != file_bytes(length):
        return False
    footer = os.pread(fd, _FOOTER.size, info.st_size - _FOOTER.size)
    return len(footer) == _FOOTER.size and _FOOTER.unpack(footer) == (_MAGIC, length, BLOCK_BYTES)


def _matches(data: memoryview, digests: bytes) -> bool:
    if len(digests) != _blocks(len(data)) * DIGEST_BYTES:
        return False
    for k, at in enumerate(range(0, len(data), BLOCK_BYTES)):
        if _digest(data[at : at + BLOCK_BYTES]) != digests[k * DIGEST_BYTES : (k + 1) * DIGEST_BYTES]:
            return False
    return True


def _pread_exactly(fd: int, count: int, offset: int) -> bytes | None:
    data = os.pread(fd, count, offset)
    parts, got = [data], len(data)
    while got < count and data:
        data = os.pread(fd, count - got, offset + got)
        parts.append(data)
        got += len(data)
    return (parts[0] if len(parts) == 1 else b"".join(parts)) if got == count else None
