"""A loader's iterations over time: the pipeline they run on (kept across epochs with persistent
workers, a fresh one per epoch without), each iteration's `EpochIterator` and the read-ahead of a
remote source's epoch, and the counters the pipeline left when it closed. `FastLoader` holds one;
which epoch and batch an iteration runs is the loader's `Position`, not this.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator

import numpy as np

from fastload._loading.jobs.iterable import IterablePlan
from fastload._loading.order.plan import OwnOrder
from fastload._loading.order.read_ahead import ReadAhead, read_ahead
from fastload._loading.running.epoch import EpochIterator, Lane
from fastload._loading.running.pipeline import Pipeline
from fastload._loading.running.stats import LoaderStats, format_summary
from fastload._loading.settings.position import Plan
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.sample_index import SampleIndex


class Iterations:
    """The pipeline a loader's iterations share, the iteration under way and its read-ahead."""

    def __init__(self, summary: bool) -> None:
        self.summary = summary  # print a per-stage table of the counters when the pipeline closes
        self.pipeline: Pipeline | None = None
        self.iterator: EpochIterator | None = None
        self.last_stats: LoaderStats | None = None  # the pipeline's counters when it closed
        self._read_ahead: ReadAhead | None = None  # of a remote source's epoch (`read_ahead`)

    def prepare(
        self, epoch: int, start: int, persistent: bool, new_pipeline: Callable[[], Pipeline]
    ) -> Lane | None:
        """End the iteration under way and make sure a pipeline runs for one of (`epoch`, from
        batch `start`): the one there, or a new one from `new_pipeline`. Returns what the ended
        iteration decoded ahead for that epoch from that batch (None: nothing to take over)."""
        carried = None
        if self.iterator is not None:
            # Its next() now says why it ended (never a silent stop); what it decoded ahead for
            # this epoch is taken over (NOTE [no drain] in `epoch`).
            carried = self.iterator.hand_over(epoch, start)
        if self.pipeline is not None and self.pipeline.closed:
            self.pipeline, carried = None, None  # its ring could not be made: it closed itself
        if self.pipeline is not None and not persistent:
            # DataLoader without persistent_workers starts fresh workers every epoch, so changes
            # made to the dataset in the trainer's process reach the next epoch's workers.
            self.pipeline.close()
            self.pipeline, carried = None, None
        if self.pipeline is None:
            self.pipeline = new_pipeline()
        return carried

    def iterate(
        self,
        plan: Plan,
        epoch: int,
        start: int,
        index: SampleIndex | ArrayIndex | None,
        persistent: bool,
        carried: Lane | None,
        on_yield: Callable[[int, int], None],
    ) -> EpochIterator:
        """The iteration of (`epoch`, from batch `start`) of `plan` on the prepared pipeline, with
        a read-ahead of `index`'s data where it is remote; `on_yield(epoch, yielded)` after each
        batch it yields."""
        assert self.pipeline is not None
        if self._read_ahead is not None:
            self._read_ahead.stop()
        self._read_ahead = read_ahead(index, plan.iter_batches(epoch, start))

        def after_yield(epoch: int, yielded: int, batch: np.ndarray | None) -> None:
            on_yield(epoch, yielded)
            self._delivered(plan, epoch, batch)

        self.iterator = EpochIterator(
            self.pipeline, plan.iter_batches(epoch, start), epoch, start, after_yield,
            following=_following(plan, epoch, persistent), carried=carried,
            on_empty=plan.ended if isinstance(plan, IterablePlan) else None,
        )
        return self.iterator

    def _delivered(self, plan: Plan, epoch: int, batch: np.ndarray | None) -> None:
        """A batch of `plan`'s `epoch` was yielded (`batch`: its samples, or an iterable stream's
        position): the read-ahead moves on and counts what it fetched; a stream's position is kept."""
        if self._read_ahead is not None:
            fetched = self._read_ahead.delivered()
            if fetched and self.pipeline is not None:
                self.pipeline.stats.add("net_bytes", fetched)
        if isinstance(plan, IterablePlan) and batch is not None:
            plan.delivered(epoch, batch)

    def stats(self) -> LoaderStats | None:
        """The live pipeline's counters, else the last it left (None before the first iteration)."""
        if self.pipeline is not None and not self.pipeline.closed:
            return self.pipeline.stats.snapshot()
        return self.last_stats

    def worker_pids(self) -> list[int]:
        """Process ids of the pipeline's live workers (none before the first iteration)."""
        return self.pipeline.worker_pids if self.pipeline is not None else []

    def close(self) -> None:
        """Stop the read-ahead, the iteration and the pipeline, keeping its counters (printed as a
        per-stage table to stderr with `summary`)."""
        if self._read_ahead is not None:
            self._read_ahead.stop()
            self._read_ahead = None
        if self.iterator is not None:
            self.iterator.stop()
        if self.pipeline is not None and not self.pipeline.closed:
            self.last_stats = self.pipeline.stats.snapshot()
            if self.summary:
                sys.stderr.write(format_summary(self.last_stats, self.pipeline.stats.last_change))
            self.pipeline.close()
            self.pipeline = None


def _following(
    plan: Plan, epoch: int, persistent: bool
) -> tuple[int, Callable[[], Iterator[np.ndarray]]] | None:
    """The epoch the iteration after this one will most likely run, and its batches: decoded
    ahead while this epoch's tail is consumed. Only a plan of fastload's own (a user's sampler
    may not be iterated ahead of time) with workers that outlive the epoch: this process's
    pool, or a daemon session's window of slots (a draining daemon fails only the tasks it
    refuses, so the epoch under way still ends whole)."""
    if not isinstance(plan, OwnOrder) or not persistent:
        return None
    return epoch + 1, functools.partial(plan.iter_batches, epoch + 1, 0)
