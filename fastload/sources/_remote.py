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
`RETRY_DEADLINE_S` after its first attempt; then the read fails naming the URL. 404 and 403 fail
at once.
NOTE [store outages]: retries wait on the store (scheme and host or bucket) in this process, not
each on a backoff of its own (which grew to 10 s, so loading resumed up to 15 s after the store
was back). A transient failure marks the store failing; while it is, requests to it start at
most one per probe gap (jittered, doubling from 0.1 s to `_MAX_PROBE_GAP_S`), taken by whichever
waiting request comes first, and the first request to succeed (a probe, or one already in
flight) wakes every waiting one at once. Loading resumes within a gap of the store's return, and
a store that is down gets a few requests a second from a process, however many reads wait.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

from fastload._errors import DatasetError

SCHEMES = ("s3://", "gs://", "gcs://", "http://", "https://")
REQUEST_TIMEOUT_S = 30.0  # a stalled read fails after this, and is retried
CONNECT_TIMEOUT_S = 5.0
RETRY_DEADLINE_S = 120.0
_FIRST_PROBE_GAP_S = 0.1
_MAX_PROBE_GAP_S = 0.5
_PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "http": "aiohttp", "https": "aiohttp"}

T = TypeVar("T")
_filesystems: dict[tuple[int, str], Any] = {}
_lock = threading.Lock()


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


def _retried(url: str, what: Callable[[Any], T]) -> T:
    """`what(filesystem)`, retried on transient failures (NOTE [remote retries], [store outages])."""
    deadline = time.monotonic() + RETRY_DEADLINE_S
    store = _store(url)
    attempt = 0
    while True:
        attempt += 1
        try:
            result = what(_filesystem(url))
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
        except (DatasetError, TypeError, AttributeError):
            raise  # ours, or a programming error: never retried
        except Exception as e:  # 5xx, throttling, resets, timeouts: transient until the deadline
            _refused(url, e)  # ... but not a 4xx of an HTTP store
            if not store.wait_turn(store.failed(), deadline):
                raise OSError(
                    f"{url}: {_first_line(e)} ({attempt} attempts in {RETRY_DEADLINE_S:g} s): the store "
                    "is unreachable or failing; check the network and the endpoint"
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


def size_of(url: str) -> tuple[int, str]:
    """(the object's size in bytes, its version: the ETag, or its last-modified time)."""
    try:
        info = _retried(url, lambda fs: fs.info(url))
    except FileNotFoundError:
        if _protocol(url) in ("http", "https"):  # fsspec says "not found" for any refused HEAD
            _retried(url, lambda fs: fs.cat_file(url, start=0, end=1))  # a GET says 403 as 403
        raise
    if info.get("type") == "directory":
        raise DatasetError(f"{url} is a prefix (a directory), not an object")
    return int(info["size"]), _version(info)


def _version(info: dict[str, Any]) -> str:
    version = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or ""
    return str(version).strip('"')


def listing(prefix: str) -> dict[str, tuple[int, str]]:
    """Every object under the prefix (a "directory"): URL -> (size, version), from the store's
    listing (a request per thousand objects on S3), not a request per object. Empty for
    http(s)://, which has no listing."""
    protocol = _protocol(prefix)
    if protocol in ("http", "https"):
        return {}
    base = prefix.rstrip("/") + "/"
    found: dict[str, dict[str, Any]] = _retried(prefix, lambda fs: fs.find(base, detail=True))
    objects = {}
    for key, info in found.items():
        if info.get("type") != "directory":
            objects[key if is_url(key) else f"{protocol}://{key}"] = (int(info["size"]), _version(info))
    return objects


def read_range(url: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of the object."""
    data: bytes = _retried(url, lambda fs: fs.cat_file(url, start=start, end=end))
    if len(data) != end - start:
        raise OSError(f"{url}: asked for bytes {start}..{end}, got {len(data)}: the object is shorter")
    return data


def read_ranges(url: str, starts: list[int], ends: list[int]) -> list[bytes]:
    """Several ranges of one object, fetched concurrently."""
    urls = [url] * len(starts)
    got: list[bytes] = _retried(url, lambda fs: fs.cat_ranges(urls, starts, ends, on_error="raise"))
    for data, start, end in zip(got, starts, ends, strict=True):
        if len(data) != end - start:
            raise OSError(f"{url}: asked for bytes {start}..{end}, got {len(data)}: the object is shorter")
    return got


def read_whole(url: str, limit: int) -> bytes:
    """The whole object, refused past `limit` bytes (a manifest, an index, a file list)."""
    size, _ = size_of(url)
    if size > limit:
        raise DatasetError(f"{url} holds {size:,} bytes, more than the {limit:,} such a file may")
    return read_range(url, 0, size) if size else b""


def exists(url: str) -> bool:
    return bool(_retried(url, lambda fs: fs.exists(url)))


def check_reachable(url: str) -> None:
    """Fail now rather than after long work: the protocol's package is importable, and the store
    answers a request for `url` with these credentials (a 404 is an answer). DatasetError or
    OSError saying what is wrong."""
    with contextlib.suppress(FileNotFoundError):
        size_of(url)


def upload(path: str, url: str) -> None:
    """Copy the local file at `path` to the object `url` (streamed, in parts when large)."""
    _retried(url, lambda fs: fs.put_file(path, url))


def write(url: str, data: bytes) -> None:
    """Put the object (s3fs uploads large ones in parts)."""
    _retried(url, lambda fs: fs.pipe_file(url, data))
