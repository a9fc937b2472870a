"""`ArrayJob`: batches of a fixed-shape array source (`ArrayIndex`), `[rows, targets]`, written
straight into a slot as stored: no decoding, no transforms, no per-row Python on the way.

The index reads a batch's rows into the slot's rows in batch order (`read_into`: a gather from a
memory map, or from a decoded copy, or one sorted selection; see `sources._formats.hdf5`); the targets
come from the index's in-memory labels. Batches depend only on the plan's indices, so they are the
same for every worker count and resume as every source does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from fastload._batch_counters import BatchCounters
from fastload._loading.jobs.contract import SourceJob
from fastload._loading.jobs.executor import Done, Task
from fastload._loading.slots.layout import BatchLayout
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.sample_index import target_row


class ArrayJob(SourceJob):
    """Loads batches of an array source's rows and targets into slots (the `Job` interface)."""

    def __init__(self, index: ArrayIndex, seed: int, batch_size: int) -> None:
        self.index: ArrayIndex = index
        self.seed = seed
        self.batch_size = batch_size
        row = np.zeros(index.row_shape, index.row_dtype)
        self.layout: BatchLayout | None = BatchLayout.infer([row, target_row(index.labels)], batch_size)

    def run(self, task: Task, arrays: Sequence[np.ndarray], layout: BatchLayout, in_trainer: bool) -> Done:
        indices = task.indices
        n = len(indices)
        rows, labels = arrays
        t0 = time.perf_counter_ns()
        bytes_read, read_cpu, read_runq = self._read_stage(
            task, "row", lambda i: self.index.read_into(i, rows[:n])
        )
        t1 = time.perf_counter_ns()
        labels[:n] = self.index.labels[indices]
        counters = BatchCounters(
            samples=n, read_ns=t1 - t0, decode_ns=time.perf_counter_ns() - t1, bytes_read=bytes_read,
            read_cpu_ns=read_cpu, read_runq_ns=read_runq,
        )
        return Done(task.seq, counters)

    def close(self) -> None:
        """Close what this process opened to read (the trainer's, with num_workers=0)."""
        self.index.close()
