"""The geometric transforms that run on a sample's uint8 pixels after the decode (stage "pixels"),
not folded into it: RandomVerticalFlip, RandomRotation, RandomAffine and RandomPerspective, with
torchvision v2's names, parameters and semantics on tensors (what `F.rotate`, `F.affine` and
`F.perspective` do to a uint8 image).
Declarations only: their batched kernels are in `fastload._augment.warp_ops`.

They keep the image's size (RandomRotation's `expand=True` is refused: a batch needs one size) and,
like every pixel-stage transform, come after the chain's crops and resizes (NOTE [transform
stages] in `_plan`): a chain that rotates before it crops is refused rather than reordered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastload.transforms._base import Transform, is_number, reject, take_interpolation
from fastload.transforms._color import check_probability
from fastload.transforms._declare import declare_transform
from fastload.transforms._policies import POLICY_INTERPOLATIONS, check_fill
from fastload.transforms._torchvision_reading import Place, fill_at, floats, interpolation_of

Bounds = tuple[float, float]
"""A (min, max) range."""

_LIMIT = 1e6
"""The largest magnitude of a degree, shear or centre accepted (far beyond any useful value; it
keeps the matrix arithmetic finite)."""


def _numbers(value: object) -> tuple[float, ...] | None:
    """`value` as a tuple of finite numbers, or None when it is not a sequence of them."""
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        return None
    if all(is_number(v) and abs(v) <= _LIMIT for v in value):
        return tuple(float(v) for v in value)
    return None


def symmetric_range(kind: str, param: str, value: object, sizes: tuple[int, ...] = (2,)) -> tuple[float, ...]:
    """torchvision's `_setup_angle`: a number v >= 0 is (-v, v); a sequence of one of `sizes`
    lengths is taken as it is, each (min, max) pair in order."""
    accepted = f"a number >= 0, or {' or '.join(str(s) for s in sizes)} numbers, (min, max) pairs"
    if is_number(value) and not isinstance(value, bool):
        if not 0 <= value <= _LIMIT:
            raise reject(kind, param, value, accepted)
        return (-float(value), float(value))
    numbers = _numbers(value)
    if numbers is None or len(numbers) not in sizes:
        raise reject(kind, param, value, accepted)
    if any(numbers[i] > numbers[i + 1] for i in range(0, len(numbers), 2)):
        raise reject(kind, param, value, accepted)
    return numbers


def _check_warp(kind: str, transform: Any, center: object) -> None:
    """The parameters the warps share: interpolation, fill and (None for RandomPerspective) center."""
    take_interpolation(transform)
    if transform.interpolation not in POLICY_INTERPOLATIONS:
        raise reject(kind, "interpolation", transform.interpolation, " or ".join(POLICY_INTERPOLATIONS))
    check_fill(kind, transform.fill)
    if center is not None:
        numbers = _numbers(center)
        if numbers is None or len(numbers) != 2:
            raise reject(kind, "center", center, "None or an (x, y) pair of numbers, in pixels")


def _optional_floats(value: Any) -> tuple[float, ...] | None:
    return None if value is None else floats(value)


def _rotation(t: Any, place: Place) -> RandomRotation:
    return RandomRotation(
        degrees=floats(t.degrees),
        interpolation=interpolation_of("RandomRotation", t.interpolation),
        expand=bool(t.expand),
        center=_optional_floats(t.center),
        fill=fill_at("RandomRotation", t.fill, place),
    )


def _affine(t: Any, place: Place) -> RandomAffine:
    return RandomAffine(
        degrees=floats(t.degrees),
        translate=_optional_floats(t.translate),
        scale=_optional_floats(t.scale),
        shear=_optional_floats(t.shear),
        interpolation=interpolation_of("RandomAffine", t.interpolation),
        fill=fill_at("RandomAffine", t.fill, place),
        center=_optional_floats(t.center),
    )


@declare_transform(
    stage="pixels",
    kernel="RandomVerticalFlip",
    example={"p": 1.0},
    torchvision=lambda t, _: RandomVerticalFlip(float(t.p)),
)
@dataclass(frozen=True)
class RandomVerticalFlip(Transform):
    """Flip top-bottom with probability `p` (torchvision semantics); after the chain's crops."""

    p: float = 0.5

    def __post_init__(self) -> None:
        check_probability("RandomVerticalFlip", self.p)


