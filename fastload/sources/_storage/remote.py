"""Objects at URLs (`s3://`, `gs://`, `http(s)://`): sizes, byte ranges, whole objects, writes;
with retries, and errors that name the URL and what to check.

Through fsspec (s3fs for S3 and S3-compatible stores, gcsfs for GCS, aiohttp for HTTP): the
library most of PyTorch's data stack already reads object storage with, which takes credentials
from the standard places (`AWS_*`, `AWS_PROFILE`'s files, instance metadata, `AWS_ENDPOINT_URL`
for an S3-compatible store; GCS's likewise), runs a batch's ranged reads concurrently
(`cat_ranges`) and, unlike obstore's Tokio runtime (measured here: a forked child of a process
that had used it hangs on its first request), survives `fork`: a loader's workers are forked.
No credential is ever logged or sent to a daemon's peer: only URLs are.

NOTE [a filesystem per process]: each process (a forked worker included) makes its own
filesystem object on first use, keyed by (pid, protocol); fsspec refuses one used across a fork.
NOTE [remote retries]: a request that fails with anything but "not found" or "denied" (a 5xx, a
throttle, a reset connection, a read stalled past `REQUEST_TIMEOUT_S`) is retried until
`REQUEST_DEADLINE_S` after its first attempt; then the read fails naming the URL. 404 and 403 fail
at once, and so do a changed object (`SourceChanged`: NOTE [conditional reads] in
`_storage/wire.py`) and a redirect to another host (NOTE [same-origin redirects]).
NOTE [request deadline]: the same deadline bounds every attempt as a whole, its answer's body
included (each attempt runs under `asyncio.wait_for` with the time left), not only the gaps
between attempts: a store that drips its answer a byte at a time never trips `REQUEST_TIMEOUT_S`
(a gap between two reads of the socket), and a read of it had been seen still running at 240 s.
Uploads are not bounded so (a large file takes what it takes); their retries are.
NOTE [store outages]: retries wait on the store (scheme and host or bucket) in this process, not
each on a backoff of its own (which grew to 10 s, so loading resumed up to 15 s after the store
was back). A transient failure marks the store failing; while it is, requests to it start at
most one per probe gap (jittered, doubling from 0.1 s to `_MAX_PROBE_GAP_S`), taken by whichever
waiting request comes first, and the first request to succeed (a probe, or one already in
flight) wakes every waiting one at once. Loading resumes within a gap of the store's return, and
a store that is down gets a few requests a second from a process, however many reads wait.
NOTE [confined requests]: a daemon opens a peer's source in a process of its own, made for that
one open (`_daemon/opener`); it calls `confine` with the daemon's roots before the source reads
anything, and from then on every request of that process is checked before it is sent (a URL a
file list names, a shard, a manifest): one outside the roots raises there, and no request
reaches the store. The check is the process's, not a read's: the open's threads (a file list's
HEADs) are held to it too.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastload._errors import DatasetError
from fastload.sources._storage import wire

SCHEMES = ("s3://", "gs://", "gcs://", "http://", "https://")
REQUEST_TIMEOUT_S = 30.0  # a stalled read fails after this, and is retried
CONNECT_TIMEOUT_S = 5.0
REQUEST_DEADLINE_S = 120.0  # a read, its retries and every byte of its answers (NOTE [request deadline])
HEAD_REQUESTS = 16  # objects `sizes_of` sizes at once
_FIRST_PROBE_GAP_S = 0.1
_MAX_PROBE_GAP_S = 0.5
_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}

T = TypeVar("T")
_filesystems: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()
_confinement: list[Callable[[str], None]] = []  # NOTE [confined requests]: set once, never undone


def confine(check: Callable[[str], None]) -> None:
    """Run `check(url)` (which raises to refuse) before every request this process makes from
    now on (NOTE [confined requests]); for a process made for one open, never undone."""
    _confinement.append(check)


class _Store:
    """One store's health in this process (NOTE [store outages])."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._answers = 0  # requests it answered
        self._failing = False
        self._gap = _FIRST_PROBE_GAP_S
        self._next_probe = 0.0

    def answered(self) -> None:
        """A request succeeded (or was refused: the store answers): wake every waiting retry."""
        with self._changed:
            self._answers += 1
            if self._failing:
                self._failing = False
                self._changed.notify_all()

    def failed(self) -> int:
        """A request failed transiently; the count of answers so far, for `wait_turn`."""
        with self._changed:
            if not self._failing:
                self._failing = True
                self._gap = _FIRST_PROBE_GAP_S
                self._next_probe = time.monotonic() + _jittered(self._gap)
            return self._answers

    def wait_turn(self, seen: int, deadline: float) -> bool:
        """Wait until a failed request may try again: the store answered another request since
        it had answered `seen`, or the next probe is this request's. False at `deadline`."""
        with self._changed:
            while self._failing and self._answers == seen:
                now = time.monotonic()
                if now >= self._next_probe:
                    self._gap = min(2 * self._gap, _MAX_PROBE_GAP_S)
                    self._next_probe = now + _jittered(self._gap)
                    return True
                if now >= deadline:
                    return False
                self._changed.wait(min(self._next_probe, deadline) - now)
            return True


