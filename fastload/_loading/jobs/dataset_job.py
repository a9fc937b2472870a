"""`DatasetJob`: what a worker does with a task of a map-style torch Dataset — call it for the
task's samples (seeding the global random states per sample, by its row in the batch) and write
them into a slot, or collate them for the slow path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fastload._bad_samples import MAX_ATTEMPTS, SkippedSample, reason_of, replacement
from fastload._batch_counters import BatchCounters
from fastload._loading.jobs.contract import (
    JobFailed,
    collate_or_fail,
    failure_of,
    rng_state,
    seed_rng,
    set_rng_state,
    write_samples,
)
from fastload._loading.jobs.executor import Done, Task
from fastload._loading.order.plan import row_seeds
from fastload._loading.slots.layout import BatchLayout
from fastload._machine import run_delay_since, thread_run_delay_ns


class DatasetJob:
    """Loads batches of a map-style Dataset: fast path into a slot, or collated and pickled.

    The global random state (torch, numpy, random) is seeded before each sample from (seed,
    epoch, batch index, its row in the batch) (`row_seeds`), so random augmentations inside
    `__getitem__` give the same batches for any worker count, however a batch is split into
    parts; in the trainer's process (`num_workers=0`) the caller's random state is restored
    after. A Dataset's `__getitems__` loads a task's samples in one call, under its first row's
    seed: its draws follow how the batch was split (the worker count) unless it seeds per sample.
    """

    layout: BatchLayout | None = None  # known only once a sample is probed

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[list[Any]], Any] | None,
        seed: int,
        batch_size: int,
        on_error: str = "raise",
        keep: np.ndarray | None = None,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.seed = seed
        self.batch_size = batch_size
        self.on_error = on_error  # NOTE [bad samples]
        self.keep = keep  # as ImageJob's

    def worker_dataset(self) -> Any:
        """What `get_worker_info().dataset` is in this job's workers: their copy of the Dataset."""
        return self.dataset

    def close(self) -> None:
        """Nothing to let go of."""

    def _path_of(self, index: int) -> str:
        samples = getattr(self.dataset, "samples", None)
        try:
            return str(samples[index][0]) if samples is not None else ""
        except Exception:
            return ""

    def _fetch(
        self,
        task: Task,
        indices: np.ndarray,
        restore_rng: bool,
        skipped: list[SkippedSample] | None = None,
    ) -> list[Any]:
        """The samples; with on_error="skip" (and `skipped` to record them), a sample that raises
        gets a stand-in (NOTE [bad samples]), and `__getitems__` is not used (it names no sample)."""
        states = rng_state() if restore_rng else None
        seeds = row_seeds(self.seed, task.epoch, task.batch_index, task.row, len(indices))
        skipping = self.on_error == "skip" and skipped is not None
        try:
            getitems = getattr(self.dataset, "__getitems__", None)
            if callable(getitems) and not skipping:
                seed_rng(seeds[0])
                try:
                    return list(getitems([int(i) for i in indices]))
                except Exception as e:
                    raise JobFailed(failure_of(task.seq, e, int(indices[0]), "", "samples starting")) from e
            record = skipped if skipping else None
            loaded = []
            for row, i in enumerate(indices):
                seed_rng(seeds[row])  # per sample: the same draws whichever part loads it
                loaded.append(self._sample(task, row, int(i), record))
            return loaded
        finally:
            if states is not None:
                set_rng_state(states)

    def _sample(self, task: Task, row: int, index: int, skipped: list[SkippedSample] | None) -> Any:
        """Sample `index`, or (recording it in `skipped`) a stand-in's when it raises."""
        i = index
        for attempt in range(MAX_ATTEMPTS + 1):
            try:
                return self.dataset[i]
            except Exception as e:
                failure = failure_of(task.seq, e, i, self._path_of(i), "sample")
                if skipped is None or attempt == MAX_ATTEMPTS:
                    raise JobFailed(failure) from e
                stand_in = replacement(self.seed, task.epoch, index, attempt, len(self.dataset), self.keep)
                skipped.append(SkippedSample(i, self._path_of(i), reason_of(e), task.row + row, stand_in))
                i = stand_in
        raise AssertionError("unreachable")

    def probe(self, task: Task, in_trainer: bool) -> BatchLayout | None:
        """Load the task's sample and return its layout, or None when batches must take the slow path."""
        if self.collate_fn is not None:
            return None
        (sample,) = self._fetch(task, task.indices[:1], in_trainer, [])  # a stand-in's, if it is broken
        return BatchLayout.infer(sample, self.batch_size)

    def run(self, task: Task, arrays: Sequence[np.ndarray], layout: BatchLayout, in_trainer: bool) -> Done:
        seq, indices = task.seq, task.indices
        cpu0 = time.process_time_ns()
        runq0 = thread_run_delay_ns()
        t0 = time.perf_counter_ns()
        skipped: list[SkippedSample] = []
        samples = self._fetch(task, indices, in_trainer, skipped)
        t1 = time.perf_counter_ns()
        read_cpu = time.process_time_ns() - cpu0
        read_runq = run_delay_since(runq0)
        write_samples(seq, samples, layout, arrays, [int(i) for i in indices], self._path_of)
        decode_ns = time.perf_counter_ns() - t1
        counters = BatchCounters(
            samples=len(indices), read_ns=t1 - t0, decode_ns=decode_ns, read_cpu_ns=read_cpu,
            read_runq_ns=read_runq,
        )
        return Done(seq, counters, skipped=tuple(skipped))

    def run_opaque(self, task: Task, in_trainer: bool) -> tuple[Any, int, tuple[SkippedSample, ...]]:
        """Load and collate a batch that cannot live in a slot (the documented slow path)."""
        skipped: list[SkippedSample] = []
        samples = self._fetch(task, task.indices, in_trainer, skipped)
        batch = collate_or_fail(task, samples, self.collate_fn, "the batch starting")
        return batch, len(samples), tuple(skipped)
