"""The native backend: libjpeg-turbo region-of-interest + DCT-scaled decode, resize and flip in C.

JPEGs go to `fastload._jpeg.decode_crop_resize`, which decodes only the rows and columns the
sample's crop keeps and writes the resized, flipped pixels straight into the batch; other
formats (PNG, WebP, ...) and a missing extension go through the Pillow backend, with the same
geometry from the same random draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import numpy as np

from fastload._loading.backends import SampleFailure
from fastload.transforms import RandomSource, SampleGeometry, TransformPlan

_JPEG_MAGIC = b"\xff\xd8\xff"
# Pillow's Image.Resampling numbering, which the extension takes.
_FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


class NativeBackend:
    """libjpeg-turbo for JPEGs, Pillow for the rest."""

    name = "native"

    def __init__(self, plan: TransformPlan, jpeg: ModuleType) -> None:
        self.plan = plan
        self._jpeg = jpeg
        self._filter = _FILTERS[plan.interpolation]

    def decode_batch(
        self, blobs: Sequence[bytes | memoryview], rngs: Sequence[RandomSource], out: np.ndarray
    ) -> None:
        jpeg = self._jpeg
        for i, (blob, rng) in enumerate(zip(blobs, rngs, strict=True)):
            try:
                if blob[:3] != _JPEG_MAGIC:
                    _pil_decode_into()(blob, self.plan, rng, out[i])
                    continue
                width, height = jpeg.jpeg_size(blob)
                g = self.plan.sample(height, width, rng)
                jpeg.decode_crop_resize(
                    blob, g.box, out[i], g.out_height, g.out_width, g.flip, self._filter, g.clip
                )
            except Exception as e:  # any decoder failure is reported against its sample
                raise SampleFailure(i, f"{type(e).__name__}: {e}") from e


_Decode = Callable[[bytes | memoryview, TransformPlan, RandomSource, np.ndarray], SampleGeometry]


def _pil_decode_into() -> _Decode:
    """Pillow's decoder for non-JPEG files, with an error that says what to install."""
    try:
        from fastload._loading.backends.pil import decode_into
    except ImportError as e:
        raise RuntimeError(
            "this image is not a JPEG, and decoding other formats needs Pillow: "
            "`pip install pillow` (or pillow-simd)"
        ) from e
    return decode_into
