"""Transforms with timm's semantics where torchvision has none (its RandAugment policy strings,
`TimmRandAugment`; its `Mixup` in modes 'batch', 'pair' and 'elem', `TimmMixup`), and
torchvision's `RandomApply` over per-sample pixel transforms (with its conversion from
torchvision's, which may give no transform, its members, or this one). Declarations only:
`fastload._augment.timm_ops` runs them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastload._errors import ConfigError
from fastload.transforms._base import Transform, is_int, is_number, reject, take_interpolation
from fastload.transforms._color import RandomSolarize
from fastload.transforms._declare import declare_transform
from fastload.transforms._geometric import RandomHorizontalFlip
from fastload.transforms._mixing import RandomErasing
from fastload.transforms._policies import check_fill
from fastload.transforms._torchvision_reading import Place


def _probability(kind: str, name: str, value: object) -> None:
    if not (is_number(value) and 0.0 <= value <= 1.0):
        raise reject(kind, name, value, "a number in [0, 1]")


TIMM_INTERPOLATIONS = ("bilinear", "bicubic", "random", "nearest")
"""The resampling of timm's geometric operations: PIL's bilinear or bicubic affine (bit for bit),
'random' (timm's default: bilinear or bicubic drawn per operation), or 'nearest' (through torch's
grid: approximated)."""


def check_op_settings(kind: str, t: Any) -> None:
    """Check (and normalise) what timm's policies share, from its AugmentOps' hparams:
    `magnitude_std`, `translate_pct`, `interpolation` and `fill`."""
    std = t.magnitude_std
    if not (std == math.inf or (is_number(std) and 0 <= std <= 1e3)):
        raise reject(kind, "magnitude_std", std, "a number >= 0, or inf (uniform in [0, magnitude])")
    if not (is_number(t.translate_pct) and 0 <= t.translate_pct <= 1):
        raise reject(kind, "translate_pct", t.translate_pct, "a number in [0, 1]")
    take_interpolation(t)
    if t.interpolation not in TIMM_INTERPOLATIONS:
        raise reject(kind, "interpolation", t.interpolation, ", ".join(TIMM_INTERPOLATIONS))
    check_fill(kind, t.fill)
    if isinstance(t.fill, Sequence):
        object.__setattr__(t, "fill", tuple(float(v) for v in t.fill))


TIMM_RAND_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd",
    "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
)
"""timm's `_RAND_TRANSFORMS`, in its order."""

_INCREASING = {"Posterize", "Solarize", "Color", "Contrast", "Brightness", "Sharpness"}
TIMM_RAND_INCREASING_OPS = tuple(f"{n}Increasing" if n in _INCREASING else n for n in TIMM_RAND_OPS)
"""timm's `_RAND_INCREASING_TRANSFORMS` ('inc1'), in its order."""


@declare_transform(stage="pixels", kernel="TimmRandAugment")
@dataclass(frozen=True)
class TimmRandAugment(Transform):
    """timm's RandAugment (`rand_augment_transform('rand-m9-mstd0.5-inc1', hparams)`): per sample,
    `num_layers` operations drawn uniformly with replacement from timm's 15 (`increasing`: its
    'inc1' set), each applied with probability `prob` at a magnitude drawn from
    N(`magnitude`, `magnitude_std`) (uniform in [0, magnitude] when it is infinite; a fixed one when
    0) clipped to [0, `magnitude_max`], on timm's 0..10 scale; signed operations negated half the
    time. Translations move by `translate_pct` of the side; `fill` (uint8 units) fills what a
    geometric operation uncovers (timm's `img_mean`); `interpolation` is its resampling (one of
    `TIMM_INTERPOLATIONS`: 'random' draws bilinear or bicubic per operation, as timm does when its
    hparams name none)."""

    num_layers: int = 2
    magnitude: float = 10.0
    magnitude_std: float = 0.0
    magnitude_max: float = 10.0
    prob: float = 0.5
    increasing: bool = False
    translate_pct: float = 0.45
    interpolation: str = "bilinear"
    fill: float | tuple[float, ...] | None = (128.0, 128.0, 128.0)

    def __post_init__(self) -> None:
        kind = "TimmRandAugment"
        if not (is_int(self.num_layers) and 0 <= self.num_layers <= 16):
            raise reject(kind, "num_layers", self.num_layers, "an int in 0..16")
        if not (is_number(self.magnitude_max) and 0 <= self.magnitude_max <= 1e3):
            raise reject(kind, "magnitude_max", self.magnitude_max, "a number in [0, 1000]")
        if not (is_number(self.magnitude) and 0 <= self.magnitude <= 1e3):
            raise reject(kind, "magnitude", self.magnitude, "a number in [0, 1000]")
        _probability(kind, "prob", self.prob)
        if not isinstance(self.increasing, bool):
            raise reject(kind, "increasing", self.increasing, "True or False")
        check_op_settings(kind, self)

    @property
    def ops(self) -> tuple[str, ...]:
        """The operation space, timm's names in timm's order."""
        return TIMM_RAND_INCREASING_OPS if self.increasing else TIMM_RAND_OPS


TIMM_MIXUP_MODES = ("batch", "pair", "elem")
"""timm's Mixup modes fastload has (not 'half', which only FastCollateMixup takes)."""


