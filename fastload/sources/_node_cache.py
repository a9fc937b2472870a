"""The node-local cache of remote objects: chunks of objects as files, filled atomically, one
download per node, least recently used evicted past `cache_limit`.

NOTE [node cache]: an object (one version of it: its URL with its ETag) is cut into chunks of
`CHUNK_BYTES` (the last one shorter; a tar shard is one chunk, read whole). A read of a byte
range takes the chunks it covers: a chunk in the cache is read with `pread` from its file; a
missing one is downloaded (the missing chunks of one read concurrently) by the process that
*claims* it first, `O_CREAT|O_EXCL` on `CHUNK.claim` holding its pid: the data goes to a
temporary file renamed into place, so no process ever reads half a chunk, and every other
process (another worker, rank, or a daemon's) waits for the rename instead of downloading it
again. A claim whose process died is taken over. Every process of the node that uses the same
directory shares the cache (default: `remote-UID` under `FASTLOAD_CACHE_DIR`, 0700). A hit
touches its chunk (mtime); once a process has written more than a tenth of `limit` since it
last looked, it sums the cache and removes the least recently used chunks until the cache is
under 90% of `limit`. A chunk removed while another process reads it stays readable to that
process (its descriptor); the next read of it downloads it again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fastload._errors import DatasetError
from fastload._machine import pid_alive
from fastload._sizes import parse_size
from fastload.sources import _remote
from fastload.sources._scan_cache import cache_root

CHUNK_BYTES = 8 << 20
MAX_REQUESTS = 16  # chunk downloads one process runs at once
CLAIM_WAIT_S = 300.0  # how long a process waits for another's download before taking it over
_POLL_S = 0.005


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


def default_limit(directory: str) -> int:
    """`FASTLOAD_CACHE_LIMIT` (bytes, or "50GiB"), else half the free space of the cache's
    filesystem now."""
    chosen = os.environ.get("FASTLOAD_CACHE_LIMIT")
    if chosen:
        return parse_size(chosen, "FASTLOAD_CACHE_LIMIT (the node cache's limit)")
    return shutil.disk_usage(directory).free // 2


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
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.stat(directory)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise DatasetError(
                f"the remote data cache {directory} is not private (it must be yours, mode 0700): remove "
                "it, or set FASTLOAD_CACHE_DIR (or cache_dir=) to a directory of your own"
            )
        self.directory = directory
        self.limit = default_limit(directory) if limit is None else int(limit)
        self._written = 0
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.bytes_downloaded = 0

    def _chunk_path(self, url: str, version: str, chunk: int, chunk_bytes: int) -> str:
        digest = hashlib.sha256(f"{url}\0{version}\0{chunk_bytes}".encode()).hexdigest()[:40]
        return os.path.join(self.directory, digest[:2], f"{digest}.{chunk}")

    def read(
        self, url: str, version: str, size: int, start: int, end: int, chunk_bytes: int = CHUNK_BYTES
    ) -> bytes:
        """Bytes [start, end) of the object (`size` bytes, `version`), through the cache."""
        if not 0 <= start <= end <= size:
            raise OSError(f"{url}: bytes {start}..{end} are outside the object's {size}")
        if start == end:
            return b""
        first, last = start // chunk_bytes, (end - 1) // chunk_bytes
        chunks = list(range(first, last + 1))
        paths = {c: self._chunk_path(url, version, c, chunk_bytes) for c in chunks}
        missing = [c for c in chunks if not os.path.exists(paths[c])]
        if missing:
            self._fill(url, size, chunk_bytes, {c: paths[c] for c in missing}, version)
        out = bytearray(end - start)
        for c in chunks:
            lo, hi = max(start, c * chunk_bytes), min(end, (c + 1) * chunk_bytes)
            piece = self._read_chunk(paths[c], lo - c * chunk_bytes, hi - lo)
            if piece is None:  # evicted between the fill and now: once more, directly
                piece = _remote.read_range(url, lo, hi, version)
            out[lo - start : hi - start] = piece
        self.hits += len(chunks) - len(missing)
        _count(hits=len(chunks) - len(missing))
        return bytes(out)

    def fetch(self, url: str, version: str, size: int, chunk: int, chunk_bytes: int = CHUNK_BYTES) -> int:
        """Download one chunk of the object in this thread, unless it is cached or another thread
        or process is downloading it; the bytes downloaded (0 when it did not). For read-ahead."""
        path = self._chunk_path(url, version, chunk, chunk_bytes)
        if os.path.exists(path) or not self._claim(path):
            return 0
        try:
            return self._download(url, size, chunk_bytes, chunk, path, version, counted=False)
        finally:
            _release(path)
            self._evict_if_due()

    def path_of_whole(self, url: str, version: str, size: int) -> str:
        """A local file holding the whole object (one chunk of its size), downloaded if needed."""
        chunk_bytes = max(size, 1)
        path = self._chunk_path(url, version, 0, chunk_bytes)
        if not os.path.exists(path):
            self._fill(url, size, chunk_bytes, {0: path}, version)
        else:
            self.hits += 1
            _count(hits=1)
            _touch(path)
        return path

    def _read_chunk(self, path: str, offset: int, length: int) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        _touch(path)
        if len(data) != length:
            raise OSError(f"the cached chunk {path} is shorter than it should be: remove the cache directory")
        return data

    def _fill(self, url: str, size: int, chunk_bytes: int, paths: dict[int, str], version: str) -> None:
        """Download the chunks of `paths` that no other process is downloading; wait for the rest."""
        started = time.perf_counter_ns()
        try:
            mine = {c: p for c, p in paths.items() if self._claim(p)}
            self._download_all(url, size, chunk_bytes, mine, version)
            for c, path in paths.items():
                if c not in mine:
                    self._wait_for(url, size, chunk_bytes, c, path, version)
        finally:
            self.misses += len(paths)
            _count(misses=len(paths), waited_ns=time.perf_counter_ns() - started)

    def _download_all(
        self, url: str, size: int, chunk_bytes: int, claimed: dict[int, str], version: str
    ) -> None:
        """Download the chunks this process claimed, concurrently; release the claims."""
        if not claimed:
            return
        try:
            pool = self._executor()
            download = self._download
            jobs = [pool.submit(download, url, size, chunk_bytes, c, p, version) for c, p in claimed.items()]
            for job in jobs:
                job.result()
        finally:
            for path in claimed.values():
                _release(path)
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

    def _claim(self, path: str) -> bool:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            fd = os.open(path + ".claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        if os.path.exists(path):  # filled by another process between our look and our claim
            os.unlink(path + ".claim")
            return False
        return True

    def _download(
        self, url: str, size: int, chunk_bytes: int, chunk: int, path: str, version: str, counted: bool = True
    ) -> int:
        """Fetch one chunk of the object's `version` (SourceChanged when the store holds another:
        NOTE [conditional reads]) into its file; its bytes. `counted`: in `READS` (a read-ahead's
        fetches are not: it reports its own, `read_ahead.ReadAhead.delivered`)."""
        lo, hi = chunk * chunk_bytes, min(size, (chunk + 1) * chunk_bytes)
        data = _remote.read_range(url, lo, hi, version)
        temporary = f"{path}.{secrets.token_hex(8)}.part"
        fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.rename(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        with self._lock:
            self._written += len(data)
            self.bytes_downloaded += len(data)
        if counted:
            _count(downloaded=len(data))
        return len(data)

    def _wait_for(self, url: str, size: int, chunk_bytes: int, chunk: int, path: str, version: str) -> None:
        """Wait for another process's download of a chunk; take it over if that process died."""
        deadline = time.monotonic() + CLAIM_WAIT_S
        while not os.path.exists(path):
            if not _claimant_alive(path + ".claim") or time.monotonic() > deadline:
                _release(path)  # its claimant's: dead, or past the wait
                if self._claim(path):
                    try:
                        self._download(url, size, chunk_bytes, chunk, path, version)
                    finally:
                        _release(path)
                    return
            time.sleep(_POLL_S)

    def size(self) -> int:
        """Bytes the cache's chunks take now."""
        return sum(size for _, size, _ in _chunks(self.directory))

    def evict(self) -> int:
        """Remove the least recently used chunks until the cache is under 90% of its limit; return
        the bytes removed."""
        self._written = 0
        chunks = sorted(_chunks(self.directory), key=lambda c: c[2])
        total = sum(size for _, size, _ in chunks)
        removed = 0
        for path, size, _ in chunks:
            if total - removed <= self.limit * 0.9:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed += size
        return removed


