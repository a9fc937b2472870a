"""The job contract: what every job offers the executors (`Job`), the one way a task runs
(`run_task`, in a worker process or in the trainer's own), and what the jobs share — a failure
that names its sample (`failure_of`, `JobFailed`), the base of the jobs of a source fastload reads
itself (`SourceJob`), writing samples into a slot or collating them, and the global random states a
Dataset's own randomness draws from.
"""

from __future__ import annotations

import dataclasses
import random
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from fastload._bad_samples import SkippedSample
from fastload._errors import exception_type_name
from fastload._loading.jobs.executor import Done, Event, Failure, Opaque, Probed, Task
from fastload._loading.slots.layout import BatchLayout, LayoutMismatch
from fastload._machine import run_delay_since, thread_run_delay_ns
from fastload.sources._indexes.sample_index import IndexBase, ReadFailure

T = TypeVar("T")


class JobFailed(Exception):
    """Raised by a job with the `Failure` to report (internal)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


# A failure report stays small whatever the exception says (the engine bounds message sizes).
_MAX_MESSAGE_CHARS = 4096
_MAX_TRACEBACK_CHARS = 32768


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters left out ...]\n{text[-half:]}"


def failure_of(seq: int, exc: BaseException, index: int, path: str, what: str, reason: str = "") -> Failure:
    """The `Failure` event of task `seq` for `exc`, naming the sample (its index, its file's `path`
    if any) and `what` was being loaded, and why (`reason`, else the exception's type and text),
    with the traceback; every text bounded in size."""
    where = f"{what} {path}" if path else f"{what} at index {index}"
    why = reason or f"{type(exc).__name__}: {exc}"
    return Failure(
        seq=seq,
        message=_clip(f"failed to load {where}: {why}", _MAX_MESSAGE_CHARS),
        path=_clip(path, _MAX_MESSAGE_CHARS),
        index=index,
        exc_type=_clip(type(exc).__name__, 256),
        exc_class=exception_type_name(type(exc)),
        traceback=_clip("".join(traceback.format_exception(exc)), _MAX_TRACEBACK_CHARS),
    )


class SourceJob:
    """What the jobs of a source fastload reads itself share: the source's index, and a batch
    layout known before any sample is loaded (batches always go into slots)."""

    index: IndexBase
    layout: BatchLayout | None

    def worker_dataset(self) -> Any:
        """What `get_worker_info().dataset` is in this job's workers: the source's root (a folder,
        a file)."""
        return self.index.root

    def probe(self, task: Task, in_trainer: bool) -> BatchLayout | None:
        """The layout is known up front (from the transforms, or an array's rows): nothing to load."""
        return self.layout

    def run_opaque(self, task: Task, in_trainer: bool) -> tuple[Any, int, tuple[SkippedSample, ...]]:
        raise TypeError(f"{self.index.root}: a source's batches always go into slots")

    def _read_stage(self, task: Task, what: str, read: Callable[[np.ndarray], T]) -> tuple[T, int, int]:
        """`read(task.indices)` with its CPU and run-queue time (ns); a `ReadFailure` becomes the
        task's failure, naming the sample (`what`, and where it lives)."""
        cpu0 = time.process_time_ns()
        runq0 = thread_run_delay_ns()
        try:
            result = read(task.indices)
        except ReadFailure as e:
            i = int(task.indices[e.position])
            raise JobFailed(failure_of(task.seq, e.cause, i, self.index.name(i), what)) from e.cause
        return result, time.process_time_ns() - cpu0, run_delay_since(runq0)


RngState = tuple[Any, Any, Any]  # torch's, numpy's and random's global random states


def rng_state() -> RngState:
    """The process's global random states (torch CPU, numpy, random), to put back later."""
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def set_rng_state(state: RngState) -> None:
    torch.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


def seed_rng(seed: int) -> None:
    """Seed the global random states a Dataset's own randomness draws from."""
    torch.default_generator.manual_seed(seed)  # CPU only: torch.manual_seed also queues CUDA seeding
    np.random.seed(seed % 2**32)
    random.seed(seed)


def write_samples(
    seq: int,
    samples: Sequence[Any],
    layout: BatchLayout,
    arrays: Sequence[np.ndarray],
    indices: Sequence[int],
    path_of: Callable[[int], str],
) -> None:
    """Write samples into consecutive rows of a slot (`fast_collate`); one that does not match the
    layout fails the task, naming it (`indices`: each sample's index, -1 where there is none)."""
    for row, (i, sample) in enumerate(zip(indices, samples, strict=True)):
        try:
            layout.write(sample, arrays, row)
        except LayoutMismatch as e:
            failure = failure_of(seq, e, i, path_of(i) if i >= 0 else "", "sample")
            which = f"sample {i}" if i >= 0 else f"sample {row} of the batch"
            message = (
                f"{which} does not match the first sample's structure ({e}); "
                "batches need fixed-shape samples unless you pass a collate_fn"
            )
            raise JobFailed(dataclasses.replace(failure, message=message)) from e


def collate_or_fail(
    task: Task, samples: list[Any], collate_fn: Callable[[list[Any]], Any] | None, what: str
) -> Any:
    """`collate_fn` (default_collate) of the samples; its error fails the task."""
    collate = collate_fn or torch.utils.data.default_collate
    try:
        return collate(samples)
    except Exception as e:
        first = int(task.indices[0]) if len(task.indices) else -1
        raise JobFailed(failure_of(task.seq, e, first, "", what)) from e


class Job(Protocol):
    """What every job offers the executors (`ImageJob`, `ArrayJob`, `DatasetJob`)."""

    seed: int
    batch_size: int
    layout: BatchLayout | None  # known before any sample is loaded (a source's), else None

    def probe(self, task: Task, in_trainer: bool) -> BatchLayout | None:
        """The layout the task's (first) sample implies; None: batches take the opaque path."""
        ...

    def run(
        self, task: Task, arrays: Sequence[np.ndarray], layout: BatchLayout, in_trainer: bool
    ) -> Done:
        """Load the task's samples into `arrays` (the slot's, from the task's row on)."""
        ...

    def run_opaque(self, task: Task, in_trainer: bool) -> tuple[Any, int, tuple[SkippedSample, ...]]:
        """Load and collate the task's samples into a batch object: (batch, samples in it, the
        broken samples stand-ins took the place of)."""
        ...

    def worker_dataset(self) -> Any:
        """What `torch.utils.data.get_worker_info().dataset` is in a worker of this job."""
        ...

    def close(self) -> None:
        """Let go of what the job holds (a daemon job's shared index)."""
        ...


def run_task(
    job: Job, task: Task, layout: BatchLayout | None, slot_buffer: Callable[[str], Any], in_trainer: bool
) -> Event:
    """Run one task of `job` (a probe, an opaque batch or a slot batch, see `executor`) and return
    its event; `slot_buffer(name)` is the slot's memory. The one way tasks run, in a worker
    process and in the trainer's own (`in_trainer`) alike."""
    try:
        if task.probe:
            return Probed(task.seq, job.probe(task, in_trainer))
        if not task.slot_name:
            started = time.perf_counter_ns()
            batch, count, skipped = job.run_opaque(task, in_trainer)
            return Opaque(task.seq, batch, count, time.perf_counter_ns() - started, skipped)
        if layout is None:
            raise RuntimeError(f"task {task.seq} names slot {task.slot_name} before any layout was set")
        arrays = [a[task.row :] for a in layout.arrays(slot_buffer(task.slot_name))]
        try:
            return job.run(task, arrays, layout, in_trainer)
        finally:
            del arrays  # no view of the slot outlives the task
    except JobFailed as e:
        return e.failure
    except Exception as e:  # an unexpected error is still reported, never a silent death
        return failure_of(task.seq, e, int(task.indices[0]) if len(task.indices) else -1, "", "batch")
