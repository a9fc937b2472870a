"""The operation spaces of torchvision v2's augmentation policies, as data: each operation's name,
magnitude table (built with the torch calls torchvision makes, so the float32 values are the same)
and sign, in torchvision's key order; and AutoAugment's learned sub-policies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Size = tuple[int, int]


@dataclass(frozen=True)
class Operation:
    """One entry of an operation space: the name torchvision gives it, its magnitude table (None:
    the operation takes no magnitude) and whether a magnitude is negated half the time."""

    name: str
    magnitudes: Callable[[int, Size], torch.Tensor] | None
    signed: bool = False


def _linspace(
    end: float | Callable[[Size], float], start: float = 0.0
) -> Callable[[int, Size], torch.Tensor]:
    """torchvision's `torch.linspace(start, end, num_bins)`, `end` maybe a function of (H, W)."""
    return lambda bins, size: torch.linspace(start, end(size) if callable(end) else end, bins)


def _posterize(top: int, span: int) -> Callable[[int, Size], torch.Tensor]:
    """torchvision's posterize bits: (top - arange(bins) / ((bins - 1) / span)).round().int()."""
    return lambda bins, size: (top - (torch.arange(bins) / ((bins - 1) / span))).round().int()


def _space(
    shear: float,
    translate: Callable[[Size], tuple[float, float]],
    rotate: float,
    color_max: float,
    posterize: tuple[int, int],
    extra: tuple[str, ...] = (),
    identity: bool = True,
) -> tuple[Operation, ...]:
    """A policy's space, in torchvision's key order (only the magnitudes differ between them)."""
    ops = [Operation("Identity", None)] if identity else []
    ops += [
        Operation("ShearX", _linspace(shear), True),
        Operation("ShearY", _linspace(shear), True),
        Operation("TranslateX", _linspace(lambda s: translate(s)[1]), True),
        Operation("TranslateY", _linspace(lambda s: translate(s)[0]), True),
        Operation("Rotate", _linspace(rotate), True),
        Operation("Brightness", _linspace(color_max), True),
        Operation("Color", _linspace(color_max), True),
        Operation("Contrast", _linspace(color_max), True),
        Operation("Sharpness", _linspace(color_max), True),
        Operation("Posterize", _posterize(*posterize)),
        Operation("Solarize", _linspace(0.0, start=1.0)),
        Operation("AutoContrast", None),
        Operation("Equalize", None),
    ]
    ops += [Operation(name, None) for name in extra]
    return tuple(ops)


def _relative(fraction: float) -> Callable[[Size], tuple[float, float]]:
    """Translation bounds (for Y, for X) as `fraction * side`, torchvision's `150.0 / 331.0 * width`."""
    return lambda size: (fraction * size[0], fraction * size[1])


RANDAUGMENT_SPACE = _space(0.3, _relative(150.0 / 331.0), 30.0, 0.9, (8, 4))
TRIVIALAUGMENT_SPACE = _space(0.99, lambda size: (32.0, 32.0), 135.0, 0.99, (8, 6))
AUTOAUGMENT_SPACE = _space(0.3, _relative(150.0 / 331.0), 30.0, 0.9, (8, 4), ("Invert",), identity=False)
_AUGMIX_ALL = _space(0.3, lambda size: (size[0] / 3.0, size[1] / 3.0), 30.0, 0.9, (4, 4), identity=False)
_PARTIAL = (
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)
AUGMIX_PARTIAL_SPACE = tuple(op for name in _PARTIAL for op in _AUGMIX_ALL if op.name == name)
AUGMIX_SPACE = AUGMIX_PARTIAL_SPACE + tuple(op for op in _AUGMIX_ALL if op.name not in _PARTIAL)
"""AugMix's spaces keep torchvision's order: the partial space, then the four colour operations."""


SubPolicy = tuple[tuple[str, float, int | None], tuple[str, float, int | None]]
"""Two (operation, probability, magnitude bin of 10 or None) pairs."""

