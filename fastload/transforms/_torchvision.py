"""A torchvision pipeline (v1 or v2) converted to fastload's transforms and normalization
(`from_torchvision`), read from the attributes torchvision stores, by class name: torchvision is
not a dependency, and is never imported here. Each transform converts as its fastload namesake
declares (`torchvision=` of `declare_transform`); this module walks the chain, following the
images' units, the Normalize and the type conversions it drops.
"""

from __future__ import annotations

from typing import Any

from fastload._errors import ConfigError
from fastload.transforms._base import Transform
from fastload.transforms._declare import declared_transforms
from fastload.transforms._timm import from_timm, is_timm, timm_conversion
from fastload.transforms._torchvision_reading import Normalization, Place, Units, floats, unsupported

# Dropped: conversions of the image's type (fastload's output makes the batch's: uint8, or float
# normalized), and no-ops.
_CONVERSIONS = {
    "ToTensor",
    "PILToTensor",
    "ToImage",
    "ToDtype",
    "ConvertImageDtype",
    "ToPureTensor",
    "Identity",
}


def _is_torchvision(t: Any) -> bool:
    return type(t).__module__.startswith("torchvision")


def _converted(t: Any, place: Place) -> tuple[Transform, ...]:
    """One transform of the chain (not a conversion nor a Normalize) as fastload's: as its
    namesake declares (RandomApply may become no transform, its own, or fastload's)."""
    if isinstance(t, Transform):
        return (t,)
    name = type(t).__name__
    if is_timm(t):
        return (from_timm(t, normalized=place.ahead is None),)
    if not _is_torchvision(t):
        raise ConfigError(
            f"{name} (from {type(t).__module__}) is neither a torchvision nor a fastload transform: run the "
            "pipeline through the Dataset path instead (a torch Dataset that applies it, given to "
            "FastLoader), or use fastload.transforms"
        )
    declared = declared_transforms().get(name)
    if declared is None or declared.torchvision is None:
        raise unsupported(t)
    converted = declared.torchvision(t, place)
    return converted if isinstance(converted, tuple) else (converted,)


def _convert(t: Any, place: Place) -> Transform:
    """A member of a transform that holds others (a RandomChoice's) as one fastload transform."""
    converted = _converted(t, place)
    if len(converted) != 1 or (_is_torchvision(t) and type(t).__name__ == "RandomApply"):
        raise unsupported(t)
    return converted[0]


def _flatten(obj: Any) -> list[Any]:
    """The chain's transforms in order: Compose and lists unrolled."""
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _flatten(item)]
    if _is_torchvision(obj) and type(obj).__name__ == "Compose":
        return _flatten(list(obj.transforms))
    return [obj]


def _passed_over(t: Any) -> str | None:
    """The name of a conversion (timm's as the torchvision one it acts as) or Normalize, else None."""
    name = type(t).__name__
    if _is_torchvision(t) and (name in _CONVERSIONS or name == "Normalize"):
        return name
    return timm_conversion(t)


def from_torchvision(obj: object) -> tuple[tuple[Transform, ...], Normalization | None]:
    """Convert a torchvision pipeline into fastload transforms and the normalization to give
    FastLoader: `transforms, normalize = from_torchvision(pipeline)`, then
    `FastLoader(folder, transform=list(transforms), normalize=normalize, ...)`.

    `obj` is a `transforms.Compose` or `transforms.v2.Compose` (nested ones too), a single
    transform, or a list of them (fastload transforms in it are kept). Supported: every torchvision
    transform whose fastload namesake declares a conversion (`declare_transform(torchvision=...)`;
    RandomChoice of MixUp and CutMix only); their parameters are read as torchvision stores them
    (InterpolationMode to "bilinear", "nearest", ...; AutoAugmentPolicy to "imagenet", "cifar10", "svhn").

    timm's transforms (`timm.data.create_transform`'s, `timm.data.Mixup`) convert too (`_timm`),
    approximations named in a UserWarning.

    Conversions of the image's type (ToTensor, PILToTensor, ToImage, ToDtype, ConvertImageDtype)
    are dropped, wherever they are: fastload's output makes the batch's type. They still set the
    units of what follows: a RandomSolarize threshold or a policy's fill written for float images
    in [0, 1] is scaled to fastload's uint8 units, and a RandomErasing value written before the
    Normalize (or the conversion to float) is brought to the output's units, where fastload erases.

    Returns:
        (transforms, normalize): `normalize` is the Normalize's (mean, std), 3 values each in [0, 1]
        units; ((0, 0, 0), (1, 1, 1)) when the pipeline makes float images in [0, 1] without a
        Normalize (fastload then yields those floats too); None when it yields uint8 images. The
        output's float dtype is FastLoader's `dtype` argument, not read from the pipeline.

    Raises:
        ConfigError: a transform fastload does not have (ElasticTransform, Lambda, RandomOrder, ...),
            named, with the alternative: a torch Dataset that applies the pipeline, given to
            FastLoader; or a photometric transform after Normalize (fastload runs them on uint8
            pixels, before normalizing), or more than one Normalize.
    """
    chain = _flatten(obj)
    # The units before each transform, and the chain's Normalize (RandomErasing before it needs it).
    units, before = Units(), []
    normalize: Normalization | None = None
    normalize_at = len(chain)
    for i, t in enumerate(chain):
        before.append(Units(units.scale, units.is_float))
        passed_over = _passed_over(t)
        if passed_over is None:
            continue
        if passed_over != "Normalize":
            units.convert(passed_over, t)
        elif normalize is None:
            normalize, normalize_at = _normalization(t, units), i
        else:
            raise ConfigError(
                "the pipeline has two Normalize: fastload normalizes once; combine them into one"
            )
    if normalize is None and units.is_float:  # float images without a Normalize: fastload makes them too
        normalize = ((0.0, 0.0, 0.0), (units.scale / 255.0,) * 3)

    transforms: list[Transform] = []
    for i, t in enumerate(chain):
        if _passed_over(t) is not None:
            continue
        for converted in _converted(t, Place(before[i], normalize if i < normalize_at else None, _convert)):
            if i > normalize_at and converted.stage == "pixels":
                raise ConfigError(
                    f"{type(t).__name__} comes after Normalize: fastload runs photometric transforms and "
                    "policies on uint8 pixels, before normalizing; move it before Normalize"
                )
            transforms.append(converted)
    return tuple(transforms), normalize


def _normalization(t: Any, units: Units) -> Normalization:
    """A Normalize's (mean, std) in [0, 1] units (FastLoader's `normalize`), 3 values each.

    torchvision normalizes float images only: one that meets uint8 images (its conversion to
    float placed after it) is taken to mean images scaled to [0, 1], as usual."""
    mean, std = floats(t.mean), floats(t.std)
    mean, std = (mean * 3 if len(mean) == 1 else mean), (std * 3 if len(std) == 1 else std)
    to_unit = units.scale / 255.0 if units.is_float else 1.0
    return tuple(m * to_unit for m in mean), tuple(s * to_unit for s in std)
