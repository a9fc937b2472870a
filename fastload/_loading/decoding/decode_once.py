"""`DecodeOnce`: the views of a `Views(..., decode="once")` from one full-size decode per image —
each view's RandomResizedCrop box (drawn as the per-view decode draws it) cropped from the decoded
pixels and resized by torch (antialiased, as torchvision v2 resizes tensors), then flipped. Cheaper
than a fused decode per view when there are many views (NOTE [views] in `fastload.transforms._views`),
but its pixels are not those of the views' chains alone (full-resolution crops resized by torch,
not the native decoder's DCT-scaled decode and resampler).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch

from fastload._encoded_bytes import JPEG_MAGIC
from fastload._loading.decoding.undecodable import sample_failure
from fastload._native_jpeg import native_jpeg
from fastload.transforms import RandomSource, TransformPlan

_MODES = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest"}


class DecodeOnce:
    """Decodes each image once and crops every view's region from it (`plans`: one per view); JPEGs
    with the native decoder when `native` (backend="native") and it is built, else Pillow."""

    def __init__(self, plans: Sequence[TransformPlan], native: bool = True) -> None:
        self._plans = tuple(plans)
        self._jpeg = native_jpeg() if native else None

    def decode_views(
        self,
        blobs: Sequence[bytes | memoryview],
        rngs: Sequence[Sequence[RandomSource]],
        outs: Sequence[np.ndarray],
    ) -> None:
        """Sample i's view v into `outs[v][i]` (HWC uint8), its geometry drawn from `rngs[v][i]`;
        a sample that cannot be decoded raises `SampleFailure` naming its position."""
        for i, blob in enumerate(blobs):
            try:
                image = torch.from_numpy(self._decode(blob)).permute(2, 0, 1).unsqueeze(0)
            except Exception as e:  # any decoder failure is reported against its sample, in words
                raise sample_failure(i, blob, e) from e
            height, width = image.shape[2], image.shape[3]
            for plan, draws, out in zip(self._plans, rngs, outs, strict=True):
                g = plan.sample(height, width, draws[i])
                left, top, right, bottom = (int(round(v)) for v in g.box)
                left, top = min(max(left, 0), width - 1), min(max(top, 0), height - 1)
                right, bottom = max(min(right, width), left + 1), max(min(bottom, height), top + 1)
                crop = image[:, :, top:bottom, left:right]
                mode = _MODES[plan.interpolation]
                size = (g.out_height, g.out_width)
                resized = torch.nn.functional.interpolate(crop, size, mode=mode, antialias=mode != "nearest")
                if g.flip:
                    resized = resized.flip(-1)
                out[i] = resized[0].permute(1, 2, 0).numpy()

    def _decode(self, blob: bytes | memoryview) -> np.ndarray:
        """The whole image, (H, W, 3) uint8: the native decoder for a JPEG, else Pillow."""
        if self._jpeg is not None and blob[:3] == JPEG_MAGIC:
            width, height = self._jpeg.jpeg_size(blob)
            image = np.empty((height, width, 3), np.uint8)
            whole = (0.0, 0.0, float(width), float(height))
            self._jpeg.decode_crop_resize(blob, whole, image, height, width, False, 2)
            return image
        from PIL import Image

        with Image.open(io.BytesIO(blob)) as img:
            return np.array(img.convert("RGB"))  # a writable copy (torch will not wrap a read-only one)
