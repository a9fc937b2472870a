"""The augmentation policies (stage "pixels"): RandAugment, TrivialAugmentWide, AutoAugment and
AugMix, with torchvision's names, parameters, operation spaces and magnitudes (v2 semantics).
Declarations only: `fastload._augment` runs them, batched, each sample drawing its own
operations and magnitudes from (seed, epoch, index).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastload.transforms._base import Transform, is_int, is_number, reject, take_interpolation
from fastload.transforms._declare import declare_transform
from fastload.transforms._torchvision_reading import fill_at, interpolation_of

POLICY_INTERPOLATIONS = ("nearest", "bilinear")  # what torchvision's tensor affine supports
AUTOAUGMENT_POLICIES = ("imagenet", "cifar10", "svhn")


def check_fill(kind: str, fill: object) -> None:
    """`fill` (the value of pixels a geometric operation uncovers): None (0), a number in 0..255,
    or one such number per channel."""
    accepted = "None, a number in [0, 255] or a sequence of 1 or 3 of them"
    if fill is None:
        return
    values = fill if isinstance(fill, Sequence) and not isinstance(fill, (str, bytes)) else (fill,)
    if len(values) not in (1, 3) or not all(is_number(v) and 0 <= v <= 255 for v in values):
        raise reject(kind, "fill", fill, accepted)


def fill_values(fill: float | Sequence[float] | None) -> tuple[float, float, float]:
    """`fill` as one value per channel."""
    if fill is None:
        return (0.0, 0.0, 0.0)
    if isinstance(fill, Sequence):
        values = tuple(float(v) for v in fill)
        return (values[0],) * 3 if len(values) == 1 else (values[0], values[1], values[2])
    return (float(fill),) * 3


def _check_interpolation(kind: str, interpolation: object) -> None:
    if interpolation not in POLICY_INTERPOLATIONS:
        raise reject(kind, "interpolation", interpolation, " or ".join(POLICY_INTERPOLATIONS))


def _check_bins(kind: str, bins: object) -> None:
    if not (is_int(bins) and 2 <= bins <= 1024):
        raise reject(kind, "num_magnitude_bins", bins, "an int in 2..1024")


@declare_transform(
    stage="pixels",
    kernel="RandAugment",
    torchvision=lambda t, place: RandAugment(
        num_ops=int(t.num_ops),
        magnitude=int(t.magnitude),
        num_magnitude_bins=int(t.num_magnitude_bins),
        interpolation=interpolation_of("RandAugment", t.interpolation),
        fill=fill_at("RandAugment", t.fill, place),
    ),
)
@dataclass(frozen=True)
class RandAugment(Transform):
    """RandAugment: `num_ops` operations per sample, each drawn uniformly from torchvision's 14,
    at `magnitude` (a bin of `num_magnitude_bins`), each signed operation negated with
    probability 0.5."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: str = "nearest"
    fill: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not (is_int(self.num_ops) and 0 <= self.num_ops <= 16):
            raise reject("RandAugment", "num_ops", self.num_ops, "an int in 0..16")
        _check_bins("RandAugment", self.num_magnitude_bins)
        if not (is_int(self.magnitude) and 0 <= self.magnitude < self.num_magnitude_bins):
            raise reject(
                "RandAugment", "magnitude", self.magnitude, f"an int in 0..{self.num_magnitude_bins - 1}"
            )
        take_interpolation(self)
        _check_interpolation("RandAugment", self.interpolation)
        check_fill("RandAugment", self.fill)


@declare_transform(
    stage="pixels",
    kernel="TrivialAugmentWide",
    torchvision=lambda t, place: TrivialAugmentWide(
        num_magnitude_bins=int(t.num_magnitude_bins),
        interpolation=interpolation_of("TrivialAugmentWide", t.interpolation),
        fill=fill_at("TrivialAugmentWide", t.fill, place),
    ),
)
@dataclass(frozen=True)
class TrivialAugmentWide(Transform):
    """TrivialAugment (wide space): one operation per sample, at a magnitude bin drawn uniformly."""

    num_magnitude_bins: int = 31
    interpolation: str = "nearest"
    fill: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _check_bins("TrivialAugmentWide", self.num_magnitude_bins)
        take_interpolation(self)
        _check_interpolation("TrivialAugmentWide", self.interpolation)
        check_fill("TrivialAugmentWide", self.fill)


@declare_transform(
    stage="pixels",
    kernel="AutoAugment",
    torchvision=lambda t, place: AutoAugment(
        policy=str(getattr(t.policy, "value", t.policy)),
        interpolation=interpolation_of("AutoAugment", t.interpolation),
        fill=fill_at("AutoAugment", t.fill, place),
    ),
)
@dataclass(frozen=True)
class AutoAugment(Transform):
    """AutoAugment with one of torchvision's learned policies ("imagenet", "cifar10", "svhn"): a
    sub-policy drawn per sample, each of its two operations applied with its own probability."""

    policy: str = "imagenet"
    interpolation: str = "nearest"
    fill: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.policy not in AUTOAUGMENT_POLICIES:
            raise reject("AutoAugment", "policy", self.policy, " or ".join(AUTOAUGMENT_POLICIES))
        take_interpolation(self)
        _check_interpolation("AutoAugment", self.interpolation)
        check_fill("AutoAugment", self.fill)


@declare_transform(
    stage="pixels",
    kernel="AugMix",
    torchvision=lambda t, place: AugMix(
        severity=int(t.severity),
        mixture_width=int(t.mixture_width),
        chain_depth=int(t.chain_depth),
        alpha=float(t.alpha),
        all_ops=bool(t.all_ops),
        interpolation=interpolation_of("AugMix", t.interpolation),
        fill=fill_at("AugMix", t.fill, place),
    ),
)
@dataclass(frozen=True)
class AugMix(Transform):
    """AugMix: `mixture_width` chains of 1..3 (or `chain_depth`) operations at up to `severity`,
    mixed with Dirichlet(`alpha`) weights, then blended with the original with Beta(`alpha`, `alpha`)."""

    severity: int = 3
    mixture_width: int = 3
    chain_depth: int = -1
    alpha: float = 1.0
    all_ops: bool = True
    interpolation: str = "bilinear"
    fill: float | tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if not (is_int(self.severity) and 1 <= self.severity <= 10):
            raise reject("AugMix", "severity", self.severity, "an int in 1..10")
        if not (is_int(self.mixture_width) and 1 <= self.mixture_width <= 8):
            raise reject("AugMix", "mixture_width", self.mixture_width, "an int in 1..8")
        if not (is_int(self.chain_depth) and self.chain_depth <= 8):  # torchvision: <= 0 draws 1..3
            accepted = "an int <= 0 (1 to 3 at random) or in 1..8"
            raise reject("AugMix", "chain_depth", self.chain_depth, accepted)
        if not (is_number(self.alpha) and 0.0 < self.alpha <= 1e3):
            raise reject("AugMix", "alpha", self.alpha, "a number > 0")
        if not isinstance(self.all_ops, bool):
            raise reject("AugMix", "all_ops", self.all_ops, "True or False")
        take_interpolation(self)
        _check_interpolation("AugMix", self.interpolation)
        check_fill("AugMix", self.fill)
