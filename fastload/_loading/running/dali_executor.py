"""`DaliExecutor`: a source's batches decoded on the GPU in the trainer's process, by DALI or nvJPEG.

With `device="cuda"` and `backend="dali"` (DALI's `mixed` nvJPEG decoder, the crop and resize on
the GPU) or `backend="nvjpeg"` (torchvision's batched nvJPEG, then `crop_resize`'s kernel), the
decode runs on the GPU, so it cannot live in forked CPU workers; this executor takes the tasks in
the trainer's own process and returns each finished batch as an `Opaque` event, so the epoch
iterator's ordering, lookahead, cancel, exactly-once and `state_dict` work as for any executor,
without a ring (the batch is already where it goes: no slot, no host copy).

    submit(task)     the task's files are read on a small thread pool (reads overlap), into
                     buffers of their own (writable: torch takes them without a copy)
    driver thread    per task, in order: geometry from the plan on each header's size (the
                     workers' helpers, `backends.boxes`); DALI: feed + `schedule_run` (DALI decodes
                     asynchronously, on its own threads), then, oldest first, `outputs()` copied
                     into a torch tensor on the batch's device (`feed_ndarray`: device to device on
                     CUDA, one copy on the CPU); nvJPEG: `NvjpegDecoder.decode` queues the decode
                     and the kernel on the side stream; labels beside the images
    poll()           the trainer's stages (`present_batch`: pixel stage, normalize, RandomErasing,
                     MixUp/CutMix) keyed by the task's (epoch, indices), then `Opaque(seq, batch)`

The DALI pipeline's shape is a `DaliTuning` (decode whole images on the hardware decoder and
slice on the GPU, or decode regions; the hardware decoder's share; the queue depth; threads):
NOTE [GPU decode tuning] in `backends.dali_tuning` says which defaults the measurements chose.
DALI is imported only when a DALI pipeline is built (`backends.dali`): nvJPEG needs none.

NOTE [DALI executor streams]: on CUDA, the driver thread copies DALI's output on the executor's
side stream and waits for that copy (its own thread only: DALI's buffers may then be reused);
`poll` runs the trainer's stages on the same side stream (so a batch's memory is used and freed
in that stream's order), records an event, makes the user's current stream wait on it, and marks
every returned tensor used by the user's stream (`record_stream`): the trainer's host never
waits, as with `CudaDelivery`.

The pipeline is the only DALI object and the driver thread the only thread that touches it. A
decode error invalidates it: the batch fails with `Failure` naming the file (DALI's `sample #k`,
else the first sample that fails alone on the CPU operators), and the batches queued behind it
are fed again to a fresh pipeline. nvJPEG's failures are found at once (`NvjpegDecoder`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import torch

from fastload._augment.program import TrainerStages
from fastload._loading.decoding.backend import SampleFailure
from fastload._loading.decoding.boxes import refuse_padding, sample_inputs
from fastload._loading.decoding.dali_tuning import DaliTuning
from fastload._loading.decoding.host_normalize import HostNormalizer
from fastload._loading.decoding.nvjpeg_decoder import NvjpegDecoder
from fastload._loading.jobs.contract import failure_of
from fastload._loading.jobs.executor import Event, Failure, Opaque, Task
from fastload._loading.slots.delivery import ImageOutput, present_batch
from fastload._loading.slots.layout import BatchLayout
from fastload._sample_random import sample_randoms
from fastload.sources._indexes.sample_index import ReadBuffer, ReadFailure, SampleIndex
from fastload.transforms import TransformPlan

_STOP = None  # the driver's inbox: a task's request, or this to stop
_JOIN_TIMEOUT_S = 10.0


@dataclass
class _Request:
    """A submitted task and its files being read."""

    task: Task
    reads: list[Future[Sequence[bytes | memoryview]]]  # a part of the task's samples each
    starts: list[int]  # where each read's samples start in the task
    blobs: list[bytes | memoryview] = field(default_factory=list)  # the encoded files, once read
    inputs: np.ndarray | None = None  # `sample_inputs`, once computed
    started_ns: int = field(default_factory=time.perf_counter_ns)  # submitted: its reads began


@dataclass
class _Decoded:
    """A task's batch out of DALI: NHWC uint8 images and int64 labels on the batch's device."""

    task: Task
    images: torch.Tensor
    labels: torch.Tensor
    load_ns: int  # from submission to out of DALI: reading, geometry, decoding, the copy


class DaliExecutor:
    """Runs an image folder's tasks on one DALI pipeline in this process (see the module docstring)."""

    def __init__(
        self,
        index: SampleIndex,
        plan: TransformPlan,
        seed: int,
        batch_size: int,
        images: ImageOutput,
        device: torch.device,
        *,
        threads: int = 2,
        pin_memory: bool = False,
        jpeg: ModuleType | None = None,
        cuda: Any = torch.cuda,
        decoder: str = "dali",
        tuning: DaliTuning | None = None,
    ) -> None:
        """`plan`: the whole chain (geometry in the decoder, the rest by `TrainerStages` here);
        `device`: CUDA decodes on it, CPU with DALI's CPU operators (or torchvision's CPU decoder);
        `threads`: the reads' (and DALI's, unless `tuning` says); `decoder`: "dali" or "nvjpeg"."""
        if decoder not in ("dali", "nvjpeg"):
            raise ValueError(f"decoder must be 'dali' or 'nvjpeg', got {decoder!r}")
        refuse_padding(plan, f"backend={decoder!r} on the trainer's device")
        self._index = index
        self._plan = plan
        self._seed = seed
        self._batch_size = batch_size
        self._images = images
        self._device = device
        self._pin = pin_memory and device.type == "cpu"
        self._jpeg = jpeg
        self._threads = max(1, threads)
        self._tuning = tuning or DaliTuning.from_environment()
        self._nvjpeg: NvjpegDecoder | None = None
        if decoder == "nvjpeg":
            self._nvjpeg = NvjpegDecoder(plan, device)
        stages = TrainerStages(plan, seed, pixels_here=True)
        self._stages = stages if stages else None
        self._affine = images.affine(device)
        self._normalize = (
            HostNormalizer(*self._affine) if self._affine is not None and device.type == "cpu" else None
        )
        self._cuda = cuda if device.type == "cuda" else None
        self._stream = cuda.Stream(device=device) if self._cuda is not None else None
        self._reads = ThreadPoolExecutor(self._threads, thread_name_prefix="fastload-dali-read")
        self._inbox: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[_Decoded | Failure] = queue.SimpleQueue()
        self._in_flight = 0
        self._closed = False
        # Driver-thread state (NOTE in the module docstring: only that thread touches DALI).
        self._pipe: Any = None
        self._scheduled: deque[_Request | None] = deque()  # None: a filler run (NOTE [pipelined first run])
        self._driver = threading.Thread(target=self._drive, name="fastload-dali", daemon=True)
        self._driver.start()

    # -- the Executor interface (the trainer's thread) ----------------------------------------

    @property
    def worker_pids(self) -> list[int]:
        return []

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def set_layout(self, layout: BatchLayout, job_id: int = 0) -> None:
        """A folder's batches never go into slots: nothing to do."""

    def submit(self, task: Task) -> None:
        if task.probe or task.slot_name:
            raise ValueError("the DALI executor runs opaque folder batches only (no probes, no slots)")
        # A read per thread, not per file: a future costs the trainer's thread ~10 µs to make.
        n = len(task.indices)
        parts = max(1, min(self._threads, n))
        spans = [(n * k // parts, n * (k + 1) // parts) for k in range(parts)]
        starts = [a for a, b in spans if b > a]
        reads = [
            self._reads.submit(self._index.read, task.indices[a:b], ReadBuffer()) for a, b in spans if b > a
        ]
        self._in_flight += 1
        self._inbox.put(_Request(task, reads, starts))

    def poll(self, timeout_s: float) -> list[Event]:
        results: list[_Decoded | Failure] = []
        try:
            first = self._outbox.get(timeout=timeout_s) if timeout_s > 0 else self._outbox.get_nowait()
            results.append(first)
            while True:
                results.append(self._outbox.get_nowait())
        except queue.Empty:
            pass
        events: list[Event] = []
        for result in results:
            if isinstance(result, Failure):
                self._in_flight -= result.seq >= 0  # seq < 0: the driver thread died, no task's
                events.append(result)
            else:
                self._in_flight -= 1
                events.append(self._present(result))
        return events

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._inbox.put(_STOP)
        self._driver.join(_JOIN_TIMEOUT_S)
        self._reads.shutdown(wait=False, cancel_futures=True)
        if self._stream is not None:
            self._stream.synchronize()

    # -- the trainer's stages ------------------------------------------------------------------

    def _present(self, decoded: _Decoded) -> Opaque | Failure:
        """The user's batch: the trainer's stages on the batch's device (NOTE [DALI executor streams])."""
        task = decoded.task
        ids = (task.epoch, task.indices)
        labels = decoded.labels if self._stages is not None else None
        try:
            if self._cuda is None:
                images, labels = present_batch(
                    decoded.images, labels, self._images, self._affine, self._stages, ids, self._normalize
                )
                tensors = [images, labels if labels is not None else decoded.labels]
                if self._pin:
                    tensors = [t.pin_memory() for t in tensors]
                return Opaque(task.seq, tensors, len(task.indices), decoded.load_ns)
            user_stream = self._cuda.current_stream(self._device)
            with self._cuda.stream(self._stream):
                images, labels = present_batch(
                    decoded.images, labels, self._images, self._affine, self._stages, ids
                )
                done = self._cuda.Event()
                done.record(self._stream)
            user_stream.wait_event(done)
            tensors = [images, labels if labels is not None else decoded.labels]
            for t in tensors:
                t.record_stream(user_stream)  # the caching allocator: the user's stream uses it too
            return Opaque(task.seq, tensors, len(task.indices), decoded.load_ns)
        except Exception as e:  # a kernel's failure is the batch's, naming its first sample
            what = "the trainer's transforms of the batch starting with image"
            return failure_of(task.seq, e, int(task.indices[0]), self._index.name(int(task.indices[0])), what)

    # -- the driver thread ---------------------------------------------------------------------

    def _drive(self) -> None:
        try:
            while True:
                if self._tuning.pipelined and len(self._scheduled) >= self._tuning.queue_depth:
                    self._collect()  # a pipelined DALI holds queue_depth runs' outputs, no more
                    continue
                try:  # feed every request there is; collect the oldest run only when none waits
                    request = self._inbox.get_nowait() if self._scheduled else self._inbox.get()
                except queue.Empty:
                    self._collect()
                    continue
                if request is _STOP:
                    return
                self._start(request)
        except BaseException as e:  # never a silent death: the trainer's next poll raises it
            self._outbox.put(failure_of(-1, e, -1, "", "batches with the DALI executor (its thread died)"))
        finally:
            self._scheduled.clear()
            self._pipe = None

    def _start(self, request: _Request) -> None:
        """Read (wait for) the request's files, compute its geometry, feed it and schedule its run."""
        task = request.task
        if request.inputs is None:
            for start, read in zip(request.starts, request.reads, strict=True):
                try:
                    request.blobs.extend(read.result())
                except ReadFailure as e:
                    i = start + e.position
                    name = self._name(task, i)
                    self._outbox.put(failure_of(task.seq, e.cause, int(task.indices[i]), name, "image"))
                    return
            try:
                rngs = sample_randoms(self._seed, task.epoch, task.indices)
                request.inputs = sample_inputs(self._plan, request.blobs, rngs, self._jpeg)
            except SampleFailure as e:
                self._outbox.put(self._failure_at(task, e))
                return
        if self._nvjpeg is not None:
            self._decode_nvjpeg(request)
            return
        try:
            fresh = self._pipe is None
            if fresh:
                self._pipe = self._build()
            arrays = [np.frombuffer(b, np.uint8) for b in request.blobs]
            feed = _dali().feed
            feed(self._pipe, self._plan, arrays, request.inputs)
            # NOTE [pipelined first run]: a pipelined pipeline's first schedule_run runs
            # queue_depth iterations at once, each needing a fed batch: the first request is fed
            # again that many times over, and those runs' outputs are dropped (once per pipeline).
            fillers = self._tuning.queue_depth - 1 if fresh and self._tuning.pipelined else 0
            for _ in range(fillers):
                feed(self._pipe, self._plan, arrays, request.inputs)
            self._pipe.schedule_run()
        except Exception as e:
            self._pipe = None
            self._outbox.put(failure_of(task.seq, e, int(task.indices[0]), self._name(task, 0), "batch"))
            return
        self._scheduled.append(request)
        self._scheduled.extend([None] * fillers)

    def _decode_nvjpeg(self, request: _Request) -> None:
        """Queue the request's decode and crop on the side stream; its batch is ready in stream order."""
        assert self._nvjpeg is not None and request.inputs is not None
        task = request.task
        labels = torch.from_numpy(self._index.labels[task.indices])
        try:
            if self._cuda is None:
                out = self._nvjpeg.decode(request.blobs, request.inputs)
            else:
                with self._cuda.stream(self._stream):
                    out = self._nvjpeg.decode(request.blobs, request.inputs)
                    labels = labels.to(self._device, non_blocking=True)
        except SampleFailure as e:
            self._outbox.put(self._failure_at(task, e))
            return
        except Exception as e:  # a CUDA error, say: the batch's, naming its first sample
            self._outbox.put(failure_of(task.seq, e, int(task.indices[0]), self._name(task, 0), "batch"))
            return
        self._outbox.put(_Decoded(task, out, labels, time.perf_counter_ns() - request.started_ns))

    def _build(self) -> Any:
        threads = self._tuning.threads or self._threads
        if self._cuda is None:
            return _dali().build_pipeline(
                self._plan, self._batch_size, num_threads=threads, exec_async=True, tuning=self._tuning
            )
        device_id = self._device.index if self._device.index is not None else self._cuda.current_device()
        return _dali().build_pipeline(
            self._plan, self._batch_size, device_id=device_id, decoder="mixed",
            num_threads=threads, exec_async=True, tuning=self._tuning,
        )

    def _collect(self) -> None:
        """The oldest scheduled run's batch, copied out of DALI (or its failure)."""
        request = self._scheduled.popleft()
        try:
            (images,) = self._pipe.outputs()
        except RuntimeError as e:  # a decode error: DALI invalidated the pipeline
            self._pipe = None
            behind = [waiting for waiting in self._scheduled if waiting is not None]
            self._scheduled.clear()
            if request is not None:
                self._outbox.put(self._decode_failure(request, e))
            for waiting in behind:  # their runs died with the pipeline: feed them again
                self._start(waiting)
            return
        if request is None:
            return  # a filler's output
        task = request.task
        n = len(task.indices)
        shape = (n, self._plan.out_height, self._plan.out_width, 3)
        labels = torch.from_numpy(self._index.labels[task.indices])
        if self._cuda is None:
            out = torch.empty(shape, dtype=torch.uint8)
            feed_ndarray(images.as_tensor(), out)
        else:
            with self._cuda.stream(self._stream):
                out = torch.empty(shape, dtype=torch.uint8, device=self._device)
                feed_ndarray(images.as_tensor(), out, cuda_stream=self._stream)
                labels = labels.to(self._device, non_blocking=True)
                copied = self._cuda.Event()
                copied.record(self._stream)
            copied.synchronize()  # this thread only: DALI's buffer is free to reuse after
        self._outbox.put(_Decoded(task, out, labels, time.perf_counter_ns() - request.started_ns))

    def _decode_failure(self, request: _Request, error: RuntimeError) -> Failure:
        """The Failure of a run DALI could not decode, naming the file (see the module docstring)
        and saying why in its CPU decoder's words where they say more than the run's error."""
        task, n = request.task, len(request.task.indices)
        dali = _dali()
        position = dali.failed_position(str(error), n)
        rows = range(n) if position is None else range(position, position + 1)
        failure = self._cpu_failure(request, rows)
        if failure is None or (position is not None and failure.position != position):
            at = 0 if position is None else position
            failure = dali.decode_failure(error, at, request.blobs[at])
        return self._failure_at(task, failure)

    def _cpu_failure(self, request: _Request, rows: range) -> SampleFailure | None:
        """The first of `rows` DALI's CPU operators cannot decode, as their SampleFailure at its
        position in the task; None if they all decode."""
        task = request.task
        backend = _dali().DaliBackend(self._plan, self._jpeg)
        out = np.empty((len(rows), self._plan.out_height, self._plan.out_width, 3), np.uint8)
        draws = sample_randoms(self._seed, task.epoch, task.indices[rows.start : rows.stop])
        try:
            backend.decode_batch(request.blobs[rows.start : rows.stop], draws, out)
        except SampleFailure as e:
            failure = SampleFailure(rows.start + e.position, str(e))
            failure.__cause__ = e.__cause__
            return failure
        return None

    def _failure_at(self, task: Task, failure: SampleFailure) -> Failure:
        cause = failure.__cause__ or failure
        position = failure.position
        index, name = int(task.indices[position]), self._name(task, position)
        return failure_of(task.seq, cause, index, name, "image", str(failure))  # why, in words

    def _name(self, task: Task, position: int) -> str:
        """The file of the task's sample at `position`, for an error message."""
        return self._index.name(int(task.indices[position]))


def _dali() -> ModuleType:
    """`backends.dali`, imported on first use (it imports DALI)."""
    from fastload._loading.decoding import dali

    return dali


def feed_ndarray(dali_tensor: Any, out: torch.Tensor, cuda_stream: Any = None) -> None:
    """Copy a DALI tensor into `out` (DALI's torch plugin; on `cuda_stream` for GPU tensors)."""
    from nvidia.dali.plugin.pytorch.torch_utils import feed_ndarray as copy

    copy(dali_tensor, out, cuda_stream=cuda_stream)
