"""A padded crop's pixels: the part of a sample's output inside its image decoded into place, the
rest filled (NOTE [padded crops] in `transforms._plan`), for every CPU backend alike.

A backend hands `decode_padded` a `RegionDecoder`: its own decode of a source box, resampled to a
given size, into a C-contiguous array. The output's padding is then filled per mode, with numpy
slices and one gather, never a Python loop over pixels:
- "constant": the part inside the image is decoded (into its rows of the output directly when it
  spans whole rows, else into a small scratch copied in), the four borders set to the fill;
- "edge", "reflect", "symmetric": each output row and column is folded back into the image
  (torchvision's, and numpy's `pad`, arithmetic), the pixels those reach decoded once into a
  scratch, and the output gathered from it, mirrored for a flip.
Only the pixels inside the image are ever decoded; a crop lying wholly in the padding decodes none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fastload.transforms import TransformPlan
from fastload.transforms._policies import fill_values

Box = tuple[float, float, float, float]
RegionDecoder = Callable[[Box, np.ndarray, bool], None]
"""`decode(box, out, flip)`: resample the source box (left, top, right, bottom) to `out`'s
(height, width), mirrored when `flip`, into `out` ((h, w, 3) uint8, C-contiguous)."""


@dataclass(frozen=True)
class Padding:
    """How a plan's padded RandomCrop fills: `mode` and `fill`, (3,) uint8 (truncated, as
    torchvision casts a fill to the image's dtype)."""

    mode: str
    fill: np.ndarray

    @classmethod
    def of(cls, plan: TransformPlan) -> Padding | None:
        """The plan's padding, or None when no crop of it may reach past the image."""
        crop = plan.padded_crop
        return None if crop is None else _padding(crop.padding_mode, crop.fill)


@functools.lru_cache(maxsize=16)
def _padding(mode: str, fill: float | tuple[float, ...]) -> Padding:
    return Padding(mode, np.trunc(np.array(fill_values(fill))).astype(np.uint8))


def decode_padded(
    padding: Padding,
    box: Box,
    clip: Box | None,
    image_rect: tuple[int, int, int, int],
    flip: bool,
    decode: RegionDecoder,
    out: np.ndarray,
) -> None:
    """Fill `out` (H, W, 3): `box` is the source box of the whole output (it reaches past the image),
    `clip` the pixels the filter may read (None: all), `image_rect` where the image lies in the
    output before the flip (`SampleGeometry.image_rect`)."""
    height, width = out.shape[0], out.shape[1]
    left, top, right, bottom = box
    sx, sy = (right - left) / width, (bottom - top) / height

    def decode_part(x0: int, y0: int, x1: int, y1: int, dst: np.ndarray, mirrored: bool) -> None:
        """The output's pixels [x0, x1) x [y0, y1) (before the flip) into `dst`, kept inside
        `clip` (a resized image's box may overshoot it by a rounding)."""
        x_low, y_low, x_high, y_high = clip or (-np.inf, -np.inf, np.inf, np.inf)
        part_left, part_top = max(left + x0 * sx, x_low), max(top + y0 * sy, y_low)
        decode((part_left, part_top, min(left + x1 * sx, x_high), min(top + y1 * sy, y_high)), dst, mirrored)

    if padding.mode == "constant":
        _constant(padding.fill, image_rect, flip, decode_part, out)
    else:
        _folded(padding.mode, image_rect, flip, decode_part, out)


_PartDecoder = Callable[[int, int, int, int, np.ndarray, bool], None]


def _constant(
    fill: np.ndarray, rect: tuple[int, int, int, int], flip: bool, decode_part: _PartDecoder, out: np.ndarray
) -> None:
    height, width = out.shape[0], out.shape[1]
    x0, y0 = min(max(rect[0], 0), width), min(max(rect[1], 0), height)
    x1, y1 = max(min(rect[2], width), x0), max(min(rect[3], height), y0)
    px0, px1 = (width - x1, width - x0) if flip else (x0, x1)  # where the image lands in the output
    out[:y0] = fill
    out[y1:] = fill
    out[y0:y1, :px0] = fill
    out[y0:y1, px1:] = fill
    if x1 == x0 or y1 == y0:
        return  # the crop lies wholly in the padding
    if px0 == 0 and px1 == width:  # whole rows: contiguous, decoded in place
        decode_part(x0, y0, x1, y1, out[y0:y1], flip)
        return
    inside = np.empty((y1 - y0, x1 - x0, 3), np.uint8)
    decode_part(x0, y0, x1, y1, inside, flip)
    out[y0:y1, px0:px1] = inside


def fold(positions: np.ndarray, size: int, mode: str) -> np.ndarray:
    """Positions along an axis (pixels of an image of `size` pixels, any integers) folded into
    [0, size) as `mode` pads: "edge", "reflect" (mirrored without the border pixel) or
    "symmetric" (with it); repeated, as numpy's `pad`, for pads longer than the image."""
    folded: np.ndarray
    if mode == "edge" or (mode == "reflect" and size == 1):
        folded = np.clip(positions, 0, size - 1)
    elif mode == "reflect":
        period = 2 * (size - 1)
        folded = np.abs(positions) % period
        folded = np.where(folded >= size, period - folded, folded)
    elif mode == "symmetric":
        folded = positions % (2 * size)
        folded = np.where(folded >= size, 2 * size - 1 - folded, folded)
    else:
        raise ValueError(f"no padding mode {mode!r}")
    return folded


def _folded(
    mode: str, rect: tuple[int, int, int, int], flip: bool, decode_part: _PartDecoder, out: np.ndarray
) -> None:
    height, width = out.shape[0], out.shape[1]
    cols = fold(np.arange(width) - rect[0], rect[2] - rect[0], mode)
    rows = fold(np.arange(height) - rect[1], rect[3] - rect[1], mode)
    c0, c1, r0, r1 = int(cols.min()), int(cols.max()) + 1, int(rows.min()), int(rows.max()) + 1
    reached = np.empty((r1 - r0, c1 - c0, 3), np.uint8)
    decode_part(rect[0] + c0, rect[1] + r0, rect[0] + c1, rect[1] + r1, reached, False)
    if flip:
        cols = cols[::-1]
    np.take(np.take(reached, rows - r0, axis=0), cols - c0, axis=1, out=out)
