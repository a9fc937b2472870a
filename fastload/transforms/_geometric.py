"""The geometric transforms (stage "geometry"): crops, resizes and flips, which the decoder folds
into the decode, so that only the pixels a crop keeps are decoded (a RandomCrop's padding: the
part of its box inside the image decoded into its place, the rest filled, NOTE [padded crops]).
Randomness follows torchvision's algorithms exactly (e.g. `RandomResizedCrop`'s ten tries of a
log-uniform aspect ratio, then the central fallback), drawn from a sample's own `RandomSource`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastload._errors import ConfigError
from fastload.transforms._base import (
    MAX_RATIO,
    MAX_SCALE,
    MAX_SIDE,
    RandomSource,
    Transform,
    check_bool,
    check_interpolation,
    check_range,
    is_int,
    is_number,
    pair,
    reject,
    take_interpolation,
)
from fastload.transforms._declare import DECODE, declare_transform
from fastload.transforms._policies import check_fill
from fastload.transforms._torchvision_reading import (
    Place,
    antialias_of,
    fill_at,
    interpolation_of,
    range_pair,
    size_of,
)


@declare_transform(
    stage="geometry",
    kernel=DECODE,
    example={"size": (4, 4)},
    torchvision=lambda t, _: RandomResizedCrop(
        size=size_of(t.size),
        scale=range_pair(t.scale),
        ratio=range_pair(t.ratio),
        interpolation=interpolation_of("RandomResizedCrop", t.interpolation),
        antialias=antialias_of(t.antialias),
    ),
)
@dataclass(frozen=True)
class RandomResizedCrop(Transform):
    """Crop a random area and aspect ratio, then resize to `size` (torchvision semantics).

    Args:
        size: output (height, width), or an int for a square.
        scale: range of the crop's area as a fraction of the image's area: finite, 0 < min <= max
            (max may exceed 1, as in torchvision; both at most 1e6).
        ratio: range of the crop's aspect ratio (width / height), sampled log-uniformly: finite,
            1e-6 < min <= max <= 1e6.
        interpolation: resampling filter; "bilinear" as torchvision's default.
        antialias: filter when downscaling, as torchvision's default (True) and PIL always do.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: str = "bilinear"
    antialias: bool = True

    def __post_init__(self) -> None:
        pair(self.size, "RandomResizedCrop")
        check_range("RandomResizedCrop", "scale", self.scale, 0.0, MAX_SCALE)
        check_range("RandomResizedCrop", "ratio", self.ratio, 1.0 / MAX_RATIO, MAX_RATIO)
        take_interpolation(self)
        check_interpolation("RandomResizedCrop", self.interpolation)
        check_bool("RandomResizedCrop", "antialias", self.antialias)

    def sample_box(self, height: int, width: int, rng: RandomSource) -> tuple[int, int, int, int]:
        """Return (top, left, crop_height, crop_width), torchvision's `get_params` algorithm."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        # Fallback to a central crop with the ratio clamped into range.
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w = width
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h = height
            w = int(round(h * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w


def shorter_edge(size: int | Sequence[int]) -> int | None:
    """A Resize size's target for the shorter edge (an int or, as torchvision, a 1-sequence)."""
    if isinstance(size, int):
        return size
    return int(size[0]) if len(size) == 1 else None


def _resize(t: Any) -> Resize:
    """torchvision's Resize as fastload's (its size is required here)."""
    if t.size is None:
        raise ConfigError(
            "Resize(size=None, max_size=...) cannot be converted: fastload's Resize needs a size (the "
            "shorter edge's, or (height, width))"
        )
    return Resize(
        size=size_of(t.size),
        interpolation=interpolation_of("Resize", t.interpolation),
        max_size=None if t.max_size is None else int(t.max_size),
        antialias=antialias_of(t.antialias),
    )


@declare_transform(stage="geometry", kernel=DECODE, example={"size": 6}, torchvision=lambda t, _: _resize(t))
@dataclass(frozen=True)
class Resize(Transform):
    """Resize to `size` (torchvision semantics).

    An int (or a 1-sequence, as in torchvision) matches the shorter edge to it, keeping the aspect
    ratio (the longer edge is `int(size * long / short)`, capped by `max_size`); a (height, width)
    pair sets both.
    """

    size: int | tuple[int, int]
    interpolation: str = "bilinear"
    max_size: int | None = None
    antialias: bool = True

    def __post_init__(self) -> None:
        pair(self.size, "Resize")  # checks an int, a 1-sequence (the shorter edge) and a pair alike
        edge = shorter_edge(self.size)
        take_interpolation(self)
        check_interpolation("Resize", self.interpolation)
        check_bool("Resize", "antialias", self.antialias)
        if self.max_size is not None:
            if edge is None:
                raise ConfigError("Resize: max_size is only allowed when size is an int")
            if not (is_int(self.max_size) and edge < self.max_size <= MAX_SIDE):
                raise reject(
                    "Resize",
                    "max_size",
                    self.max_size,
                    f"None or an int larger than size ({edge}) and at most {MAX_SIDE}",
                )

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """Return the (height, width) an image of the given size is resized to."""
        edge = shorter_edge(self.size)
        if edge is None:
            return pair(self.size, "Resize")
        short, long = (height, width) if height <= width else (width, height)
        new_short, new_long = edge, int(edge * long / short)
        if self.max_size is not None and new_long > self.max_size:
            new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
        return (new_short, new_long) if height <= width else (new_long, new_short)


