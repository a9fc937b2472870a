"""Declarative image transforms with torchvision's names, parameters and semantics.

Transforms are data, not callables: a chain of them is compiled once into a `TransformPlan`, which
knows the output size up front (so batch buffers are sized before any image is decoded) and, for
each sample, turns the source image size and a random generator into a `SampleGeometry`: the box of
the *source* image that ends up in the output, the output size and whether to flip. A decoder then
decodes only that box and resizes it straight into the batch, which is what lets a native decoder
skip the pixels a crop throws away.

Randomness follows torchvision's algorithms exactly (e.g. `RandomResizedCrop`'s ten tries of a
log-uniform aspect ratio, then the central fallback); the generator is a numpy `Generator` seeded
from (seed, epoch, sample index), so results do not depend on which worker ran the sample.

Every parameter is checked once, when a transform is built (by a user, or by `from_config` from a
client's JSON): a NaN, an infinity, an empty or inverted range, a size that is a float, a bool or
beyond `MAX_SIDE` is a `ConfigError` naming the transform, the parameter, the value and what is
accepted, instead of an error on every sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

from fastload._errors import ConfigError

# The transforms and their union type. The loader's machinery here (`compile_transforms`,
# `TransformPlan`, `SampleGeometry`, `to_config`, `from_config`, `MAX_SIDE`) is used by module
# attribute inside fastload and is not part of the public API.
__all__ = [
    "CenterCrop",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "Resize",
    "Transform",
]

class RandomSource(Protocol):
    """Where a sample's random choices come from: a numpy Generator, or (in workers) the
    counter-based `SampleRandom` of `fastload._loading.sample_random`."""

    def random(self) -> float: ...
    def uniform(self, low: float, high: float) -> float: ...
    def integers(self, low: int, high: int) -> Any: ...


_INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos", "box", "hamming")

MAX_SIDE = 16384
"""The largest output side (and `Resize.max_size`) a transform accepts, in pixels.

