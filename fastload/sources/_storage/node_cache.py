"""The node-local cache of remote objects: chunks of objects as files, filled atomically, one
download per node, each verified before use, least recently used evicted past `cache_limit`.

NOTE [node cache]: an object (one version of it: its URL with its ETag) is cut into chunks of
`CHUNK_BYTES` (the last one shorter; a tar shard is one chunk, read whole). A read of a byte
range takes the chunks it covers: a chunk in the cache is read with `pread` from its file and
checked against the digests written with it (NOTE [chunk verification] in `_storage/chunk_file.py`; a
damaged chunk is dropped and fetched again); a missing one is downloaded (the missing chunks of
one read concurrently) by the process that *claims* it first, `O_CREAT|O_EXCL` on `CHUNK.claim`
holding its pid: the data goes to a temporary file renamed into place, so no process ever reads
half a chunk, and every other process (another worker, rank, or a daemon's) waits for the rename
instead of downloading it again. A claim whose process died is taken over. Every process of the
node that uses the same directory shares the cache (default: `remote-UID` under
`FASTLOAD_CACHE_DIR`). The directory is opened once per process by `open_private_dir` (NOTE
[private directory]: no link followed, this user's and 0700, else refused) and everything after
(claims, temporaries, renames, reads, touches, listing, eviction) is done relative to that
descriptor, never by path. A hit touches its chunk (mtime); once a process has written more
than a tenth of `limit` since it last looked, it sums the cache and removes the least recently
used chunks until the cache is under 90% of `limit`; only files named as chunks are counted and
removed. A chunk removed while another process reads it stays readable to that process (its
descriptor); the next read of it downloads it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

from fastload._errors import DatasetError
from fastload._machine import pid_alive
from fastload._sizes import parse_size
from fastload.sources._storage import chunk_file as _chunk_file
from fastload.sources._storage import remote as _remote
from fastload.sources._storage.private_dir import open_private_dir
from fastload.sources._storage.scan_cache import cache_root

CHUNK_BYTES = 8 << 20
MAX_REQUESTS = 16  # chunk downloads one process runs at once
CLAIM_WAIT_S = 300.0  # how long a process waits for another's download before taking it over
_POLL_S = 0.005
_STALE_PART_S = 3600.0  # a temporary this old is a killed download's
_CHUNK_NAME = re.compile(r"[0-9a-f]{40}\.\d+")
_PART_NAME = re.compile(r"[0-9a-f]{40}\.\d+\.[0-9a-f]{16}\.part")
_OLD_LAYOUT = re.compile(r"[0-9a-f]{2}")  # before issue 29: chunks in subdirectories, unverified
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RemoteReads:
    """What this process's reads of remote objects did, through every cache (read by a worker
    around each task, for the loader's statistics and iostat)."""

    def __init__(self) -> None:
        self.downloaded = 0  # bytes fetched from stores
        self.waited_ns = 0  # time reads waited for chunks not in the cache (fetching, or another's fetch)
        self.hits = 0  # chunks read from the cache
        self.misses = 0  # chunks a read had to wait for
        self.lock = threading.Lock()

    def snapshot(self) -> tuple[int, int, int, int]:
        """(downloaded, waited_ns, hits, misses) so far."""
        return self.downloaded, self.waited_ns, self.hits, self.misses

    def since(self, then: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
        """What was done since the `snapshot` `then`."""
        now = self.snapshot()
        return now[0] - then[0], now[1] - then[1], now[2] - then[2], now[3] - then[3]


READS = RemoteReads()


def default_limit(directory: str | int) -> int:
    """`FASTLOAD_CACHE_LIMIT` (bytes, or "50GiB"), else half the free space of the cache's
    filesystem now (`directory`: its path or a descriptor)."""
    chosen = os.environ.get("FASTLOAD_CACHE_LIMIT")
    if chosen:
        return parse_size(chosen, "FASTLOAD_CACHE_LIMIT (the node cache's limit)")
    info = os.statvfs(directory)
    return info.f_bavail * info.f_frsize // 2


class NodeCache:
    """One directory of cached chunks (NOTE [node cache]); safe to share between processes."""

    def __init__(self, directory: str | None = None, limit: int | None = None) -> None:
        if directory is None:
            root = cache_root()
            if root is None:
                raise DatasetError(
                    "remote data needs a local cache: FASTLOAD_CACHE_DIR is empty; set it to a directory"
                )
            directory = os.path.join(root, f"remote-{os.geteuid()}")
        directory = os.path.abspath(directory)
        try:
            self.fd = open_private_dir(os.path.dirname(directory), os.path.basename(directory))
        except OSError as e:
            raise DatasetError(
                f"cannot use the remote data cache: {e} (set FASTLOAD_CACHE_DIR, or cache_dir=, to a "
                "directory of your own)"
            ) from None
        self.directory = directory  # for messages: what is done in it goes through `fd`
        self.limit = default_limit(self.fd) if limit is None else int(limit)
        self._written = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.damaged = 0  # chunks that failed verification: dropped, fetched again
        self.bytes_downloaded = 0

    def close(self) -> None:
        """Close the directory's descriptor (in the process that opened it; a forked child's copy
        is its own, closed with it)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        with contextlib.suppress(AttributeError, OSError):
            self.close()

    @staticmethod
    def chunk_name(url: str, version: str, chunk: int, chunk_bytes: int) -> str:
        """The file name of a chunk of an object (one version of it, cut in `chunk_bytes`)."""
        digest = hashlib.sha256(f"{url}\0{version}\0{chunk_bytes}".encode()).hexdigest()[:40]
        return f"{digest}.{chunk}"

    def read(
        self, url: str, version: str, size: int, start: int, end: int, chunk_bytes: int = CHUNK_BYTES
    ) -> bytes:
        """Bytes [start, end) of the object (`size` bytes, `version`), through the cache."""
        if not 0 <= start <= end <= size:
            raise OSError(f"{url}: bytes {start}..{end} are outside the object's {size}")
        if start == end:
            return b""
        first, last = start // chunk_bytes, (end - 1) // chunk_bytes
        names = {c: self.chunk_name(url, version, c, chunk_bytes) for c in range(first, last + 1)}
        out = bytearray(end - start)
        pending, hits = list(names), 0
        for attempt in range(2):  # a chunk evicted or damaged meanwhile is fetched once more
            missing = [c for c in pending if not self._present(names[c])]
            if missing:
                self._fill(url, size, chunk_bytes, {c: names[c] for c in missing}, version)
            unread = []
            for c in pending:
                lo, hi = max(start, c * chunk_bytes), min(end, (c + 1) * chunk_bytes)
                length = min(chunk_bytes, size - c * chunk_bytes)
                piece = self._read_chunk(names[c], length, lo - c * chunk_bytes, hi - lo)
                if piece is None:
                    unread.append(c)
                else:
                    out[lo - start : hi - start] = piece
                    if attempt == 0 and c not in missing:
                        hits += 1
            pending = unread
            if not pending:
                break
        for c in pending:  # evicted (or damaged) twice in a row: once more, directly
            lo, hi = max(start, c * chunk_bytes), min(end, (c + 1) * chunk_bytes)
            out[lo - start : hi - start] = _remote.read_range(url, lo, hi, version)
        self.hits += hits
        _count(hits=hits)
        return bytes(out)

    def fetch(self, url: str, version: str, size: int, chunk: int, chunk_bytes: int = CHUNK_BYTES) -> int:
        """Download one chunk of the object in this thread, unless it is cached or another thread
        or process is downloading it; the bytes downloaded (0 when it did not). For read-ahead."""
        name = self.chunk_name(url, version, chunk, chunk_bytes)
        if self._present(name) or not self._claim(name):
            return 0
        try:
            return self._download(url, size, chunk_bytes, chunk, name, version, counted=False)
        finally:
            self._release(name)
            self._evict_if_due()

    @contextlib.contextmanager
    def open_whole(self, url: str, version: str, size: int) -> Iterator[BinaryIO]:
        """The whole object (one chunk of its size) as a read-only file of its bytes, downloaded
        if needed and verified whole before it is handed out (a tar shard to scan)."""
        fd = self._verified_whole(url, version, size)
        try:
            _touch(fd)
            with io.BufferedReader(_chunk_file.WholeChunk(fd, size), 1 << 16) as whole:
                yield whole
        finally:
            os.close(fd)

    def _verified_whole(self, url: str, version: str, size: int) -> int:
        """A descriptor of the object's one chunk, verified whole; fetched again once if damaged."""
        chunk_bytes = max(size, 1)
        name = self.chunk_name(url, version, 0, chunk_bytes)
        for _ in range(2):
            if self._present(name):
                self.hits += 1
                _count(hits=1)
            else:
                self._fill(url, size, chunk_bytes, {0: name}, version)
            fd = self._open_chunk(name)
            if fd is not None:
                if _chunk_file.verify_whole(fd, size):
                    return fd
                os.close(fd)
                self._drop(name)
        raise OSError(f"{url}: its copy in the node cache {self.directory} was damaged again when fetched")

    def _present(self, name: str) -> bool:
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return False

    def _open_chunk(self, name: str) -> int | None:
        try:
            return os.open(name, _chunk_file.READ_FLAGS, dir_fd=self.fd)
        except FileNotFoundError:
            return None

    def _read_chunk(self, name: str, length: int, offset: int, count: int) -> bytes | memoryview | None:
        """`count` bytes at `offset` of a chunk of `length` bytes, verified; None when it is not
        there (evicted) or damaged (then dropped)."""
        fd = self._open_chunk(name)
        if fd is None:
            return None
        try:
            data = _chunk_file.read(fd, length, offset, count)
            if data is not None:
                _touch(fd)
        finally:
            os.close(fd)
        if data is None:
            self._drop(name)
        return data

    def _drop(self, name: str) -> None:
        """Remove a damaged chunk (NOTE [chunk verification]) so that it is fetched again."""
        with self._lock:
            self.damaged += 1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def _fill(self, url: str, size: int, chunk_bytes: int, names: dict[int, str], version: str) -> None:
        """Download the chunks of `names` that no other process is downloading; wait for the rest."""
        started = time.perf_counter_ns()
        try:
            mine = {c: n for c, n in names.items() if self._claim(n)}
            self._download_all(url, size, chunk_bytes, mine, version)
            for c, name in names.items():
                if c not in mine:
                    self._wait_for(url, size, chunk_bytes, c, name, version)
        finally:
            self.misses += len(names)
            _count(misses=len(names), waited_ns=time.perf_counter_ns() - started)

    def _download_all(
        self, url: str, size: int, chunk_bytes: int, claimed: dict[int, str], version: str
    ) -> None:
        """Download the chunks this process claimed, concurrently; release the claims."""
        if not claimed:
            return
        try:
            pool = self._executor()
            download = self._download
            jobs = [pool.submit(download, url, size, chunk_bytes, c, n, version) for c, n in claimed.items()]
            for job in jobs:
                job.result()
        finally:
            for name in claimed.values():
                self._release(name)
        self._evict_if_due()

    def _evict_if_due(self) -> None:
        """Look at the cache's size once this process has written a tenth of the limit since."""
        if self._written > self.limit // 10:
            self.evict()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pool_pid != os.getpid():  # threads do not survive a fork
                self._pool = ThreadPoolExecutor(MAX_REQUESTS, "fastload-fetch")
                self._pool_pid = os.getpid()
            return self._pool

    def _claim(self, name: str) -> bool:
        flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name + ".claim", flags, 0o600, dir_fd=self.fd)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        if self._present(name):  # filled by another process between our look and our claim
            self._release(name)
            return False
        return True

    def _release(self, name: str) -> None:
        """Give up the claim on a chunk (downloaded, or failed)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name + ".claim", dir_fd=self.fd)

    def _download(
        self, url: str, size: int, chunk_bytes: int, chunk: int, name: str, version: str, counted: bool = True
    ) -> int:
        """Fetch one chunk of the object's `version` (SourceChanged when the store holds another:
        NOTE [conditional reads]) into its file, with its digests; its bytes. `counted`: in
        `READS` (a read-ahead's fetches are not: it reports its own, `read_ahead.ReadAhead.delivered`)."""
        lo, hi = chunk * chunk_bytes, min(size, (chunk + 1) * chunk_bytes)
        data = _remote.read_range(url, lo, hi, version)
        if len(data) != hi - lo:
            raise OSError(f"{url}: asked for bytes {lo}..{hi}, got {len(data)}")
        _chunk_file.write(self.fd, name, data)
        with self._lock:
            self._written += len(data)
            self.bytes_downloaded += len(data)
        if counted:
            _count(downloaded=len(data))
        return len(data)

    def _wait_for(
        self, url: str, size: int, chunk_bytes: int, chunk: int, name: str, version: str
    ) -> None:
        """Wait for another process's download of a chunk; take it over if that process died."""
        deadline = time.monotonic() + CLAIM_WAIT_S
        while not self._present(name):
            if not self._claimant_alive(name) or time.monotonic() > deadline:
                self._release(name)  # its claimant's: dead, or past the wait
                if self._claim(name):
                    try:
                        self._download(url, size, chunk_bytes, chunk, name, version)
                    finally:
                        self._release(name)
                    return
            time.sleep(_POLL_S)

    def _claimant_alive(self, name: str) -> bool:
        try:
            fd = os.open(name + ".claim", _chunk_file.READ_FLAGS, dir_fd=self.fd)
        except OSError:
            return False  # gone: the chunk is in place (or its claimant gave up): look again
        try:
            info = os.fstat(fd)
            text = os.read(fd, 32) if stat.S_ISREG(info.st_mode) else b"x"
        finally:
            os.close(fd)
        try:
            pid = int(text) if text else 0
        except ValueError:
            return False
        if pid <= 0:  # made, its pid not written yet: alive unless that was long ago
            return time.time() - info.st_mtime < 10.0
        return pid_alive(pid)

    def size(self) -> int:
        """Bytes the cache's chunks take now."""
        return sum(size for _, size, _ in self._chunks())

    def evict(self) -> int:
        """Remove the least recently used chunks until the cache is under 90% of its limit; return
        the bytes removed."""
        self._written = 0
        chunks = sorted(self._chunks(), key=lambda c: c[2])
        total = sum(size for _, size, _ in chunks)
        removed = 0
        for name, size, _ in chunks:
            if total - removed <= self.limit * 0.9:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self.fd)
                removed += size
        return removed

    def _chunks(self) -> list[tuple[str, int, float]]:
        """(name, bytes, mtime) of every complete chunk in the cache; on the way, temporaries of
        killed downloads are removed, and chunks of the layout before issue 29 (never read now)."""
        found = []
        now = time.time()
        listing = os.open(".", _DIRECTORY, dir_fd=self.fd)  # its own offset: not shared across a fork
        try:
            with os.scandir(listing) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    if stat.S_ISREG(info.st_mode) and _CHUNK_NAME.fullmatch(entry.name):
                        found.append((entry.name, info.st_size, info.st_mtime))
                    elif _PART_NAME.fullmatch(entry.name) and now - info.st_mtime > _STALE_PART_S:
                        with contextlib.suppress(OSError):
                            os.unlink(entry.name, dir_fd=self.fd)
                    elif stat.S_ISDIR(info.st_mode) and _OLD_LAYOUT.fullmatch(entry.name):
                        _remove_old_layout(self.fd, entry.name)
        finally:
            os.close(listing)
        return found


