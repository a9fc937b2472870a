"""The daemon's dataset indexes: scanned off the serving thread, bounded, shared, evicted.

A hello names a source (an image folder, a file list, ...); its index (every sample's place and
target) is made once and shared with the workers through a shared-memory segment. Scans run one
at a time on a background thread, so the daemon keeps serving (and obeys SIGTERM) while a huge
tree is walked; a folder's walk is bounded in files, memory (what is left of the daemon's budget)
and time, and cancelled when the daemon stops. An index no session uses is evicted after
`idle_s`, or at once when its memory is wanted, except those the configuration warms.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass

from fastload._errors import DatasetError, FastloadError
from fastload._loading.shm import Segment
from fastload.sources import ImageFolder, Source
from fastload.sources._arrays import ArrayIndex
from fastload.sources._folder import scan_image_folder
from fastload.sources._index import SampleIndex

log = logging.getLogger("fastload.daemon")


@dataclass(frozen=True)
class IndexLimits:
    """Bounds on one scan: files indexed, and wall time."""

    max_files: int = 20_000_000
    timeout_s: float = 600.0


@dataclass
class IndexEntry:
    path: str  # the key: a folder's real path, or a source's description
    index: SampleIndex
    segment: Segment
    users: int = 0
    pinned: bool = False  # warmed from the configuration: never evicted
    idle_since: float = 0.0

    @property
    def size(self) -> int:
        return self.segment.size


class _Scan(threading.Thread):
    """One source's indexing on a background thread; `result` is the index or the error. A folder's
    walk is bounded (`IndexLimits`, memory, cancel); other sources read a file they name (a list,
    shard headers, a packed index), bounded by that file."""

    def __init__(
        self, path: str, source: Source, limits: IndexLimits, max_bytes: int, cancel: threading.Event
    ) -> None:
        super().__init__(name=f"fastload-index {source.where}", daemon=True)
        self.path = path
        self.source = source
        self.started_at = time.monotonic()
        self._limits = limits
        self._max_bytes = max_bytes
        self._cancel = cancel
        self.result: SampleIndex | BaseException | None = None

    def run(self) -> None:
        try:
            if not isinstance(self.source, ImageFolder):
                try:
                    index = self.source.open()
                except FastloadError:
                    raise
                except (TypeError, ValueError, KeyError, AttributeError) as e:  # a peer's odd description
                    raise DatasetError(f"cannot open {self.source!r}: {type(e).__name__}: {e}"[:1000]) from e
                if isinstance(index, ArrayIndex):  # its batches are arrays, not images to decode
                    raise DatasetError(f"{self.source.where} holds arrays: a daemon serves encoded images")
                self.result = index
                return
            self.result = scan_image_folder(
                self.path,
                max_files=self._limits.max_files,
                max_bytes=self._max_bytes,
                deadline=self.started_at + self._limits.timeout_s,
                cancel=self._cancel,
            )
        except BaseException as e:  # handed to the serving thread, which replies with it
            self.result = e


class DatasetIndexes:
    """Every index the daemon holds or is making."""

    def __init__(self, limits: IndexLimits, idle_s: float = 60.0) -> None:
        self.limits = limits
        self.idle_s = idle_s
        self._ready: dict[str, IndexEntry] = {}
        self._waiting: deque[tuple[str, Source, int]] = deque()  # (key, source, memory it may use)
        self._scan: _Scan | None = None
        self._cancel = threading.Event()

    @staticmethod
    def key(source: Source) -> str:
        """What identifies a source's index: a folder's real path, else its description."""
        if isinstance(source, ImageFolder):
            return os.path.realpath(source.root)
        return source.resolved().to_json()

    def get(self, key: str) -> IndexEntry | None:
        return self._ready.get(key)

    def pending(self, key: str) -> bool:
        scanning = self._scan is not None and self._scan.path == key
        return scanning or any(p == key for p, _, _ in self._waiting)

    def request(self, key: str, source: Source, max_bytes: int) -> None:
        """Index `source` (known by `key`) in the background, once, however many hellos ask."""
        if key in self._ready or self.pending(key):
            return
        self._waiting.append((key, source, max_bytes))
        self._start_next()

    def _start_next(self) -> None:
        if self._scan is None and self._waiting and not self._cancel.is_set():
            key, source, max_bytes = self._waiting.popleft()
            self._scan = _Scan(key, source, self.limits, max_bytes, self._cancel)
            self._scan.start()

    def scanning(self) -> tuple[str, float] | None:
        """(path, seconds so far) of the scan running now."""
        return None if self._scan is None else (self._scan.path, time.monotonic() - self._scan.started_at)

    def finished(self) -> list[tuple[str, IndexEntry | Exception]]:
        """Scans that ended since the last call: the ready entry, or why there is none."""
        scan = self._scan
        if scan is None or scan.is_alive():
            return []
        self._scan = None
        outcome: IndexEntry | Exception
        result = scan.result
        if result is not None and not isinstance(result, BaseException):
            try:
                outcome = self._add(scan.path, result)
            except Exception as e:  # e.g. no shared memory for it
                outcome = e
            else:
                seconds = time.monotonic() - scan.started_at
                log.info("indexed %s: %d images in %.1f s", scan.source.where, len(result), seconds)
        elif isinstance(result, Exception):
            outcome = result
        else:
            outcome = DatasetError(f"indexing {scan.path} failed: {result!r}")
        self._start_next()
        return [(scan.path, outcome)]

    def _add(self, key: str, index: SampleIndex, pinned: bool = False) -> IndexEntry:
        entry = IndexEntry(key, index, index.to_segment(), pinned=pinned, idle_since=time.monotonic())
        self._ready[key] = entry
        return entry

    def warm(self, path: str, max_bytes: int) -> IndexEntry:
        """Index a folder now, on this thread (at start-up), and keep it for the daemon's life."""
        key = self.key(ImageFolder(path))
        entry = self._ready.get(key)
        if entry is None:
            deadline = time.monotonic() + self.limits.timeout_s
            index = scan_image_folder(
                key,
                max_files=self.limits.max_files,
                max_bytes=max_bytes,
                deadline=deadline,
                cancel=self._cancel,
            )
            entry = self._add(key, index, pinned=True)
        entry.pinned = True
        return entry

    def acquire(self, entry: IndexEntry) -> None:
        entry.users += 1

    def release(self, key: str) -> None:
        entry = self._ready.get(key)
        if entry is not None:
            entry.users = max(0, entry.users - 1)
            if entry.users == 0:
                entry.idle_since = time.monotonic()

    def evict(self, *, all_idle: bool = False) -> int:
        """Drop indexes nobody uses (idle past `idle_s`, or every one with `all_idle`); bytes freed."""
        now, freed = time.monotonic(), 0
        for key, entry in list(self._ready.items()):
            if entry.users or entry.pinned or (not all_idle and now - entry.idle_since < self.idle_s):
                continue
            del self._ready[key]
            entry.segment.close()
            freed += entry.size
            log.info("evicted the index of %s (unused for %.0f s)", key, now - entry.idle_since)
        return freed

    @property
    def memory(self) -> int:
        return sum(e.size for e in self._ready.values())

    def describe(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = [
            {"path": e.path, "images": len(e.index), "bytes": e.size, "sessions": e.users, "state": "ready"}
            for e in self._ready.values()
        ]
        scanning = self.scanning()
        if scanning is not None:
            rows.append({"path": scanning[0], "images": 0, "bytes": 0, "sessions": 0, "state": "indexing"})
        rows += [
            {"path": p, "images": 0, "bytes": 0, "sessions": 0, "state": "queued"}
            for p, _, _ in self._waiting
        ]
        return rows

    def close(self) -> None:
        """Cancel the scan in progress (it stops within a directory), unlink every index."""
        self._cancel.set()
        self._waiting.clear()
        if self._scan is not None:
            self._scan.join(10.0)
            self._scan = None
        for entry in self._ready.values():
            entry.segment.close()
        self._ready.clear()
