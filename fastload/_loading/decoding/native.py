"""The native backend: libjpeg-turbo region-of-interest + DCT-scaled decode, resize and flip in C.

JPEGs go to `fastload._jpeg.decode_crop_resize`, which decodes only the rows and columns the
sample's crop keeps and writes the resized, flipped pixels straight into the batch (a padded
crop's part inside the image, the rest filled by `padding`); other
formats (PNG, WebP, ...) and a missing extension go through the Pillow backend, with the same
geometry from the same random draws.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from types import ModuleType

import numpy as np

from fastload._encoded_bytes import JPEG_MAGIC
from fastload._loading.decoding.padding import Box, Padding, decode_padded
from fastload._loading.decoding.undecodable import sample_failure
from fastload._sample_random import SampleDraws
from fastload.transforms import MAX_SIDE, RandomSource, SampleGeometry, TransformPlan
from fastload.transforms._batch_geometry import sample_batch

# Pillow's Image.Resampling numbering, which the extension takes.
_FILTERS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}


class NativeBackend:
    """libjpeg-turbo for JPEGs, Pillow for the rest."""

    name = "native"

    def __init__(self, plan: TransformPlan, jpeg: ModuleType) -> None:
        self.plan = plan
        self._jpeg = jpeg
        self._filter = _FILTERS[plan.interpolation]
        self._padding = Padding.of(plan)  # a padded RandomCrop's fill (NOTE [padded crops])

    def decode_batch(
        self, blobs: Sequence[bytes | memoryview], rngs: Sequence[RandomSource], out: np.ndarray
    ) -> None:
        """Decode the batch; a task's `SampleDraws` get their geometry drawn a batch at a time
        (NOTE [per-batch geometry]), other random sources a sample at a time."""
        png_sizes = {i: size for i, blob in enumerate(blobs) if (size := png_size(blob)) is not None}
        headed = [i for i, blob in enumerate(blobs) if blob[:3] == JPEG_MAGIC or i in png_sizes]  # sizes read
        sizes = np.empty((len(headed), 2), np.int64)  # (width, height), as the header says
        for k, i in enumerate(headed):
            try:
                sizes[k] = png_sizes[i] if i in png_sizes else self._jpeg.jpeg_size(blobs[i])
            except Exception as e:
                raise sample_failure(i, blobs[i], e) from e
        geometry = None
        if isinstance(rngs, SampleDraws) and headed:
            geometry = sample_batch(self.plan, sizes[:, 1], sizes[:, 0], rngs.uniforms[headed])
        if geometry is None:
            for i, blob in enumerate(blobs):
                self._decode_one(i, blob, rngs[i], out)
            return
        boxes, clips, flips = geometry.boxes.tolist(), geometry.clips.tolist(), geometry.flips.tolist()
        heights, widths = geometry.out_heights.tolist(), geometry.out_widths.tolist()
        padded = geometry.needs_padding().tolist()
        rects = geometry.image_rects.tolist() if geometry.image_rects is not None else None
        decode, filter_ = self._jpeg.decode_crop_resize, self._filter
        k = 0
        for i, blob in enumerate(blobs):
            if k == len(headed) or headed[k] != i:
                self._decode_one(i, blob, rngs[i], out)
                continue
            try:
                if i in png_sizes:  # Pillow's decode, with the geometry drawn here
                    rect = tuple(rects[k]) if rects is not None else None
                    g = SampleGeometry(
                        boxes[k], heights[k], widths[k], flips[k], self.plan.interpolation, clips[k], rect
                    )
                    _pil_decode_with()(blob, g, self._padding, out[i])
                elif padded[k] and rects is not None and self._padding is not None:
                    self._decode_padded(self._padding, blob, boxes[k], clips[k], rects[k], flips[k], out[i])
                else:
                    decode(blob, boxes[k], out[i], heights[k], widths[k], flips[k], filter_, clips[k])
            except Exception as e:  # any decoder failure is reported against its sample, in words
                raise sample_failure(i, blob, e) from e
            k += 1

    def _decode_padded(
        self,
        padding: Padding,
        blob: bytes | memoryview,
        box: Box,
        clip: Box | None,
        rect: tuple[int, int, int, int],
        flip: bool,
        out: np.ndarray,
    ) -> None:
        """A JPEG whose output reaches past it: the part inside decoded, the rest filled."""

        def region(region_box: Box, dst: np.ndarray, region_flip: bool) -> None:
            height, width, filter_ = dst.shape[0], dst.shape[1], self._filter
            self._jpeg.decode_crop_resize(blob, region_box, dst, height, width, region_flip, filter_, clip)

        decode_padded(padding, box, clip, rect, flip, region, out)

    def _decode_one(self, i: int, blob: bytes | memoryview, rng: RandomSource, out: np.ndarray) -> None:
        """Sample i alone, its geometry drawn from `rng` by the plan's per-sample walk."""
        try:
            if blob[:3] != JPEG_MAGIC:
                _pil_decode_into()(blob, self.plan, rng, out[i])
                return
            width, height = self._jpeg.jpeg_size(blob)
            g = self.plan.sample(height, width, rng)
            if g.needs_padding and g.image_rect is not None and self._padding is not None:
                self._decode_padded(self._padding, blob, g.box, g.clip, g.image_rect, g.flip, out[i])
                return
            self._jpeg.decode_crop_resize(
                blob, g.box, out[i], g.out_height, g.out_width, g.flip, self._filter, g.clip
            )
        except Exception as e:  # any decoder failure is reported against its sample, in words
            raise sample_failure(i, blob, e) from e


# NOTE [per-batch geometry]: a task's crops are drawn for all its JPEGs (and PNGs, whose IHDR
# says their size; Pillow decodes them with the geometry drawn here) at once
# (`transforms._batch_geometry.sample_batch`: the same draws, the same boxes as the per-sample
# walk, tested sample for sample), after one pass reading their headers' sizes; what it cannot
# decide (a chain that could use more draws than a task has, a CenterCrop larger than an image)
# and other files go a sample at a time. The per-sample walk cost ~10 µs an image,
# ~1% of a worker's time beside the decode.


_Decode = Callable[[bytes | memoryview, TransformPlan, RandomSource, np.ndarray], SampleGeometry]
_DecodeWith = Callable[[bytes | memoryview, SampleGeometry, Padding | None, np.ndarray], None]
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(blob: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR (its first chunk, by the format), or None: not a PNG,
    or a header that does not say (Pillow then reads it, sample by sample)."""
    if len(blob) < 24 or bytes(blob[:8]) != _PNG_SIGNATURE or bytes(blob[12:16]) != b"IHDR":
        return None
    width, height = struct.unpack(">II", blob[16:24])
    return (width, height) if 0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE else None


def _pil_decode_into() -> _Decode:
    """Pillow's decoder for non-JPEG files, with an error that says what to install."""
    return _pil().decode_into  # type: ignore[no-any-return]


def _pil_decode_with() -> _DecodeWith:
    """Pillow's decoder for PNGs whose geometry was drawn with the batch's."""
    return _pil().decode_with  # type: ignore[no-any-return]


def _pil() -> ModuleType:
    try:
        from fastload._loading.decoding import pil
    except ImportError as e:
        raise RuntimeError(
            "this image is not a JPEG, and decoding other formats needs Pillow: "
            "`pip install pillow` (or pillow-simd)"
        ) from e
    return pil
