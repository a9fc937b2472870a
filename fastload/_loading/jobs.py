"""What a worker does with one task: load its samples and write them into a slot's arrays.

`ImageJob` reads image files and decodes+augments them with a backend; `DatasetJob` calls a
map-style torch Dataset. Both keep the `Job` interface, and `run_task` runs any task of either
the same way in a worker process or, with `num_workers=0`, in the trainer's own process (then
`in_trainer`: the caller's random state is restored afterwards). Errors come back as `Failure`s
naming the sample and its file.
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

from fastload._augment.program import SampleProgram
from fastload._errors import exception_type_name
from fastload._loading.backends import SampleFailure, make_backend
from fastload._loading.executor import Done, Event, Failure, Opaque, Probed, Task
from fastload._loading.host_normalize import HostNormalizer
from fastload._loading.layout import BatchLayout, LayoutMismatch
from fastload._loading.plan import batch_seed
from fastload._loading.sample_random import PIXELS_STREAM, TENSOR_STREAM, sample_randoms
from fastload._loading.shm import Segment
from fastload._machine import run_delay_since, thread_run_delay_ns
from fastload.sources._index import (
    SHARED_INDEX_TYPES,
    IndexBase,
    PathIndex,
    ReadBuffer,
    ReadFailure,
    SampleIndex,
    target_row,
)
from fastload.transforms import TransformPlan, compile_transforms, from_config, to_config

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


def failure_of(seq: int, exc: BaseException, index: int, path: str, what: str) -> Failure:
    """The `Failure` event of task `seq` for `exc`, naming the sample (its index, its file's `path`
    if any) and `what` was being loaded, with the traceback; every text bounded in size."""
    where = f"{what} {path}" if path else f"{what} at index {index}"
    return Failure(
        seq=seq,
        message=_clip(f"failed to load {where}: {type(exc).__name__}: {exc}", _MAX_MESSAGE_CHARS),
        path=_clip(path, _MAX_MESSAGE_CHARS),
        index=index,
        exc_type=_clip(type(exc).__name__, 256),
        exc_class=exception_type_name(type(exc)),
        traceback=_clip("".join(traceback.format_exception(exc)), _MAX_TRACEBACK_CHARS),
    )


# NOTE [float slots]: CPU batches with normalize would have the trainer's thread normalize each
# batch and run RandomErasing on it (~7 ms a batch of 64 at 224x224), on the thread that should
# be training. Instead a job given `normalize` keeps its images in the slot as float32 (H, W, 3):
# a worker decodes and runs the pixel stage on uint8 rows of its own scratch, normalizes them into
# its rows of the slot (the native one-pass table, or torch: bit-identical, `HostNormalizer.into`)
# and runs the tensor stage (RandomErasing) on them, its draws keyed by (seed, epoch, index) from
# TENSOR_STREAM as the trainer's were, so batches are bit-identical to the trainer-side path. The
# trainer returns views over the slot and runs only the batch stage (MixUp/CutMix) in place there.
# Slots are 4x larger; `ring.default_prefetch` sizes the ring from their bytes.


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

    def run_opaque(self, task: Task, in_trainer: bool) -> tuple[Any, int]:
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


class ImageJob(SourceJob):
    """Loads batches of encoded images from a source (`SampleIndex`: a folder, a file list, tar
    shards, a packed file): read a batch's bytes, decode + crop + flip into NHWC uint8, then the
    pixel stage (colour, policies) in place when `plan` has one (NOTE [transform stages]), labels.
    With `normalize` (mean, std), the images are normalized into float32 slots and the tensor stage
    runs here too (NOTE [float slots])."""

    def __init__(
        self,
        index: SampleIndex,
        plan: TransformPlan,
        backend: str,
        seed: int,
        batch_size: int,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> None:
        self.index: SampleIndex = index
        self.plan = plan
        self.backend_name = backend
        self.seed = seed
        self.batch_size = batch_size
        self.normalize = (
            (tuple(float(v) for v in normalize[0]), tuple(float(v) for v in normalize[1]))
            if normalize is not None
            else None
        )
        dtype = np.float32 if self.normalize is not None else np.uint8
        image = np.zeros((plan.out_height, plan.out_width, 3), dtype)
        self.layout = BatchLayout.infer([image, target_row(index.labels)], batch_size)
        self._backend = make_backend(backend, plan)
        self._pixels = SampleProgram(plan.pixels, PIXELS_STREAM)
        # The tensor stage needs normalized images: it runs here only on the images normalized here.
        self._tensor = SampleProgram(plan.tensor if self.normalize is not None else (), TENSOR_STREAM)
        self._normalizer: HostNormalizer | None = None  # made where the job runs (it holds a module)
        self._scratch: np.ndarray | None = None  # uint8 rows to decode into, before normalizing
        self._read_buffer = ReadBuffer()  # NOTE [read buffer]
        self._index_segment: Segment | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_normalizer"], state["_scratch"] = None, None  # made anew where the job runs
        return state

    def _normalize_into(self, pixels: np.ndarray, images: np.ndarray) -> None:
        if self._normalizer is None:
            assert self.normalize is not None
            mean = torch.tensor(self.normalize[0], dtype=torch.float32).view(1, -1, 1, 1)
            std = torch.tensor(self.normalize[1], dtype=torch.float32).view(1, -1, 1, 1)
            self._normalizer = HostNormalizer(1.0 / (255.0 * std), -mean / std)  # as ImageOutput.affine
        self._normalizer.into(pixels, images)

    def _uint8_rows(self, n: int) -> np.ndarray:
        if self._scratch is None:
            shape = (self.batch_size, self.plan.out_height, self.plan.out_width, 3)
            self._scratch = np.empty(shape, np.uint8)
        return self._scratch[:n]

    def to_config(self, index_segment: str) -> dict[str, Any]:
        """This job as JSON-able data, its index living in the named shared segment."""
        index_type = next(k for k, t in SHARED_INDEX_TYPES.items() if isinstance(self.index, t))
        return {
            "index_segment": index_segment,
            "index_type": index_type,
            "transforms": to_config(self.plan.transforms),
            "backend": self.backend_name,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "normalize": [list(v) for v in self.normalize] if self.normalize is not None else None,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ImageJob:
        """Rebuild a job from `to_config` data (in a daemon's worker): attach the shared index."""
        segment = Segment.attach(str(config["index_segment"]))
        plan = compile_transforms(from_config(config["transforms"]))
        index_type = SHARED_INDEX_TYPES[str(config.get("index_type", "paths"))]
        job = cls(
            index_type.from_segment(segment),
            plan,
            str(config["backend"]),
            int(config["seed"]),
            int(config["batch_size"]),
            normalize=config.get("normalize"),
        )
        job._index_segment = segment
        return job

    def close(self) -> None:
        """Let go of the shared index, if this job attached one, and of the files its index opened
        in this process (an HDF5 file's handle)."""
        close_files = getattr(self.index, "close", None)
        if callable(close_files):
            close_files()
        if self._index_segment is not None:
            empty = np.empty(0, np.int64)
            self.index = PathIndex("", (), np.empty(0, np.uint8), np.zeros(1, np.int64), empty)
            self._index_segment.close()
            self._index_segment = None

    def run(self, task: Task, arrays: Sequence[np.ndarray], layout: BatchLayout, in_trainer: bool) -> Done:
        seq, epoch, indices = task.seq, task.epoch, task.indices
        n = len(indices)
        images, labels = arrays
        t0 = time.perf_counter_ns()
        buffer = self._read_buffer
        buffer.start()  # the previous task's views died with it
        blobs, read_cpu, read_runq = self._read_stage(task, "image", lambda i: self.index.read(i, buffer))
        t1 = time.perf_counter_ns()
        rngs = sample_randoms(self.seed, epoch, indices)
        pixels = images[:n] if self.normalize is None else self._uint8_rows(n)
        try:
            self._backend.decode_batch(blobs, rngs, pixels)
        except SampleFailure as e:
            cause = e.__cause__ or e
            i = int(indices[e.position])
            raise JobFailed(failure_of(seq, cause, i, self.index.name(i), "image")) from e
        t2 = time.perf_counter_ns()
        self._run_stage(self._pixels, "pixel", pixels, task)
        if self.normalize is not None:
            self._normalize_into(pixels, images[:n])
            self._run_stage(self._tensor, "tensor", images[:n], task)
        labels[:n] = self.index.labels[indices]
        t3 = time.perf_counter_ns()
        return Done(seq, n, t1 - t0, t2 - t1, sum(len(b) for b in blobs), read_cpu, read_runq, t3 - t2)


    def _run_stage(self, stage: SampleProgram, name: str, rows: np.ndarray, task: Task) -> None:
        """Run a stage of the chain in place on the task's rows; a kernel's failure is the task's,
        naming its first sample."""
        if not stage:
            return
        try:
            stage.run_in_slot(rows, self.seed, task.epoch, task.indices)
        except Exception as e:
            what = f"the {name} transforms of the rows starting with image"
            first = int(task.indices[0])
            raise JobFailed(failure_of(task.seq, e, first, self.index.name(first), what)) from e


class DatasetJob:
    """Loads batches of a map-style Dataset: fast path into a slot, or collated and pickled.

    The global random state (torch, numpy, random) is seeded per batch from (seed, epoch, batch
    index), so random augmentations inside `__getitem__` give the same batches for any worker
    count; in the trainer's process (`num_workers=0`) the caller's random state is restored after.
    """

    layout: BatchLayout | None = None  # known only once a sample is probed

    def __init__(
        self, dataset: Any, collate_fn: Callable[[list[Any]], Any] | None, seed: int, batch_size: int
    ) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.seed = seed
        self.batch_size = batch_size

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
        self, seq: int, epoch: int, batch_index: int, indices: np.ndarray, restore_rng: bool
    ) -> list[Any]:
        states = rng_state() if restore_rng else None
        seed_rng(batch_seed(self.seed, epoch, batch_index))
        try:
            getitems = getattr(self.dataset, "__getitems__", None)
            if callable(getitems):
                try:
                    return list(getitems([int(i) for i in indices]))
                except Exception as e:
                    raise JobFailed(failure_of(seq, e, int(indices[0]), "", "samples starting")) from e
            samples = []
            for i in indices:
                try:
                    samples.append(self.dataset[int(i)])
                except Exception as e:
                    raise JobFailed(failure_of(seq, e, int(i), self._path_of(int(i)), "sample")) from e
            return samples
        finally:
            if states is not None:
                set_rng_state(states)

    def probe(self, task: Task, in_trainer: bool) -> BatchLayout | None:
        """Load the task's sample and return its layout, or None when batches must take the slow path."""
        if self.collate_fn is not None:
            return None
        (sample,) = self._fetch(task.seq, task.epoch, task.batch_index, task.indices[:1], in_trainer)
        return BatchLayout.infer(sample, self.batch_size)

    def run(self, task: Task, arrays: Sequence[np.ndarray], layout: BatchLayout, in_trainer: bool) -> Done:
        seq, indices = task.seq, task.indices
        cpu0 = time.process_time_ns()
        runq0 = thread_run_delay_ns()
        t0 = time.perf_counter_ns()
        samples = self._fetch(seq, task.epoch, task.batch_index, indices, in_trainer)
        t1 = time.perf_counter_ns()
        read_cpu = time.process_time_ns() - cpu0
        read_runq = run_delay_since(runq0)
        write_samples(seq, samples, layout, arrays, [int(i) for i in indices], self._path_of)
        return Done(seq, len(indices), t1 - t0, time.perf_counter_ns() - t1, 0, read_cpu, read_runq)

    def run_opaque(self, task: Task, in_trainer: bool) -> tuple[Any, int]:
        """Load and collate a batch that cannot live in a slot (the documented slow path)."""
        samples = self._fetch(task.seq, task.epoch, task.batch_index, task.indices, in_trainer)
        return collate_or_fail(task, samples, self.collate_fn, "the batch starting"), len(samples)


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

    def run_opaque(self, task: Task, in_trainer: bool) -> tuple[Any, int]:
        """Load and collate the task's samples into a batch object: (batch, samples in it)."""
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
            batch, count = job.run_opaque(task, in_trainer)
            return Opaque(task.seq, batch, count, time.perf_counter_ns() - started)
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
