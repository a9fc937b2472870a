"""A compressed tar shard (gzip, xz, bzip2; local or at a URL) decompressed once into an
uncompressed copy in the user's private cache directory: `decompressed_copy` and
`remote_decompressed_copy`, whose copy `TarShards` then scans and reads as a plain shard.

NOTE [decompressed shards]: samples are read at byte offsets, which a compressed stream has
none of, so each compressed shard is decompressed whole, once, and its copy is what the index
names (its `files`) and what workers read. The copies live in `tar-plain-UID` under the cache
root (`cache_root`, NOTE [scan cache trust]), opened by `open_private_dir` (NOTE [private
directory]: no link followed, this user's, 0700, every operation relative to its descriptor).

- A shard at a URL is read whole through the node cache (verified there, NOTE [chunk
  verification]) once per listed version and size, which name its copy as a local shard's
  identity does; its workers read the local copy.
- A copy is kept under the shard's own base name (samples are named `SHARD:KEY`) in
  `SHARD/VERSION/`, SHARD a hash of the compressed shard's real path and VERSION of its identity
  (device, inode, size, mtime, ctime): a changed or replaced shard is decompressed again, into a
  new VERSION, and the copies of its earlier versions are removed (a loader still reading one
  then fails as it would on a plain shard replaced under it).
- It is streamed (`gzip`/`lzma`/`bz2` file objects, 1 MiB at a time: never a whole shard in
  memory) to a temporary name (`O_CREAT|O_EXCL|O_NOFOLLOW`, 0600), then linked into place (never
  over a copy another process made meanwhile, which loaders may already have indexed), so a
  copy is there whole or not at all; a copy is used only when a regular file of ours.
- A decompression bomb is refused: a copy may grow to `MAX_EXPANSION` times the compressed size
  (at least `MIN_LIMIT_BYTES`, at most `MAX_PLAIN_BYTES`); past that the temporary is removed and
  a DatasetError says to decompress the shard by hand. A corrupt or truncated stream is a
  DatasetError naming the shard.
- No caching (an empty `FASTLOAD_CACHE_DIR`) or a cache that is not private: refused, saying so.
  Copies of shards' current versions are not pruned (each is a whole shard, possibly in use by a
  running loader): remove the directory to reclaim them.

A daemon's allowlist checks the compressed shard and then the directory of the copies
(`TarShards.files_before_open`), and its workers read the copies beneath its roots: a confined
daemon (one with `roots`) serves compressed shards only when its cache (`FASTLOAD_CACHE_DIR`) lies
under a root, and otherwise refuses them before decompressing anything, saying what to do.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import lzma
import os
import secrets
import stat
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from fastload._errors import DatasetError
from fastload.sources._storage.bounds import clip, identity
from fastload.sources._storage.node_cache import NodeCache
from fastload.sources._storage.private_dir import open_private_dir
from fastload.sources._storage.scan_cache import Identity, cache_root

# The compressors a copy can be made from (the names `shard_names.COMPRESSED_TAR_SUFFIXES` gives).
DECOMPRESSORS: dict[str, Callable[[BinaryIO], io.BufferedIOBase]] = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "xz": lzma.LZMAFile,
    "bzip2": bz2.BZ2File,
}
MAX_EXPANSION = 64  # JPEG shards barely compress; text and JSON members about 5-10 times
MIN_LIMIT_BYTES = 1 << 30
MAX_PLAIN_BYTES = 256 << 30
_CHUNK = 1 << 20
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CORRUPT = (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)


def copies_dir() -> str | None:
    """The directory this user's copies are kept in, or None when caching is off."""
    root = cache_root()
    return None if root is None else os.path.join(root, f"tar-plain-{os.geteuid()}")


def plain_limit(compressed_bytes: int) -> int:
    """How large the copy of a shard of `compressed_bytes` may grow (NOTE [decompressed shards])."""
    return min(MAX_PLAIN_BYTES, max(MIN_LIMIT_BYTES, MAX_EXPANSION * compressed_bytes))


