"""The native backend: libjpeg-turbo region-of-interest + DCT-scaled decode, resize and flip in C.

JPEGs go to `fastload._jpeg.decode_crop_resize`, which decodes only the rows and columns the
sample's crop keeps and writes the resized, flipped pixels straight into the batch (a padded
crop's part inside the image, the rest filled by `padding`); other
formats (PNG, WebP, ...) and a missing extension go through the Pillow backend, with the same
geometry from the same random draws.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import numpy as np

from fastload._encoded_bytes import JPEG_MAGIC
from fastload._loading.decoding.padding import Box, Padding, decode_padded
from fastload._loading.decoding.undecodable import sample_failure
from fastload._sample_random import SampleDraws
from fastload.transforms import RandomSource, SampleGeometry, TransformPlan
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
        jpegs = [i for i, blob in enumerate(blobs) if blob[:3] == JPEG_MAGIC]
        sizes = np.empty((len(jpegs), 2), np.int64)  # (width, height), as the header says
        for k, i in enumerate(jpegs):
            try:
                sizes[k] = self._jpeg.jpeg_size(blobs[i])
            except Exception as e:
                raise sample_failure(i, blobs[i], e) from e
        geometry = None
        if isinstance(rngs, SampleDraws) and jpegs:
            geometry = sample_batch(self.plan, sizes[:, 1], sizes[:, 0], rngs.uniforms[jpegs])
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
            if k == len(jpegs) or jpegs[k] != i:
                self._decode_one(i, blob, rngs[i], out)
                continue
            try:
                if padded[k] and rects is not None:
                    self._decode_padded(blob, boxes[k], clips[k], rects[k], flips[k], out[i])
                else:
                    decode(blob, boxes[k], out[i], heights[k], widths[k], flips[k], filter_, clips[k])
            except Exception as e:  # any decoder failure is reported against its sample, in words
                raise sample_failure(i, blob, e) from e
            k += 1

    def _decode_padded(
        self,
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

        if self._padding is not None:
            decode_padded(self._padding, box, clip, rect, flip, region, out)

    def _decode_one(self, i: int, blob: bytes | memoryview, rng: RandomSource, out: np.ndarray) -> None:
        """Sample i alone, its geometry drawn from `rng` by the plan's per-sample walk."""
        try:
            if blob[:3] != JPEG_MAGIC:
                _pil_decode_into()(blob, self.plan, rng, out[i])
                return
            width, height = self._jpeg.jpeg_size(blob)
            g = self.plan.sample(height, width, rng)
            if g.needs_padding and g.image_rect is not None:
                self._decode_padded(blob, g.box, g.clip, g.image_rect, g.flip, out[i])
                return
            self._jpeg.decode_crop_resize(
                blob, g.box, out[i], g.out_height, g.out_width, g.flip, self._filter, g.clip
            )
        except Exception as e:  # any decoder failure is reported against its sample, in words
            raise sample_failure(i, blob, e) from e


# NOTE [per-batch geometry]: a task's crops are drawn for all its JPEGs at once
# (`transforms._batch_geometry.sample_batch`: the same draws, the same boxes as the per-sample
# walk, tested sample for sample), after one pass reading their headers' sizes; what it cannot
# decide (a chain that could use more draws than a task has, a CenterCrop larger than an image)
# and files that are not JPEGs go a sample at a time. The per-sample walk cost ~10 µs an image,
# ~1% of a worker's time beside the decode.


_Decode = Callable[[bytes | memoryview, TransformPlan, RandomSource, np.ndarray], SampleGeometry]


def _pil_decode_into() -> _Decode:
    """Pillow's decoder for non-JPEG files, with an error that says what to install."""
    try:
        from fastload._loading.decoding.pil import decode_into
    except ImportError as e:
        raise RuntimeError(
            "this image is not a JPEG, and decoding other formats needs Pillow: "
            "`pip install pillow` (or pillow-simd)"
        ) from e
    return decode_into
