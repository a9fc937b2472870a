"""timm's AutoAugment (its policies 'original', 'originalr', 'v0', 'v0r' and DeiT III's '3a') and
timm's AugMix (`augment_and_mix_transform`), with timm's operations, levels and draws; and
3-Augment as timm builds it (`three_augment`). Declarations only: `fastload._augment.timm_policies`
runs them, on the operation table timm's RandAugment uses (`fastload._augment.timm_ops`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fastload.transforms._base import Transform, is_int, is_number, reject
from fastload.transforms._color import ColorJitter
from fastload.transforms._declare import declare_transform
from fastload.transforms._timm_transforms import check_op_settings

SubPolicy = tuple[tuple[str, float, float], ...]
"""(operation, probability, magnitude) of each step, timm's names."""

_V0: tuple[SubPolicy, ...] = (
    (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)), (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
    (("Color", 0.4, 1), ("Rotate", 0.6, 8)), (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
    (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)), (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
    (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)), (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
    (("Color", 0.6, 1), ("Equalize", 1.0, 2)), (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
    (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)), (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
    (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)), (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
    (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)), (("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)),
    (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)), (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
    (("Color", 1.0, 0), ("Rotate", 0.6, 2)), (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
    (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)), (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
    (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)), (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
    (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)

_ORIGINAL: tuple[SubPolicy, ...] = (
    (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
    (("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)), (("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)), (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)), (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)


def _research_posterize(policy: tuple[SubPolicy, ...]) -> tuple[SubPolicy, ...]:
    """The 'r' variant of a policy: its posterize as 'PosterizeIncreasing' (timm's v0r, originalr)."""
    rename = {"Posterize": "PosterizeIncreasing", "PosterizeOriginal": "PosterizeIncreasing"}
    return tuple(tuple((rename.get(n, n), p, m) for n, p, m in sub) for sub in policy)


TIMM_AUTOAUGMENT_POLICIES: dict[str, tuple[SubPolicy, ...]] = {
    "original": _ORIGINAL,
    "originalr": _research_posterize(_ORIGINAL),
    "v0": _V0,
    "v0r": _research_posterize(_V0),
    "3a": ((("Solarize", 1.0, 5),), (("Desaturate", 1.0, 10),), (("GaussianBlurRand", 1.0, 10),)),
}
"""timm's `auto_augment_policy_*` tables, by the name its config strings give."""

TIMM_AUGMIX_OPS = (
    "AutoContrast", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing",
    "Equalize", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing", "ShearX", "ShearY",
    "TranslateXRel", "TranslateYRel",
)
"""timm's `_AUGMIX_TRANSFORMS`, in its order."""


@declare_transform(stage="pixels", kernel="TimmAutoAugment")
@dataclass(frozen=True)
class TimmAutoAugment(Transform):
    """timm's AutoAugment (`auto_augment_transform('original-mstd0.5', hparams)`): per sample, one
    sub-policy of `policy`'s uniformly, each of its steps applied when a uniform is <= its
    probability, at its magnitude (timm's 0..10; with `magnitude_std` > 0 drawn from N(magnitude,
    magnitude_std), uniform in [0, magnitude] when infinite) clipped to [0, 10], signed operations
    negated half the time. Policies: 'original', 'originalr', 'v0', 'v0r' and '3a' (DeiT III's
    3-Augment: solarize at 128, grayscale, or a PIL Gaussian blur of radius uniform in [0.1, 2]).
    Translations move by `translate_pct` of the side; `fill` (uint8 units) fills what a geometric
    operation uncovers (timm's `img_mean`); `interpolation` as `TimmRandAugment`'s."""

    policy: str = "original"
    magnitude_std: float = 0.0
    translate_pct: float = 0.45
    interpolation: str = "bilinear"
    fill: float | tuple[float, ...] | None = (128.0, 128.0, 128.0)

    def __post_init__(self) -> None:
        if self.policy not in TIMM_AUTOAUGMENT_POLICIES:
            raise reject("TimmAutoAugment", "policy", self.policy, ", ".join(TIMM_AUTOAUGMENT_POLICIES))
        check_op_settings("TimmAutoAugment", self)

    @property
    def sub_policies(self) -> tuple[SubPolicy, ...]:
        """The policy's table, timm's."""
        return TIMM_AUTOAUGMENT_POLICIES[self.policy]


@declare_transform(stage="pixels", kernel="TimmAugMix")
@dataclass(frozen=True)
class TimmAugMix(Transform):
    """timm's AugMix (`augment_and_mix_transform('augmix-m5-w4-d2', hparams)`): `width` chains per
    sample of `depth` operations (uniform in 1..3 when -1), each uniform over timm's 13 with
    replacement, at a level uniform in [0, `severity`] (`magnitude_std` inf, timm's default; else
    N(severity, magnitude_std)) clipped to [0, 10]; chain weights Dirichlet(alpha) and a blend
    m ~ Beta(alpha, alpha), float32. Not `blended`: the chains summed with their weights in
    float32, clipped and truncated to uint8, then PIL's blend of the image with it by m; `blended`
    (timm's faster variant): PIL blends of each chain into the running image, by weights made
    from the chain weights times m (timm's `_calc_blended_weights`)."""

    severity: int = 3
    width: int = 3
    depth: int = -1
    alpha: float = 1.0
    blended: bool = False
    magnitude_std: float = math.inf
    translate_pct: float = 0.45
    interpolation: str = "bilinear"
    fill: float | tuple[float, ...] | None = (128.0, 128.0, 128.0)

    def __post_init__(self) -> None:
        kind = "TimmAugMix"
        if not (is_int(self.severity) and 0 <= self.severity <= 10):
            raise reject(kind, "severity", self.severity, "an int in 0..10")
        if not (is_int(self.width) and 1 <= self.width <= 16):
            raise reject(kind, "width", self.width, "an int in 1..16")
        if not (is_int(self.depth) and (self.depth == -1 or 1 <= self.depth <= 16)):
            raise reject(kind, "depth", self.depth, "-1 (uniform in 1..3) or an int in 1..16")
        if not (is_number(self.alpha) and 0 < self.alpha <= 1e3):
            raise reject(kind, "alpha", self.alpha, "a number > 0")
        if not isinstance(self.blended, bool):
            raise reject(kind, "blended", self.blended, "True or False")
        check_op_settings(kind, self)


def three_augment(color_jitter: float | None = 0.3, interpolation: str = "bilinear") -> tuple[Transform, ...]:
    """DeiT III's 3-Augment as timm builds it (`create_transform(..., auto_augment='3a',
    color_jitter=0.3)`): per image one of solarize, grayscale and Gaussian blur, uniformly
    (`TimmAutoAugment('3a')`), then `ColorJitter(color_jitter, color_jitter, color_jitter)` (left out
    when None). Put it after the crop and flip: `[RandomResizedCrop(224), RandomHorizontalFlip(),
    *three_augment()]`."""
    policy = TimmAutoAugment(policy="3a", interpolation=interpolation)
    if color_jitter is None:
        return (policy,)
    return (policy, ColorJitter(brightness=color_jitter, contrast=color_jitter, saturation=color_jitter))