def decompressed_copy(shard: str, compressor: str) -> tuple[str, Identity]:
    """The path and identity of `shard`'s uncompressed copy, made when missing (NOTE
    [decompressed shards]); DatasetError when it cannot be made, saying what to do."""
    opener = _opener(shard, compressor)
    try:
        source = os.open(shard, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise DatasetError(f"cannot read tar shard {clip(shard)}: {clip(str(e))}") from e
    try:
        info = os.fstat(source)
        if not stat.S_ISREG(info.st_mode):
            raise DatasetError(f"tar shard {clip(shard)} is not a regular file")
        version = "\0".join(map(str, identity(info)))
        return _copy(shard, os.path.realpath(shard), version, info.st_size, opener, lambda: _reopened(source))
    finally:
        os.close(source)


def remote_decompressed_copy(
    url: str, compressor: str, size: int, version: str, node: NodeCache
) -> tuple[str, Identity]:
    """`decompressed_copy` of the shard at `url` (its `version` and `size` as listed), read whole
    through the node cache (verified before it is read: NOTE [chunk verification]) only when
    this version has no copy yet."""
    opener = _opener(url, compressor)
    return _copy(url, url, f"{version}\0{size}", size, opener, lambda: node.open_whole(url, version, size))


@contextlib.contextmanager
def _reopened(fd: int) -> Iterator[BinaryIO]:
    with os.fdopen(os.dup(fd), "rb") as raw:
        yield raw


def _opener(shard: str, compressor: str) -> Callable[[BinaryIO], io.BufferedIOBase]:
    opener = DECOMPRESSORS.get(compressor)
    if opener is None:
        raise DatasetError(
            f"{clip(shard)} is a {compressor}-compressed tar, which fastload cannot decompress (it reads "
            f"gzip, xz and bzip2): decompress it (`{compressor} -d`) and pass the .tar"
        )
    return opener


def _copy(
    shard: str,
    where: str,
    version: str,
    size: int,
    opener: Callable[[BinaryIO], io.BufferedIOBase],
    compressed: Callable[[], contextlib.AbstractContextManager[BinaryIO]],
) -> tuple[str, Identity]:
    """The copy of the shard (`where`: its real path or URL; `version`: what changes with its
    bytes), read from `compressed()` when this version has none yet."""
    root, copies = cache_root(), copies_dir()
    if root is None or copies is None:
        raise DatasetError(
            f"{clip(shard)} is compressed and must be decompressed into the cache, which is off "
            "(FASTLOAD_CACHE_DIR is empty): set FASTLOAD_CACHE_DIR, or decompress it and pass the .tar"
        )
    shard_dir, version_dir = _digest(where), _digest(version)
    name = os.path.basename(where)  # samples are named `SHARD:KEY` after the file read
    try:
        shard_fd, dir_fd = _copy_dirs(root, os.path.basename(copies), shard_dir, version_dir)
    except OSError as e:
        raise DatasetError(f"cannot decompress {clip(shard)} into the cache: {clip(str(e))}") from e
    try:
        kept = _kept(name, dir_fd)
        if kept is None:
            with compressed() as raw:
                _write_copy(shard, opener(raw), name, dir_fd, plain_limit(size))
            kept = _kept(name, dir_fd)
            _drop_other_versions(shard_fd, version_dir)
        if kept is None:
            raise DatasetError(f"the copy of {clip(shard)} left the cache as it was made: try again")
        return os.path.join(copies, shard_dir, version_dir, name), kept
    finally:
        os.close(dir_fd)
        os.close(shard_fd)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def _copy_dirs(root: str, directory: str, shard_dir: str, version: str) -> tuple[int, int]:
    """Descriptors of the directories of one shard (`shard_dir`) and of its version in the
    private `directory`, made 0700 when missing, never through a link (NOTE [private directory])."""
    private = open_private_dir(root, directory)
    try:
        shard_fd = _subdir(private, shard_dir)
    finally:
        os.close(private)
    try:
        return shard_fd, _subdir(shard_fd, version)
    except BaseException:
        os.close(shard_fd)
        raise


def _subdir(parent_fd: int, name: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    return os.open(name, _DIRECTORY, dir_fd=parent_fd)


def _drop_other_versions(shard_fd: int, keep: str) -> None:
    """Remove the copies of the shard's earlier versions (best effort: never raises)."""
    with contextlib.suppress(OSError), os.scandir(shard_fd) as listing:
        for entry in listing:
            if entry.name == keep or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                fd = os.open(entry.name, _DIRECTORY, dir_fd=shard_fd)
                try:
                    with os.scandir(fd) as files:
                        for file in files:
                            with contextlib.suppress(OSError):
                                os.unlink(file.name, dir_fd=fd)
                finally:
                    os.close(fd)
                os.rmdir(entry.name, dir_fd=shard_fd)


def _kept(name: str, dir_fd: int) -> Identity | None:
    """The identity of the copy `name`, when it is a regular file of ours; None otherwise."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        return None
    return identity(info)


def _write_copy(shard: str, stream: io.BufferedIOBase, name: str, dir_fd: int, limit: int) -> None:
    """Stream `stream` into `name` (a temporary linked into place, unless a copy is there by
    then); DatasetError past `limit`
    bytes or when the stream is corrupt, the temporary removed."""
    tmp = f".{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=dir_fd)
    except OSError as e:
        raise DatasetError(f"cannot decompress {clip(shard)} into the cache: {clip(str(e))}") from e
    try:
        written = 0
        with stream, os.fdopen(fd, "wb") as out:
            # One byte past the limit is asked for, so a copy of exactly `limit` bytes passes.
            while chunk := _read(shard, stream, min(_CHUNK, limit + 1 - written)):
                written += len(chunk)
                if written > limit:
                    raise DatasetError(
                        f"{clip(shard)} decompresses to over {limit:,} bytes (the limit for its size, "
                        "NOTE [decompressed shards]), so it was refused as a decompression bomb: "
                        "if it is a real shard, decompress it yourself and pass the .tar"
                    )
                out.write(chunk)
        # Linked, never renamed over: a copy another process made meanwhile (ranks of one node
        # open the same shards at once) stays the one every loader's index names.
        try:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links: renamed (over a concurrent copy, if any)
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as e:
        raise DatasetError(f"cannot decompress {clip(shard)} into the cache: {clip(str(e))}") from e
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)


def _read(shard: str, stream: io.BufferedIOBase, size: int) -> bytes:
    """Up to `size` decompressed bytes (b"" at the end); DatasetError when the stream is corrupt."""
    try:
        return stream.read(size)
    except _CORRUPT as e:
        raise DatasetError(
            f"{clip(shard)} is not a readable compressed tar ({clip(str(e) or type(e).__name__)}): it is "
            "corrupt or truncated; copy it again, or recreate it"
        ) from e