@declare_transform(
    stage="geometry",
    kernel=DECODE,
    example={"size": (4, 4)},
    torchvision=lambda t, _: CenterCrop(size_of(t.size)),
)
@dataclass(frozen=True)
class CenterCrop(Transform):
    """Crop the centre `size` (torchvision semantics; the crop must fit inside the image)."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        pair(self.size, "CenterCrop")

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Return (top, left, crop_height, crop_width) for an image of the given size."""
        crop_h, crop_w = pair(self.size, "CenterCrop")
        if crop_h > height or crop_w > width:
            raise ConfigError(
                f"CenterCrop({self.size}) is larger than the {height}x{width} image it gets; "
                "padding is not supported: put a Resize before it"
            )
        return int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0)), crop_h, crop_w


PADDING_MODES = ("constant", "edge", "reflect", "symmetric")


def _random_crop(t: Any, place: Place) -> RandomCrop:
    """torchvision's RandomCrop (v1 keeps `padding` as given; v2 as [left, right, top, bottom])."""
    padding = t.padding
    if padding is not None and ".v2." in type(t).__module__:
        left, right, top, bottom = (int(p) for p in padding)
        padding = (left, top, right, bottom)
    if isinstance(padding, Sequence):  # the shortest form that says it, as a user would write it
        padding = tuple(int(p) for p in padding)
        if len(padding) == 4 and padding[:2] == padding[2:]:
            padding = padding[:2]
        if len(padding) == 2 and padding[0] == padding[1]:
            padding = padding[:1]
        if len(padding) == 1:
            padding = padding[0]
    fill = fill_at("RandomCrop", t.fill, place)
    mirrored = t.padding_mode in ("reflect", "symmetric")
    if ".v2." not in type(t).__module__ and padding and t.pad_if_needed and mirrored:
        warnings.warn(
            f"RandomCrop(padding={t.padding}, pad_if_needed=True, padding_mode={t.padding_mode!r}) of "
            "torchvision v1 pads twice (the second time mirroring the first padding); fastload pads "
            "once, as v2 does: images smaller than size - padding get other pixels in the padding",
            UserWarning,
            stacklevel=2,
        )
    return RandomCrop(
        size=size_of(t.size),
        padding=padding or None,
        pad_if_needed=bool(t.pad_if_needed),
        fill=0 if fill is None else fill,
        padding_mode=str(t.padding_mode),
    )


