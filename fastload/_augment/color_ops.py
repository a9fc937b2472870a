"""The colour transforms' `SampleOp`s (ColorJitter, GaussianBlur, Grayscale, RandomGrayscale,
RandomSolarize, RandomPosterize, RandomAutocontrast, RandomEqualize), in `KERNELS` by kernel name: each
draws its parameters from the loader's uniforms (`params`) and runs the kernels of `color`, in
place, on the samples they pick (`apply`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fastload._augment.batching import apply_kernel
from fastload._augment.color import (
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    autocontrast,
    equalize,
    gaussian_blur,
    posterize,
    rgb_to_grayscale,
    solarize,
)
from fastload._augment.ops import DeviceParams, Params, SampleKernel
from fastload._native_jpeg import native_pass
from fastload.transforms._color import ColorJitter, GaussianBlur


def _chosen(u: np.ndarray, p: float) -> np.ndarray:
    """The samples (increasing int64 indices) whose uniform `u` (N,) falls below `p`."""
    return np.flatnonzero(u < p).astype(np.int64)


def _uniform(u: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """`u` (N,) mapped onto [low, high), as float32 (torchvision draws its factors in float32)."""
    low, high = bounds
    return (low + u * (high - low)).astype(np.float32)


class RandomApplyOp:
    """A functional kernel run on the samples whose uniform falls below `p`: the random-apply
    transforms (grayscale, solarize, posterize, autocontrast, equalize). `per_sample` are the
    kernel's per-sample arguments, in order, each one value for every sample."""

    draws = 1

    def __init__(self, p: float, kernel: Callable[..., torch.Tensor], **per_sample: np.ndarray) -> None:
        self.p = p
        self.kernel = kernel
        self.per_sample = per_sample

    def params(self, u: np.ndarray) -> Params:
        """`index`: the samples it applies to; and each of `per_sample`, for each of them."""
        index = _chosen(u[:, 0], self.p)
        params = {"index": index}
        for name, value in self.per_sample.items():
            params[name] = np.full(index.shape[0], value)
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the kernel on the chosen samples, in place."""
        return apply_kernel(x, p["index"], self.kernel, *(p[name] for name in self.per_sample))


JITTER_KERNELS: tuple[tuple[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]], ...] = (
    ("brightness", adjust_brightness),
    ("contrast", adjust_contrast),
    ("saturation", adjust_saturation),
    ("hue", adjust_hue),
)
"""ColorJitter's operations, by torchvision's `fn_idx` (0 brightness ... 3 hue)."""


class ColorJitterOp:
    """ColorJitter: per sample, each present factor uniform in its range and the four operations in
    a random order (torchvision: `randperm(4)`; here the argsort of 4 uniforms). Position by
    position, the samples are grouped by the operation they run there."""

    draws = 8
    """4 for the order, then one per factor (brightness, contrast, saturation, hue)."""

    def __init__(self, transform: ColorJitter) -> None:
        self.ranges = dict(zip((name for name, _ in JITTER_KERNELS), transform.ranges(), strict=True))
        # CPU batches without a hue shift: one native pass per sample (`fastload._jpeg.color_jitter`,
        # the same bits as these kernels, ~2.3x faster).
        self._native = native_pass("color_jitter") if self.ranges["hue"] is None else None

    def params(self, u: np.ndarray) -> Params:
        """`order` (N, 4): the operation (0 brightness ... 3 hue) at each position; each present
        factor (N,) float32; and per position k and present operation, `index@k:name` (the samples
        that run it there) and `name@k` (their factors)."""
        order = np.argsort(u[:, :4], axis=1, kind="stable").astype(np.int64)
        params: Params = {"order": order}
        for op_id, (name, _) in enumerate(JITTER_KERNELS):
            bounds = self.ranges[name]
            if bounds is None:
                continue
            factor = _uniform(u[:, 4 + op_id], bounds)
            params[name] = factor
            for position in range(4):
                index = np.flatnonzero(order[:, position] == op_id).astype(np.int64)
                params[f"index@{position}:{name}"] = index
                params[f"{name}@{position}"] = factor[index]
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the four positions in turn, each on its groups of samples, in place."""
        if self._native is not None and x.device.type == "cpu" and x.shape[0]:
            nhwc = x.permute(0, 2, 3, 1)
            if nhwc.is_contiguous():  # a worker's rows of a slot
                self._run_native(nhwc, p)
                return x
        for position in range(4):
            for name, kernel in JITTER_KERNELS:
                if self.ranges[name] is not None:
                    apply_kernel(x, p[f"index@{position}:{name}"], kernel, p[f"{name}@{position}"])
        return x


    def _run_native(self, nhwc: torch.Tensor, p: DeviceParams) -> None:
        n = nhwc.shape[0]
        order = p["order"].to(torch.int64).clone()
        factors = torch.ones((n, 3), dtype=torch.float32)
        for op_id, (name, _) in enumerate(JITTER_KERNELS[:3]):
            if self.ranges[name] is None:
                order[order == op_id] = -1  # absent: the position does nothing
            else:
                factors[:, op_id] = p[name]
        order[order == 3] = -1  # hue: absent on this path
        assert self._native is not None
        self._native(nhwc.numpy(), n, order.numpy(), factors.numpy())


class GaussianBlurOp:
    """GaussianBlur: every sample, with its sigma uniform in the range (both axes, as torchvision)."""

    draws = 1

    def __init__(self, transform: GaussianBlur) -> None:
        self.kernel_size = transform.kernel()
        self.sigma_range = transform.sigma_range()

    def params(self, u: np.ndarray) -> Params:
        """`index` (every sample) and `sigma` (N,) float32."""
        return {"index": np.arange(u.shape[0], dtype=np.int64), "sigma": _uniform(u[:, 0], self.sigma_range)}

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Blur the batch, in place."""
        return apply_kernel(x, p["index"], gaussian_blur, p["sigma"], kernel_size=self.kernel_size)


KERNELS: dict[str, SampleKernel] = {
    "ColorJitter": lambda t, _: ColorJitterOp(t),
    "GaussianBlur": lambda t, _: GaussianBlurOp(t),
    "Grayscale": lambda t, _: RandomApplyOp(1.0, rgb_to_grayscale),
    "RandomGrayscale": lambda t, _: RandomApplyOp(t.p, rgb_to_grayscale),
    "RandomSolarize": lambda t, _: RandomApplyOp(t.p, solarize, threshold=np.asarray(float(t.threshold))),
    "RandomPosterize": lambda t, _: RandomApplyOp(t.p, posterize, bits=np.asarray(t.bits, dtype=np.int64)),
    "RandomAutocontrast": lambda t, _: RandomApplyOp(t.p, autocontrast),
    "RandomEqualize": lambda t, _: RandomApplyOp(t.p, equalize),
}
"""The colour transforms' kernels, by the names their declarations give (`registry`)."""
