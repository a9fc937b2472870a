"""The DALI backend: NVIDIA DALI's CPU operators decode, crop, resize and flip each batch.

fastload's plan draws each sample's geometry from its own randomness, as for the native
backend; a DALI pipeline then does the pixels. The pipeline is built on first use in the process
that runs it (a worker, a daemon's worker, or the trainer itself with `num_workers=0`), so the
parent that forks workers holds none unless it also decodes inline, and a forked child never
frees one it inherited (NOTE [DALI pipelines and fork]). It runs DALI's CPU operators
(`device_id=None`, one thread: each worker is one process), synchronously:

    external_source(bytes, slice, roi, size)
      -> decoders.image_slice   the clip box rounded outwards to whole pixels (RGB, EXIF ignored)
      -> resize                 the exact fractional box, antialiased; reversed in x for a flip

and each output is copied once into its row of the slot. Image sizes for the geometry come from
the header (the native extension's `jpeg_size`, else Pillow). A decode failure drops the pipeline
(DALI invalidates it) and is reported as `SampleFailure` at the sample DALI names (or, if it
names none, the first that fails alone), with the reason its decoder logged to stderr (that
sample is run once more to catch it: DALI's exception says only which sample failed). Bytes that
cannot be a decodable image are refused before DALI sees them (NOTE [DALI's stderr]). The
pieces both DALI paths share (the pipeline's graph, feeding it, DALI's error text) are this
module's functions, each sample's slice and box `backends.boxes`': the in-process executor
(`dali_executor`, GPU `mixed` decoding) builds the same graph on other devices, shaped by a
`DaliTuning`.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import weakref
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

from fastload._errors import ConfigError
from fastload._loading.decoding.boxes import sample_inputs
from fastload._loading.decoding.dali_tuning import DaliTuning
from fastload._loading.decoding.undecodable import SampleFailure, sample_failure
from fastload.transforms import RandomSource, TransformPlan

_INTERP = {
    "nearest": types.DALIInterpType.INTERP_NN,
    "bilinear": types.DALIInterpType.INTERP_LINEAR,
    "bicubic": types.DALIInterpType.INTERP_CUBIC,
    "lanczos": types.DALIInterpType.INTERP_LANCZOS3,
}
# DALI names the failing sample of a batch: "Failed to decode sample #3 : ...".
_FAILED_SAMPLE = re.compile(r"sample #(\d+)")
_FAILED_PREFIX = re.compile(r"^Failed to decode sample #\d+\s*:?\s*")  # a batch position: not the user's
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # DALI colours its log lines
_MAX_REASON_CHARS = 2000

# NOTE [DALI pipelines and fork]: a pipeline's C++ side owns threads. A forked child has the
# parent's pipeline objects but none of their threads, so freeing one there (the child's garbage
# collector finding a parent's loader in a dead reference cycle) joins threads that do not exist:
# a hang, then a segfault. So a child takes a strong reference to every pipeline its parent
# built, for good: never used, never freed. Its own pipelines it builds and frees as usual.
_BUILT: weakref.WeakSet[Pipeline] = weakref.WeakSet()  # the live pipelines this process built
_INHERITED: list[Pipeline] = []  # in a forked child: its parent's
_fork_hook: list[bool] = []  # non-empty once the hook is registered


def _keep_inherited_pipelines() -> None:
    """After fork, in the child (NOTE [DALI pipelines and fork])."""
    _INHERITED.extend(_BUILT)
    _BUILT.clear()


class DaliBackend:
    """Decode + crop + resize + flip with a DALI CPU pipeline, one per process."""

    name = "dali"

    def __init__(self, plan: TransformPlan, jpeg: ModuleType | None) -> None:
        if plan.interpolation not in _INTERP:
            raise ConfigError(
                f"the DALI backend has no {plan.interpolation!r} filter (it has "
                f"{', '.join(_INTERP)}): pick one of those, or backend='native'"
            )
        self.plan = plan
        self._jpeg = jpeg  # fastload's extension, for JPEG header sizes; None: Pillow reads them
        self._pipe: Any = None
        self._capacity = 0  # the pipeline's batch size: the largest task seen
        self._pid = 0  # the process that built the pipeline

    def __getstate__(self) -> dict[str, Any]:
        """A spawned worker gets the configuration, never a pipeline (it builds its own)."""
        state = self.__dict__.copy()
        state.update(_pipe=None, _capacity=0, _pid=0, _jpeg=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        from fastload._native_jpeg import built_native_jpeg

        self.__dict__.update(state)
        self._jpeg = built_native_jpeg()

    def decode_batch(
        self, blobs: Sequence[bytes | memoryview], rngs: Sequence[RandomSource], out: np.ndarray
    ) -> None:
        n = len(blobs)
        if n == 0:
            return
        inputs = sample_inputs(self.plan, blobs, rngs, self._jpeg)
        arrays = [np.frombuffer(b, np.uint8) for b in blobs]
        try:
            images = self._run(arrays, inputs)
        except RuntimeError as e:
            self._pipe = None  # DALI: "Current pipeline object is no longer valid"
            position = failed_position(str(e), n)
            if position is None:
                position = self._first_failing(arrays, inputs)
            detail = self._logged_reason(arrays[position], inputs[position : position + 1])
            failure = decode_failure(e, position, blobs[position], detail)
            raise failure from failure.__cause__
        for i in range(n):  # DALI's output, viewed, copied once into the slot
            out[i] = np.asarray(images[i])

    def _run(self, arrays: list[np.ndarray], inputs: np.ndarray) -> Any:
        """The batch's pixels, a DALI TensorListCPU of n (H, W, 3) uint8 images."""
        n = len(arrays)
        if self._pid != os.getpid():
            self._pipe = None  # none built yet, or the parent's (NOTE [DALI pipelines and fork])
        if self._pipe is None or self._capacity < n:
            self._pipe = None  # a larger task: a larger pipeline (the first task is usually the largest)
            self._capacity = max(n, self._capacity)
            self._pipe, self._pid = build_pipeline(self.plan, self._capacity), os.getpid()
        pipe = self._pipe
        feed(pipe, self.plan, arrays, inputs)
        (images,) = pipe.run()
        return images

    # NOTE [DALI's stderr]: DALI's decoders (nvImageCodec, libjpeg-turbo) write every failure to
    # fd 2 from C++ ("[ERROR] [libjpeg_turbo_decoder] ... Premature end of JPEG data"), whatever
    # DALI_NVIMGCODEC_LOG_LEVEL says (its documented knob: tried, 0 to 3, the lines stay). So the
    # bytes are checked before DALI sees them (`boxes.sample_inputs`): a header that does not read
    # (empty, not an image: refused by the header read) and a JPEG cut short (no end-of-image
    # marker after its scan: the common broken file) never reach it, in any process, and their
    # reason is fastload's (`undecodable`). Not a redirect of fd 2 around every run: fd 2 is the
    # process's, so a redirect would also take other threads' output (the trainer's own, where
    # DALI decodes inline) and a crash's last words inside DALI. Damage only decoding finds (a
    # scan naming an undefined table) still reaches DALI, which logs it once; the sample is then
    # run again with fd 2 captured for the reason (`_logged_reason`, only after a failure).
    def _logged_reason(self, array: np.ndarray, inputs: np.ndarray) -> str:
        """Why DALI cannot decode this one sample, in its own words: its decoders log the reason
        to the process's stderr and raise a bare "Failed to decode sample #i", so the sample is
        run once more with fd 2 going to a file (only ever after a failure; NOTE [DALI's stderr]).
        "" if it decodes."""
        with tempfile.TemporaryFile() as log:
            sys.stderr.flush()
            saved = os.dup(2)
            try:
                os.dup2(log.fileno(), 2)
                try:
                    self._run([array], inputs)
                except RuntimeError:
                    self._pipe = None
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            log.seek(0)
            raw = log.read().decode("utf-8", "replace")
        lines = raw.splitlines(keepends=True)
        errors = [_ANSI_ESCAPE.sub("", line).split("]", 1)[-1].strip() for line in lines if "[ERROR]" in line]
        others = "".join(line for line in lines if "[ERROR]" not in line)
        if not errors:  # libjpeg's own words ("Huffman table 0x03 was not defined"), unmarked
            errors, others = [line.strip() for line in lines], ""
        # Whatever else reached fd 2 meanwhile (another thread's logging) goes where it was going.
        pending = others.encode("utf-8", "replace")
        while pending:
            pending = pending[os.write(2, pending) :]
        return "; ".join(dict.fromkeys(e for e in errors if e))[:_MAX_REASON_CHARS]

    def _first_failing(self, arrays: list[np.ndarray], inputs: np.ndarray) -> int:
        """The first sample that fails on its own (DALI's error named none); 0 if none does."""
        for i in range(len(arrays)):
            try:
                self._run(arrays[i : i + 1], inputs[i : i + 1])
            except RuntimeError:
                self._pipe = None
                return i
        return 0


