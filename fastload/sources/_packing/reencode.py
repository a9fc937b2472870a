"""Smaller stored images for `pack(max_side=...)` (`fastload pack --max-side N`): what FFCV's
`max_resolution` does, as a stage between the source's reads and the pack's writer.

Its one responsibility is turning a source's samples into the pack's, in order (with or without
`max_side`): each is checked to be a whole image first (`_packing/image_bytes.py`: a pack never holds broken
bytes as if good; `on_error="skip"` leaves such a sample out, as `Skipped`, else it is an error
naming it), then, with `max_side`:

- an image whose longer side is at most `max_side` is stored as it is, byte for byte;
- a larger JPEG is decoded at the coarsest DCT scale that keeps it at least the target size
  (1/2, 1/4 or 1/8 of the work for a large photo), resized so that its longer side is `max_side`
  (aspect kept, the shorter side rounded to the nearest pixel), with Pillow's antialiased Lanczos
  arithmetic (native/fl_resample.c), and encoded as a baseline JPEG at `quality` (4:2:0 chroma,
  optimised Huffman tables, no metadata: EXIF and ICC profiles are not kept, and fastload's
  decoders ignore them anyway); an image whose three channels are equal is encoded as gray;
- a larger image of another format (PNG, WebP, ...) is decoded by Pillow, converted to RGB as the
  loader does (`convert("RGB")`), resized the same way (Pillow's Lanczos) and encoded as JPEG too,
  unless it has an alpha channel (RGBA, LA, a palette with transparency): that one is resized as
  RGBA (premultiplied, the right way to resample transparency) and stored as a PNG, so the pack
  keeps what its source said; fastload's decoders drop the alpha of both as they do for the source.

Decode and encode go through fastload's native extension (libjpeg-turbo, GIL released) where it
is built, else through Pillow; non-JPEG images always need Pillow. The output depends only on the
sample's bytes, `max_side` and `quality` (and the library versions): the same on every run, for
every worker count, which keeps a resumed pack byte-identical to an uninterrupted one.

The work runs in a process pool (`workers`, forked: NOTE [re-encoding pool]); each task reads
`TASK_SAMPLES` consecutive samples of the pack's order itself (one sorted read, as the loader's
workers do), so the trainer-side process only writes, in order.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._encoded_bytes import JPEG_MAGIC, describe
from fastload._errors import ConfigError, DatasetError
from fastload._native_jpeg import built_native_jpeg
from fastload.sources._indexes.sample_index import ReadFailure, SampleIndex
from fastload.sources._packing.image_bytes import damage

DEFAULT_QUALITY = 90  # FFCV's default: visually lossless on photos at ~1/3 of quality 100's size
LANCZOS = 1  # Pillow's Image.Resampling.LANCZOS, native/fl_resample.h's FL_FILTER_LANCZOS
# Samples one pool task reads and re-encodes; tasks in flight: 2 per worker (tests make it small).
TASK_SAMPLES = 64
_PILLOW_INSTALL = "pip install pillow (or pip install fastload[pillow])"

Blob = bytes | memoryview


@dataclass(frozen=True)
class Reencoding:
    """What `pack(max_side=..., quality=...)` asked for; checked on construction."""

    max_side: int
    quality: int = DEFAULT_QUALITY

    def __post_init__(self) -> None:
        if isinstance(self.max_side, bool) or not isinstance(self.max_side, int) or self.max_side < 16:
            raise ConfigError(f"max_side must be an integer of at least 16 pixels, got {self.max_side!r}")
        quality = self.quality
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
            raise ConfigError(f"quality must be an integer in 1..100, got {self.quality!r}")


def fitted_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """(width, height) scaled so that the longer side is `max_side`, the other rounded half up
    (at least 1); unchanged when the image is already within `max_side`."""
    longer = max(width, height)
    if longer <= max_side:
        return width, height

    def scaled(side: int) -> int:
        return max(1, (2 * side * max_side + longer) // (2 * longer))

    return (max_side, scaled(height)) if width >= height else (scaled(width), max_side)


def check_encoders() -> None:
    """Refuse, before any work, to re-encode with nothing to do it with."""
    if built_native_jpeg() is None and _pillow() is None:
        raise ConfigError(
            "re-encoding (max_side) needs fastload's native extension (libjpeg-turbo headers at install: "
            f"Debian libjpeg62-turbo-dev, then reinstall fastload) or Pillow: {_PILLOW_INSTALL}"
        )


def reencode(blob: Blob, setting: Reencoding) -> Blob:
    """One sample as the pack stores it: `blob` itself when within `setting.max_side`, else the
    resized re-encoding (module docstring). ValueError/OSError for an image that cannot be
    decoded, ConfigError when Pillow is needed and missing."""
    native = built_native_jpeg()
    if bytes(blob[:3]) == JPEG_MAGIC:
        if native is not None:
            width, height = native.jpeg_size(blob)
            size = fitted_size(width, height, setting.max_side)
            if size == (width, height):
                return blob
            pixels = np.empty((size[1], size[0], 3), np.uint8)
            box = (0.0, 0.0, float(width), float(height))
            native.decode_crop_resize(blob, box, pixels, size[1], size[0], filter=LANCZOS)
            return _encode(pixels, setting.quality)
        return _reencode_with_pillow(blob, setting, jpeg=True)
    return _reencode_with_pillow(blob, setting, jpeg=False)


def _reencode_with_pillow(blob: Blob, setting: Reencoding, *, jpeg: bool) -> Blob:
    pil = _pillow()
    if pil is None:
        raise ConfigError(f"re-encoding an image that is not a JPEG needs Pillow: {_PILLOW_INSTALL}")
    with pil.open(io.BytesIO(blob)) as image:
        size = fitted_size(image.width, image.height, setting.max_side)
        if size == image.size:
            return blob
        lanczos = pil.Resampling.LANCZOS
        if not jpeg and _has_alpha(image):
            rgba = image if image.mode in ("RGBA", "LA") else image.convert("RGBA")
            out = io.BytesIO()
            rgba.resize(size, lanczos).save(out, format="PNG")
            return out.getvalue()
        if jpeg:
            image.draft("RGB", size)  # the DCT scaling the native path does
        rgb = image.convert("RGB").resize(size, lanczos)
        return _encode(np.asarray(rgb), setting.quality)


def _has_alpha(image: Any) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info


def _encode(pixels: np.ndarray, quality: int) -> bytes:
    """(h, w, 3) uint8 RGB as JPEG; gray when the three channels are equal (a gray source)."""
    height, width = pixels.shape[:2]
    red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    gray = bool(np.array_equal(red, green) and np.array_equal(green, blue))
    plane = np.ascontiguousarray(pixels[..., 0]) if gray else np.ascontiguousarray(pixels)
    native = built_native_jpeg()
    if native is not None:
        encoded: bytes = native.encode_jpeg(plane, width, height, quality)
        return encoded
    pil = _pillow()
    if pil is None:  # check_encoders refused this before any work
        raise ConfigError(f"encoding a JPEG needs fastload's native extension or Pillow: {_PILLOW_INSTALL}")
    out = io.BytesIO()
    pil.fromarray(plane).save(out, format="JPEG", quality=quality, optimize=True, subsampling="4:2:0")
    return out.getvalue()


def _pillow() -> Any:
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


# --------------------------------------------------------------------------------------------
# Running it over a pack's samples, in order.


@dataclass(frozen=True)
class Skipped:
    """A sample `pack(on_error="skip")` leaves out, in its place among the samples made: why."""

    reason: str


Made = Blob | Skipped  # a sample as this stage hands it to the pack's writer
_HOW_TO_LEAVE_OUT = (
    "run the same command again with --on-error skip (on_error='skip'): it goes on from the samples "
    "packed so far and lists those it leaves out in the manifest; or list every broken sample with "
    "`fastload verify SRC -o bad.txt` and pack into a new directory with --exclude bad.txt"
)


@dataclass(frozen=True)
class _Failure:
    """Sample `position` of a task could not be made: `kind` is "read" (unreadable), "broken"
    (not a whole image: `_packing/image_bytes.py`), "reencode" (the decoder refused it) or "config" (the
    message is a ConfigError's: what to install)."""

    position: int
    message: str
    kind: str


@dataclass(frozen=True)
class _Job:
    index: SampleIndex
    order: np.ndarray
    setting: Reencoding | None  # None: the samples as the source stores them
    parent: int
    skip: bool = False  # on_error="skip": a sample that cannot be made is `Skipped`, not a failure


def _run_task(job: _Job, first: int, stop: int, keep_views: bool) -> list[Made] | _Failure:
    """Read samples `order[first:stop]`, check them and re-encode them; bytes (not views) unless
    `keep_views` (a result that crosses a pipe must be picklable)."""
    indices = job.order[first:stop]
    unread: dict[int, str] = {}
    try:
        blobs: Sequence[Blob | None] = job.index.read(indices)
    except ReadFailure as e:
        if not job.skip:
            return _Failure(e.position, str(e.cause), "read")
        blobs, unread = _read_each(job.index, indices)
    out: list[Made] = []
    for position, blob in enumerate(blobs):
        if blob is None:
            out.append(Skipped(f"cannot read it: {unread[position]}"))
            continue
        broken = damage(blob)
        if broken is not None:
            if not job.skip:
                return _Failure(position, broken, "broken")
            out.append(Skipped(f"not a whole image: {broken}"))
            continue
        try:
            done = blob if job.setting is None else reencode(blob, job.setting)
        except ConfigError as e:
            return _Failure(position, str(e), "config")
        except Exception as e:  # any decoder's error (ValueError, OSError, Pillow's own): in words
            if not job.skip:
                return _Failure(position, describe(blob, e), "reencode")
            out.append(Skipped(f"cannot re-encode it: {describe(blob, e)}"))
            continue
        out.append(done if keep_views or isinstance(done, bytes) else bytes(done))
    return out


def _read_each(index: SampleIndex, indices: np.ndarray) -> tuple[list[Blob | None], dict[int, str]]:
    """The samples read one at a time (after a batch's read failed): None for each unreadable
    one, and why, by position."""
    blobs: list[Blob | None] = []
    unread: dict[int, str] = {}
    for position in range(len(indices)):
        try:
            blobs.append(index.read(indices[position : position + 1])[0])
        except ReadFailure as e:
            blobs.append(None)
            unread[position] = str(e.cause)
    return blobs, unread


# NOTE [re-encoding pool]: the pool's processes are forked (fastload's start method), so each one
# inherits the source's index (sources reopen their files per pid, as loader workers do) and the
# pack's order; nothing but (first, stop) goes to a worker, and only the re-encoded bytes come
# back. Results are taken in submission order, so the pack's bytes do not depend on the worker
# count. Workers ignore SIGINT (Ctrl-C reaches the whole process group: the parent alone stops,
# and shuts the pool down) and exit when their parent is gone (a SIGKILLed `fastload pack` must
# not leave them waiting on the pool's queue forever).
_job: _Job | None = None  # a pool worker's job, set once by _worker_init (in the pool's processes only)


def _worker_init(job: _Job) -> None:
    global _job
    _job = job
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(job.parent,), daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _worker_task(first: int, stop: int) -> list[Made] | _Failure:
    if _job is None:
        raise RuntimeError("a re-encoding task ran outside the pool it was made for")
    return _run_task(_job, first, stop, keep_views=False)


def made_batches(
    index: SampleIndex,
    order: np.ndarray,
    start: int,
    setting: Reencoding | None,
    workers: int,
    skip: bool,
    step: int | None = None,
) -> Generator[Sequence[Made], None, None]:
    """The samples `order[start:]` as the pack stores them, a task's worth at a time, in order:
    checked (`_packing/image_bytes.py`), and re-encoded when `setting` asks. `workers` processes re-encode
    (1, or no `setting`: this process). `skip`: a sample that cannot be read, is broken or cannot
    be re-encoded is `Skipped`; else it is a DatasetError naming it and how to go on. ConfigError
    when Pillow is needed and missing. `step`: samples a task (default `TASK_SAMPLES`)."""
    job = _Job(index, order, setting, os.getpid(), skip)
    step = max(1, TASK_SAMPLES if step is None else step)
    tasks = [(first, min(first + step, len(order))) for first in range(start, len(order), step)]
    workers = min(workers, len(tasks)) if setting is not None else 1  # copying bytes: this process
    if workers <= 1:
        for first, stop in tasks:
            yield _checked(index, order, first, _run_task(job, first, stop, keep_views=True))
        return
    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("fork"), initializer=_worker_init, initargs=(job,)
    )
    pending: deque[tuple[int, Future[list[Made] | _Failure]]] = deque()
    try:
        for first, stop in tasks:
            pending.append((first, pool.submit(_worker_task, first, stop)))
            if len(pending) >= 2 * workers:
                yield _checked(index, order, *_result(pending.popleft()))
        while pending:
            yield _checked(index, order, *_result(pending.popleft()))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _result(item: tuple[int, Future[list[Made] | _Failure]]) -> tuple[int, list[Made] | _Failure]:
    first, future = item
    try:
        return first, future.result()
    except BrokenProcessPool as e:
        raise DatasetError(
            f"a re-encoding worker process died ({e}); run the same command again to go on "
            "(if memory ran out, use fewer --workers)"
        ) from e


def _checked(index: SampleIndex, order: np.ndarray, first: int, result: list[Made] | _Failure) -> list[Made]:
    """`result`, or the error naming the sample that failed (task starting at position `first`)."""
    if not isinstance(result, _Failure):
        return result
    name = index.name(int(order[first + result.position]))
    if result.kind == "config":
        raise ConfigError(f"{name}: {result.message}")
    if result.kind == "read":
        raise DatasetError(
            f"cannot read {name}: {result.message}. Run the same command again to go on (the samples "
            "packed so far are kept); if it stays unreadable, leave it out: --on-error skip "
            "(on_error='skip')"
        )
    if result.kind == "broken":
        raise DatasetError(f"{name} is not a whole image ({result.message}): a pack must not hold it; "
                           f"{_HOW_TO_LEAVE_OUT}")
    raise DatasetError(f"cannot re-encode {name}: {result.message}; {_HOW_TO_LEAVE_OUT}")