@declare_transform(
    stage="pixels", kernel="RandomRotation", example={"degrees": (30.0, 30.0)}, torchvision=_rotation
)
@dataclass(frozen=True)
class RandomRotation(Transform):
    """Rotate by an angle drawn uniformly from `degrees` (a number d: (-d, d); or (min, max)),
    counter-clockwise, about `center` ((x, y) pixels from the top-left corner; None: the image's
    centre), as torchvision v2's `rotate` on tensors: quarter turns about the centre exactly
    (its fast path), others through an affine grid with `interpolation` "nearest" or "bilinear",
    uncovered pixels taking `fill` (uint8 units; None: zeros padding, which bilinear blends
    otherwise). `expand` must be False: the output keeps the image's size."""

    degrees: float | tuple[float, ...]
    interpolation: str = "nearest"
    expand: bool = False
    center: tuple[float, ...] | None = None
    fill: float | tuple[float, ...] | None = 0

    def __post_init__(self) -> None:
        self.angle_range()
        if self.expand is not False:
            raise reject(
                "RandomRotation", "expand", self.expand,
                "False (a batch needs one size: rotate without expanding, then crop or resize)",
            )
        _check_warp("RandomRotation", self, self.center)

    def angle_range(self) -> tuple[float, float]:
        """(min, max) of the angle, in degrees."""
        low, high = symmetric_range("RandomRotation", "degrees", self.degrees)
        return low, high


@declare_transform(
    stage="pixels",
    kernel="RandomAffine",
    example={"degrees": (20.0, 20.0), "scale": (1.25, 1.25), "shear": (10.0, 10.0, -5.0, -5.0)},
    torchvision=_affine,
)
@dataclass(frozen=True)
class RandomAffine(Transform):
    """A random affine transformation about the image's centre (or `center`), as torchvision v2's
    RandomAffine on tensors: an angle from `degrees` (as RandomRotation's), a translation of
    round(uniform(-a * width, a * width)) and round(uniform(-b * height, b * height)) pixels for
    `translate` (a, b) in [0, 1], a scale from `scale` (min, max) > 0, shears from `shear` (a
    number s: x in (-s, s); 2 numbers: x's range; 4: x's then y's), in degrees; `interpolation`
    and `fill` as RandomRotation's."""

    degrees: float | tuple[float, ...]
    translate: tuple[float, ...] | None = None
    scale: tuple[float, ...] | None = None
    shear: float | tuple[float, ...] | None = None
    interpolation: str = "nearest"
    fill: float | tuple[float, ...] | None = 0
    center: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        symmetric_range("RandomAffine", "degrees", self.degrees)
        if self.translate is not None:
            translate = _numbers(self.translate)
            if translate is None or len(translate) != 2 or not all(0 <= v <= 1 for v in translate):
                raise reject("RandomAffine", "translate", self.translate, "None or an (a, b) pair in [0, 1]")
        if self.scale is not None:
            scale = _numbers(self.scale)
            if scale is None or len(scale) != 2 or not 0 < scale[0] <= scale[1]:
                accepted = "None or a (min, max) pair with 0 < min <= max"
                raise reject("RandomAffine", "scale", self.scale, accepted)
        if self.shear is not None:
            symmetric_range("RandomAffine", "shear", self.shear, (2, 4))
        _check_warp("RandomAffine", self, self.center)

    def ranges(self) -> tuple[Bounds, Bounds, Bounds, Bounds]:
        """(angle, scale, shear x, shear y) (min, max) ranges ((1, 1) and (0, 0) where absent)."""
        low, high = symmetric_range("RandomAffine", "degrees", self.degrees)
        scale = (1.0, 1.0) if self.scale is None else (float(self.scale[0]), float(self.scale[1]))
        shear = (0.0, 0.0, 0.0, 0.0)
        if self.shear is not None:
            given = symmetric_range("RandomAffine", "shear", self.shear, (2, 4))
            shear = given if len(given) == 4 else (given[0], given[1], 0.0, 0.0)
        return (low, high), scale, (shear[0], shear[1]), (shear[2], shear[3])


@declare_transform(
    stage="pixels",
    kernel="RandomPerspective",
    example={"distortion_scale": 0.5, "p": 1.0},
    torchvision=lambda t, place: RandomPerspective(
        distortion_scale=float(t.distortion_scale),
        p=float(t.p),
        interpolation=interpolation_of("RandomPerspective", t.interpolation),
        fill=fill_at("RandomPerspective", t.fill, place),
    ),
)
@dataclass(frozen=True)
class RandomPerspective(Transform):
    """With probability `p`, move each corner of the image inwards by up to `distortion_scale`
    (0..1) of half the image's side, at random, and warp the image to match, as torchvision v2's
    RandomPerspective on tensors; `interpolation` and `fill` as RandomRotation's."""

    distortion_scale: float = 0.5
    p: float = 0.5
    interpolation: str = "bilinear"
    fill: float | tuple[float, ...] | None = 0

    def __post_init__(self) -> None:
        if not (is_number(self.distortion_scale) and 0 <= self.distortion_scale <= 1):
            raise reject("RandomPerspective", "distortion_scale", self.distortion_scale, "a number in [0, 1]")
        check_probability("RandomPerspective", self.p)
        _check_warp("RandomPerspective", self, None)