def build_pipeline(
    plan: TransformPlan,
    capacity: int,
    *,
    device_id: int | None = None,
    decoder: str = "cpu",
    num_threads: int = 1,
    exec_async: bool = False,
    tuning: DaliTuning | None = None,
) -> Pipeline:
    """A pipeline for batches of up to `capacity` images (see the module's docstring).

    `decoder` "cpu" (resize on the CPU too) or "mixed" (nvJPEG; resize on the GPU `device_id`).
    `exec_async`: `schedule_run` returns at once and `outputs` waits, runs queued in order (the
    in-process executor), shaped by `tuning` (NOTE [GPU decode tuning]); else `run` decodes in the
    caller's thread, one fed batch per run, regions decoded.
    """
    if not exec_async or tuning is None:
        tuning = DaliTuning(region=True, queue_depth=1, pipelined=False)
    pipe = Pipeline(
        batch_size=capacity,
        num_threads=num_threads,
        device_id=device_id,  # None: CPU operators only, no CUDA context (the workers)
        exec_async=exec_async,
        exec_pipelined=tuning.pipelined,
        prefetch_queue_depth=tuning.queue_depth,
    )
    u8, f32, i32 = types.DALIDataType.UINT8, types.DALIDataType.FLOAT, types.DALIDataType.INT32
    with pipe:
        encoded = fn.external_source(name="encoded", dtype=u8, ndim=1)
        anchor = fn.external_source(name="anchor", dtype=i32, ndim=1)
        shape = fn.external_source(name="shape", dtype=i32, ndim=1)
        roi_start = fn.external_source(name="roi_start", dtype=f32, ndim=1)
        roi_end = fn.external_source(name="roi_end", dtype=f32, ndim=1)
        size = fn.external_source(name="size", dtype=f32, ndim=1)
        # As the other backends, EXIF is ignored: the header's size is the image's.
        options: dict[str, Any] = dict(
            device=decoder, output_type=types.DALIImageType.RGB, adjust_orientation=False
        )
        if decoder == "mixed" and tuning.hw_decoder_load is not None:
            options["hw_decoder_load"] = tuning.hw_decoder_load
        if tuning.region:
            image = fn.decoders.image_slice(encoded, anchor, shape, axis_names="HW", **options)
        else:  # the whole image, then the same pixels cut where it now is (the GPU, for mixed)
            image = fn.decoders.image(encoded, **options)
            image = fn.slice(image, anchor, shape, axis_names="HW")
        resized = fn.resize(
            image, roi_start=roi_start, roi_end=roi_end, roi_relative=False, size=size,
            interp_type=_INTERP[plan.interpolation], antialias=True,
            device="cpu" if decoder == "cpu" else "gpu",
        )
        pipe.set_outputs(resized)
    pipe.build()
    if not _fork_hook:
        os.register_at_fork(after_in_child=_keep_inherited_pipelines)
        _fork_hook.append(True)
    _BUILT.add(pipe)
    return pipe


