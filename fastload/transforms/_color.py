"""The photometric transforms (stage "pixels"): colour, blur and tone operations on a sample's
uint8 pixels after its geometry, with torchvision's names, parameters and semantics (v2 where it
differs). They are declarations: the batched kernels that run them live in `fastload._augment`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastload.transforms._base import Transform, is_int, is_number, reject
from fastload.transforms._declare import declare_transform
from fastload.transforms._torchvision_reading import optional_range, range_pair, size_of


def check_probability(kind: str, p: object) -> None:
    """`p` must be a number in [0, 1]."""
    if not (is_number(p) and 0.0 <= p <= 1.0):
        raise reject(kind, "p", p, "a number in [0, 1]")


def factor_range(
    kind: str, param: str, value: object, center: float, bound: float, clip_first: bool
) -> tuple[float, float] | None:
    """torchvision's `ColorJitter._check_input`: a number v gives [center - v, center + v] (the low
    end clipped at 0 for factors), a pair is taken as (min, max); None when the range does nothing."""
    accepted = (
        f"None, a number >= 0 or a (min, max) pair with {-bound:g} <= min <= max <= {bound:g}"
        if not clip_first
        else "None, a number >= 0 or a (min, max) pair with 0 <= min <= max"
    )
    if value is None:
        return None
    if is_number(value):
        if value < 0 or (not clip_first and value > bound):
            raise reject(kind, param, value, accepted)
        low, high = center - float(value), center + float(value)
        if clip_first:
            low = max(low, 0.0)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        low, high = value
        if not (is_number(low) and is_number(high) and low <= high):
            raise reject(kind, param, value, accepted)
        low, high = float(low), float(high)
        valid = low >= 0 and high <= 1e6 if clip_first else -bound <= low <= high <= bound
        if not valid:
            raise reject(kind, param, value, accepted)
    else:
        raise reject(kind, param, value, accepted)
    return None if low == high == center else (low, high)


@declare_transform(
    stage="pixels",
    kernel="ColorJitter",
    example={"brightness": (1.5, 1.5)},
    torchvision=lambda t, _: ColorJitter(
        brightness=optional_range(t.brightness),
        contrast=optional_range(t.contrast),
        saturation=optional_range(t.saturation),
        hue=optional_range(t.hue),
    ),
)
@dataclass(frozen=True)
class ColorJitter(Transform):
    """Randomly change brightness, contrast, saturation and hue, in a random order per sample
    (torchvision v2 semantics).

    Each of brightness, contrast and saturation is None, a number v >= 0 (a factor drawn from
    [max(0, 1 - v), 1 + v]) or a (min, max) pair of factors; hue is None, a number h in [0, 0.5]
    (a shift drawn from [-h, h], in turns of the colour wheel) or a pair within [-0.5, 0.5].
    """

    brightness: float | tuple[float, float] | None = None
    contrast: float | tuple[float, float] | None = None
    saturation: float | tuple[float, float] | None = None
    hue: float | tuple[float, float] | None = None

    def __post_init__(self) -> None:
        self.ranges()

    def ranges(
        self,
    ) -> tuple[tuple[float, float] | None, tuple[float, float] | None, tuple[float, float] | None,
               tuple[float, float] | None]:
        """(brightness, contrast, saturation, hue) ranges; None for each that does nothing."""
        return (
            factor_range("ColorJitter", "brightness", self.brightness, 1.0, 0.0, True),
            factor_range("ColorJitter", "contrast", self.contrast, 1.0, 0.0, True),
            factor_range("ColorJitter", "saturation", self.saturation, 1.0, 0.0, True),
            factor_range("ColorJitter", "hue", self.hue, 0.0, 0.5, False),
        )


@declare_transform(
    stage="pixels",
    kernel="RandomGrayscale",
    example={"p": 1.0},
    torchvision=lambda t, _: RandomGrayscale(float(t.p)),
)
@dataclass(frozen=True)
class RandomGrayscale(Transform):
    """Convert to grayscale (kept as 3 channels) with probability `p`."""

    p: float = 0.1

    def __post_init__(self) -> None:
        check_probability("RandomGrayscale", self.p)


@declare_transform(
    stage="pixels",
    kernel="Grayscale",
    example={"num_output_channels": 3},
    torchvision=lambda t, _: Grayscale(int(t.num_output_channels)),
)
@dataclass(frozen=True)
class Grayscale(Transform):
    """Convert to grayscale, kept as 3 equal channels (torchvision's luma weights and rounding).

    torchvision's default, one output channel, is refused: a batch's images have 3 channels here
    (take the first channel of the batch, or use `num_output_channels=3`)."""

    num_output_channels: int = 3

    def __post_init__(self) -> None:
        if self.num_output_channels != 3 or not is_int(self.num_output_channels):
            raise reject(
                "Grayscale", "num_output_channels", self.num_output_channels,
                "3 (fastload's batches have 3 channels: take one channel of the batch for 1)",
            )


@declare_transform(
    stage="pixels",
    kernel="GaussianBlur",
    example={"kernel_size": (3, 3), "sigma": (1.0, 1.0)},
    torchvision=lambda t, _: GaussianBlur(kernel_size=size_of(t.kernel_size), sigma=range_pair(t.sigma)),
)
@dataclass(frozen=True)
class GaussianBlur(Transform):
    """Blur with a Gaussian kernel of `kernel_size` (odd, positive; an int, or torchvision's (kx, ky):
    the size along the width, then along the height) and a sigma drawn per sample from `sigma` (a
    number, or a (min, max) pair, > 0), the same along both axes."""

    kernel_size: int | tuple[int, int]
    sigma: float | tuple[float, float] = (0.1, 2.0)

    def __post_init__(self) -> None:
        self.kernel()
        self.sigma_range()

    def kernel(self) -> tuple[int, int]:
        """(along the width, along the height) sizes of the kernel, torchvision's (kx, ky) order,
        checked: odd and positive, at most 255."""
        size = self.kernel_size
        sizes = (size, size) if is_int(size) else tuple(size) if isinstance(size, Sequence) else ()
        if len(sizes) == 1:
            sizes = (sizes[0], sizes[0])
        if len(sizes) != 2 or not all(is_int(k) and 0 < k <= 255 and k % 2 == 1 for k in sizes):
            raise reject("GaussianBlur", "kernel_size", size, "an odd int in 1..255, or a pair of them")
        return int(sizes[0]), int(sizes[1])

    def sigma_range(self) -> tuple[float, float]:
        """(min, max) of the per-sample sigma, checked: 0 < min <= max (a number s or (s,): (s, s))."""
        sigma = self.sigma
        if is_number(sigma):
            low = high = float(sigma)
        elif isinstance(sigma, Sequence) and len(sigma) in (1, 2) and all(is_number(s) for s in sigma):
            low, high = float(sigma[0]), float(sigma[-1])  # torchvision takes (s,) as (s, s)
        else:
            low = high = -1.0
        if not 0.0 < low <= high <= 1e4:
            accepted = "a number > 0, or a (min, max) pair with 0 < min <= max"
            raise reject("GaussianBlur", "sigma", sigma, accepted)
        return low, high


@declare_transform(
    stage="pixels",
    kernel="RandomSolarize",
    example={"threshold": 128.0, "p": 1.0},
    # The threshold is in the units of the images it gets: 0..255 for uint8, 0..1 for floats.
    torchvision=lambda t, place: RandomSolarize(float(t.threshold) * place.units.scale, float(t.p)),
)
@dataclass(frozen=True)
class RandomSolarize(Transform):
    """Invert every pixel value at or above `threshold` (0..255, uint8 units) with probability `p`."""

    threshold: float
    p: float = 0.5

    def __post_init__(self) -> None:
        if not (is_number(self.threshold) and 0 <= self.threshold <= 255):
            raise reject("RandomSolarize", "threshold", self.threshold, "a number in [0, 255] (uint8 pixels)")
        check_probability("RandomSolarize", self.p)


@declare_transform(
    stage="pixels",
    kernel="RandomPosterize",
    example={"bits": 3, "p": 1.0},
    torchvision=lambda t, _: RandomPosterize(int(t.bits), float(t.p)),
)
@dataclass(frozen=True)
class RandomPosterize(Transform):
    """Keep only the `bits` (0..8) most significant bits of each channel, with probability `p`."""

    bits: int
    p: float = 0.5

    def __post_init__(self) -> None:
        if not (is_int(self.bits) and 0 <= self.bits <= 8):
            raise reject("RandomPosterize", "bits", self.bits, "an int in 0..8")
        check_probability("RandomPosterize", self.p)


@declare_transform(
    stage="pixels",
    kernel="RandomAutocontrast",
    example={"p": 1.0},
    torchvision=lambda t, _: RandomAutocontrast(float(t.p)),
)
@dataclass(frozen=True)
class RandomAutocontrast(Transform):
    """Stretch each channel to the full 0..255 range, with probability `p`."""

    p: float = 0.5

    def __post_init__(self) -> None:
        check_probability("RandomAutocontrast", self.p)


@declare_transform(
    stage="pixels",
    kernel="RandomEqualize",
    example={"p": 1.0},
    torchvision=lambda t, _: RandomEqualize(float(t.p)),
)
@dataclass(frozen=True)
class RandomEqualize(Transform):
    """Equalize each channel's histogram, with probability `p`."""

    p: float = 0.5

    def __post_init__(self) -> None:
        check_probability("RandomEqualize", self.p)
