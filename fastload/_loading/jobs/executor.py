"""The executor contract: what a pipeline hands out (tasks), what it gets back (events), and the
interface every executor keeps, whether it runs tasks on a pool of worker processes (`Engine`),
in the trainer's own process (`InlineExecutor`) or on a loader daemon's pool (`DaemonSession`).

A task asks for one of three things, by its fields: a probe (`probe=True`: load one sample and
say the batch layout it implies), an opaque batch (`slot_name == ""`: collate and return the
batch itself), or a slot batch (write the batch into the ring slot `slot_name`, from row `row`).
Each submitted task yields exactly one event with its `seq`: `Probed`, `Opaque`, `Done` or
`Failure` (a `Failure` with seq < 0 is a worker that could not start). Executors never call back
into the pipeline: events are only returned from `poll`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np

from fastload._bad_samples import SkippedSample
from fastload._batch_counters import BatchCounters
from fastload._errors import DaemonError, WorkerError, sample_error

if TYPE_CHECKING:  # not at run time: layout imports torch, which `fastload status` must not pay
    from fastload._loading.slots.layout import BatchLayout
    from fastload._loading.slots.ring import Ring

__all__ = [
    "Done", "Event", "Executor", "Failure", "Opaque", "Probed", "RemoteExecutor", "Task", "raise_failure",
]


@dataclass
class Task:
    """One unit of work: a batch into a slot, a batch to collate opaquely, or a probe."""

    seq: int
    epoch: int
    batch_index: int
    indices: np.ndarray
    slot_name: str  # "" for opaque batches and probes
    probe: bool = False
    job_id: int = 0
    row: int = 0  # first row of the slot's batch this task writes (a batch split across workers)
    worker: int | None = None  # the only worker (by id) that may run it (NOTE [iterable streams])
    # Supervision's bookkeeping (`Engine`, NOTE [blame] in `supervision`):
    strikes: int = 0  # deaths it caused (crashes alone on a worker, or hangs)
    hangs: int = 0
    suspect: bool = False  # lost with a crashed worker among others: runs alone until it completes


@dataclass(frozen=True)
class Done:
    """Slot batch `seq` is written; its counters (`_batch_counters`) feed the loader's statistics."""

    seq: int
    counters: BatchCounters
    # Samples that could not be loaded and were replaced (on_error="skip": NOTE [bad samples]).
    skipped: tuple[SkippedSample, ...] = ()

    @property
    def count(self) -> int:
        """The samples written into the slot."""
        return self.counters.samples


@dataclass(frozen=True)
class Failure:
    """Task `seq` failed: which sample, which file, and the worker's traceback.

    `exc_type` is the exception's class name ("KeyError"), `exc_class` its "module:qualname"
    ("builtins:KeyError"; "" when unknown), which the trainer re-raises it as (`_errors`).
    """

    seq: int
    message: str
    path: str
    index: int
    exc_type: str
    traceback: str
    exc_class: str = ""


def raise_failure(failure: Failure) -> NoReturn:
    """Raise the trainer-side error for a worker's Failure: a SampleError, of the sample's own
    exception class too where it can be (NOTE [original exception types] in `_errors`)."""
    if failure.seq < 0:
        raise WorkerError(f"a worker could not start: {failure.message}\n{failure.traceback}")
    if failure.exc_type == WorkerError.__name__:  # the task kept killing workers (see `running.supervision`)
        raise WorkerError(failure.message)
    if failure.exc_type == DaemonError.__name__:  # a draining daemon refused the task
        raise DaemonError(failure.message)
    raise sample_error(
        failure.message,
        path=failure.path,
        index=failure.index,
        exc_type=failure.exc_type,
        worker_traceback=failure.traceback,
        original=failure.exc_class,
    )


@dataclass(frozen=True)
class Probed:
    """The layout a probed sample implies (None: batches must take the opaque path)."""

    seq: int
    layout: BatchLayout | None


@dataclass(frozen=True)
class Opaque:
    """A finished batch returned as an object: collated in a worker (a Dataset's slow path), or
    decoded in the trainer's process (`DaliExecutor`). `count` samples, `load_ns` the time its
    making took: the loader's statistics count them as they count slot batches."""

    seq: int
    batch: Any
    count: int = 0
    load_ns: int = 0
    skipped: tuple[SkippedSample, ...] = ()  # as Done's


Event = Done | Failure | Probed | Opaque


class Executor(Protocol):
    """Runs a pipeline's tasks; `tests/test_executors.py` holds every implementation to this."""

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes this executor started (none: empty)."""
        ...

    @property
    def in_flight(self) -> int:
        """Tasks submitted whose event has not been returned by `poll` yet."""
        ...

    def set_layout(self, layout: BatchLayout, job_id: int = 0) -> None:
        """The layout of a job's slot batches, once known (probed); before any slot task."""
        ...

    def submit(self, task: Task) -> None:
        """Queue one task; never blocks, never raises for a dead worker (it is rerun)."""
        ...

    def poll(self, timeout_s: float) -> list[Event]:
        """Events of finished tasks, waiting up to `timeout_s` for the first one."""
        ...

    def close(self) -> None:
        """Stop all work and free what the executor holds; safe to call twice."""
        ...


class RemoteExecutor(Executor, Protocol):
    """An executor whose pool, batch layout and ring are another process's (a loader daemon's
    session): the pipeline attaches the ring rather than making one."""

    @property
    def workers(self) -> int:
        """The size of the pool that runs the tasks."""
        ...

    @property
    def layout(self) -> BatchLayout:
        """The layout of every slot batch, fixed by the other process."""
        ...

    def attach_ring(self) -> Ring:
        """The ring the batches are written into."""
        ...
