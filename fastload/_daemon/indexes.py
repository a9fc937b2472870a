"""The daemon's dataset indexes: opened in child processes, bounded, shared, evicted.

A hello names a source (an image folder, a file list, ...); its index (every sample's place and
target) is made once and shared with the workers through a shared-memory segment. Each source is
opened in a child process (`opener`: several at a time, a deadline, a memory limit, the
allowlist of `confine`), so the daemon keeps serving (and obeys SIGTERM) while a huge tree is
walked, and a file that crashes or hangs its parser fails only its own hellos; an open no hello
waits for any more (their peers gone, or `bye`) is stopped (`cancel`: its child killed, its slot
given to the next), so a peer that leaves holds no opening slot. An index no session uses is
evicted after `idle_s` (`index_idle`), or before that when the memory budget is wanted
for another index or a ring (`evict_for`: the longest idle first, only as many as needed), except
those the configuration warms.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass

from fastload._daemon.confine import Refused, Roots, source_name
from fastload._daemon.opener import Opened, Opener, OpenFailed, Opening, OpenLimits
from fastload._errors import DatasetError
from fastload._labels import label
from fastload._shm import Segment
from fastload._sizes import format_size
from fastload.sources import ImageFolder, Source
from fastload.sources._indexes.sample_index import SampleIndex
from fastload.sources._shared_indexes import SHARED_INDEX_TYPES

log = logging.getLogger("fastload.daemon")

IndexLimits = OpenLimits  # the name the configuration knew it by


@dataclass
class IndexEntry:
    path: str  # the key: a folder's real path, or a source's description
    index: SampleIndex
    segment: Segment
    classes: tuple[str, ...] = ()
    users: int = 0
    pinned: bool = False  # warmed from the configuration: never evicted
    idle_since: float = 0.0

    @property
    def size(self) -> int:
        return self.segment.size


class DatasetIndexes:
    """Every index the daemon holds or is making."""

    def __init__(
        self,
        limits: IndexLimits,
        idle_s: float = 60.0,
        roots: tuple[str, ...] | None = None,
        plugins: tuple[str, ...] = (),
    ) -> None:
        self.limits = limits
        self.idle_s = idle_s
        self.roots = roots
        self._ready: dict[str, IndexEntry] = {}
        # (key, source, memory it may use, confined to the roots)
        self._waiting: deque[tuple[str, Source, int, bool]] = deque()
        self._running: dict[str, Opening] = {}
        self._unstarted: list[tuple[str, Exception]] = []  # opens that failed to start: `finished`
        self._opener = Opener(roots, limits, plugins)
        self._closed = False

    # NOTE [no resolution before the roots]: a folder's index is known by its real path, so that
    # two names of one folder share it. Resolving a peer's path before the allowlist resolved
    # anything it named (`/proc/self/cwd`: the daemon's working directory; an in-root link: its
    # target outside), and the resolution showed in `status`. A confined hello's folder is now
    # checked against the roots first, in the daemon (links followed, nothing read): outside, it
    # is refused there with the public text (`confine.Refused`), and only a path under the roots
    # is ever resolved. The opening child still checks every file the source names.
    def key(self, source: Source, confined: bool = False) -> str:
        """What identifies a source's index: a folder's real path (with a mark when it keeps empty
        classes: the same folder may be refused without), else its description. `confined`: a
        folder outside the roots is refused first (NOTE [no resolution before the roots])."""
        if isinstance(source, ImageFolder):
            if confined and self.roots is not None:
                try:
                    Roots(self.roots).check(source.root, source_name(source), "its root")
                except Refused as e:
                    log.info("refused %s: %s", label(source_name(source)), label(e.detail))
                    raise
            try:
                path = os.path.realpath(source.root)
            except OSError:  # a link it may not read (/proc/1/cwd): its open, in a child, says why
                path = os.path.abspath(source.root)
            return path + (" (allow_empty=True)" if source.allow_empty else "")
        return source.resolved().to_json()

    def get(self, key: str) -> IndexEntry | None:
        return self._ready.get(key)

    def pending(self, key: str) -> bool:
        return key in self._running or any(w[0] == key for w in self._waiting)

    def request(self, key: str, source: Source, max_bytes: int, confined: bool = False) -> None:
        """Index `source` (known by `key`) in a child process, once, however many hellos ask;
        `confined`: only if every file it names is under the roots (`confine`)."""
        if key in self._ready or self.pending(key):
            return
        self._waiting.append((key, source, max_bytes, confined))
        self._start_next()

    def _start_next(self) -> None:
        while len(self._running) < self.limits.parallel and self._waiting and not self._closed:
            key, source, max_bytes, confined = self._waiting.popleft()
            try:
                self._running[key] = self._opener.start(key, source, confined, max_bytes)
            except Exception as e:  # its hellos are answered (`finished`), never left waiting
                log.exception("cannot start opening %s", key)
                public = f"the daemon could not start opening it ({type(e).__name__}; its log says why)"
                self._unstarted.append((key, OpenFailed(f"cannot start opening {key}: {e}", public)))

    def cancel(self, key: str) -> bool:
        """Stop making the index of `key` (every hello waiting for it is gone): its child killed
        and its opening slot given to the next open; False when it was not being made."""
        waiting = [w for w in self._waiting if w[0] == key]
        for w in waiting:
            self._waiting.remove(w)
        opening = self._running.get(key)
        if opening is not None and opening.starting:
            opening = None  # no process to kill yet: it runs to its end (or deadline), unwanted
        if opening is not None:
            del self._running[key]
            opening.close()
            log.info(
                "stopped opening %s after %.1f s: every hello waiting for it is gone",
                opening.name, time.monotonic() - opening.started_at,
            )
            self._start_next()
        return opening is not None or bool(waiting)

    def scanning(self, key: str) -> float | None:
        """Seconds the open of `key` has run, None when it is not running."""
        opening = self._running.get(key)
        return None if opening is None else time.monotonic() - opening.started_at

    def finished(self) -> list[tuple[str, IndexEntry | Exception]]:
        """Opens that ended since the last call: the ready entry, or why there is none."""
        done: list[tuple[str, IndexEntry | Exception]] = list(self._unstarted)
        self._unstarted.clear()
        for key, opening in list(self._running.items()):
            if not opening.poll():
                continue
            del self._running[key]
            done.append((key, self._outcome(key, opening)))
        if done:
            self._start_next()
        return done

    def _outcome(self, key: str, opening: Opening, pinned: bool = False) -> IndexEntry | Exception:
        result = opening.result
        if not isinstance(result, Opened):
            failed = DatasetError(f"indexing {opening.name} failed")  # never the key: a real path
            return result if isinstance(result, Exception) else failed
        try:
            index = SHARED_INDEX_TYPES[result.index_type].from_segment(result.segment, result.root)
            if len(index) != result.count:
                raise DatasetError(f"the index of {opening.name} does not hold the samples it said")
        except Exception as e:  # a bad segment from a child that parsed a hostile file
            result.segment.close()
            return (
                e
                if isinstance(e, DatasetError)
                else DatasetError(f"cannot use the index of {opening.name}: {e}")
            )
        entry = IndexEntry(
            key, index, result.segment, result.classes, pinned=pinned, idle_since=time.monotonic()
        )
        self._ready[key] = entry
        seconds = time.monotonic() - opening.started_at
        log.info("indexed %s: %d images in %.1f s", label(opening.name), len(index), seconds)
        return entry

    def warm(self, path: str, max_bytes: int, confined: bool = False) -> IndexEntry:
        """Index a folder now (at start-up; in a child as any other) and keep it for the daemon's life."""
        source = ImageFolder(path)
        key = self.key(source)
        entry = self._ready.get(key)
        if entry is None:
            opening = self._opener.start(key, source, confined, max_bytes)
            while not opening.poll():
                time.sleep(0.02)
            outcome = self._outcome(key, opening, pinned=True)
            if isinstance(outcome, Exception):
                raise outcome
            entry = outcome
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

    def evict(self) -> int:
        """Drop the indexes no session has used for `idle_s` (pinned ones never); bytes freed."""
        now = time.monotonic()
        return self._drop([e for e in self._idle() if now - e.idle_since >= self.idle_s], "")

    def evict_for(self, need: int, keep: str | None = None) -> int:
        """Free at least `need` bytes by dropping idle indexes, the longest idle first (never
        pinned ones, nor `keep`, an index a session is being opened on); bytes freed (less than
        `need` when not enough is idle)."""
        chosen: list[IndexEntry] = []
        for entry in sorted(self._idle(), key=lambda e: e.idle_since):
            if sum(e.size for e in chosen) >= need:
                break
            if entry.path != keep:
                chosen.append(entry)
        return self._drop(chosen, f"; {format_size(need)} of the memory budget were wanted")

    @property
    def idle_memory(self) -> int:
        """What the indexes `evict_for` may drop take."""
        return self.evictable()

    def evictable(self, keep: str | None = None) -> int:
        """What `evict_for(..., keep)` could free at most."""
        return sum(e.size for e in self._idle() if e.path != keep)

    def _idle(self) -> list[IndexEntry]:
        return [e for e in self._ready.values() if not e.users and not e.pinned]

    def _drop(self, entries: list[IndexEntry], why: str) -> int:
        now, freed = time.monotonic(), 0
        for entry in entries:
            del self._ready[entry.path]
            entry.segment.close()
            freed += entry.size
            unused = now - entry.idle_since
            log.info("evicted the index of %s (unused for %.0f s%s)", label(entry.path), unused, why)
        return freed

    @property
    def memory(self) -> int:
        return sum(e.size for e in self._ready.values())

    def describe(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = [
            {"path": e.path, "images": len(e.index), "bytes": e.size, "sessions": e.users, "state": "ready"}
            for e in self._ready.values()
        ]
        rows += [
            {"path": key, "images": 0, "bytes": 0, "sessions": 0, "state": "indexing"}
            for key in self._running
        ]
        rows += [
            {"path": p, "images": 0, "bytes": 0, "sessions": 0, "state": "queued"} for p, *_ in self._waiting
        ]
        return rows

    def close(self) -> None:
        """Stop every open in progress (its child killed), unlink every index."""
        self._closed = True
        self._waiting.clear()
        for opening in self._running.values():
            opening.close()
        self._running.clear()
        for entry in self._ready.values():
            entry.segment.close()
        self._ready.clear()