def _count(downloaded: int = 0, waited_ns: int = 0, hits: int = 0, misses: int = 0) -> None:
    with READS.lock:
        READS.downloaded += downloaded
        READS.waited_ns += waited_ns
        READS.hits += hits
        READS.misses += misses


def _release(path: str) -> None:
    """Give up the claim on a chunk (downloaded, or failed)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + ".claim")


def _touch(path: str) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def _claimant_alive(claim: str) -> bool:
    try:
        with open(claim) as f:
            text = f.read()
        pid = int(text) if text else 0
        made = os.stat(claim).st_mtime
    except FileNotFoundError:
        return False  # gone: the chunk is in place (or its claimant gave up): look again
    except (OSError, ValueError):
        return False
    if pid <= 0:  # made, its pid not written yet: alive unless that was long ago
        return time.time() - made < 10.0
    return pid_alive(pid)


def _chunks(directory: str) -> list[tuple[str, int, float]]:
    """(path, bytes, mtime) of every complete chunk in the cache."""
    found = []
    for sub in os.scandir(directory):
        if not sub.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(sub.path):
            if entry.name.endswith((".claim", ".part")) or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat(follow_symlinks=False)
                found.append((entry.path, info.st_size, info.st_mtime))
    return found


_caches: dict[tuple[str, int | None], NodeCache] = {}


def node_cache(directory: str | None = None, limit: int | None = None) -> NodeCache:
    """The process's cache object for a directory (one per directory and limit; the default
    directory as `FASTLOAD_CACHE_DIR` says now)."""
    key = (directory if directory is not None else f"default:{cache_root()}", limit)
    cache = _caches.get(key)
    if cache is None:
        cache = _caches[key] = NodeCache(directory, limit)
    return cache