@declare_transform(
    stage="geometry",
    kernel=DECODE,
    example={"size": (4, 4), "padding": 1},
    torchvision=_random_crop,
)
@dataclass(frozen=True)
class RandomCrop(Transform):
    """Crop `size` at a random place, after padding the image (torchvision semantics, v2's).

    Args:
        size: output (height, width), or an int for a square.
        padding: added on each border before the crop is drawn: an int (all four), (left/right,
            top/bottom) or (left, top, right, bottom); None: none.
        pad_if_needed: pad each side by what the (padded) image lacks of `size`, as v2 does
            (on both sides); without it, an image smaller than `size` fails its sample.
        fill: the padding's value for "constant": a number in [0, 255] (uint8 units, truncated
            as torchvision casts it) or one per channel.
        padding_mode: "constant", "edge" (the border pixel repeated), "reflect" (mirrored without
            the border pixel) or "symmetric" (with it).

    After a padded RandomCrop only flips and crops that neither pad nor resize may come (a resize
    would blend the padding into the image, which the decoder cannot fold in; NOTE [padded crops]).
    """

    size: int | tuple[int, int]
    padding: int | tuple[int, ...] | None = None
    pad_if_needed: bool = False
    fill: float | tuple[float, ...] = 0
    padding_mode: str = "constant"

    def __post_init__(self) -> None:
        pair(self.size, "RandomCrop")
        for name in ("padding", "fill"):  # a list given is kept as a tuple: hashable, as JSON gives it back
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        self.pads()
        check_bool("RandomCrop", "pad_if_needed", self.pad_if_needed)
        if self.fill is None:
            raise reject("RandomCrop", "fill", None, "a number in [0, 255] or a sequence of 1 or 3 of them")
        check_fill("RandomCrop", self.fill)
        if self.padding_mode not in PADDING_MODES:
            modes = " or ".join(map(repr, PADDING_MODES))
            raise reject("RandomCrop", "padding_mode", self.padding_mode, modes)

    @property
    def pads_image(self) -> bool:
        """Whether the crop may reach past the image (then the decoder fills the rest)."""
        return self.pad_if_needed or any(self.pads())

    def pads(self) -> tuple[int, int, int, int]:
        """`padding` as (left, top, right, bottom)."""
        return self._pads

    @functools.cached_property
    def _pads(self) -> tuple[int, int, int, int]:
        accepted = f"None, an int in 0..{MAX_SIDE} or a sequence of 1, 2 or 4 of them"
        p = self.padding
        if p is None:
            return (0, 0, 0, 0)
        given: tuple[object, ...] = (p,) if is_int(p) else tuple(p) if isinstance(p, Sequence) else ()
        values = tuple(v for v in given if is_int(v) and 0 <= v <= MAX_SIDE)
        if len(values) not in (1, 2, 4) or len(values) != len(given):
            raise reject("RandomCrop", "padding", p, accepted)
        if len(values) == 1:
            return (values[0],) * 4
        if len(values) == 2:
            return (values[0], values[1], values[0], values[1])
        return (values[0], values[1], values[2], values[3])

    def sample_box(self, height: int, width: int, rng: RandomSource) -> tuple[int, int, int, int]:
        """Return (top, left, crop_height, crop_width) in the unpadded image's pixels (negative,
        or reaching past it, where the crop takes padding): v2's `make_params`, two draws."""
        pad_left, pad_top, pad_right, pad_bottom = self.pads()
        crop_h, crop_w = pair(self.size, "RandomCrop")
        padded_h, padded_w = height + pad_top + pad_bottom, width + pad_left + pad_right
        if self.pad_if_needed and padded_h < crop_h:
            pad_top += crop_h - padded_h
            padded_h += 2 * (crop_h - padded_h)
        if self.pad_if_needed and padded_w < crop_w:
            pad_left += crop_w - padded_w
            padded_w += 2 * (crop_w - padded_w)
        if padded_h < crop_h or padded_w < crop_w:
            raise ConfigError(
                f"RandomCrop({self.size}) is larger than the {height}x{width} image it gets (padded: "
                f"{padded_h}x{padded_w}): set pad_if_needed=True, or pad it"
            )
        top = int(rng.integers(0, padded_h - crop_h + 1)) - pad_top
        left = int(rng.integers(0, padded_w - crop_w + 1)) - pad_left
        return top, left, crop_h, crop_w


@declare_transform(
    stage="geometry", kernel=DECODE, torchvision=lambda t, _: RandomHorizontalFlip(float(t.p))
)
@dataclass(frozen=True)
class RandomHorizontalFlip(Transform):
    """Flip left-right with probability `p` (torchvision semantics)."""

    p: float = 0.5

    def __post_init__(self) -> None:
        if not (is_number(self.p) and 0.0 <= self.p <= 1.0):
            raise reject("RandomHorizontalFlip", "p", self.p, "a number in [0, 1]")


@dataclass(frozen=True)
class SampleGeometry:
    """What one sample's transform chain does to its source image.

    `box` is (left, top, right, bottom) in source pixels, possibly fractional; the decoder resamples
    that box to `out_height` x `out_width` with `interpolation`, then mirrors it when `flip`.
    `clip` (same form; None for the whole image) bounds the source pixels the resampling filter
    may read: what the chain's last resize resampled. torchvision crops before it resizes, so at
    a RandomResizedCrop's edges the filter sees only the crop, not the image beyond it.
    `image_rect` (left, top, right, bottom), whole output pixels before the flip: where the image
    a padded RandomCrop cut lies (it may reach past the output on any side); the output's pixels
    outside it are padding. None: the output is all image (`needs_padding`).
    """

    box: tuple[float, float, float, float]
    out_height: int
    out_width: int
    flip: bool
    interpolation: str
    clip: tuple[float, float, float, float] | None = None
    image_rect: tuple[int, int, int, int] | None = None

    @property
    def needs_padding(self) -> bool:
        """Whether some output pixels lie outside the image (a padded crop reached past it)."""
        r = self.image_rect
        if r is None:
            return False
        return not (r[0] <= 0 and r[1] <= 0 and r[2] >= self.out_width and r[3] >= self.out_height)
