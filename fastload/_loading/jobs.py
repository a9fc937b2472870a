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
from fastload._bad_samples import MAX_ATTEMPTS, SkippedSample, reason_of, replacement
from fastload._errors import exception_type_name
from fastload._loading.backends import SampleFailure, make_backend
from fastload._loading.executor import Done, Event, Failure, Opaque, Probed, Task
from fastload._loading.host_normalize import HostNormalizer
from fastload._loading.layout import BatchLayout, LayoutMismatch
from fastload._loading.plan import batch_seed
from fastload._machine import run_delay_since, thread_run_delay_ns
from fastload._sample_random import PIXELS_STREAM, TENSOR_STREAM, sample_randoms
from fastload._shm import Segment
from fastload.sources._indexes.sample_index import (
    SHARED_INDEX_TYPES,
    IndexBase,
    PathIndex,
    ReadBuffer,
    ReadFailure,
    SampleIndex,
    target_row,
)
from fastload.sources._storage.beneath import Beneath
from fastload.sources._storage.node_cache import READS as REMOTE_READS
from fastload.transforms import TransformPlan, compile_transforms, from_config, to_config

T = TypeVar("T")


class _Broken(Exception):
    """Sample `position` of an attempt could not be read or decoded (`cause`); `reason`: why, in
    words, where the decoder's backend said (`undecodable`), else "" (the cause says)."""

    def __init__(self, position: int, cause: BaseException, what: str, reason: str = "") -> None:
        super().__init__(reason or str(cause))
        self.position, self.cause, self.what, self.reason = position, cause, what, reason


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
        on_error: str = "raise",
        keep: np.ndarray | None = None,
    ) -> None:
        self.index: SampleIndex = index
        self.on_error = on_error  # NOTE [bad samples]
        self.keep = keep  # the samples stand-ins are drawn from (an `exclude=` list's rest), else all
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

    def to_config(self, index_segment: str, roots: tuple[str, ...] | None = None) -> dict[str, Any]:
        """This job as JSON-able data, its index living in the named shared segment; `roots`:
        where its workers may open files (a confined daemon session's dataset roots: `_storage/beneath`)."""
        index_type = next(k for k, t in SHARED_INDEX_TYPES.items() if isinstance(self.index, t))
        return {
            "index_segment": index_segment,
            "index_type": index_type,
            "roots": None if roots is None else list(roots),
            "transforms": to_config(self.plan.transforms),
            "backend": self.backend_name,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "normalize": [list(v) for v in self.normalize] if self.normalize is not None else None,
            "on_error": self.on_error,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ImageJob:
        """Rebuild a job from `to_config` data (in a daemon's worker): attach the shared index,
        which opens its files only beneath the roots when the config names some."""
        roots = config.get("roots")
        segment = Segment.attach(str(config["index_segment"]))
        plan = compile_transforms(from_config(config["transforms"]))
        index_type = SHARED_INDEX_TYPES[str(config.get("index_type", "paths"))]
        if roots is None:
            index = index_type.from_segment(segment)
        else:
            index = index_type.from_segment(segment, beneath=Beneath(tuple(str(r) for r in roots)))
        job = cls(
            index,
            plan,
            str(config["backend"]),
            int(config["seed"]),
            int(config["batch_size"]),
            normalize=config.get("normalize"),
            on_error=str(config.get("on_error", "raise")),
        )
        job._index_segment = segment
        return job

    def close(self) -> None:
        """Let go of the shared index, if this job attached one, and of the files its index opened
        in this process (an HDF5 file's handle)."""
        close_files = getattr(self.index, "close", None)
        if callable(close_files):
            close_files()
        beneath = getattr(self.index, "beneath", None)
        if isinstance(beneath, Beneath):
            beneath.close()  # its descriptors of the roots
        if self._index_segment is not None:
            empty = np.empty(0, np.int64)
            self.index = PathIndex("", (), np.empty(0, np.uint8), np.zeros(1, np.int64), empty)
            self._index_segment.close()
            self._index_segment = None

    def run(self, task: Task, arrays: Sequence[np.ndarray], layout: BatchLayout, in_trainer: bool) -> Done:
        indices = task.indices
        skipped: list[SkippedSample] = []
        drawn: dict[int, int] = {}  # row -> replacements drawn for it
        while True:
            try:
                done = self._load(task, indices, arrays)
            except _Broken as broken:  # NOTE [bad samples]: raise, or load the batch again with a stand-in
                indices = self._replace(task, indices, broken, skipped, drawn)
                continue
            return dataclasses.replace(done, skipped=tuple(skipped)) if skipped else done

    def _load(self, task: Task, indices: np.ndarray, arrays: Sequence[np.ndarray]) -> Done:
        """Load samples `indices` (the task's, or with stand-ins for broken ones) into the rows."""
        n = len(indices)
        images, labels = arrays
        t0 = time.perf_counter_ns()
        buffer = self._read_buffer
        buffer.start()  # the previous task's (or attempt's) views died with it
        cpu0, runq0 = time.process_time_ns(), thread_run_delay_ns()
        remote0 = REMOTE_READS.snapshot()
        try:
            blobs = self.index.read(indices, buffer)
        except ReadFailure as e:
            raise _Broken(e.position, e.cause, "image") from e.cause
        read_cpu, read_runq = time.process_time_ns() - cpu0, run_delay_since(runq0)
        net_bytes, net_wait, hits, misses = REMOTE_READS.since(remote0)
        t1 = time.perf_counter_ns()
        rngs = sample_randoms(self.seed, task.epoch, indices)
        pixels = images[:n] if self.normalize is None else self._uint8_rows(n)
        try:
            self._backend.decode_batch(blobs, rngs, pixels)
        except SampleFailure as e:
            raise _Broken(e.position, e.__cause__ or e, "image", str(e)) from e
        t2 = time.perf_counter_ns()
        self._run_stage(self._pixels, "pixel", pixels, task, indices)
        if self.normalize is not None:
            self._normalize_into(pixels, images[:n])
            self._run_stage(self._tensor, "tensor", images[:n], task, indices)
        labels[:n] = self.index.labels[indices]
        t3 = time.perf_counter_ns()
        return Done(
            task.seq, n, t1 - t0, t2 - t1, sum(len(b) for b in blobs), read_cpu, read_runq, t3 - t2,
            net_bytes=net_bytes, net_wait_ns=net_wait, cache_hits=hits, cache_misses=misses,
        )

    def _replace(
        self,
        task: Task,
        indices: np.ndarray,
        broken: _Broken,
        skipped: list[SkippedSample],
        drawn: dict[int, int],
    ) -> np.ndarray:
        """The indices with a stand-in for the broken sample (on_error="skip"), else its Failure."""
        i = int(indices[broken.position])
        name = self.index.name(i)
        failure = failure_of(task.seq, broken.cause, i, name, broken.what, broken.reason)
        if self.on_error != "skip":
            raise JobFailed(failure) from broken.cause
        attempt, original = drawn.get(broken.position, 0), int(task.indices[broken.position])
        if attempt >= MAX_ATTEMPTS:
            last = f"the last of {MAX_ATTEMPTS} stand-ins for sample {original}, all broken"
            failure = dataclasses.replace(failure, message=f"{failure.message} ({last})")
            raise JobFailed(failure) from broken.cause
        drawn[broken.position] = attempt + 1
        stand_in = replacement(self.seed, task.epoch, original, attempt, len(self.index), self.keep)
        reason = reason_of(broken.cause, broken.reason)
        skipped.append(SkippedSample(i, name, reason, task.row + broken.position, stand_in))
        indices = indices.copy()
        indices[broken.position] = stand_in
        return indices

    def _run_stage(
        self, stage: SampleProgram, name: str, rows: np.ndarray, task: Task, indices: np.ndarray
    ) -> None:
        """Run a stage of the chain in place on the rows of samples `indices`; a kernel's failure
        is the task's, naming its first sample."""
        if not stage:
            return
        try:
            stage.run_in_slot(rows, self.seed, task.epoch, indices)
        except Exception as e:
            what = f"the {name} transforms of the rows starting with image"
            first = int(indices[0])
            raise JobFailed(failure_of(task.seq, e, first, self.index.name(first), what)) from e


class DatasetJob:
    """Loads batches of a map-style Dataset: fast path into a slot, or collated and pickled.

    The global random state (torch, numpy, random) is seeded per batch from (seed, epoch, batch
    index), so random augmentations inside `__getitem__` give the same batches for any worker
    count; in the trainer's process (`num_workers=0`) the caller's random state is restored after.
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
        seed_rng(batch_seed(self.seed, task.epoch, task.batch_index))
        skipping = self.on_error == "skip" and skipped is not None
        try:
            getitems = getattr(self.dataset, "__getitems__", None)
            if callable(getitems) and not skipping:
                try:
                    return list(getitems([int(i) for i in indices]))
                except Exception as e:
                    raise JobFailed(failure_of(task.seq, e, int(indices[0]), "", "samples starting")) from e
            record = skipped if skipping else None
            return [self._sample(task, row, int(i), record) for row, i in enumerate(indices)]
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
        return Done(seq, len(indices), t1 - t0, decode_ns, 0, read_cpu, read_runq, skipped=tuple(skipped))

    def run_opaque(self, task: Task, in_trainer: bool) -> tuple[Any, int, tuple[SkippedSample, ...]]:
        """Load and collate a batch that cannot live in a slot (the documented slow path)."""
        skipped: list[SkippedSample] = []
        samples = self._fetch(task, task.indices, in_trainer, skipped)
        batch = collate_or_fail(task, samples, self.collate_fn, "the batch starting")
        return batch, len(samples), tuple(skipped)


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