_stores: dict[tuple[int, str], _Store] = {}


def _jittered(seconds: float) -> float:
    return seconds * (0.5 + random.random())


def _store(url: str) -> _Store:
    """This process's `_Store` of the URL's store (its threading state is per process, as a
    filesystem is: NOTE [a filesystem per process])."""
    parts = urllib.parse.urlsplit(url)
    key = (os.getpid(), f"{parts.scheme.lower()}://{parts.netloc.lower()}")
    store = _stores.get(key)
    if store is None:
        with _lock:
            store = _stores.setdefault(key, _Store())
    return store


def is_url(path: object) -> bool:
    """Whether `path` names an object in a remote store rather than a local file."""
    return isinstance(path, str) and path.lower().startswith(SCHEMES)


def join(base: str, name: str) -> str:
    """`name` inside the "directory" `base` (a prefix)."""
    return f"{base.rstrip('/')}/{name}"


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower()


def _filesystem(url: str) -> Any:
    """This process's filesystem for `url`'s protocol (NOTE [a filesystem per process])."""
    protocol = _protocol(url)
    key = (os.getpid(), protocol)
    fs = _filesystems.get(key)
    if fs is None:
        with _lock:
            fs = _filesystems.get(key)
            if fs is None:
                fs = _make_filesystem(protocol, url)
                _filesystems[key] = fs
    return fs


