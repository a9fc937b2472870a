"""The decode+augment seam: one small interface, one implementation per backend.

A backend turns a batch of encoded images into uint8 NHWC pixels written straight into the
batch's place in a ring slot, following a compiled `TransformPlan`. `native` (the default) is the
libjpeg-turbo extension built from native/, falling back to Pillow in JPEG draft mode where the
extension is not built; `pil` is Pillow decoding JPEGs whole (torchvision's pixels on PIL images);
`dali` (NVIDIA DALI's CPU operators, an optional extra) does the same geometry, drawn by the same
plan, in a DALI pipeline. `nvjpeg` (torchvision's GPU decoder)
decodes only on the GPU, in the trainer's process (`dali_executor`): no worker runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fastload._errors import ConfigError
from fastload._loading.decoding.boxes import refuse_padding
from fastload._loading.decoding.undecodable import SampleFailure
from fastload.transforms import RandomSource, TransformPlan

__all__ = ["BACKENDS", "ImageBackend", "SampleFailure", "make_backend"]

BACKENDS = ("native", "pil", "dali", "nvjpeg")


class ImageBackend(Protocol):
    """Decodes and augments a batch of encoded images into `out` (B, H, W, 3) uint8."""

    name: str

    def decode_batch(
        self, blobs: Sequence[bytes | memoryview], rngs: Sequence[RandomSource], out: np.ndarray
    ) -> None:
        """Fill `out[i]` from `blobs[i]` with `rngs[i]`; raise SampleFailure naming the position."""
        ...


def make_backend(name: str, plan: TransformPlan) -> ImageBackend:
    """Return the backend called `name`, configured with `plan`."""
    draft = False  # backend="pil": torchvision's pixels on PIL images (NOTE [Pillow's pixels])
    if name == "native":
        from fastload._native_jpeg import native_jpeg

        jpeg = native_jpeg()
        if jpeg is not None:
            from fastload._loading.decoding.native import NativeBackend

            return NativeBackend(plan, jpeg)
        name, draft = "pil", True  # the fallback is for speed, as native: DCT-scaled decoding
    if name == "pil":
        try:
            from fastload._loading.decoding.pil import PilBackend
        except ImportError as e:
            raise ConfigError(
                "the Pillow backend needs PIL: `pip install pillow` (or pillow-simd); for JPEGs, "
                "building fastload with libjpeg-turbo's headers gives the faster native backend"
            ) from e

        return PilBackend(plan, draft=draft)
    if name == "dali":
        refuse_padding(plan, "backend='dali'")
        try:
            from fastload._loading.decoding.dali import DaliBackend
        except ImportError as e:
            raise ConfigError(
                f"backend='dali' needs NVIDIA DALI, which could not be imported ({e}): "
                "`pip install fastload[dali]` (or `pip install nvidia-dali-cuda120`), or use "
                "backend='native'"
            ) from e
        from fastload._native_jpeg import built_native_jpeg

        return DaliBackend(plan, built_native_jpeg())
    if name == "nvjpeg":
        raise ConfigError(
            "backend='nvjpeg' decodes on the GPU, in the training process (device='cuda', no daemon): "
            "worker processes cannot run it; use backend='native' or 'dali' for CPU workers and daemons"
        )
    raise ConfigError(f"backend {name!r} is not one of {', '.join(BACKENDS)}")
