"""A task's geometry in one vectorized pass: `TransformPlan.sample` for every sample at once.

`TransformPlan.sample` walks the chain for one sample in Python (~10 µs, beside a ~1 ms decode:
a per-sample cost the workers pay on every image). `sample_batch` does the same arithmetic on
numpy arrays over the whole task, drawing from the same per-sample uniforms in the same order,
so every box, clip and flip is the one the per-sample walk gives (tested against it, sample for
sample). A draw is consumed per sample at that sample's own position (a RandomResizedCrop that
found its box on the third try used six uniforms, one that fell back twenty), so each sample
keeps a cursor into its row.

It returns None (the caller walks sample by sample) when the chain could read past the uniforms
a task has per sample, where `SampleRandom` goes on from a slower generator, and when a
CenterCrop or RandomCrop is larger than some (padded) image, where the per-sample walk raises
the error naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fastload._sample_random import uniform_integers
from fastload.transforms._base import pair
from fastload.transforms._geometric import (
    CenterCrop,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    shorter_edge,
)
from fastload.transforms._plan import TransformPlan

_RRC_TRIES = 10  # torchvision's RandomResizedCrop tries ten boxes before its central fallback


@dataclass(frozen=True)
class BatchGeometry:
    """What each sample's chain does to its source image (`SampleGeometry`, a row a sample).

    `boxes` and `clips` are (n, 4) float64 (left, top, right, bottom) in source pixels; `flips`
    (n,) bool; `out_heights`/`out_widths` (n,) int64; `image_rects` (n, 4) int64, or None when
    the chain has no padded RandomCrop (`SampleGeometry.image_rect`).
    """

    boxes: np.ndarray
    clips: np.ndarray
    flips: np.ndarray
    out_heights: np.ndarray
    out_widths: np.ndarray
    image_rects: np.ndarray | None = None

    def needs_padding(self) -> np.ndarray:
        """(n,) bool: the samples whose output reaches past their image (`SampleGeometry.needs_padding`)."""
        if self.image_rects is None:
            return np.zeros(len(self.flips), bool)
        r = self.image_rects
        inside = (r[:, 0] <= 0) & (r[:, 1] <= 0)
        return ~(inside & (r[:, 2] >= self.out_widths) & (r[:, 3] >= self.out_heights))


def most_draws(plan: TransformPlan) -> int:
    """The most uniforms the plan's geometry can use for one sample."""
    # A RandomResizedCrop: two a try, and two more for the box's place when a try fits.
    costs = {RandomHorizontalFlip: 1, RandomResizedCrop: 2 * _RRC_TRIES + 2, RandomCrop: 2}
    return sum(costs.get(type(t), 0) for t in plan.geometry)


def sample_batch(
    plan: TransformPlan, heights: np.ndarray, widths: np.ndarray, uniforms: np.ndarray
) -> BatchGeometry | None:
    """The geometry of source images `heights` x `widths` (n,), sample i drawing from row i of
    `uniforms` (n, draws) as `plan.sample` draws from a `SampleRandom` over the same row; None
    where the per-sample walk must decide (see the module docstring)."""
    n = len(heights)
    if most_draws(plan) > uniforms.shape[1]:
        return None
    rows = np.arange(n)
    cursor = np.zeros(n, np.int64)
    cur_h, cur_w = heights.astype(np.int64), widths.astype(np.int64)
    left, top = np.zeros(n), np.zeros(n)
    box_w, box_h = cur_w.astype(np.float64), cur_h.astype(np.float64)
    flip = np.zeros(n, bool)
    clip = np.stack([left, top, box_w, box_h], axis=1)
    image_rects: np.ndarray | None = None
    for t in plan.geometry:
        if isinstance(t, RandomHorizontalFlip):
            flip ^= uniforms[rows, cursor] < t.p
            cursor += 1
            continue
        if isinstance(t, Resize):
            cur_h, cur_w = _resized(t, cur_h, cur_w)
            clip = np.stack([left, top, left + box_w, top + box_h], axis=1)
            continue
        if isinstance(t, RandomResizedCrop):
            ct, cl, ch, cw, used = _random_resized_crop(t, cur_h, cur_w, uniforms, cursor)
            cursor += used
            new_h, new_w = pair(t.size, "RandomResizedCrop")
        elif isinstance(t, RandomCrop):
            drawn = _random_crop(t, cur_h, cur_w, uniforms, cursor)
            if drawn is None:
                return None  # the per-sample walk raises, naming the size
            ct, cl = drawn
            cursor += 2
            new_h, new_w = pair(t.size, "RandomCrop")
            ch, cw = np.full(n, new_h, np.int64), np.full(n, new_w, np.int64)
        elif isinstance(t, CenterCrop):
            crop_h, crop_w = pair(t.size, "CenterCrop")
            if bool(np.any((cur_h < crop_h) | (cur_w < crop_w))):
                return None  # the per-sample walk raises, naming the size
            ct = np.rint((cur_h - crop_h) / 2.0).astype(np.int64)
            cl = np.rint((cur_w - crop_w) / 2.0).astype(np.int64)
            ch, cw = np.full(n, crop_h, np.int64), np.full(n, crop_w, np.int64)
            new_h, new_w = crop_h, crop_w
        else:
            raise AssertionError(f"{t!r} is not a geometric transform")
        sx, sy = box_w / cur_w, box_h / cur_h
        cl = np.where(flip, cur_w - cl - cw, cl)
        if isinstance(t, RandomCrop) and t.pads_image:  # NOTE [padded crops]
            image_rects = np.stack([-cl, -ct, cur_w - cl, cur_h - ct], axis=1)
        elif image_rects is not None:  # a crop of the padded crop
            image_rects = image_rects - np.stack([cl, ct, cl, ct], axis=1)
        left, top = left + cl * sx, top + ct * sy
        box_w, box_h = cw * sx, ch * sy
        cur_h, cur_w = np.full(n, new_h, np.int64), np.full(n, new_w, np.int64)
        if isinstance(t, RandomResizedCrop):
            clip = np.stack([left, top, left + box_w, top + box_h], axis=1)
    boxes = np.stack([left, top, left + box_w, top + box_h], axis=1)
    return BatchGeometry(boxes, clip, flip, cur_h, cur_w, image_rects)


