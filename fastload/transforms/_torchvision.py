"""A torchvision pipeline (v1 or v2) converted to fastload's transforms and normalization
(`from_torchvision`), read from the attributes torchvision stores, by class name: torchvision is
not a dependency, and is never imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastload._errors import ConfigError
from fastload.transforms._base import Transform
from fastload.transforms._color import (
    ColorJitter,
    GaussianBlur,
    RandomAutocontrast,
    RandomEqualize,
    RandomGrayscale,
    RandomPosterize,
    RandomSolarize,
)
from fastload.transforms._geometric import CenterCrop, RandomHorizontalFlip, RandomResizedCrop, Resize
from fastload.transforms._mixing import CutMix, MixUp, RandomChoice, RandomErasing
from fastload.transforms._policies import AugMix, AutoAugment, RandAugment, TrivialAugmentWide
from fastload.transforms._timm import from_timm, is_timm, random_apply, timm_conversion

Normalization = tuple[tuple[float, ...], tuple[float, ...]]
"""(mean, std), one value per channel, in torchvision's units (pixels scaled to [0, 1])."""

# PIL's resampling constants, which torchvision still accepts for `interpolation`.
_PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

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


@dataclass
class _Units:
    """The pixel values' units at a point of a torchvision chain: a value v there is v * `scale`
    in uint8 units (0..255): `scale` is 255 once images are floats in [0, 1] (ToTensor,
    ToDtype(float, scale=True)), 1 while they are uint8 (PIL, PILToTensor, ToImage)."""

    scale: float = 1.0
    is_float: bool = False

    def convert(self, name: str, t: Any) -> None:
        """Follow a conversion of the image's type."""
        if name == "ToTensor":
            self.scale, self.is_float = 255.0, True
        elif name in ("ConvertImageDtype", "ToDtype"):
            to_float = _is_float_dtype(_image_dtype(name, t.dtype))
            if name == "ConvertImageDtype" or bool(getattr(t, "scale", False)):  # values rescaled
                if to_float and not self.is_float:
                    self.scale = 255.0
                elif not to_float and self.is_float:
                    self.scale = 1.0
            self.is_float = to_float


def _is_float_dtype(dtype: Any) -> bool:
    return bool(getattr(dtype, "is_floating_point", False))


def _image_dtype(name: str, dtype: Any) -> Any:
    """v2's ToDtype takes one dtype, or a dict of them by input type: the images' entry."""
    if not isinstance(dtype, Mapping):
        return dtype
    for key, value in dtype.items():
        if getattr(key, "__name__", None) == "Image":
            return value
    if "others" in dtype:
        return dtype["others"]
    raise ConfigError(f"{name}: cannot tell the images' dtype from {dtype!r}: give it for tv_tensors.Image")


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in value)


def _pair(value: Any) -> tuple[float, float]:
    """A (min, max) range torchvision stores (a tuple or a list; it checked the length)."""
    low, high = value
    return float(low), float(high)


def _range(value: Any) -> tuple[float, float] | None:
    return None if value is None else _pair(value)


