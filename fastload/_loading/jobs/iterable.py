"""IterableDataset with DataLoader's semantics: one stream per worker, batches round-robin.

Each worker w iterates its own copy of the dataset (`get_worker_info()` says which worker it is,
for sharding, as under DataLoader) and makes batches of its stream; the loader yields worker 0's
first batch, worker 1's first, ..., then every worker's second, skipping workers whose stream has
ended: DataLoader's order. With `num_workers=0` the one stream runs in the trainer's process,
where `get_worker_info()` is None.

NOTE [iterable streams]: a task names (stream, k), the k-th batch of one worker's stream, and
the engine sends it to that worker only (`Task.worker`). The worker keeps its stream's iterator
between tasks; a task for a batch the stream already passed (a replacement worker after a crash,
or a resumed epoch) restarts the stream and skips to batch k, which is exact when the dataset
iterates the same way every time from (seed, epoch): the global random state is seeded per
(seed, epoch, stream) when a stream starts and kept per stream between its batches. A stream that
has ended answers with an empty batch, which the loader skips, and stops asking that stream. A
stream whose batch fails (its iterator raised, or it crashed or hung three workers: a replay
would meet the same fault) ends there too: the error is raised in its turn, the stream's later
batches are cancelled, and the other streams go on. A pinned task lost with a crashed worker
runs alone on its replacement before anything else is sent there, so crashes count against it.
Samples whose leaves are fixed-shape go straight into the slot, as a map-style Dataset's do.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload._bad_samples import SkippedSample
from fastload._batch_counters import BatchCounters
from fastload._errors import ConfigError
from fastload._loading.jobs.contract import (
    JobFailed,
    RngState,
    collate_or_fail,
    failure_of,
    rng_state,
    seed_rng,
    set_rng_state,
    write_samples,
)
from fastload._loading.jobs.executor import Done, Task
from fastload._loading.order.plan import batch_seed
from fastload._loading.slots.layout import BatchLayout
from fastload._machine import run_delay_since, thread_run_delay_ns

_STREAM_SEED = 0x17E  # the batch_seed "batch index" slot carries a stream's seed key


class IterablePlan:
    """The order of an IterableDataset's batches: (stream, k) round-robin over the live streams.

    `delivered` and `ended` are told what the loader yielded and which streams ran out; the
    position (`state`) is per stream, since how many batches each stream has is found out only by
    running it.
    """

    def __init__(self, dataset: Any, batch_size: int, drop_last: bool, streams: int) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.streams = streams
        self._ended: dict[int, set[int]] = {}  # epoch -> streams found to have ended
        self._yielded: dict[int, list[int]] = {}  # epoch -> batches yielded per stream
        self._resume: dict[int, list[int]] = {}  # epoch -> per-stream counts to start from

    def __len__(self) -> int:
        if not isinstance(self.dataset, Sized):
            raise TypeError("this IterableDataset has no len()")
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """(stream, k) pairs as int64 arrays, in DataLoader's order; `start` (batches yielded
        already) is honoured through the per-stream counts of `resume_from`."""
        del start
        ended = self._ended[epoch] = set()
        base = self._resume.pop(epoch, [0] * self.streams)
        self._yielded[epoch] = list(base)
        for k in itertools.count(min(base, default=0)):  # no lap of batches all streams passed
            live = [s for s in range(self.streams) if s not in ended]
            if not live:
                return
            for s in live:
                if k >= base[s] and s not in ended:
                    yield np.array([s, k], dtype=np.int64)

    def ended(self, epoch: int, batch: np.ndarray) -> None:
        """Batch (stream, k) came back empty: that stream has ended this epoch."""
        self._ended.setdefault(epoch, set()).add(int(batch[0]))

    def delivered(self, epoch: int, batch: np.ndarray) -> None:
        counts = self._yielded.setdefault(epoch, [0] * self.streams)
        counts[int(batch[0])] = int(batch[1]) + 1

    def state(self, epoch: int) -> list[int]:
        """Batches yielded per stream in `epoch` so far."""
        return list(self._yielded.get(epoch, [0] * self.streams))

    def resume_from(self, epoch: int, counts: list[int]) -> None:
        """Make `epoch`'s next iteration start each stream after the batches `counts` says."""
        if len(counts) != self.streams:  # `resume.check_state` refuses such a state first
            raise ConfigError(f"the state has {len(counts)} streams, this loader {self.streams} workers")
        self._resume[epoch] = [int(c) for c in counts]