@declare_transform(stage="batch", kernel="TimmMixup", example={"num_classes": 3})
@dataclass(frozen=True, kw_only=True)
class TimmMixup(Transform):
    """timm's `Mixup`. In `mode` 'batch': with probability `prob` a batch is mixed, by CutMix with
    probability `switch_prob` when both alphas are > 0 (else the one that is); lam ~ Beta(alpha,
    alpha); each image mixed with its mirror in the batch (`x.flip(0)`); a CutMix box of sides
    sqrt(1 - lam) of the image's around a uniform centre, clipped (or of sides uniform in
    `cutmix_minmax` of the image's), lam then corrected to the area kept (`correct_lam`); targets
    are one-hot smoothed by `label_smoothing` (off = s / num_classes, on = 1 - s + off) and mixed
    by lam, also when the batch is not mixed. In mode 'elem' each image i draws its own (lam, CutMix
    or not), as timm's `_params_per_elem` (float32 lam), and is mixed with the batch's original
    image B-1-i (its mirror; its own box); in mode 'pair' images i and B-1-i share one draw and
    are mixed with each other (the middle image of an odd batch is left as it is); targets mixed
    per image by its lam. Deterministic from the loader's seed: the batch's draws come from a
    numpy Generator seeded by one of its uniforms, in timm's order."""

    mixup_alpha: float = 1.0
    cutmix_alpha: float = 0.0
    cutmix_minmax: tuple[float, float] | None = None
    prob: float = 1.0
    switch_prob: float = 0.5
    correct_lam: bool = True
    label_smoothing: float = 0.1
    num_classes: int
    mode: str = "batch"

    def __post_init__(self) -> None:
        kind = "TimmMixup"
        for name in ("mixup_alpha", "cutmix_alpha"):
            value = getattr(self, name)
            if not (is_number(value) and 0.0 <= value <= 1e3):
                raise reject(kind, name, value, "a number >= 0 (0 turns it off)")
        minmax = self.cutmix_minmax
        if minmax is not None:
            pair = tuple(minmax) if isinstance(minmax, Sequence) else ()
            if not (len(pair) == 2 and all(is_number(v) for v in pair) and 0 < pair[0] < pair[1] <= 1):
                raise reject(kind, "cutmix_minmax", minmax, "None or (min, max) with 0 < min < max <= 1")
            object.__setattr__(self, "cutmix_minmax", (float(pair[0]), float(pair[1])))
            object.__setattr__(self, "cutmix_alpha", 1.0)  # as timm: minmax turns CutMix on
        if not (self.mixup_alpha > 0 or self.cutmix_alpha > 0):
            raise reject(kind, "mixup_alpha", self.mixup_alpha, "> 0 when cutmix_alpha is 0")
        _probability(kind, "prob", self.prob)
        _probability(kind, "switch_prob", self.switch_prob)
        if not isinstance(self.correct_lam, bool):
            raise reject(kind, "correct_lam", self.correct_lam, "True or False")
        if not (is_number(self.label_smoothing) and 0.0 <= self.label_smoothing <= 1.0):
            raise reject(kind, "label_smoothing", self.label_smoothing, "a number in [0, 1]")
        if not (is_int(self.num_classes) and 1 <= self.num_classes <= 1 << 20):
            raise reject(kind, "num_classes", self.num_classes, "the number of classes, an int >= 1")
        if self.mode not in TIMM_MIXUP_MODES:
            raise reject(kind, "mode", self.mode, " or ".join(repr(m) for m in TIMM_MIXUP_MODES))


def _random_apply(t: Any, place: Place) -> tuple[Transform, ...]:
    """torchvision's RandomApply (v1 or v2): p = 0 drops it, p = 1 keeps its transforms; otherwise a
    flip or an erasing alone takes p into its own, and pixel transforms become fastload's
    RandomApply (all or none per sample, as torchvision)."""
    p = float(t.p)
    members = tuple(place.member(m) for m in t.transforms)
    if p == 0.0:
        return ()
    if p == 1.0:
        return members
    if len(members) == 1 and isinstance(members[0], (RandomHorizontalFlip, RandomErasing)):
        member = members[0]
        if isinstance(member, RandomHorizontalFlip):
            return (RandomHorizontalFlip(p * member.p),)
        return (RandomErasing(p * member.p, member.scale, member.ratio, member.value),)
    if not all(m.stage == "pixels" for m in members):
        raise ConfigError(
            f"RandomApply(p={p}) of {', '.join(type(m).__name__ for m in members)}: fastload applies at "
            "random colour transforms and policies (or one flip or erasing); crops and batch transforms "
            "cannot be skipped per sample: run the pipeline through the Dataset path instead"
        )
    return (RandomApply(members, p),)


@declare_transform(
    stage="pixels",
    kernel="RandomApply",
    example={"transforms": (RandomSolarize(128.0),), "p": 0.5},
    torchvision=_random_apply,
)
@dataclass(frozen=True)
class RandomApply(Transform):
    """torchvision's RandomApply over pixel-stage transforms: with probability `p` a sample runs
    all of `transforms`, in order; otherwise none of them."""

    transforms: tuple[Transform, ...]
    p: float = 0.5

    def __post_init__(self) -> None:
        members = tuple(self.transforms) if isinstance(self.transforms, Sequence) else ()
        if not members or not all(isinstance(t, Transform) and t.stage == "pixels" for t in members):
            accepted = "a non-empty list of pixel-stage transforms (colour operations, policies)"
            raise reject("RandomApply", "transforms", self.transforms, accepted)
        object.__setattr__(self, "transforms", members)
        _probability("RandomApply", "p", self.p)