def feed(pipe: Pipeline, plan: TransformPlan, arrays: list[np.ndarray], inputs: np.ndarray) -> None:
    """Feed one batch (encoded `arrays`, their `sample_inputs`) to a `build_pipeline` pipeline."""
    pipe.feed_input("encoded", arrays)
    pipe.feed_input("anchor", inputs[:, 0].astype(np.int32))
    pipe.feed_input("shape", inputs[:, 1].astype(np.int32))
    pipe.feed_input("roi_start", np.ascontiguousarray(inputs[:, 2]))
    pipe.feed_input("roi_end", np.ascontiguousarray(inputs[:, 3]))
    size = np.array([plan.out_height, plan.out_width], np.float32)
    pipe.feed_input("size", np.tile(size, (len(arrays), 1)))


def decode_failure(
    error: RuntimeError, position: int, blob: bytes | memoryview, detail: str = ""
) -> SampleFailure:
    """The SampleFailure for DALI's decode `error` on `blob` at `position`, in words
    (`undecodable.describe`), its cause a ValueError in DALI's words (and `detail`: what its
    decoder logged about the sample)."""
    reason = _FAILED_PREFIX.sub("", decode_reason(str(error)))
    if detail and detail not in reason:
        reason = f"{reason.rstrip(' :')}: {detail}" if reason else detail
    try:
        raise ValueError(f"DALI could not decode the image: {reason or 'no reason given'}") from error
    except ValueError as cause:
        return sample_failure(position, blob, cause)


def failed_position(message: str, n: int) -> int | None:
    match = _FAILED_SAMPLE.search(message)
    if match is None or not 0 <= int(match.group(1)) < n:
        return None
    return int(match.group(1))


def decode_reason(message: str) -> str:
    """DALI's words about the failure, without its pipeline-definition traceback."""
    _, _, rest = message.partition("encountered:")
    text = (rest or message).split("Current pipeline object")[0]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines) or "unknown error"