def _remove_old_layout(parent: int, name: str) -> None:
    """Remove the chunks (and their claims and temporaries) of a subdirectory the cache kept
    before issue 29, by descriptor, and the subdirectory when that empties it."""
    with contextlib.suppress(OSError):
        fd = os.open(name, _DIRECTORY, dir_fd=parent)
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    if re.fullmatch(r"[0-9a-f]{40}\.\d+(\.claim|\.[0-9a-f]{16}\.part)?", entry.name):
                        with contextlib.suppress(OSError):
                            os.unlink(entry.name, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent)


def _touch(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.utime(fd)


def _count(downloaded: int = 0, waited_ns: int = 0, hits: int = 0, misses: int = 0) -> None:
    with READS.lock:
        READS.downloaded += downloaded
        READS.waited_ns += waited_ns
        READS.hits += hits
        READS.misses += misses


_caches: dict[tuple[str, int | None], NodeCache] = {}


def node_cache(directory: str | None = None, limit: int | None = None) -> NodeCache:
    """The process's cache object for a directory (one per directory and limit; the default
    directory as `FASTLOAD_CACHE_DIR` says now)."""
    key = (directory if directory is not None else f"default:{cache_root()}", limit)
    cache = _caches.get(key)
    if cache is None:
        cache = _caches[key] = NodeCache(directory, limit)
    return cache