One 16384 x 16384 RGB sample is already 768 MiB: a larger output cannot be part of a training
batch, and accepting it would only make the loader allocate absurd batch-slot buffers (or fail on
every sample). Checked once, when a transform is built, so a bad value fails at hello, not per sample.
"""

# Bounds on RandomResizedCrop's ranges, far beyond any useful value (a scale above 1 can never fit,
# so it only means "fall back to the central crop" more often): they keep `sample_box`'s arithmetic
# finite for any image, where e.g. scale=(1e300, 1e300) with ratio=(1e300, 1e300) would overflow.
_MAX_SCALE = 1e6
_MAX_RATIO = 1e6


def _reject(kind: str, param: str, value: object, accepted: str) -> ConfigError:
    """The error for a bad parameter: names the transform, the parameter, the value and what is allowed."""
    shown = repr(value)
    if len(shown) > 80:  # a client's 4000-digit number should not make a 4 kB message
        shown = shown[:77] + "..."
    return ConfigError(f"{kind}: {param} must be {accepted}, got {shown}")


def _is_int(value: object) -> TypeGuard[int]:
    """A Python int that is not a bool (a float or a bool is not a size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float, not a bool (NaN and infinities pass every comparison wrongly)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _side(value: object) -> int | None:
    """`value` if it is an int in 1..MAX_SIDE (not a bool, not a float), else None."""
    return value if _is_int(value) and 1 <= value <= MAX_SIDE else None


def _pair(size: object, kind: str) -> tuple[int, int]:
    """Return (height, width) from an int or a 1- or 2-sequence, as torchvision does.

    Every side must be an int in 1..MAX_SIDE.
    """
    accepted = f"an int in 1..{MAX_SIDE} or a (height, width) pair of them"
    if _is_int(size):
        height = width = _side(size)
    elif isinstance(size, Sequence) and not isinstance(size, (str, bytes)) and len(size) in (1, 2):
        height, width = _side(size[0]), _side(size[-1])
    else:
        raise _reject(kind, "size", size, accepted)
    if height is None or width is None:
        raise _reject(kind, "size", size, accepted)
    return height, width


def _check_range(kind: str, param: str, value: object, lowest: float, highest: float) -> None:
    """Check a (min, max) pair of finite numbers with lowest < min <= max <= highest."""
    accepted = f"a (min, max) pair of finite numbers with {lowest:g} < min <= max <= {highest:g}"
    if not (isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2):
        raise _reject(kind, param, value, accepted)
    low, high = value
    if not (_is_number(low) and _is_number(high) and lowest < low <= high <= highest):
        raise _reject(kind, param, value, accepted)


def _check_bool(kind: str, param: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _reject(kind, param, value, "True or False")


def _check_interpolation(name: str, interpolation: object) -> None:
    if not isinstance(interpolation, str) or interpolation not in _INTERPOLATIONS:
        raise _reject(name, "interpolation", interpolation, f"one of {', '.join(_INTERPOLATIONS)}")


@dataclass(frozen=True)
class RandomResizedCrop:
    """Crop a random area and aspect ratio, then resize to `size` (torchvision semantics).

    Args:
        size: output (height, width), or an int for a square.
        scale: range of the crop's area as a fraction of the image's area: finite, 0 < min <= max
            (max may exceed 1, as in torchvision; both at most 1e6).
        ratio: range of the crop's aspect ratio (width / height), sampled log-uniformly: finite,
            1e-6 < min <= max <= 1e6.
        interpolation: resampling filter; "bilinear" as torchvision's default.
        antialias: filter when downscaling, as torchvision's default (True) and PIL always do.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: str = "bilinear"
    antialias: bool = True

    def __post_init__(self) -> None:
        _pair(self.size, "RandomResizedCrop")
        _check_range("RandomResizedCrop", "scale", self.scale, 0.0, _MAX_SCALE)
        _check_range("RandomResizedCrop", "ratio", self.ratio, 1.0 / _MAX_RATIO, _MAX_RATIO)
        _check_interpolation("RandomResizedCrop", self.interpolation)
        _check_bool("RandomResizedCrop", "antialias", self.antialias)

    def sample_box(self, height: int, width: int, rng: RandomSource) -> tuple[int, int, int, int]:
        """Return (top, left, crop_height, crop_width), torchvision's `get_params` algorithm."""
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * rng.uniform(self.scale[0], self.scale[1])
            aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        # Fallback to a central crop with the ratio clamped into range.
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            w = width
            h = int(round(w / min(self.ratio)))
        elif in_ratio > max(self.ratio):
            h = height
            w = int(round(h * max(self.ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w


def _shorter_edge(size: int | Sequence[int]) -> int | None:
    """A Resize size's target for the shorter edge (an int or, as torchvision, a 1-sequence)."""
    if isinstance(size, int):
        return size
    return int(size[0]) if len(size) == 1 else None


@dataclass(frozen=True)
class Resize:
    """Resize to `size` (torchvision semantics).

    An int (or a 1-sequence, as in torchvision) matches the shorter edge to it, keeping the aspect
    ratio (the longer edge is `int(size * long / short)`, capped by `max_size`); a (height, width)
    pair sets both.
    """

    size: int | tuple[int, int]
    interpolation: str = "bilinear"
    max_size: int | None = None
    antialias: bool = True

    def __post_init__(self) -> None:
        _pair(self.size, "Resize")  # checks an int, a 1-sequence (the shorter edge) and a pair alike
        edge = _shorter_edge(self.size)
        _check_interpolation("Resize", self.interpolation)
        _check_bool("Resize", "antialias", self.antialias)
        if self.max_size is not None:
            if edge is None:
                raise ConfigError("Resize: max_size is only allowed when size is an int")
            if not (_is_int(self.max_size) and edge < self.max_size <= MAX_SIDE):
                raise _reject(
                    "Resize",
                    "max_size",
                    self.max_size,
                    f"None or an int larger than size ({edge}) and at most {MAX_SIDE}",
                )

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """Return the (height, width) an image of the given size is resized to."""
        edge = _shorter_edge(self.size)
        if edge is None:
            return _pair(self.size, "Resize")
        short, long = (height, width) if height <= width else (width, height)
        new_short, new_long = edge, int(edge * long / short)
        if self.max_size is not None and new_long > self.max_size:
            new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
        return (new_short, new_long) if height <= width else (new_long, new_short)


@dataclass(frozen=True)
class CenterCrop:
    """Crop the centre `size` (torchvision semantics; the crop must fit inside the image)."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        _pair(self.size, "CenterCrop")

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Return (top, left, crop_height, crop_width) for an image of the given size."""
        crop_h, crop_w = _pair(self.size, "CenterCrop")
        if crop_h > height or crop_w > width:
            raise ConfigError(
                f"CenterCrop({self.size}) is larger than the {height}x{width} image it gets; "
                "padding is not supported: put a Resize before it"
            )
        return int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0)), crop_h, crop_w


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Flip left-right with probability `p` (torchvision semantics)."""

    p: float = 0.5

    def __post_init__(self) -> None:
        if not (_is_number(self.p) and 0.0 <= self.p <= 1.0):
            raise _reject("RandomHorizontalFlip", "p", self.p, "a number in [0, 1]")


Transform = RandomResizedCrop | Resize | CenterCrop | RandomHorizontalFlip


@dataclass(frozen=True)
class SampleGeometry:
    """What one sample's transform chain does to its source image.

    `box` is (left, top, right, bottom) in source pixels, possibly fractional; the decoder resamples
    that box to `out_height` x `out_width` with `interpolation`, then mirrors it when `flip`.
    `clip` (same form; None for the whole image) bounds the source pixels the resampling filter
    may read: what the chain's last resize resampled. torchvision crops before it resizes, so at
    a RandomResizedCrop's edges the filter sees only the crop, not the image beyond it.
    """

    box: tuple[float, float, float, float]
    out_height: int
    out_width: int
    flip: bool
    interpolation: str
    clip: tuple[float, float, float, float] | None = None


@dataclass(frozen=True)
class TransformPlan:
    """A compiled transform chain: a fixed output size and a per-sample geometry sampler."""

    transforms: tuple[Transform, ...]
    out_height: int
    out_width: int
    interpolation: str

    def sample(self, height: int, width: int, rng: RandomSource) -> SampleGeometry:
        """Return the geometry for a source image of `height` x `width`, drawing from `rng`."""
        left, top, box_w, box_h = 0.0, 0.0, float(width), float(height)
        cur_h, cur_w = height, width
        flip = False
        clip = (0.0, 0.0, float(width), float(height))
        for t in self.transforms:
            if isinstance(t, RandomHorizontalFlip):
                # torchvision draws torch.rand(1) < p; the order of draws is part of determinism.
                if rng.random() < t.p:
                    flip = not flip
                continue
            if isinstance(t, Resize):
                cur_h, cur_w = t.output_size(cur_h, cur_w)
                clip = (left, top, left + box_w, top + box_h)  # the whole current image is resampled
                continue
            if isinstance(t, RandomResizedCrop):
                ct, cl, ch, cw = t.sample_box(cur_h, cur_w, rng)
                new_h, new_w = _pair(t.size, "RandomResizedCrop")
            else:
                ct, cl, ch, cw = t.box(cur_h, cur_w)
                new_h, new_w = ch, cw
            # Map the crop (in current-image pixels) back to the source; a flip before a crop
            # mirrors where the crop lands.
            sx, sy = box_w / cur_w, box_h / cur_h
            if flip:
                cl = cur_w - cl - cw
            left, top = left + cl * sx, top + ct * sy
            box_w, box_h = cw * sx, ch * sy
            cur_h, cur_w = new_h, new_w
            if isinstance(t, RandomResizedCrop):
                clip = (left, top, left + box_w, top + box_h)  # it resizes its crop, and only that
        return SampleGeometry(
            box=(left, top, left + box_w, top + box_h),
            out_height=cur_h,
            out_width=cur_w,
            flip=flip,
            interpolation=self.interpolation,
            clip=clip,
        )


def compile_transforms(transforms: Sequence[Transform] | None) -> TransformPlan:
    """Check a transform chain and return its plan.

    Raises:
        ConfigError: an unknown transform, or a chain whose output size depends on the image
            (batches need one size: end the chain with a crop or a fixed-size Resize).
    """
    chain = tuple(transforms or ())
    out: tuple[int, int] | None = None
    interpolation = "bilinear"
    for t in chain:
        if isinstance(t, RandomResizedCrop):
            out = _pair(t.size, "RandomResizedCrop")
            interpolation = t.interpolation
        elif isinstance(t, CenterCrop):
            out = _pair(t.size, "CenterCrop")
        elif isinstance(t, Resize):
            out = None if _shorter_edge(t.size) is not None else _pair(t.size, "Resize")
            interpolation = t.interpolation
        elif not isinstance(t, RandomHorizontalFlip):
            raise ConfigError(
                f"{t!r} is not a fastload transform: use fastload.transforms "
                "(RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip)"
            )
    if out is None:
        raise ConfigError(
            "the transform chain does not give every image the same size, but a batch needs one: "
            "end it with RandomResizedCrop, CenterCrop or Resize((height, width))"
        )
    return TransformPlan(chain, out[0], out[1], interpolation)


_BY_NAME: dict[str, type] = {
    "RandomResizedCrop": RandomResizedCrop,
    "Resize": Resize,
    "CenterCrop": CenterCrop,
    "RandomHorizontalFlip": RandomHorizontalFlip,
}


def to_config(transforms: Sequence[Transform]) -> list[dict[str, object]]:
    """The chain as plain JSON-able data: [{"type": name, field: value, ...}, ...]."""
    config: list[dict[str, object]] = []
    for t in transforms:
        entry: dict[str, object] = {"type": type(t).__name__}
        for name, value in vars(t).items():
            entry[name] = list(value) if isinstance(value, tuple) else value
        config.append(entry)
    return config


def _field_value(kind: str, name: str, value: object) -> object:
    """Check one field read from configuration: numbers, short strings, pairs of numbers, None."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and len(value) <= 32:
        return value
    if isinstance(value, list) and 1 <= len(value) <= 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        return tuple(value)
    raise ConfigError(f"{kind}.{name}: {value!r} is not a valid value")


def from_config(config: object) -> tuple[Transform, ...]:
    """Rebuild a chain from `to_config` data, validating every name, field and value.

    This is how transforms cross a socket (the daemon's clients): data, never pickles.
    """
    if not isinstance(config, list) or len(config) > 32:
        raise ConfigError("transforms must be a list of at most 32 entries")
    chain: list[Transform] = []
    for entry in config:
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise ConfigError(f"a transform entry must be an object with a 'type': {entry!r}")
        kind = entry["type"]
        cls = _BY_NAME.get(kind)
        if cls is None:
            raise ConfigError(f"unknown transform {kind!r}; known: {', '.join(sorted(_BY_NAME))}")
        fields = {f for f in cls.__dataclass_fields__}  # type: ignore[attr-defined]
        kwargs = {}
        for name, value in entry.items():
            if name == "type":
                continue
            if name not in fields:
                raise ConfigError(f"{kind} has no parameter {name!r}")
            kwargs[name] = _field_value(kind, name, value)
        try:
            chain.append(cls(**kwargs))
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{kind}: {e}") from e
    return tuple(chain)
