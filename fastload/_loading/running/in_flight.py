"""The in-flight window: how many batches one loader keeps submitted and not yet delivered. Its
one owner, and the handle a tuner turns.

It starts where the ring plan puts it (NOTE [what "prefetch" names] in `slots.ring_plan`), is
fitted to the ring once the ring exists, and changes only through `resize`, which clamps to its
bounds and says why it did not take a value:
- at least 1: with none in flight no batch would ever load;
- once a ring exists, at most its slots less `EXTRA_SLOTS`: a batch in flight holds a slot, and
  the extra ones are the batch the user holds and a spare;
- with the local engine, at most `MAX_TASKS_PER_WORKER` x workers: a batch in flight is at least
  one task, and past that, tasks would wait in the engine rather than in a worker.
`set_ring` and `set_workers` move the last two bounds as a tuner resizes the ring and the pool.
The epoch loop (`epoch`) submits while its lanes hold fewer batches than `limit`; it reads the
limit before every submission, so a change applies from the next one: a smaller window submits
nothing until enough batches are delivered, a larger one submits at once. Either way no batch is
dropped or submitted twice: the window only decides when the next one is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastload._errors import ConfigError
from fastload._loading.running.dispatch import MAX_TASKS_PER_WORKER
from fastload._loading.slots.ring_plan import EXTRA_SLOTS


@dataclass(frozen=True)
class Resized:
    """What `InFlightWindow.resize` did: the limit now, and why it is not the one asked for
    ("" when it is)."""

    limit: int
    refused: str = ""


class InFlightWindow:
    """The batches one loader keeps in flight: the limit, its bounds, and `resize`."""

    def __init__(self, limit: int, *, workers: int, engine: bool) -> None:
        """Start at `limit` (`ring_plan`'s derivation); `engine`: tasks run on a local pool of
        `workers` workers, whose per-worker cap bounds the window."""
        self._engine_bound = MAX_TASKS_PER_WORKER * max(1, workers) if engine else None
        self._ring_bound: int | None = None
        self._limit = 1
        self.resize(limit)

    @property
    def limit(self) -> int:
        """Batches submitted and not yet delivered that the epoch loop allows."""
        return self._limit

    @property
    def ceiling(self) -> int | None:
        """The largest limit `resize` takes now (None: no bound but 1 from below)."""
        bounds = [b for b in (self._ring_bound, self._engine_bound) if b is not None]
        return min(bounds) if bounds else None

    def fit_ring(self, slots: int) -> Resized:
        """The ring now has `slots` slots: the window is bounded by what they leave in flight, and
        opens to it (the ring was planned, or a daemon made it, for that many)."""
        self._ring_bound = max(1, slots - EXTRA_SLOTS)
        return self.resize(self._ring_bound)

    def set_ring(self, slots: int) -> Resized:
        """The ring grew or shrank to `slots` slots: the bound follows, the limit is clamped to it
        (never opened: a tuner asks for the limit it wants with `resize`)."""
        self._ring_bound = max(1, slots - EXTRA_SLOTS)
        return self.resize(self._limit)

    def set_workers(self, workers: int) -> Resized:
        """The local pool now has `workers` workers taking tasks: the engine's bound follows
        (`MAX_TASKS_PER_WORKER` x workers) and the limit is clamped to it (never opened)."""
        if self._engine_bound is not None:
            self._engine_bound = MAX_TASKS_PER_WORKER * max(1, workers)
        return self.resize(self._limit)

    def slots_for(self, wanted: int) -> int:
        """The ring slots `wanted` batches in flight need, within every bound but the ring's
        own: what a tuner grows (or shrinks) the ring to before it resizes the window."""
        _check_whole(wanted)
        limit = max(1, wanted)
        if self._engine_bound is not None:
            limit = min(limit, self._engine_bound)
        return limit + EXTRA_SLOTS

    def resize(self, wanted: int) -> Resized:
        """Keep `wanted` batches in flight from the next submission on, clamped to the bounds;
        the result says what was taken and, if not `wanted`, why."""
        _check_whole(wanted)
        limit, refused = wanted, ""
        if wanted < 1:
            limit, refused = 1, f"{wanted} batches in flight would never load one: at least 1"
        elif self._ring_bound is not None and wanted > self._ring_bound:
            limit = self._ring_bound
            refused = (
                f"{wanted} batches in flight need {wanted + EXTRA_SLOTS} ring slots; the ring has "
                f"{self._ring_bound + EXTRA_SLOTS} ({EXTRA_SLOTS} kept for the user's batch and a spare)"
            )
        if self._engine_bound is not None and limit > self._engine_bound:
            limit = self._engine_bound
            refused = (
                f"{wanted} batches in flight are more tasks than the workers may hold "
                f"({MAX_TASKS_PER_WORKER} each, {self._engine_bound} in all)"
            )
        self._limit = limit
        return Resized(limit, refused)

    def __repr__(self) -> str:
        return f"InFlightWindow(limit={self._limit}, ceiling={self.ceiling})"


def _check_whole(wanted: object) -> None:
    if isinstance(wanted, bool) or not isinstance(wanted, int):
        raise ConfigError(f"batches in flight must be a whole number, got {wanted!r}")
