"""What every fastload transform shares: the `Transform` base, its stages, and the checks that
turn a bad parameter into a `ConfigError` naming the transform, the parameter, the value and what
is accepted (once, when the transform is built, never per sample).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, Protocol, TypeGuard

from fastload._errors import ConfigError

Stage = Literal["geometry", "pixels", "tensor", "batch"]
"""Where in the pipeline a transform runs (NOTE [transform stages] in `_plan`):

- "geometry": crops, resizes and flips, folded into the decode (only the kept pixels are decoded);
- "pixels": per-sample uint8 pixel operations after the geometry (colour, policies), in the
  workers when batches stay on the CPU, batched on the GPU after the copy otherwise;
- "tensor": per-sample operations on normalized images (RandomErasing, as torchvision orders it);
- "batch": operations that mix the samples of a batch (MixUp, CutMix), labels becoming soft targets.
"""

STAGES: tuple[Stage, ...] = ("geometry", "pixels", "tensor", "batch")


class Transform:
    """Base of every fastload transform: frozen data, checked when built, run by the loader.

    Subclasses are frozen dataclasses whose fields are torchvision's parameters, each declared
    once with `declare_transform` (`_declare`), which sets `stage`: where the loader runs it.
    """

    stage: ClassVar[Stage]


class RandomSource(Protocol):
    """Where a sample's random choices come from: a numpy Generator, or (in workers) the
    counter-based `SampleRandom` of `fastload._sample_random`."""

    def random(self) -> float: ...
    def uniform(self, low: float, high: float) -> float: ...
    def integers(self, low: int, high: int) -> Any: ...


INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos", "box", "hamming")

MAX_SIDE = 16384
"""The largest output side (and `Resize.max_size`) a transform accepts, in pixels.

One 16384 x 16384 RGB sample is already 768 MiB: a larger output cannot be part of a training
batch, and accepting it would only make the loader allocate absurd batch-slot buffers (or fail on
every sample). Checked once, when a transform is built, so a bad value fails at hello, not per sample.
"""

# Bounds on RandomResizedCrop's ranges, far beyond any useful value (a scale above 1 can never fit,
# so it only means "fall back to the central crop" more often): they keep `sample_box`'s arithmetic
# finite for any image, where e.g. scale=(1e300, 1e300) with ratio=(1e300, 1e300) would overflow.
MAX_SCALE = 1e6
MAX_RATIO = 1e6


def reject(kind: str, param: str, value: object, accepted: str) -> ConfigError:
    """The error for a bad parameter: names the transform, the parameter, the value and what is allowed."""
    shown = repr(value)
    if len(shown) > 80:  # a client's 4000-digit number should not make a 4 kB message
        shown = shown[:77] + "..."
    return ConfigError(f"{kind}: {param} must be {accepted}, got {shown}")


def is_int(value: object) -> TypeGuard[int]:
    """A Python int that is not a bool (a float or a bool is not a size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float, not a bool (NaN and infinities pass every comparison wrongly)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def side(value: object) -> int | None:
    """`value` if it is an int in 1..MAX_SIDE (not a bool, not a float), else None."""
    return value if is_int(value) and 1 <= value <= MAX_SIDE else None


def pair(size: object, kind: str) -> tuple[int, int]:
    """Return (height, width) from an int or a 1- or 2-sequence, as torchvision does.

    Every side must be an int in 1..MAX_SIDE.
    """
    accepted = f"an int in 1..{MAX_SIDE} or a (height, width) pair of them"
    if is_int(size):
        height = width = side(size)
    elif isinstance(size, Sequence) and not isinstance(size, (str, bytes)) and len(size) in (1, 2):
        height, width = side(size[0]), side(size[-1])
    else:
        raise reject(kind, "size", size, accepted)
    if height is None or width is None:
        raise reject(kind, "size", size, accepted)
    return height, width


def check_range(kind: str, param: str, value: object, lowest: float, highest: float) -> None:
    """Check a (min, max) pair of finite numbers with lowest < min <= max <= highest."""
    accepted = f"a (min, max) pair of finite numbers with {lowest:g} < min <= max <= {highest:g}"
    if not (isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2):
        raise reject(kind, param, value, accepted)
    low, high = value
    if not (is_number(low) and is_number(high) and lowest < low <= high <= highest):
        raise reject(kind, param, value, accepted)


def check_bool(kind: str, param: str, value: object) -> None:
    if not isinstance(value, bool):
        raise reject(kind, param, value, "True or False")


def interpolation_name(value: object) -> object:
    """torchvision's `InterpolationMode` (an Enum whose values are fastload's names) as its name;
    anything else as it is, for `check_interpolation` to judge."""
    name = getattr(value, "value", None)
    if type(value).__name__ == "InterpolationMode" and isinstance(name, str):
        return name
    return value


def take_interpolation(transform: Any) -> None:
    """Store a frozen transform's `interpolation` as fastload's name (torchvision's enum accepted)."""
    object.__setattr__(transform, "interpolation", interpolation_name(transform.interpolation))


def check_interpolation(name: str, interpolation: object) -> None:
    if not isinstance(interpolation, str) or interpolation not in INTERPOLATIONS:
        raise reject(name, "interpolation", interpolation, f"one of {', '.join(INTERPOLATIONS)}")


