"""Decode+augment with Pillow: JPEG draft (DCT-scaled) decode, one resample of the crop box, flip.

Pillow's `draft()` lets libjpeg scale by 1/2, 1/4 or 1/8 while decoding; the scale is chosen so
the crop box still has at least as many pixels as the output, so quality is kept. The crop and the
resize are one `Image.resize(box=...)` call (what torchvision's crop-then-resize computes), so no
intermediate crop is materialised.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

from fastload._backends import SampleFailure
from fastload.transforms import SampleGeometry, TransformPlan

_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def decode_into(
    blob: bytes, plan: TransformPlan, rng: np.random.Generator, out: np.ndarray, draft: bool = True
) -> SampleGeometry:
    """Decode one encoded image, apply `plan` with `rng`, write HWC uint8 into `out`."""
    with Image.open(io.BytesIO(blob)) as img:
        width, height = img.size
        geometry = plan.sample(height, width, rng)
        left, top, right, bottom = geometry.box
        if draft and img.format == "JPEG":
            wanted = (
                math.ceil(width * geometry.out_width / (right - left)),
                math.ceil(height * geometry.out_height / (bottom - top)),
            )
            img.draft("RGB", wanted)
            sx, sy = img.size[0] / width, img.size[1] / height
            left, top, right, bottom = left * sx, top * sy, right * sx, bottom * sy
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        resized = rgb.resize(
            (geometry.out_width, geometry.out_height),
            _FILTERS[geometry.interpolation],
            box=(left, top, right, bottom),
        )
    if geometry.flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out[...] = np.asarray(resized)
    return geometry


class PilBackend:
    """The Pillow backend (pillow-simd when installed)."""

    name = "pil"

    def __init__(self, plan: TransformPlan) -> None:
        self.plan = plan

    def decode_batch(
        self, blobs: Sequence[bytes], rngs: Sequence[np.random.Generator], out: np.ndarray
    ) -> None:
        for i, (blob, rng) in enumerate(zip(blobs, rngs, strict=True)):
            try:
                decode_into(blob, self.plan, rng, out[i])
            except Exception as e:  # any decoder failure is reported against its sample
                raise SampleFailure(i, f"{type(e).__name__}: {e}") from e