def _make_filesystem(protocol: str, url: str) -> Any:
    try:
        import fsspec

        # No listings cache: a listing (a file list's root) would answer later lookups of objects
        # made since, in a process (a daemon) that lives for weeks.
        options: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
        if protocol == "s3":
            options["config_kwargs"] = {
                "connect_timeout": CONNECT_TIMEOUT_S,
                "read_timeout": REQUEST_TIMEOUT_S,
                "retries": {"max_attempts": 1},  # ours (NOTE [remote retries]): one policy, one deadline
            }
        if protocol in ("http", "https"):
            import aiohttp

            timeout = aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S, sock_read=REQUEST_TIMEOUT_S)
            options["client_kwargs"] = {"timeout": timeout}
            options["allow_redirects"] = False  # ours follow them within the host only (`_storage/wire.py`)
        return fsspec.filesystem(protocol, **options)
    except ImportError as e:
        package = _PACKAGES.get(protocol, "fsspec")
        extra = "fastload[remote] gcsfs" if package == "gcsfs" else "fastload[remote]"
        raise DatasetError(
            f"{url}: reading {protocol}:// needs {package} ({e.name or package} is missing): pip install "
            f"'{extra}'"
        ) from None
    except ValueError as e:  # a protocol fsspec does not know
        raise DatasetError(f"{url}: {e}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _retried(url: str, what: Callable[[Any, float | None], T], bounded: bool = True) -> T:
    """`what(filesystem, seconds)`, retried on transient failures (NOTE [remote retries], [store
    outages]); `seconds` is what the attempt may take, the deadline's rest (NOTE [request
    deadline]), None when not `bounded` (an upload)."""
    for refuse_outside in _confinement:
        refuse_outside(url)
    deadline = time.monotonic() + REQUEST_DEADLINE_S
    store = _store(url)
    attempt = 0
    while True:
        attempt += 1
        left = max(deadline - time.monotonic(), 0.001) if bounded else None
        try:
            result = what(_filesystem(url), left)
        except FileNotFoundError:
            store.answered()
            web = _protocol(url) in ("http", "https")
            check = "the URL" if web else "the bucket, the key and the endpoint"
            raise FileNotFoundError(f"{url} does not exist (404): check {check}") from None
        except PermissionError:
            store.answered()
            raise PermissionError(
                f"{url}: access denied (403): check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...), "
                "the bucket's policy, and AWS_ENDPOINT_URL for an S3-compatible store"
            ) from None
        except wire.Refused:
            store.answered()
            raise
        except (DatasetError, TypeError, AttributeError):
            raise  # ours (SourceChanged: NOTE [conditional reads]), or a programming error: never retried
        except Exception as e:  # 5xx, throttling, resets, timeouts: transient until the deadline
            _refused(url, e)  # ... but not a 4xx of an HTTP store
            if not store.wait_turn(store.failed(), deadline):
                raise OSError(
                    f"{url}: {_first_line(e)} ({attempt} attempts in {REQUEST_DEADLINE_S:g} s): the store "
                    "is unreachable, failing or answering too slowly; check the network and the endpoint"
                ) from None
        else:
            store.answered()
            return result


def _refused(url: str, e: Exception) -> None:
    """Raise at once for an HTTP store's 4xx (S3's 403 and 404 come as PermissionError and
    FileNotFoundError); 408 and 429 are transient."""
    status = getattr(e, "status", None)
    if not isinstance(status, int) or not 400 <= status < 500 or status in (408, 429):
        return
    if status in (401, 403):
        raise PermissionError(f"{url}: access denied ({status}): check the URL and its credentials") from None
    if status == 404:
        raise FileNotFoundError(f"{url} does not exist (404): check the URL") from None
    raise OSError(f"{url}: the store refused the request ({status}): {_first_line(e)}") from None


def _web(url: str) -> bool:
    return _protocol(url) in ("http", "https")


def _on_loop(fs: Any, coroutine: Callable[..., Any], *args: Any, timeout: float | None) -> Any:
    """`coroutine(fs, *args)` run on the filesystem's event loop, cancelled after `timeout` s."""
    import fsspec.asyn

    return fsspec.asyn.sync(fs.loop, coroutine, fs, *args, timeout=timeout)


def size_of(url: str) -> tuple[int, str]:
    """(the object's size in bytes, its version: the ETag, or its last-modified time)."""
    if _web(url):  # our HEAD: redirects within the host only (NOTE [same-origin redirects])
        info = _retried(url, lambda fs, left: _on_loop(fs, wire.http_head, url, timeout=left))
    else:
        info = _retried(url, lambda fs, left: fs.info(url, timeout=left))
    if info.get("type") == "directory":
        raise DatasetError(f"{url} is a prefix (a directory), not an object")
    return int(info["size"]), _version(info)


def sizes_of(urls: Iterable[str]) -> dict[str, tuple[int, str] | OSError]:
    """`size_of` each URL, HEAD_REQUESTS at a time: URL -> (size, version), or the OSError sizing
    it raised (the caller names what it was: a file list, its line)."""

    def one(url: str) -> tuple[str, tuple[int, str] | OSError]:
        try:
            return url, size_of(url)
        except OSError as e:
            return url, e

    with ThreadPoolExecutor(HEAD_REQUESTS, "fastload-list-head") as pool:
        return dict(pool.map(one, urls))


def _version(info: dict[str, Any]) -> str:
    """The version a read asks for (NOTE [conditional reads]): the ETag, quoted as HTTP writes
    it, or else the object's last-modified time."""
    tag = info.get("ETag") or info.get("etag")
    if tag:
        return wire.etag(tag)
    return str(info.get("LastModified") or info.get("Last-Modified") or info.get("mtime") or "")


def listing(prefix: str) -> dict[str, tuple[int, str]]:
    """Every object under the prefix (a "directory"): URL -> (size, version), from the store's
    listing (a request per thousand objects on S3), not a request per object. Empty for
    http(s)://, which has no listing."""
    protocol = _protocol(prefix)
    if protocol in ("http", "https"):
        return {}
    base = prefix.rstrip("/") + "/"
    found: dict[str, dict[str, Any]] = _retried(
        prefix, lambda fs, left: fs.find(base, detail=True, timeout=left)
    )
    objects = {}
    for key, info in found.items():
        if info.get("type") != "directory":
            objects[key if is_url(key) else f"{protocol}://{key}"] = (int(info["size"]), _version(info))
    return objects


def read_range(url: str, start: int, end: int, version: str = "") -> bytes:
    """Bytes [start, end) of the object; of its `version` only (`size_of`'s: SourceChanged when
    the store holds another, NOTE [conditional reads]), when given."""
    if end <= start:
        return b""
    protocol = _protocol(url)

    def attempt(fs: Any, left: float | None) -> bytes:
        if protocol == "s3":
            return bytes(_on_loop(fs, wire.s3_get, url, start, end, version, timeout=left))
        if protocol in ("http", "https"):
            return bytes(_on_loop(fs, wire.http_get, url, start, end, version, timeout=left))
        return bytes(fs.cat_file(url, start=start, end=end, timeout=left))  # gs://: not conditional

    data = _retried(url, attempt)
    if len(data) != end - start:
        raise OSError(f"{url}: asked for bytes {start}..{end}, got {len(data)}: the object is shorter")
    return data


def read_whole(url: str, limit: int) -> bytes:
    """The whole object (of the version it had when sized), refused past `limit` bytes (a
    manifest, an index, a file list)."""
    size, version = size_of(url)
    if size > limit:
        raise DatasetError(f"{url} holds {size:,} bytes, more than the {limit:,} such a file may")
    return read_range(url, 0, size, version)


def check_reachable(url: str) -> None:
    """Fail now rather than after long work: the protocol's package is importable, and the store
    answers a request for `url` with these credentials (a 404 is an answer). DatasetError or
    OSError saying what is wrong."""
    with contextlib.suppress(FileNotFoundError):
        size_of(url)


def upload(path: str, url: str) -> None:
    """Copy the local file at `path` to the object `url` (streamed, in parts when large)."""
    _retried(url, lambda fs, _: fs.put_file(path, url), bounded=False)


def write(url: str, data: bytes) -> None:
    """Put the object (s3fs uploads large ones in parts)."""
    _retried(url, lambda fs, _: fs.pipe_file(url, data), bounded=False)
