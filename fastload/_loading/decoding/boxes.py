"""Each sample's decode slice and resampling box, from its header's size: what a GPU decoder is given.

DALI's pipelines (`backends.dali`, both the workers' and the in-trainer executor's) and the nvJPEG
decoder (`nvjpeg_decoder` with `crop_resize`) take the same per-sample inputs, drawn by the
transform plan on each image's header size: the pixels to decode (the clip box rounded outwards)
and the exact fractional box within them, x reversed for a flip. No DALI import here: the nvJPEG
path needs none.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from fastload._encoded_bytes import JPEG_MAGIC, jpeg_cut_short
from fastload._errors import ConfigError
from fastload._loading.decoding.undecodable import SampleFailure, sample_failure
from fastload._sample_random import SampleDraws
from fastload.transforms import RandomSource, SampleGeometry, TransformPlan
from fastload.transforms._batch_geometry import BatchGeometry, sample_batch

_EPS = 1e-6  # as the Pillow backend: a clip edge within this of a whole pixel is that pixel


def refuse_padding(plan: TransformPlan, decoder: str) -> None:
    """ConfigError when `plan` has a padded RandomCrop: the GPU decoders' inputs (a slice inside
    the image and a box within it) cannot reach past the image (NOTE [padded crops])."""
    crop = plan.padded_crop
    if crop is not None:
        raise ConfigError(
            f"{decoder} cannot pad a crop ({crop!r} may reach past the image): use backend='native' "
            "(or 'pil') for RandomCrop's padding / pad_if_needed, or leave them out"
        )


def image_size(blob: bytes | memoryview, jpeg: ModuleType | None) -> tuple[int, int]:
    """(height, width) from the image's header: fastload's extension (`jpeg`) for JPEGs, else Pillow."""
    if jpeg is not None and blob[:3] == JPEG_MAGIC:
        width, height = jpeg.jpeg_size(blob)
        return int(height), int(width)
    try:
        from PIL import Image
    except ImportError as e:
        raise RuntimeError(
            "reading this image's size needs Pillow (it is not a JPEG, or fastload's native "
            "extension is not built): `pip install pillow`"
        ) from e
    with Image.open(io.BytesIO(blob)) as img:
        width, height = img.size
    return int(height), int(width)


def sample_inputs(
    plan: TransformPlan,
    blobs: Sequence[bytes | memoryview],
    rngs: Sequence[RandomSource],
    jpeg: ModuleType | None,
) -> np.ndarray:
    """(n, 4, 2) float32: each sample's [slice anchor, shape, roi start, end] (`slice_and_roi`) for
    the geometry `plan` draws on its header's size; SampleFailure for a header that cannot be read,
    or a JPEG cut short (refused here, before a GPU decoder or DALI logs it: NOTE [DALI's stderr]).
    A task's `SampleDraws` get their geometry a batch at a time (NOTE [per-batch geometry])."""
    n = len(blobs)
    sizes = np.empty((n, 2), np.int64)  # (height, width)
    for i, blob in enumerate(blobs):
        try:
            sizes[i] = image_size(blob, jpeg)
            if blob[:3] == JPEG_MAGIC and jpeg_cut_short(blob):
                raise ValueError("the JPEG stops before its end-of-image marker")
        except Exception as e:  # a header that cannot be read is reported against its sample
            raise sample_failure(i, blob, e) from e
    if isinstance(rngs, SampleDraws) and n:
        geometry = sample_batch(plan, sizes[:, 0], sizes[:, 1], rngs.uniforms)
        if geometry is not None:
            return batch_slice_and_roi(geometry, sizes[:, 0], sizes[:, 1])
    inputs = np.empty((n, 4, 2), np.float32)
    for i, rng in enumerate(rngs):
        height, width = int(sizes[i, 0]), int(sizes[i, 1])
        try:
            inputs[i] = slice_and_roi(plan.sample(height, width, rng), height, width)
        except Exception as e:  # e.g. a CenterCrop larger than the image
            raise SampleFailure(i, f"{type(e).__name__}: {e}") from e
    return inputs


def slice_and_roi(g: SampleGeometry, height: int, width: int) -> np.ndarray:
    """[anchor, shape, roi_start, roi_end], each (y, x): the pixels to decode (the clip box rounded
    outwards, as the filter must not read past it), and the box within them (x reversed: a flip)."""
    left, top, right, bottom = g.box
    clip = g.clip or (0.0, 0.0, float(width), float(height))
    x0, y0 = max(0, math.floor(clip[0] + _EPS)), max(0, math.floor(clip[1] + _EPS))
    x1, y1 = min(width, math.ceil(clip[2] - _EPS)), min(height, math.ceil(clip[3] - _EPS))
    x_start, x_end = (right, left) if g.flip else (left, right)
    return np.array(
        [[y0, x0], [y1 - y0, x1 - x0], [top - y0, x_start - x0], [bottom - y0, x_end - x0]], np.float32
    )


def batch_slice_and_roi(g: BatchGeometry, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """`slice_and_roi` for every sample of a `BatchGeometry` at once: (n, 4, 2) float32."""
    left, top, right, bottom = g.boxes.T
    x0 = np.maximum(0, np.floor(g.clips[:, 0] + _EPS))
    y0 = np.maximum(0, np.floor(g.clips[:, 1] + _EPS))
    x1 = np.minimum(widths, np.ceil(g.clips[:, 2] - _EPS))
    y1 = np.minimum(heights, np.ceil(g.clips[:, 3] - _EPS))
    x_start, x_end = np.where(g.flips, right, left), np.where(g.flips, left, right)
    rows = [(y0, x0), (y1 - y0, x1 - x0), (top - y0, x_start - x0), (bottom - y0, x_end - x0)]
    return np.stack([np.stack(pair, axis=1) for pair in rows], axis=1).astype(np.float32)
