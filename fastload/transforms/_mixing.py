"""Transforms after normalization (stage "tensor": `RandomErasing`) and across a batch (stage
"batch": `MixUp`, `CutMix`, a `RandomChoice` between them), with torchvision v2's names,
parameters and semantics; labels of a mixed batch become soft targets (N, num_classes).
Declarations only: `fastload._augment` runs them in the trainer's process, on the batch's device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastload._errors import ConfigError
from fastload.transforms._base import Transform, check_range, is_int, is_number, reject
from fastload.transforms._color import check_probability
from fastload.transforms._declare import declare_transform
from fastload.transforms._torchvision_reading import Place, floats, range_pair, unsupported


def _random_erasing(t: Any, place: Place) -> RandomErasing:
    """RandomErasing with its value in the output's units: fastload erases the images it outputs
    (normalized), so a value torchvision writes before its Normalize is normalized here."""
    value: float | tuple[float, ...] | str
    to_unit = place.units.scale / 255.0
    if t.value is None or isinstance(t.value, str):  # v2 stores "random" as None
        if place.ahead is not None and place.ahead != ((0.0,) * 3, (to_unit,) * 3):
            raise ConfigError(
                "RandomErasing(value='random') comes before Normalize (or the conversion to float): "
                "fastload erases the images it outputs, where 'random' is standard normal noise, not "
                "noise that is then shifted and scaled; put RandomErasing after Normalize (as "
                "torchvision's reference recipes do)"
            )
        value = "random"
    else:
        values = floats(t.value) if isinstance(t.value, Sequence) else (float(t.value),)
        if place.ahead is not None:
            mean, std = place.ahead
            values = values * len(mean) if len(values) == 1 else values
            values = tuple((v * to_unit - m) / s for v, m, s in zip(values, mean, std, strict=True))
            if len(set(values)) == 1:
                values = values[:1]
        value = values[0] if len(values) == 1 else values
    return RandomErasing(p=float(t.p), scale=range_pair(t.scale), ratio=range_pair(t.ratio), value=value)


@declare_transform(stage="tensor", kernel="RandomErasing", torchvision=_random_erasing)
@dataclass(frozen=True)
class RandomErasing(Transform):
    """Erase a random rectangle with probability `p` (torchvision semantics), after normalization.

    Args:
        p: probability of erasing a sample.
        scale: range of the rectangle's area as a fraction of the image's: 0 <= min <= max <= 1.
        ratio: range of its aspect ratio, drawn log-uniformly; as in torchvision's RandomErasing
            (unlike RandomResizedCrop) it is height / width: 0 < min <= max.
        value: what fills it, in normalized units (0 is the mean colour): a number, one number per
            channel, or "random" for standard normal noise (read from a fixed bank of noise at an
            offset drawn per sample: deterministic, the same on a CPU and a GPU; see NOTE
            [erasing noise] in `fastload._augment.mixing`).

    If none of torchvision's 10 tries fits inside the image, the sample is left as it is.
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float | tuple[float, ...] | str = 0.0

    def __post_init__(self) -> None:
        check_probability("RandomErasing", self.p)
        scale = self.scale  # torchvision accepts a min of 0 (check_range would not)
        pair = tuple(scale) if isinstance(scale, Sequence) and not isinstance(scale, (str, bytes)) else ()
        if not (len(pair) == 2 and all(is_number(s) for s in pair) and 0.0 <= pair[0] <= pair[1] <= 1.0):
            raise reject("RandomErasing", "scale", scale, "a (min, max) pair with 0 <= min <= max <= 1")
        check_range("RandomErasing", "ratio", self.ratio, 0.0, 1e6)
        object.__setattr__(self, "scale", tuple(scale))  # lists (as torchvision takes) as tuples
        object.__setattr__(self, "ratio", tuple(self.ratio))
        value = self.value
        if value == "random":
            return
        values = value if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else (value,)
        if len(values) not in (1, 3) or not all(is_number(v) for v in values):
            raise reject("RandomErasing", "value", value, "a number, 3 numbers (one per channel) or 'random'")
        if values is value:  # a list from a user or from configuration: a tuple, as a frozen field
            object.__setattr__(self, "value", tuple(float(v) for v in values))


