"""One epoch of a loader: its batches submitted in plan order, as many in flight as the
pipeline's `InFlightWindow` allows (its limit read before each submission), their outcomes
reordered into plan order and delivered; and, once all are submitted, the next epoch's first
batches decoded ahead (NOTE [no drain]). It drives a `Pipeline`, which never calls it back.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload._errors import ConfigError
from fastload._loading.jobs.executor import Failure, Opaque
from fastload._loading.running.pipeline import Outcome, Pipeline, deadline_after


@dataclass
class Lane:
    """One epoch's batches on their way: the plan's remaining batches, the tickets in flight and
    the outcomes not yet yielded. An iteration has its own epoch's lane and, once that is all
    submitted, a lane for the next epoch (NOTE [no drain]), which the next iteration takes over."""

    epoch: int
    batches: Iterator[np.ndarray]
    next_batch_index: int = 0
    batch_of_ticket: dict[int, int] = field(default_factory=dict)  # ticket -> batch index
    ready: dict[int, Outcome] = field(default_factory=dict)  # batch index -> outcome
    samples: dict[int, np.ndarray] = field(default_factory=dict)  # batch index -> its sample indices
    exhausted: bool = False  # every batch of the plan submitted (or failed at its probe)


# NOTE [no drain]: a pipeline that stops submitting when an epoch's plan runs out idles its workers
# while the trainer eats the last window's batches, and the next epoch then starts cold (its
# first batch a whole batch-time away). An epoch's plan is known from (seed, epoch), so once this
# epoch's batches are all submitted, free room in the window goes to the next epoch's first
# batches (`following`: the epoch the loader will most likely run next). The next iteration takes
# them over if it runs that epoch from batch 0 (`hand_over`), and otherwise they are cancelled
# and their slots come back. The same keeps a training loader warm while a validation loader
# runs between its epochs: its workers decode ahead, within the same window of slots.


class EpochIterator(Iterator[Any]):
    """Yields one epoch's batches in plan order, starting at batch `start`."""

    def __init__(
        self,
        pipeline: Pipeline,
        batches: Iterator[np.ndarray],
        epoch: int,
        start: int,
        on_yield: Any,
        following: tuple[int, Callable[[], Iterator[np.ndarray]]] | None = None,
        carried: Lane | None = None,
        on_empty: Callable[[int, np.ndarray], None] | None = None,
    ) -> None:
        """`following`: (the epoch the next iteration will most likely run, its batches from the
        start), to decode ahead into; `carried`: the lane a previous iteration decoded ahead for
        this epoch from `start`, taken over instead of `batches`; `on_empty(epoch, batch)`: a
        batch loaded nothing (an iterable stream ended) and was skipped."""
        self._pipeline = pipeline
        self._lane = carried if carried is not None else Lane(epoch, batches, start)
        self._next_yield = start
        self._following = following
        self._ahead: Lane | None = None
        self._active = True
        self._superseded = False  # ended by a newer iter(loader) before it was exhausted
        self._started = False  # it yielded a batch (its first wait is the epoch's start-up)
        self._on_yield = on_yield
        self._on_empty = on_empty

    def _in_window(self) -> int:
        lanes = (self._lane, self._ahead) if self._ahead is not None else (self._lane,)
        return sum(len(lane.batch_of_ticket) + len(lane.ready) for lane in lanes)

    def _fill(self) -> None:
        self._fill_lane(self._lane)
        if self._lane.exhausted and self._following is not None and self._pipeline.runs_ahead:
            if self._ahead is None:
                epoch, batches = self._following
                self._ahead = Lane(epoch, batches())
            self._fill_lane(self._ahead)

    def _fill_lane(self, lane: Lane) -> None:
        """Submit `lane`'s next batches while the window has room and a slot is free."""
        pipe = self._pipeline
        while not lane.exhausted and self._in_window() < pipe.window.limit:
            indices = next(lane.batches, None)
            if indices is None:
                lane.exhausted = True
                return
            failed = pipe.ensure_layout(lane.epoch, lane.next_batch_index, indices)
            if failed is not None:  # its first sample failed while probed: the batch fails, in order
                lane.ready[lane.next_batch_index] = failed
                lane.next_batch_index += 1
                continue
            ticket = pipe.submit(lane.epoch, lane.next_batch_index, indices)
            if ticket is None:
                lane.batches = itertools.chain([indices], lane.batches)
                return
            lane.batch_of_ticket[ticket] = lane.next_batch_index
            lane.samples[lane.next_batch_index] = indices
            lane.next_batch_index += 1

    def _take_outcomes(self) -> None:
        for ticket, outcome in self._pipeline.take_outcomes():
            lane = self._lane if ticket in self._lane.batch_of_ticket else self._ahead
            assert lane is not None
            lane.ready[lane.batch_of_ticket.pop(ticket)] = outcome

    def hand_over(self, epoch: int, start: int) -> Lane | None:
        """End this iteration for a newer one that runs `epoch` from batch `start`: what was
        decoded ahead for it, if that is the epoch it ran ahead into, else None (then cancelled)."""
        ahead, self._ahead = self._ahead, None
        self.supersede()
        if ahead is not None and ahead.epoch == epoch and start == 0:
            return ahead
        if ahead is not None:
            self._drop(ahead)
        return None

    def __next__(self) -> Any:
        if not self._active:
            if self._superseded:
                raise ConfigError(
                    "this iterator was ended by a newer iter() of the same FastLoader: a loader runs "
                    "one epoch at a time; finish (or drop) an iteration before starting another, or "
                    "make a second FastLoader for a second concurrent iteration"
                )
            raise StopIteration
        entered = time.perf_counter()
        try:
            return self._next()
        finally:
            if self._pipeline.closed:  # its ring could not be made, and it closed itself
                self._active = False
            else:
                stats = self._pipeline.stats
                waited = int((time.perf_counter() - entered) * 1e9)
                stats.add("trainer_wait_ns", waited)
                if not self._started and self._active:  # this epoch's first batch (or its error)
                    self._started = True
                    stats.add("epochs", 1)
                    stats.add("epoch_start_wait_ns", waited)
                stats.add("next_calls", 1)
                stats.set("ready_batches", len(self._lane.ready))
                stats.set("in_flight", self._in_window() - len(self._lane.ready))
                if self._pipeline.tuner is not None:
                    self._pipeline.tuner.tick(self._pipeline)

    def _next(self) -> Any:
        pipe = self._pipeline
        deadline = deadline_after(pipe.spec.timeout_s)
        if self._next_yield in self._lane.ready and not pipe.inline:
            # Take in what finished meanwhile (without waiting): it frees slots and keeps the
            # ready-queue figure that iostat shows true even when the trainer never has to wait.
            pipe.poll_once(None, wait_s=0.0)
            self._take_outcomes()
        while True:
            while self._next_yield not in self._lane.ready:
                self._fill()
                lane = self._lane
                if lane.exhausted and not lane.batch_of_ticket and self._next_yield not in lane.ready:
                    self._active = False  # done; what it decoded ahead waits for the next iteration
                    # Its end puts the epoch under way even if it yielded nothing (a stream resumed
                    # at its end): the next iteration runs the next epoch (NOTE [drawn epochs]).
                    self._on_yield(lane.epoch, self._next_yield, None)
                    raise StopIteration
                if pipe.grow_if_starved(len(self._lane.ready)):
                    continue  # a slot is free again: submit into it rather than wait for nothing
                waited = time.perf_counter()
                pipe.poll_once(deadline)
                if self._started:  # not the epoch's first batch (NOTE in `stats`: starved)
                    pipe.stats.add("starved_ns", int((time.perf_counter() - waited) * 1e9))
                self._take_outcomes()
            outcome = self._lane.ready.pop(self._next_yield)
            samples = self._lane.samples.pop(self._next_yield, None)
            self._next_yield += 1
            if isinstance(outcome, Failure) and self._on_empty is not None and samples is not None:
                self._end_stream(samples)  # it cannot be replayed past the failure
            if not _loaded_nothing(outcome):
                break
            pipe.discard(outcome)  # an iterable stream that has ended (NOTE [iterable streams])
            if self._on_empty is not None and samples is not None:
                self._on_empty(self._lane.epoch, samples)
        self._on_yield(self._lane.epoch, self._next_yield, samples)
        self._fill()
        return pipe.deliver(outcome, self._lane.epoch, samples, self._next_yield - 1)

    def _end_stream(self, failed: np.ndarray) -> None:
        """An iterable stream's batch failed (its iterator raised, or it crashed or hung its
        worker three times): the stream ends there, its later batches in flight are cancelled
        and skipped, and the plan asks it for no more."""
        assert self._on_empty is not None
        lane, stream = self._lane, int(failed[0])
        self._on_empty(lane.epoch, failed)
        later = [b for b, batch in lane.samples.items() if int(batch[0]) == stream]
        tickets = [t for t, b in lane.batch_of_ticket.items() if b in later]
        self._pipeline.cancel(tickets)
        for ticket in tickets:
            del lane.batch_of_ticket[ticket]
        for b in later:
            del lane.samples[b]
            dropped = lane.ready.pop(b, None)
            if dropped is not None:
                self._pipeline.discard(dropped)
            lane.ready[b] = _SKIPPED

    def supersede(self) -> None:
        """End this epoch early because a newer iteration starts: a later `next()` says so."""
        if self._active:
            self._superseded = True
        self.stop()

    def stop(self) -> None:
        """End this epoch early: outcomes not yet delivered (and what was decoded ahead for the
        next epoch) give their slots back."""
        if self._ahead is not None:
            self._drop(self._ahead)
            self._ahead = None
        if not self._active:
            return
        self._active = False
        self._drop(self._lane)

    def _drop(self, lane: Lane) -> None:
        self._pipeline.cancel(list(lane.batch_of_ticket))
        lane.batch_of_ticket.clear()
        for outcome in lane.ready.values():
            self._pipeline.discard(outcome)
        lane.ready.clear()
        lane.samples.clear()


_SKIPPED = Opaque(-1, None, 0, 0)  # a cancelled batch of an ended stream: skipped in its turn


def _loaded_nothing(outcome: Any) -> bool:
    """Whether a batch's outcome holds no sample: only an ended iterable stream's does."""
    if isinstance(outcome, tuple):
        return bool(outcome[1] == 0)
    return isinstance(outcome, Opaque) and outcome.count == 0
