"""Decode+augment with Pillow: decode (whole, or DCT-scaled with `draft`), one resample of the
crop box, flip; a padded crop's padding filled around it (`padding`, not drafted).

The resize is one `Image.resize(box=...)` call; the image is first cut to `SampleGeometry.clip`
(for a RandomResizedCrop, its crop), because the filter must not read past it: with draft off this
is exactly torchvision's crop-then-resize on a PIL image, edges included.

NOTE [Pillow's pixels]: `backend="pil"` exists to give a Pillow pipeline's pixels, so it decodes
JPEGs whole (`draft=False`): bit-exact with torchvision's RandomResizedCrop on PIL images, within
a level of its Resize + CenterCrop (the fractional centre box, rounded), tested in
tests/test_torchvision_compat.py. With `draft()` (the fallback where the native extension is not
built, which is for speed as native is), libjpeg scales by 1/2, 1/4 or 1/8 while decoding, the
scale chosen so the crop box keeps at least the output's pixels: much faster on large images, but
the reduced decode is a different image (measured: 0.12-0.13 levels mean, 20-27 worst, as native).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

from fastload._loading.decoding.padding import Box, Padding, decode_padded
from fastload._loading.decoding.undecodable import sample_failure
from fastload.transforms import RandomSource, SampleGeometry, TransformPlan

_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


def decode_into(
    blob: bytes | memoryview, plan: TransformPlan, rng: RandomSource, out: np.ndarray, draft: bool = True
) -> SampleGeometry:
    """Decode one encoded image, apply `plan` with `rng`, write HWC uint8 into `out`."""
    with Image.open(io.BytesIO(blob)) as img:
        width, height = img.size
        geometry = plan.sample(height, width, rng)
        padding = Padding.of(plan) if geometry.needs_padding else None
        _apply(img, geometry, padding, out, draft)
    return geometry


def decode_with(
    blob: bytes | memoryview, geometry: SampleGeometry, padding: Padding | None, out: np.ndarray
) -> None:
    """Decode one encoded image (not a JPEG: nothing drafted) with the `geometry` drawn for it
    (the native backend's per-batch path, NOTE [per-batch geometry]), write HWC uint8 into `out`."""
    with Image.open(io.BytesIO(blob)) as img:
        _apply(img, geometry, padding if geometry.needs_padding else None, out, draft=False)


def _apply(
    img: Image.Image, geometry: SampleGeometry, padding: Padding | None, out: np.ndarray, draft: bool
) -> None:
    """`geometry` on the opened `img` into `out`: its padding filled around it when `padding`."""
    if padding is not None and geometry.image_rect is not None:  # NOTE [padded crops]
        clip = geometry.clip

        def region(box: Box, dst: np.ndarray, flip: bool) -> None:
            if not _copy_into(img, box, flip, dst):
                _resample_into(img, box, clip, geometry.interpolation, flip, dst)

        decode_padded(padding, geometry.box, clip, geometry.image_rect, geometry.flip, region, out)
        return
    width, height = img.size
    left, top, right, bottom = geometry.box
    clip = geometry.clip or (0.0, 0.0, float(width), float(height))
    if draft and img.format == "JPEG":
        wanted = (
            math.ceil(width * geometry.out_width / (right - left)),
            math.ceil(height * geometry.out_height / (bottom - top)),
        )
        img.draft("RGB", wanted)
        sx, sy = img.size[0] / width, img.size[1] / height
        left, top, right, bottom = left * sx, top * sy, right * sx, bottom * sy
        clip = (clip[0] * sx, clip[1] * sy, clip[2] * sx, clip[3] * sy)
    _resample_into(img, (left, top, right, bottom), clip, geometry.interpolation, geometry.flip, out)


def _copy_into(img: Image.Image, box: Box, flip: bool, out: np.ndarray) -> bool:
    """Copy `box` into `out` when it is whole pixels of `out`'s size (a crop of the source, as
    the CIFAR recipe's: every filter at scale 1 on whole pixels is a copy); False otherwise."""
    whole = tuple(round(v) for v in box)
    if any(abs(v - w) > 1e-9 for v, w in zip(box, whole, strict=True)):
        return False
    x0, y0, x1, y1 = whole
    if (y1 - y0, x1 - x0) != out.shape[:2]:
        return False
    small = img.size[0] * img.size[1] <= 4 * out.shape[0] * out.shape[1]  # whole, then sliced
    part = img if small or (x0, y0, x1, y1) == (0, 0, *img.size) else img.crop((x0, y0, x1, y1))
    pixels = np.asarray(part if part.mode == "RGB" else part.convert("RGB"))
    if part is img:
        pixels = pixels[y0:y1, x0:x1]
    out[...] = pixels[:, ::-1] if flip else pixels
    return True


def _resample_into(
    img: Image.Image, box: Box, clip: Box | None, interpolation: str, flip: bool, out: np.ndarray
) -> None:
    """Resample `box` of `img` to `out`'s size (the filter reading only inside `clip`), mirrored
    when `flip`, into `out` (h, w, 3)."""
    left, top, right, bottom = box
    clip = clip or (0.0, 0.0, float(img.size[0]), float(img.size[1]))
    # The filter must not read past `clip` (torchvision crops, then resizes): crop to it first.
    x0, y0 = max(0, math.floor(clip[0] + 1e-6)), max(0, math.floor(clip[1] + 1e-6))
    x1 = min(img.size[0], math.ceil(clip[2] - 1e-6))
    y1 = min(img.size[1], math.ceil(clip[3] - 1e-6))
    src: Image.Image = img
    if (x0, y0, x1, y1) != (0, 0, *img.size):
        src = img.crop((x0, y0, x1, y1))
        left, top, right, bottom = left - x0, top - y0, right - x0, bottom - y0
    rgb = src if src.mode == "RGB" else src.convert("RGB")
    size = (out.shape[1], out.shape[0])
    resized = rgb.resize(size, _FILTERS[interpolation], box=(left, top, right, bottom))
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out[...] = np.asarray(resized)


class PilBackend:
    """The Pillow backend (pillow-simd when installed)."""

    name = "pil"

    def __init__(self, plan: TransformPlan, draft: bool = False) -> None:
        self.plan = plan
        self.draft = draft  # DCT-scaled JPEG decoding (NOTE [Pillow's pixels])

    def decode_batch(
        self, blobs: Sequence[bytes | memoryview], rngs: Sequence[RandomSource], out: np.ndarray
    ) -> None:
        for i, (blob, rng) in enumerate(zip(blobs, rngs, strict=True)):
            try:
                decode_into(blob, self.plan, rng, out[i], self.draft)
            except Exception as e:  # any decoder failure is reported against its sample, in words
                raise sample_failure(i, blob, e) from e
