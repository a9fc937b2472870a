"""Reading a torchvision transform as torchvision stores it (v1 or v2, by attribute, never importing
torchvision): its sizes, ranges, interpolation modes and fills, and the units of the images at its
place in the chain. The declared conversions (`torchvision=` of `declare_transform`) use these;
`_torchvision.from_torchvision` walks the chain and gives each its `Place`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastload._errors import ConfigError

if TYPE_CHECKING:
    from fastload.transforms._base import Transform

Normalization = tuple[tuple[float, ...], tuple[float, ...]]
"""(mean, std), one value per channel, in torchvision's units (pixels scaled to [0, 1])."""

# PIL's resampling constants, which torchvision still accepts for `interpolation`.
PIL_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

@dataclass
class Units:
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
            to_float = is_float_dtype(image_dtype(name, t.dtype))
            if name == "ConvertImageDtype" or bool(getattr(t, "scale", False)):  # values rescaled
                if to_float and not self.is_float:
                    self.scale = 255.0
                elif not to_float and self.is_float:
                    self.scale = 1.0
            self.is_float = to_float


def is_float_dtype(dtype: Any) -> bool:
    return bool(getattr(dtype, "is_floating_point", False))


def image_dtype(name: str, dtype: Any) -> Any:
    """v2's ToDtype takes one dtype, or a dict of them by input type: the images' entry."""
    if not isinstance(dtype, Mapping):
        return dtype
    for key, value in dtype.items():
        if getattr(key, "__name__", None) == "Image":
            return value
    if "others" in dtype:
        return dtype["others"]
    raise ConfigError(f"{name}: cannot tell the images' dtype from {dtype!r}: give it for tv_tensors.Image")


def floats(value: Any) -> tuple[float, ...]:
    return tuple(float(v) for v in value)


def range_pair(value: Any) -> tuple[float, float]:
    """A (min, max) range torchvision stores (a tuple or a list; it checked the length)."""
    low, high = value
    return float(low), float(high)


def optional_range(value: Any) -> tuple[float, float] | None:
    return None if value is None else range_pair(value)


def size_of(value: Any) -> Any:
    """A torchvision size: an int, or a sequence of ints (a 1-sequence is the int it holds); the
    fastload transform checks it."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        sizes = tuple(int(v) for v in value)
        return sizes[0] if len(sizes) == 1 else sizes
    return int(value)


def interpolation_of(kind: str, mode: Any) -> str:
    """torchvision's InterpolationMode (or a PIL constant) as fastload's name."""
    name = getattr(mode, "value", mode)
    if isinstance(name, int) and not isinstance(name, bool):
        name = PIL_FILTERS.get(name, name)
    if name == "nearest-exact":
        raise ConfigError(
            f"{kind}: interpolation NEAREST_EXACT is not supported by fastload: use NEAREST (what "
            "torchvision does on PIL images) or another filter"
        )
    if not isinstance(name, str):
        raise ConfigError(f"{kind}: interpolation {mode!r} is not an InterpolationMode")
    return name


def antialias_of(value: Any) -> bool:
    # None means "as the input type does": PIL images (what ImageFolder yields) always antialias.
    return True if value is None else bool(value)


@dataclass(frozen=True)
class Place:
    """Where in the chain a transform is converted: the units of the images it gets, and the
    normalization (mean, std) that values written there still go through before the loader's
    output (the chain's Normalize ahead, or the one `from_torchvision` makes without it); None
    when they are already in the output's units (after Normalize, or uint8 all along)."""

    units: Units
    ahead: Normalization | None
    convert: Callable[[Any, Place], Transform]
    """How the chain converts one transform (for a transform that holds others: RandomChoice)."""

    def member(self, t: Any) -> Transform:
        """A member transform (of a RandomChoice, a RandomApply) converted at this same place."""
        return self.convert(t, self)


def fill_at(kind: str, fill: Any, place: Place) -> float | tuple[float, ...] | None:
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


def unsupported(t: Any, why: str = "") -> ConfigError:
    """The error for a torchvision transform fastload does not have (or not with these parameters)."""
    name = type(t).__name__
    reason = f" ({why})" if why else ""
    return ConfigError(
        f"{name} has no fastload equivalent{reason}: run this pipeline through the Dataset path instead "
        f"(a torch Dataset that applies it, e.g. torchvision's ImageFolder(root, transform=...), given "
        f"to FastLoader), or leave {name} out"
    )
