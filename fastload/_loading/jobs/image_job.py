"""`ImageJob`: what a worker does with a task of a source of encoded images — read the task's
samples' bytes, decode + augment them with a backend into the slot's rows (each view's into its
own leaf, for a `Views`: NOTE [views] in `fastload.transforms._views`), labels beside them (or a
source's declared fields: `field_rows`);
a broken sample raises, or with on_error="skip" gets a stand-in (NOTE [bad samples]). The job
contract it keeps, and `run_task` that runs it, are in `contract`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from fastload._augment.program import SampleProgram
from fastload._bad_samples import MAX_ATTEMPTS, SkippedSample, reason_of, replacement
from fastload._batch_counters import BatchCounters
from fastload._errors import ConfigError
from fastload._loading.decoding.backend import SampleFailure, make_backend
from fastload._loading.decoding.decode_once import DecodeOnce
from fastload._loading.decoding.host_normalize import HostNormalizer
from fastload._loading.jobs.contract import JobFailed, SourceJob, failure_of
from fastload._loading.jobs.executor import Done, Task
from fastload._loading.jobs.field_rows import MemberFailure, fields_layout, write_fields
from fastload._loading.order.sampling import RepeatCopies
from fastload._loading.slots.layout import BatchLayout
from fastload._machine import run_delay_since, thread_run_delay_ns
from fastload._sample_random import PIXELS_STREAM, TENSOR_STREAM, sample_randoms
from fastload._shm import Segment
from fastload.sources._indexes.sample_index import (
    PathIndex,
    ReadBuffer,
    ReadFailure,
    SampleIndex,
    declared_fields,
    target_row,
)
from fastload.sources._shared_indexes import SHARED_INDEX_TYPES, shared_name
from fastload.sources._storage.beneath import Beneath
from fastload.sources._storage.node_cache import READS as REMOTE_READS
from fastload.transforms import TransformPlan, compile_transforms, from_config, to_config


class _Broken(Exception):
    """Sample `position` of an attempt could not be read or decoded (`cause`); `reason`: why, in
    words, where the decoder's backend said (`undecodable`), else "" (the cause says)."""

    def __init__(self, position: int, cause: BaseException, what: str, reason: str = "") -> None:
        super().__init__(reason or str(cause))
        self.position, self.cause, self.what, self.reason = position, cause, what, reason


# NOTE [float slots]: CPU batches with normalize would have the trainer's thread normalize each
# batch and run RandomErasing on it (~7 ms a batch of 64 at 224x224), on the thread that should
# be training. Instead a job given `normalize` keeps its images in the slot as float32 (H, W, 3):
# a worker decodes and runs the pixel stage on uint8 rows of its own scratch, normalizes them into
# its rows of the slot (the native one-pass table, or torch: bit-identical, `HostNormalizer.into`)
# and runs the tensor stage (RandomErasing) on them, its draws keyed by (seed, epoch, index) from
# TENSOR_STREAM as the trainer's were, so batches are bit-identical to the trainer-side path. The
# trainer returns views over the slot and runs only the batch stage (MixUp/CutMix) in place there.
# Slots are 4x larger; `ring_plan.plan_ring` sizes the ring from their bytes.