@dataclass
class _Stream:
    epoch: int
    iterator: Iterator[Any]
    produced: int = 0  # batches taken from it
    pending: list[Any] = field(default_factory=list)  # a sample taken by the layout probe
    rng: RngState | None = None  # its global random state between batches


class IterableJob:
    """Loads batches of one worker's stream of an IterableDataset (NOTE [iterable streams])."""

    layout: BatchLayout | None = None  # known once a sample is probed

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[list[Any]], Any] | None,
        seed: int,
        batch_size: int,
        drop_last: bool,
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.seed = seed
        self.batch_size = batch_size
        self.drop_last = drop_last
        self._stream: _Stream | None = None

    def worker_dataset(self) -> Any:
        return self.dataset

    def close(self) -> None:
        self._stream = None

    def _samples(self, task: Task, count: int, in_trainer: bool) -> list[Any]:
        """The next `count` samples of batch (stream, k) of the task (fewer at the end)."""
        stream_id, k = int(task.indices[0]), int(task.indices[1])
        caller = rng_state() if in_trainer else None
        try:
            stream = self._stream
            if stream is None or stream.epoch != task.epoch or stream.produced > k:
                seed_rng(batch_seed(self.seed, task.epoch, _STREAM_SEED + stream_id))
                stream = self._stream = _Stream(task.epoch, iter(self.dataset))
            elif stream.rng is not None:
                set_rng_state(stream.rng)
            while stream.produced < k:  # replay up to batch k (NOTE [iterable streams])
                if len(self._take(stream, self.batch_size, task)) < self.batch_size:
                    stream.produced = k + 1  # it ended before batch k: so has every batch after
                    return []
                stream.produced += 1
            samples = self._take(stream, count, task)
            stream.produced += 1
            stream.rng = rng_state()
            if self.drop_last and len(samples) < self.batch_size:
                return []
            return samples
        finally:
            if caller is not None:
                set_rng_state(caller)

    def _take(self, stream: _Stream, count: int, task: Task) -> list[Any]:
        taken, stream.pending = stream.pending[:count], stream.pending[count:]
        try:
            taken.extend(itertools.islice(stream.iterator, count - len(taken)))
        except Exception as e:
            what = f"the samples of batch {task.batch_index}"
            raise JobFailed(failure_of(task.seq, e, -1, "", what)) from e
        return taken

    def probe(self, task: Task, in_trainer: bool) -> BatchLayout | None:
        """The layout of the stream's first sample, which is kept for its first batch."""
        samples = self._samples(task, 1, in_trainer)
        if not samples:
            return None
        assert self._stream is not None
        self._stream.pending = samples
        self._stream.produced -= 1  # the probe took no batch
        return None if self.collate_fn is not None else BatchLayout.infer(samples[0], self.batch_size)

    def run(self, task: Task, arrays: Any, layout: BatchLayout, in_trainer: bool) -> Done:
        cpu0, runq0 = time.process_time_ns(), thread_run_delay_ns()
        t0 = time.perf_counter_ns()
        samples = self._samples(task, self.batch_size, in_trainer)
        t1 = time.perf_counter_ns()
        read_cpu, read_runq = time.process_time_ns() - cpu0, run_delay_since(runq0)
        write_samples(task.seq, samples, layout, arrays, [-1] * len(samples), str)
        counters = BatchCounters(
            samples=len(samples), read_ns=t1 - t0, decode_ns=time.perf_counter_ns() - t1,
            read_cpu_ns=read_cpu, read_runq_ns=read_runq,
        )
        return Done(task.seq, counters)

    def run_opaque(self, task: Task, in_trainer: bool) -> tuple[Any, int, tuple[SkippedSample, ...]]:
        samples = self._samples(task, self.batch_size, in_trainer)
        if not samples:
            return None, 0, ()  # the stream has ended
        return collate_or_fail(task, samples, self.collate_fn, f"batch {task.batch_index}"), len(samples), ()