def _random_crop(
    t: RandomCrop, height: np.ndarray, width: np.ndarray, uniforms: np.ndarray, cursor: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """`RandomCrop.sample_box` for every sample: (top, left), or None where a crop does not fit."""
    pad_left, pad_top, pad_right, pad_bottom = t.pads()
    crop_h, crop_w = pair(t.size, "RandomCrop")
    padded_h, padded_w = height + pad_top + pad_bottom, width + pad_left + pad_right
    top_pad, left_pad = np.full(len(height), pad_top, np.int64), np.full(len(height), pad_left, np.int64)
    if t.pad_if_needed:
        lack_h, lack_w = np.maximum(crop_h - padded_h, 0), np.maximum(crop_w - padded_w, 0)
        top_pad, left_pad = top_pad + lack_h, left_pad + lack_w
        padded_h, padded_w = padded_h + 2 * lack_h, padded_w + 2 * lack_w
    if bool(np.any((padded_h < crop_h) | (padded_w < crop_w))):
        return None
    rows = np.arange(len(height))
    top = uniform_integers(uniforms[rows, cursor], padded_h - crop_h + 1) - top_pad
    left = uniform_integers(uniforms[rows, cursor + 1], padded_w - crop_w + 1) - left_pad
    return top, left


def _resized(t: Resize, height: np.ndarray, width: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`Resize.output_size`, element-wise (the same integer and float steps)."""
    edge = shorter_edge(t.size)
    if edge is None:
        h, w = pair(t.size, "Resize")
        return np.full(len(height), h, np.int64), np.full(len(height), w, np.int64)
    portrait = height <= width
    short, long = np.where(portrait, height, width), np.where(portrait, width, height)
    new_short = np.full(len(height), edge, np.int64)
    new_long = ((edge * long) / short).astype(np.int64)
    if t.max_size is not None:
        over = new_long > t.max_size
        new_short = np.where(over, ((t.max_size * new_short) / new_long).astype(np.int64), new_short)
        new_long = np.where(over, t.max_size, new_long)
    return np.where(portrait, new_short, new_long), np.where(portrait, new_long, new_short)


def _random_resized_crop(
    t: RandomResizedCrop, height: np.ndarray, width: np.ndarray, uniforms: np.ndarray, cursor: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`RandomResizedCrop.sample_box` for every sample: (top, left, height, width, draws used)."""
    n = len(height)
    rows = np.arange(n)[:, None]
    tries = cursor[:, None] + 2 * np.arange(_RRC_TRIES)
    scale_u, ratio_u = uniforms[rows, tries], uniforms[rows, tries + 1]
    area = (height * width).astype(np.float64)[:, None]
    target_area = area * (t.scale[0] + (t.scale[1] - t.scale[0]) * scale_u)
    log_lo, log_hi = math.log(t.ratio[0]), math.log(t.ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * ratio_u)
    w = np.rint(np.sqrt(target_area * aspect)).astype(np.int64)
    h = np.rint(np.sqrt(target_area / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= width[:, None]) & (h > 0) & (h <= height[:, None])
    found = fits.any(axis=1)
    first = np.argmax(fits, axis=1)
    crop_w, crop_h = w[rows[:, 0], first], h[rows[:, 0], first]
    place = cursor + 2 * first + 2
    # `SampleRandom.integers(0, high)` per sample; high < 1 only where no try fit (then unused).
    top_u = uniforms[rows[:, 0], np.minimum(place, uniforms.shape[1] - 1)]
    left_u = uniforms[rows[:, 0], np.minimum(place + 1, uniforms.shape[1] - 1)]
    top = uniform_integers(top_u, np.maximum(height - crop_h + 1, 1))
    left = uniform_integers(left_u, np.maximum(width - crop_w + 1, 1))
    used = np.where(found, 2 * first + 4, 2 * _RRC_TRIES)
    if not bool(found.all()):
        fb_top, fb_left, fb_h, fb_w = _central_fallback(t, height, width)
        top, left = np.where(found, top, fb_top), np.where(found, left, fb_left)
        crop_h, crop_w = np.where(found, crop_h, fb_h), np.where(found, crop_w, fb_w)
    return top, left, crop_h, crop_w, used


def _central_fallback(
    t: RandomResizedCrop, height: np.ndarray, width: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The central crop RandomResizedCrop falls back to, its ratio clamped into range."""
    in_ratio = width / height
    lo, hi = min(t.ratio), max(t.ratio)
    narrow, wide = in_ratio < lo, in_ratio > hi
    w = np.where(narrow, width, np.where(wide, np.rint(height * hi).astype(np.int64), width))
    h = np.where(narrow, np.rint(width / lo).astype(np.int64), height)
    return (height - h) // 2, (width - w) // 2, h, w
