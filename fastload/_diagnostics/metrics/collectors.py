"""The collectors a scrape calls: a daemon's (its published status) and a process's loaders'.

A collector reads, at each scrape, only what the loop that produces batches has already
published: a local loader's statistics block (read from /dev/shm as `iostat` reads it), a
daemon's `status()` snapshot (replaced whole by its loop, never computed for the scrape) and its
sessions' trainers' blocks. A scrape takes no lock of the loop's and never waits for it; what a
loader is (dataset, mode, device, pid) is in `fastload_loader_info`.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastload._diagnostics.metrics.daemon_series import add_daemon
from fastload._diagnostics.metrics.families import Families
from fastload._diagnostics.metrics.loader_series import add_loader
from fastload._diagnostics.metrics.windows import RateWindows
from fastload._labels import label
from fastload._loading.running.stats import LoaderStats, find_loaders, read_block
from fastload._machine import SHM_DIR

if TYPE_CHECKING:
    from prometheus_client.core import Metric


def session_trainers(sessions: list[Mapping[str, Any]]) -> dict[int, LoaderStats]:
    """Each local session's trainer's statistics block: the one block of that pid attached to a
    daemon for that dataset (a trainer with two such loaders on one dataset is left out: which is
    which cannot be told)."""
    by_owner: dict[tuple[int, str], list[LoaderStats]] = {}
    for stats in find_loaders().values():
        if stats.mode == "daemon":
            by_owner.setdefault((stats.pid, stats.dataset), []).append(stats)
    found = {}
    for row in sessions:
        blocks = by_owner.get((row["pid"], row["dataset"]), [])
        if len(blocks) == 1:
            found[row["session"]] = blocks[0]
    return found


class DaemonCollector:
    """Reads `published()`, a daemon's latest status snapshot (None before the first)."""

    def __init__(self, published: Callable[[], Mapping[str, Any] | None]) -> None:
        self._published = published
        self._windows = RateWindows()
        self._lock = threading.Lock()  # the collector's own state, between concurrent scrapes

    def collect(self) -> Iterator[Metric]:
        status = self._published()
        if status is None:
            return iter(())
        f = Families()
        with self._lock:
            add_daemon(f, status, session_trainers(status["sessions"]), self._windows)
        return iter(f)



@dataclass
class ExportedLoader:
    loader: weakref.ref[Any]
    number: int
    rank: int


class LoaderCollector:
    """The loaders of this process that export on one address."""

    def __init__(self) -> None:
        self._loaders: list[ExportedLoader] = []
        self._windows = RateWindows()
        self._lock = threading.Lock()
        self._numbers = 0

    def add(self, loader: Any, rank: int) -> ExportedLoader:
        with self._lock:
            entry = ExportedLoader(weakref.ref(loader), self._numbers, rank)
            self._numbers += 1
            self._loaders.append(entry)
            return entry

    def remove(self, entry: ExportedLoader) -> bool:
        """Forget a loader; True when none is left."""
        with self._lock:
            self._loaders = [e for e in self._loaders if e is not entry and e.loader() is not None]
            return not self._loaders

    def collect(self) -> Iterator[Metric]:
        f = Families()
        with self._lock:
            for entry in self._loaders:
                stats = _loader_stats(entry.loader())
                if stats is None:
                    continue
                labels = {"rank": str(entry.rank), "loader": str(entry.number)}
                f.gauge(
                    "fastload_loader_info",
                    "A loader: its dataset, mode and device (value 1).",
                    {
                        **labels,
                        "dataset": label(stats.dataset),
                        "mode": stats.mode,
                        "device": stats.device,
                        "pid": str(stats.pid),
                        "workers": str(stats.num_workers),
                    },
                    1.0,
                )
                add_loader(f, labels, stats, self._windows.rates(f"loader {entry.number}", stats))
        return iter(f)


def _loader_stats(loader: Any) -> LoaderStats | None:
    """A loader's counters, read from its block's file (its pipeline may close meanwhile: then the
    last snapshot it kept), never from its mapping."""
    if loader is None:
        return None
    pipeline = loader._runs.pipeline
    if pipeline is not None and not pipeline.closed:
        stats = read_block(os.path.join(SHM_DIR, pipeline.stats.segment.name))
        if stats is not None:
            return stats
    last: LoaderStats | None = loader._runs.last_stats
    return last