def _check_mix(kind: str, alpha: object, num_classes: object) -> None:
    if not (is_number(alpha) and 0.0 < alpha <= 1e3):
        raise reject(kind, "alpha", alpha, "a number > 0 (the Beta distribution's parameter)")
    if not (is_int(num_classes) and 1 <= num_classes <= 1 << 20):
        raise reject(kind, "num_classes", num_classes, "the number of classes, an int >= 1")


def _mix(cls: type[MixUp] | type[CutMix], t: Any) -> MixUp | CutMix:
    """torchvision v2's MixUp or CutMix as fastload's (which needs num_classes)."""
    if t.num_classes is None:
        raise ConfigError(
            f"{cls.__name__}: num_classes is None, but fastload's labels are class indices: give "
            "num_classes, the number of classes"
        )
    return cls(alpha=float(t.alpha), num_classes=int(t.num_classes))


@declare_transform(
    stage="batch", kernel="MixUp", example={"num_classes": 3}, torchvision=lambda t, _: _mix(MixUp, t)
)
@dataclass(frozen=True, kw_only=True)
class MixUp(Transform):
    """MixUp: each image blended with its neighbour in the batch (the batch rolled by one) with a
    weight drawn once per batch from Beta(`alpha`, `alpha`), labels as the same blend of one-hot
    targets over `num_classes`."""

    alpha: float = 1.0
    num_classes: int

    def __post_init__(self) -> None:
        _check_mix("MixUp", self.alpha, self.num_classes)


@declare_transform(
    stage="batch", kernel="CutMix", example={"num_classes": 3}, torchvision=lambda t, _: _mix(CutMix, t)
)
@dataclass(frozen=True, kw_only=True)
class CutMix(Transform):
    """CutMix: a box of each image replaced by its neighbour's (the batch rolled by one), the box's
    area drawn once per batch from Beta(`alpha`, `alpha`), labels mixed by the area pasted."""

    alpha: float = 1.0
    num_classes: int

    def __post_init__(self) -> None:
        _check_mix("CutMix", self.alpha, self.num_classes)


def _random_choice(t: Any, place: Place) -> RandomChoice:
    members = tuple(place.member(m) for m in t.transforms)
    if not all(isinstance(m, (MixUp, CutMix)) for m in members):
        raise unsupported(t, "fastload's RandomChoice picks between batch transforms, MixUp and CutMix")
    p = None if t.p is None else floats(t.p)
    if p is not None and len(set(p)) == 1:
        p = None  # uniform (v2 stores its default, None, as equal weights)
    elif p is not None and sum(p) > 0:
        total = sum(p)
        p = tuple(w / total for w in p)  # as v2 stores them (v1 keeps the weights given)
    return RandomChoice(members, p)


@declare_transform(
    stage="batch",
    kernel="RandomChoice",
    example={"transforms": (MixUp(num_classes=3), CutMix(num_classes=3))},
    torchvision=_random_choice,
)
@dataclass(frozen=True)
class RandomChoice(Transform):
    """One of `transforms`, chosen per batch with probabilities `p` (uniform when None); fastload
    takes batch transforms here (MixUp, CutMix), as torchvision's recipes use it."""

    transforms: tuple[Transform, ...]
    p: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        members = tuple(self.transforms) if isinstance(self.transforms, Sequence) else ()
        if not members or not all(isinstance(t, (MixUp, CutMix)) for t in members):
            raise reject(
                "RandomChoice", "transforms", self.transforms,
                "a non-empty list of MixUp / CutMix (other transforms: chain them directly)",
            )
        if len({t.num_classes for t in members}) != 1:  # type: ignore[attr-defined]
            accepted = "transforms with the same num_classes"
            raise reject("RandomChoice", "transforms", self.transforms, accepted)
        object.__setattr__(self, "transforms", members)
        if self.p is not None:
            weights = tuple(self.p) if isinstance(self.p, Sequence) else ()
            if len(weights) != len(members) or not all(is_number(w) and w >= 0 for w in weights) or not sum(
                weights
            ):
                raise reject("RandomChoice", "p", self.p, f"None or {len(members)} weights >= 0, not all 0")
            object.__setattr__(self, "p", tuple(float(w) for w in weights))

    @property
    def num_classes(self) -> int:
        """The members' number of classes."""
        return int(self.transforms[0].num_classes)  # type: ignore[attr-defined]