def _size(value: Any) -> Any:
    """A torchvision size: an int, or a sequence of ints (a 1-sequence is the int it holds); the
    fastload transform checks it."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        sizes = tuple(int(v) for v in value)
        return sizes[0] if len(sizes) == 1 else sizes
    return int(value)


def _interpolation(kind: str, mode: Any) -> str:
    """torchvision's InterpolationMode (or a PIL constant) as fastload's name."""
    name = getattr(mode, "value", mode)
    if isinstance(name, int) and not isinstance(name, bool):
        name = _PIL_FILTERS.get(name, name)
    if name == "nearest-exact":
        raise ConfigError(
            f"{kind}: interpolation NEAREST_EXACT is not supported by fastload: use NEAREST (what "
            "torchvision does on PIL images) or another filter"
        )
    if not isinstance(name, str):
        raise ConfigError(f"{kind}: interpolation {mode!r} is not an InterpolationMode")
    return name


def _antialias(value: Any) -> bool:
    # None means "as the input type does": PIL images (what ImageFolder yields) always antialias.
    return True if value is None else bool(value)


@dataclass(frozen=True)
class _Place:
    """Where in the chain a transform is converted: the units of the images it gets, and the
    normalization (mean, std) that values written there still go through before the loader's
    output (the chain's Normalize ahead, or the one `from_torchvision` makes without it); None
    when they are already in the output's units (after Normalize, or uint8 all along)."""

    units: _Units
    ahead: Normalization | None


def _fill(kind: str, fill: Any, place: _Place) -> float | tuple[float, ...] | None:
    """A policy's fill in uint8 units; v2's dict of fills by input type: the images' entry."""
    if isinstance(fill, Mapping):
        images = [v for k, v in fill.items() if getattr(k, "__name__", None) == "Image"]
        if images:
            fill = images[0]
        elif "others" in fill:
            fill = fill["others"]
        else:
            raise ConfigError(
                f"{kind}: cannot tell the images' fill from {fill!r}: give one value or one per channel"
            )
    if fill is None:
        return None
    if isinstance(fill, Sequence) and not isinstance(fill, (str, bytes)):
        return tuple(float(v) * place.units.scale for v in fill)
    return float(fill) * place.units.scale


def _random_erasing(t: Any, place: _Place) -> RandomErasing:
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
        values = _floats(t.value) if isinstance(t.value, Sequence) else (float(t.value),)
        if place.ahead is not None:
            mean, std = place.ahead
            values = values * len(mean) if len(values) == 1 else values
            values = tuple((v * to_unit - m) / s for v, m, s in zip(values, mean, std, strict=True))
            if len(set(values)) == 1:
                values = values[:1]
        value = values[0] if len(values) == 1 else values
    return RandomErasing(p=float(t.p), scale=_pair(t.scale), ratio=_pair(t.ratio), value=value)


def _random_choice(t: Any, place: _Place) -> RandomChoice:
    members = tuple(_convert(m, place) for m in t.transforms)
    if not all(isinstance(m, (MixUp, CutMix)) for m in members):
        raise _unsupported(t, "fastload's RandomChoice picks between batch transforms, MixUp and CutMix")
    p = None if t.p is None else _floats(t.p)
    if p is not None and len(set(p)) == 1:
        p = None  # uniform (v2 stores its default, None, as equal weights)
    elif p is not None and sum(p) > 0:
        total = sum(p)
        p = tuple(w / total for w in p)  # as v2 stores them (v1 keeps the weights given)
    return RandomChoice(members, p)


def _mix(cls: type[MixUp] | type[CutMix], t: Any) -> MixUp | CutMix:
    if t.num_classes is None:
        raise ConfigError(
            f"{cls.__name__}: num_classes is None, but fastload's labels are class indices: give "
            "num_classes, the number of classes"
        )
    return cls(alpha=float(t.alpha), num_classes=int(t.num_classes))


def _resize(t: Any) -> Resize:
    if t.size is None:
        raise ConfigError(
            "Resize(size=None, max_size=...) cannot be converted: fastload's Resize needs a size (the "
            "shorter edge's, or (height, width))"
        )
    return Resize(
        size=_size(t.size),
        interpolation=_interpolation("Resize", t.interpolation),
        max_size=None if t.max_size is None else int(t.max_size),
        antialias=_antialias(t.antialias),
    )


_MAKERS: dict[str, Callable[[Any, _Place], Transform]] = {
    "RandomResizedCrop": lambda t, _: RandomResizedCrop(
        size=_size(t.size),
        scale=_pair(t.scale),
        ratio=_pair(t.ratio),
        interpolation=_interpolation("RandomResizedCrop", t.interpolation),
        antialias=_antialias(t.antialias),
    ),
    "Resize": lambda t, _: _resize(t),
    "CenterCrop": lambda t, _: CenterCrop(_size(t.size)),
    "RandomHorizontalFlip": lambda t, _: RandomHorizontalFlip(float(t.p)),
    "ColorJitter": lambda t, _: ColorJitter(
        brightness=_range(t.brightness),
        contrast=_range(t.contrast),
        saturation=_range(t.saturation),
        hue=_range(t.hue),
    ),
    "RandomGrayscale": lambda t, _: RandomGrayscale(float(t.p)),
    "GaussianBlur": lambda t, _: GaussianBlur(kernel_size=_size(t.kernel_size), sigma=_pair(t.sigma)),
    # The threshold is in the units of the images it gets: 0..255 for uint8, 0..1 for floats.
    "RandomSolarize": lambda t, place: RandomSolarize(float(t.threshold) * place.units.scale, float(t.p)),
    "RandomPosterize": lambda t, _: RandomPosterize(int(t.bits), float(t.p)),
    "RandomAutocontrast": lambda t, _: RandomAutocontrast(float(t.p)),
    "RandomEqualize": lambda t, _: RandomEqualize(float(t.p)),
    "RandAugment": lambda t, place: RandAugment(
        num_ops=int(t.num_ops),
        magnitude=int(t.magnitude),
        num_magnitude_bins=int(t.num_magnitude_bins),
        interpolation=_interpolation("RandAugment", t.interpolation),
        fill=_fill("RandAugment", t.fill, place),
    ),
    "TrivialAugmentWide": lambda t, place: TrivialAugmentWide(
        num_magnitude_bins=int(t.num_magnitude_bins),
        interpolation=_interpolation("TrivialAugmentWide", t.interpolation),
        fill=_fill("TrivialAugmentWide", t.fill, place),
    ),
    "AutoAugment": lambda t, place: AutoAugment(
        policy=str(getattr(t.policy, "value", t.policy)),
        interpolation=_interpolation("AutoAugment", t.interpolation),
        fill=_fill("AutoAugment", t.fill, place),
    ),
    "AugMix": lambda t, place: AugMix(
        severity=int(t.severity),
        mixture_width=int(t.mixture_width),
        chain_depth=int(t.chain_depth),
        alpha=float(t.alpha),
        all_ops=bool(t.all_ops),
        interpolation=_interpolation("AugMix", t.interpolation),
        fill=_fill("AugMix", t.fill, place),
    ),
    "RandomErasing": _random_erasing,
    "MixUp": lambda t, _: _mix(MixUp, t),
    "CutMix": lambda t, _: _mix(CutMix, t),
    "RandomChoice": _random_choice,
}
"""How each supported torchvision transform (by class name, v1 and v2 alike) becomes fastload's."""


def _unsupported(t: Any, why: str = "") -> ConfigError:
    name = type(t).__name__
    reason = f" ({why})" if why else ""
    return ConfigError(
        f"{name} has no fastload equivalent{reason}: run this pipeline through the Dataset path instead "
        f"(a torch Dataset that applies it, e.g. torchvision's ImageFolder(root, transform=...), given "
        f"to FastLoader), or leave {name} out"
    )


def _is_torchvision(t: Any) -> bool:
    return type(t).__module__.startswith("torchvision")


def _convert(t: Any, place: _Place) -> Transform:
    """One transform of the chain (not a conversion nor a Normalize) as fastload's."""
    if isinstance(t, Transform):
        return t
    name = type(t).__name__
    if is_timm(t):
        return from_timm(t, normalized=place.ahead is None)
    if not _is_torchvision(t):
        raise ConfigError(
            f"{name} (from {type(t).__module__}) is neither a torchvision nor a fastload transform: run the "
            "pipeline through the Dataset path instead (a torch Dataset that applies it, given to "
            "FastLoader), or use fastload.transforms"
        )
    make = _MAKERS.get(name)
    if make is None:
        raise _unsupported(t)
    return make(t, place)


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


def _converted(t: Any, place: _Place) -> tuple[Transform, ...]:
    """`_convert`, and RandomApply, which becomes no transform, its own, or fastload's."""
    if _is_torchvision(t) and type(t).__name__ == "RandomApply":
        return random_apply(t, lambda member: _convert(member, place))
    return (_convert(t, place),)


def from_torchvision(obj: object) -> tuple[tuple[Transform, ...], Normalization | None]:
    """Convert a torchvision pipeline into fastload transforms and the normalization to give
    FastLoader: `transforms, normalize = from_torchvision(pipeline)`, then
    `FastLoader(folder, transform=list(transforms), normalize=normalize, ...)`.

    `obj` is a `transforms.Compose` or `transforms.v2.Compose` (nested ones too), a single
    transform, or a list of them (fastload transforms in it are kept). Supported: RandomResizedCrop,
    Resize, CenterCrop, RandomHorizontalFlip, ColorJitter, RandomGrayscale, GaussianBlur,
    RandomSolarize, RandomPosterize, RandomAutocontrast, RandomEqualize, RandAugment,
    TrivialAugmentWide, AutoAugment, AugMix, RandomErasing, MixUp, CutMix, RandomChoice (of MixUp
    and CutMix); their parameters are read as torchvision stores them (InterpolationMode to
    "bilinear", "nearest", ...; AutoAugmentPolicy to "imagenet", "cifar10", "svhn").

    timm's transforms (`timm.data.create_transform`'s, `timm.data.Mixup`) and RandomApply convert
    too (`_timm`), approximations named in a UserWarning.

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
        ConfigError: a transform fastload does not have (RandomRotation, Lambda, RandomOrder, ...),
            named, with the alternative: a torch Dataset that applies the pipeline, given to
            FastLoader; or a photometric transform after Normalize (fastload runs them on uint8
            pixels, before normalizing), or more than one Normalize.
    """
    chain = _flatten(obj)
    # The units before each transform, and the chain's Normalize (RandomErasing before it needs it).
    units, before = _Units(), []
    normalize: Normalization | None = None
    normalize_at = len(chain)
    for i, t in enumerate(chain):
        before.append(_Units(units.scale, units.is_float))
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
        for converted in _converted(t, _Place(before[i], normalize if i < normalize_at else None)):
            if i > normalize_at and converted.stage == "pixels":
                raise ConfigError(
                    f"{type(t).__name__} comes after Normalize: fastload runs photometric transforms and "
                    "policies on uint8 pixels, before normalizing; move it before Normalize"
                )
            transforms.append(converted)
    return tuple(transforms), normalize


def _normalization(t: Any, units: _Units) -> Normalization:
    """A Normalize's (mean, std) in [0, 1] units (FastLoader's `normalize`), 3 values each.

    torchvision normalizes float images only: one that meets uint8 images (its conversion to
    float placed after it) is taken to mean images scaled to [0, 1], as usual."""
    mean, std = _floats(t.mean), _floats(t.std)
    mean, std = (mean * 3 if len(mean) == 1 else mean), (std * 3 if len(std) == 1 else std)
    to_unit = units.scale / 255.0 if units.is_float else 1.0
    return tuple(m * to_unit for m in mean), tuple(s * to_unit for s in std)
