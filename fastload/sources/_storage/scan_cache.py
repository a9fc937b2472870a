"""The tar shard scan cache: one file per shard scan, in a private directory, trusted only when it
is ours, well formed and of the shard as it is now.

Its one responsibility is keeping scans (NOTE [shard index cache] in `_formats/tar_scan.py`) so that a cache
directory another user can write cannot be turned against its user (NOTE [scan cache trust]).

NOTE [scan cache trust]: the cache root (`$FASTLOAD_CACHE_DIR`, else `$XDG_CACHE_HOME/fastload`,
else `~/.cache/fastload`; empty turns caching off) may be shared, so entries live in a
subdirectory of the user's own, `tar-index-UID`, created 0700, opened by `open_private_dir`
(NOTE [private directory]: no link followed, this user's with no group or other permission, every
later operation relative to its descriptor); one that is not private is bypassed with a warning
(scanned every time: slower, never wrong).

- An entry is named by a hash of the shard's real path and identity (device, inode, size, mtime
  and ctime in ns: a copy that keeps size and mtime, `rsync -a` or `cp -p`, changes the inode or
  the ctime), and holds that identity again, checked when read.
- It is written to a temporary name with 64 random bits, `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600,
  then renamed into place: a planted file or symlink at the name is never written through.
- It is read with `O_NOFOLLOW|O_NONBLOCK` (a planted symlink or FIFO is refused, not followed or
  waited on), only when a regular file of ours of at most `MAX_ENTRY_BYTES`, whose size is the
  one its header declares; the format is raw little-endian arrays behind a fixed header (no
  compression: nothing to inflate), and the arrays are checked (extents inside the shard, sizes
  within `MAX_SAMPLE_BYTES`, labels >= 0, key offsets increasing) before use. Anything else is a
  miss.
- A scan of declared fields (NOTE [declared fields' scans]) is an entry of its own, named with
  its declaration too, under another magic: the same arrays (labels may be -1: none) followed by
  the ragged members' int64 offsets and sizes (fields, n), checked the same way (inside the
  shard, within `MAX_SAMPLE_BYTES`, or -1 for a missing member).
- Pruned after an open that wrote entries: least recently used first (a hit touches its entry)
  down to `MAX_ENTRIES` entries and `MAX_CACHE_BYTES`; temporaries older than an hour go too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import struct
import time
import warnings

import numpy as np

from fastload.sources._storage.bounds import MAX_SAMPLE_BYTES, read_bounded
from fastload.sources._storage.private_dir import open_private_dir

MAX_ENTRY_BYTES = 256 << 20  # one shard's scan: ~40 bytes a sample, 6 M samples
MAX_CACHE_BYTES = 2 << 30
MAX_ENTRIES = 100_000
_STALE_TMP_S = 3600.0
_SUFFIX = ".scan"
_MAGIC = b"FLSCAN01"
_MAGIC_FIELDS = b"FLSCANF1"  # the same, then the ragged fields' count and their extents
_MAX_FIELD_ROWS = 64  # a declaration's fields at most (`sample_fields.py`)
# magic, samples, key blob bytes, the shard's identity (device, inode, size, mtime_ns, ctime_ns)
_HEAD = struct.Struct("<8s2q5q")

Identity = tuple[int, int, int, int, int]
Scan = dict[str, np.ndarray]


def cache_root() -> str | None:
    """Where caches are kept (NOTE [scan cache trust]), or None when caching is off."""
    chosen = os.environ.get("FASTLOAD_CACHE_DIR")
    if chosen is not None:
        return chosen or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload")


def entry_dir_name() -> str:
    return f"tar-index-{os.geteuid()}"


class ScanCache:
    """An open, trusted cache directory (`open` gives None when there is none to trust)."""

    def __init__(self, fd: int, where: str) -> None:
        self.fd = fd
        self.where = where
        self.wrote = False

    @classmethod
    def open(cls) -> ScanCache | None:
        root = cache_root()
        if root is None:
            return None
        where = os.path.join(root, entry_dir_name())
        try:
            fd = open_private_dir(root, entry_dir_name())
        except OSError as e:
            warnings.warn(f"fastload: not caching tar shard scans: {e}", RuntimeWarning, stacklevel=3)
            return None
        return cls(fd, where)

    def close(self) -> None:
        if self.wrote:
            with contextlib.suppress(OSError):
                self.prune()
        os.close(self.fd)

    def __enter__(self) -> ScanCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def name(real_path: str, ident: Identity, variant: str = "") -> str:
        """The entry of a shard (and `variant`: a fields declaration, "" for none)."""
        key = "\0".join([real_path, *map(str, ident), *([variant] if variant else [])])
        key_bytes = key.encode("utf-8", "surrogateescape")
        return hashlib.sha256(key_bytes).hexdigest()[:40] + _SUFFIX

    def get(self, real_path: str, ident: Identity, variant: str = "") -> Scan | None:
        """The kept scan of the shard with this identity (and `variant`), or None (a miss, whatever
        is wrong)."""
        try:
            fd = os.open(
                self.name(real_path, ident, variant),
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=self.fd,
            )
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if (
                not stat.S_ISREG(info.st_mode)
                or info.st_uid != os.geteuid()
                or not _HEAD.size <= info.st_size <= MAX_ENTRY_BYTES
            ):
                return None
            data = read_bounded(fd, MAX_ENTRY_BYTES, self.where, "scan cache entry")
            scanned = _decode(data, ident, bool(variant))
            if scanned is not None:
                with contextlib.suppress(OSError):
                    os.utime(fd)  # recently used (pruning drops the least recently used)
            return scanned
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)

    def put(self, real_path: str, ident: Identity, scanned: Scan, variant: str = "") -> None:
        """Keep a scan (never raises: a cache that cannot be written is skipped)."""
        data = _encode(scanned, ident)
        if len(data) > MAX_ENTRY_BYTES:
            return
        name = self.name(real_path, ident, variant)
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(
                tmp,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=self.fd,
            )
        except OSError:
            return
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            self.wrote = True
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)

    def prune(self) -> None:
        """Drop the least recently used entries past `MAX_ENTRIES` or `MAX_CACHE_BYTES`, and
        temporaries left by killed processes."""
        now = time.time()
        entries: list[tuple[float, int, str]] = []
        with os.scandir(self.fd) as listing:
            for entry in listing:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.name.endswith(".tmp"):
                    if now - info.st_mtime > _STALE_TMP_S:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.name, dir_fd=self.fd)
                elif entry.name.endswith(_SUFFIX):
                    entries.append((info.st_mtime, info.st_size, entry.name))
        total, count = sum(size for _, size, _ in entries), len(entries)
        entries.sort()  # least recently used first
        for _, size, name in entries:
            if count <= MAX_ENTRIES and total <= MAX_CACHE_BYTES:
                break
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)
            total -= size
            count -= 1


def _encode(scanned: Scan, ident: Identity) -> bytes:
    n = int(scanned["labels"].shape[0])
    key_blob = scanned["key_blob"]
    fields = "field_offsets" in scanned
    parts = [_HEAD.pack(_MAGIC_FIELDS if fields else _MAGIC, n, int(key_blob.shape[0]), *ident)]
    for field in ("offsets", "sizes", "labels", "key_offsets"):
        parts.append(np.ascontiguousarray(scanned[field], "<i8").tobytes())
    parts.append(np.ascontiguousarray(key_blob, np.uint8).tobytes())
    if fields:
        parts.append(struct.pack("<q", int(scanned["field_sizes"].shape[0])))
        for field in ("field_offsets", "field_sizes"):
            parts.append(np.ascontiguousarray(scanned[field], "<i8").tobytes())
    return b"".join(parts)


def _decode(data: bytes, ident: Identity, fields: bool = False) -> Scan | None:
    """The scan `data` holds, None unless it is well formed, of this shard, and consistent (and
    of declared fields when `fields`)."""
    magic, n, key_len, *kept = _HEAD.unpack_from(data, 0)
    if magic != (_MAGIC_FIELDS if fields else _MAGIC) or tuple(kept) != ident or n < 0 or key_len < 0:
        return None
    base = _HEAD.size + 8 * (4 * n + 1) + key_len
    rows = struct.unpack_from("<q", data, base)[0] if fields and len(data) >= base + 8 else 0
    if not 0 <= rows <= _MAX_FIELD_ROWS or len(data) != base + (8 + 16 * rows * n if fields else 0):
        return None
    at = _HEAD.size
    arrays: Scan = {}
    for field, count in (("offsets", n), ("sizes", n), ("labels", n), ("key_offsets", n + 1)):
        arrays[field] = np.frombuffer(data, "<i8", count, at).astype(np.int64)
        at += 8 * count
    arrays["key_blob"] = np.frombuffer(data, np.uint8, key_len, at)
    offsets, sizes, keys = arrays["offsets"], arrays["sizes"], arrays["key_offsets"]
    shard_size = ident[2]
    if fields:
        at = base + 8
        for field in ("field_offsets", "field_sizes"):
            arrays[field] = np.frombuffer(data, "<i8", rows * n, at).astype(np.int64).reshape(rows, n)
            at += 8 * rows * n
        member_offsets, member_sizes = arrays["field_offsets"], arrays["field_sizes"]
        present = np.maximum(member_sizes, 0)
        if not (
            (member_offsets >= 0).all()
            and ((member_sizes == -1) | ((member_sizes >= 0) & (member_sizes <= MAX_SAMPLE_BYTES))).all()
            and (member_offsets + present <= shard_size).all()
            and (arrays["labels"] >= -1).all()
        ):
            return None
    if not (
        (offsets >= 0).all()
        and (sizes >= 0).all()
        and (sizes <= MAX_SAMPLE_BYTES).all()
        and (offsets + sizes <= shard_size).all()
        and (fields or (arrays["labels"] >= 0).all())
        and keys[0] == 0
        and keys[-1] == key_len
        and (np.diff(keys) >= 0).all()
    ):
        return None
    return arrays