class _View:
    """One view's part of a job: its plan, the seed its draws come from, its backend (the
    decoder's geometry is the view's), its pixel and tensor stages, and (for float slots) its
    uint8 scratch rows. A plain chain is one view (NOTE [views] in `fastload.transforms._views`)."""

    def __init__(self, plan: TransformPlan, seed: int, backend: str, normalized: bool) -> None:
        self.plan, self.seed = plan, seed
        self.backend = make_backend(backend, plan)
        self.pixels = SampleProgram(plan.pixels, PIXELS_STREAM)
        # The tensor stage needs normalized images: it runs here only on the images normalized here.
        self.tensor = SampleProgram(plan.tensor if normalized else (), TENSOR_STREAM)
        self._scratch: np.ndarray | None = None  # uint8 rows to decode into, before normalizing

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_scratch": None}  # made anew where the job runs

    def uint8_rows(self, batch_size: int, n: int) -> np.ndarray:
        if self._scratch is None:
            self._scratch = np.empty((batch_size, self.plan.out_height, self.plan.out_width, 3), np.uint8)
        return self._scratch[:n]


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
        # One `_View` per view (a plain chain is one, drawing from `seed`: NOTE [views] in transforms).
        normalized = self.normalize is not None
        self._views = [_View(view, seed_, backend, normalized) for view, seed_ in plan.view_plans(seed)]
        images = [np.zeros((v.plan.out_height, v.plan.out_width, 3), dtype) for v in self._views]
        # Declared fields (`TarShards(fields=...)`): their rows beside the one image (`field_rows`).
        self._fields_index = declared_fields(index)
        if self._fields_index is not None:
            assert self._fields_index.fields is not None
            if plan.views:
                raise ConfigError("Views of a source with declared fields are not built yet: give one chain")
            self.layout: BatchLayout | None = fields_layout(self._fields_index.fields, images[0], batch_size)
        else:
            # DINO's [[views], label] for a Views
            sample = [images if plan.views else images[0], target_row(index.labels)]
            self.layout = BatchLayout.infer(sample, batch_size)
        self._decode_once = DecodeOnce(plan.views, backend == "native") if plan.decode_once else None
        self._normalizer: HostNormalizer | None = None  # made where the job runs (it holds a module)
        self._read_buffer = ReadBuffer()  # NOTE [read buffer]
        self.copies: RepeatCopies | None = None  # a RepeatedPlan's keys (NOTE [augmentation of repeats])
        self._index_segment: Segment | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_normalizer"] = None  # made anew where the job runs
        return state

    def _normalize_into(self, pixels: np.ndarray, images: np.ndarray) -> None:
        if self._normalizer is None:
            assert self.normalize is not None
            mean = torch.tensor(self.normalize[0], dtype=torch.float32).view(1, -1, 1, 1)
            std = torch.tensor(self.normalize[1], dtype=torch.float32).view(1, -1, 1, 1)
            self._normalizer = HostNormalizer(1.0 / (255.0 * std), -mean / std)  # as ImageOutput.affine
        self._normalizer.into(pixels, images)

    def to_config(self, index_segment: str, roots: tuple[str, ...] | None = None) -> dict[str, Any]:
        """This job as JSON-able data, its index living in the named shared segment; `roots`:
        where its workers may open files (a confined daemon session's dataset roots: `_beneath`)."""
        index_type = shared_name(self.index)
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
            **({} if self.copies is None else {"copies": dataclasses.asdict(self.copies)}),
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
        copies = config.get("copies")
        job.copies = None if copies is None else RepeatCopies(**{k: int(v) for k, v in copies.items()})
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
        t0 = time.perf_counter_ns()
        buffer = self._read_buffer
        buffer.start()  # the previous task's (or attempt's) views died with it
        cpu0, runq0 = time.process_time_ns(), thread_run_delay_ns()
        remote0 = REMOTE_READS.snapshot()
        try:
            blobs = self.index.read(indices, buffer)
        except ReadFailure as e:
            raise _Broken(e.position, e.cause, "image") from e.cause
        member_bytes = 0
        if self._fields_index is not None:
            try:
                member_bytes = write_fields(self._fields_index, indices, arrays, buffer)
            except MemberFailure as e:
                raise _Broken(e.position, e.cause, f"field {e.name!r} of") from e.cause
        read_cpu, read_runq = time.process_time_ns() - cpu0, run_delay_since(runq0)
        net_bytes, net_wait, hits, misses = REMOTE_READS.since(remote0)
        t1 = time.perf_counter_ns()
        images = arrays[: len(self._views)]  # one leaf per view (a plain chain: one), then labels or fields
        decoded = [  # where each view is decoded: its rows, or uint8 scratch to normalize from
            rows[:n] if self.normalize is None else view.uint8_rows(self.batch_size, n)
            for view, rows in zip(self._views, images, strict=True)
        ]
        keys = indices if self.copies is None else self.copies.keys(task.batch_index, task.row, indices)
        rngs = [sample_randoms(view.seed, task.epoch, keys) for view in self._views]
        try:
            if self._decode_once is not None:  # every view cropped from one decode (NOTE [views])
                self._decode_once.decode_views(blobs, rngs, decoded)
            else:
                for view, view_rngs, pixels in zip(self._views, rngs, decoded, strict=True):
                    view.backend.decode_batch(blobs, view_rngs, pixels)
        except SampleFailure as e:
            raise _Broken(e.position, e.__cause__ or e, "image", str(e)) from e
        t2 = time.perf_counter_ns()
        for view, pixels, rows in zip(self._views, decoded, images, strict=True):
            self._run_stage(view.pixels, view.seed, "pixel", pixels, task, indices, keys)
            if self.normalize is not None:
                self._normalize_into(pixels, rows[:n])
                self._run_stage(view.tensor, view.seed, "tensor", rows[:n], task, indices, keys)
        if self._fields_index is None:
            arrays[len(self._views)][:n] = self.index.labels[indices]
        t3 = time.perf_counter_ns()
        counters = BatchCounters(
            samples=n, read_ns=t1 - t0, decode_ns=t2 - t1,
            bytes_read=sum(len(b) for b in blobs) + member_bytes,
            read_cpu_ns=read_cpu, read_runq_ns=read_runq, augment_ns=t3 - t2,
            net_bytes=net_bytes, net_wait_ns=net_wait, cache_hits=hits, cache_misses=misses,
        )
        return Done(task.seq, counters)

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
        self, stage: SampleProgram, seed: int, name: str, rows: np.ndarray, task: Task, indices: np.ndarray,
        keys: np.ndarray,
    ) -> None:
        """Run a stage of the chain in place on the rows of samples `indices`, its draws keyed by
        `keys`; a kernel's failure is the task's, naming its first sample."""
        if not stage:
            return
        try:
            stage.run_in_slot(rows, seed, task.epoch, keys)
        except Exception as e:
            what = f"the {name} transforms of the rows starting with image"
            first = int(indices[0])
            raise JobFailed(failure_of(task.seq, e, first, self.index.name(first), what)) from e