AUTOAUGMENT_POLICIES: dict[str, tuple[SubPolicy, ...]] = {
    "imagenet": (
        (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
        (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
        (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
        (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
        (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
        (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
        (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
        (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
        (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
        (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
        (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
        (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
        (("Color", 0.4, 0), ("Equalize", 0.6, None)),
        (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
        (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
        (("Invert", 0.6, None), ("Equalize", 1.0, None)),
        (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
        (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    ),
    "cifar10": (
        (("Invert", 0.1, None), ("Contrast", 0.2, 6)),
        (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9)),
        (("Sharpness", 0.8, 1), ("Sharpness", 0.9, 3)),
        (("ShearY", 0.5, 8), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.5, None), ("Equalize", 0.9, None)),
        (("ShearY", 0.2, 7), ("Posterize", 0.3, 7)),
        (("Color", 0.4, 3), ("Brightness", 0.6, 7)),
        (("Sharpness", 0.3, 9), ("Brightness", 0.7, 9)),
        (("Equalize", 0.6, None), ("Equalize", 0.5, None)),
        (("Contrast", 0.6, 7), ("Sharpness", 0.6, 5)),
        (("Color", 0.7, 7), ("TranslateX", 0.5, 8)),
        (("Equalize", 0.3, None), ("AutoContrast", 0.4, None)),
        (("TranslateY", 0.4, 3), ("Sharpness", 0.2, 6)),
        (("Brightness", 0.9, 6), ("Color", 0.2, 8)),
        (("Solarize", 0.5, 2), ("Invert", 0.0, None)),
        (("Equalize", 0.2, None), ("AutoContrast", 0.6, None)),
        (("Equalize", 0.2, None), ("Equalize", 0.6, None)),
        (("Color", 0.9, 9), ("Equalize", 0.6, None)),
        (("AutoContrast", 0.8, None), ("Solarize", 0.2, 8)),
        (("Brightness", 0.1, 3), ("Color", 0.7, 0)),
        (("Solarize", 0.4, 5), ("AutoContrast", 0.9, None)),
        (("TranslateY", 0.9, 9), ("TranslateY", 0.7, 9)),
        (("AutoContrast", 0.9, None), ("Solarize", 0.8, 3)),
        (("Equalize", 0.8, None), ("Invert", 0.1, None)),
        (("TranslateY", 0.7, 9), ("AutoContrast", 0.9, None)),
    ),
    "svhn": (
        (("ShearX", 0.9, 4), ("Invert", 0.2, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.6, None), ("Solarize", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("AutoContrast", 0.8, None)),
        (("ShearY", 0.9, 8), ("Invert", 0.4, None)),
        (("ShearY", 0.9, 5), ("Solarize", 0.2, 6)),
        (("Invert", 0.9, None), ("AutoContrast", 0.8, None)),
        (("Equalize", 0.6, None), ("Rotate", 0.9, 3)),
        (("ShearX", 0.9, 4), ("Solarize", 0.3, 3)),
        (("ShearY", 0.8, 8), ("Invert", 0.7, None)),
        (("Equalize", 0.9, None), ("TranslateY", 0.6, 6)),
        (("Invert", 0.9, None), ("Equalize", 0.6, None)),
        (("Contrast", 0.3, 3), ("Rotate", 0.8, 4)),
        (("Invert", 0.8, None), ("TranslateY", 0.0, 2)),
        (("ShearY", 0.7, 6), ("Solarize", 0.4, 8)),
        (("Invert", 0.6, None), ("Rotate", 0.8, 4)),
        (("ShearY", 0.3, 7), ("TranslateX", 0.9, 3)),
        (("ShearX", 0.1, 6), ("Invert", 0.6, None)),
        (("Solarize", 0.7, 2), ("TranslateY", 0.6, 7)),
        (("ShearY", 0.8, 4), ("Invert", 0.8, None)),
        (("ShearX", 0.7, 9), ("TranslateY", 0.8, 3)),
        (("ShearY", 0.8, 5), ("AutoContrast", 0.7, None)),
        (("ShearX", 0.7, 2), ("Invert", 0.1, None)),
    ),
}
"""torchvision's `AutoAugment._get_policies`, per policy name."""
