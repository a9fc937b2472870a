"""Crop, resize and flip a batch of decoded images of any sizes into one NHWC uint8 batch.

The GPU decoders (`nvjpeg_decoder`) decode whole images; this module then does what the native
decoder does after its region decode: each sample's exact fractional box, resampled to the output
size with Pillow's antialiased filters (the same weights as native/fl_resample.c: a filter widened
by the downscale factor, its taps clipped to the sample's clip box and renormalized), mirrored for
a flip, rounded to uint8, written into its row of the batch.

    images: CHW uint8 tensors, one per sample, laid end to end in one flat buffer (`flatten`)
    inputs: (n, 4, 2) float32 per sample (`backends.boxes.sample_inputs`): the clip box's
            [anchor (y, x), shape (h, w)], then the box within it [start (y, x), end (y, x)],
            x reversed for a flip
    out:    (n, H, W, 3) uint8

On CUDA with Triton (it ships with PyTorch's CUDA builds on Linux) one kernel does the whole batch:
a program per (sample, block of output pixels), the 2-D filter as the product of the two 1-D
ones, no intermediate rounding (Pillow rounds between its two passes: a level apart at most).
Elsewhere `crop_resize_reference` does the same arithmetic per sample as two dense matrix
products (float64 weights): the fallback, and the reference the kernel is tested against.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

# Pillow's filters' supports (native/fl_resample.c has the same table); the kernel's codes.
FILTER_CODES = {"nearest": 0, "box": 1, "bilinear": 2, "hamming": 3, "bicubic": 4, "lanczos": 5}
_SUPPORT = {"nearest": 0.0, "box": 0.5, "bilinear": 1.0, "hamming": 1.0, "bicubic": 2.0, "lanczos": 3.0}


def _sinc(x: torch.Tensor) -> torch.Tensor:
    px = x * math.pi
    return torch.where(x == 0, torch.ones_like(x), torch.sin(px) / torch.where(x == 0, 1.0, px))


def _filter(name: str, x: torch.Tensor) -> torch.Tensor:
    """Pillow's filter `name` at `x`."""
    a = x.abs()
    if name == "box":
        return ((x > -0.5) & (x <= 0.5)).to(x.dtype)
    if name == "bilinear":
        return (1.0 - a).clamp(min=0.0)
    if name == "hamming":
        px = a * math.pi
        value = torch.sin(px) / torch.where(a == 0, 1.0, px) * (0.54 + 0.46 * torch.cos(px))
        return torch.where(a == 0, 1.0, torch.where(a >= 1.0, 0.0, value))
    if name == "bicubic":
        c = -0.5
        near = ((c + 2.0) * a - (c + 3.0)) * a * a + 1
        far = (((a - 5) * a + 8) * a - 4) * c
        return torch.where(a < 1.0, near, torch.where(a < 2.0, far, 0.0))
    if name == "lanczos":
        return torch.where((x >= -3.0) & (x < 3.0), _sinc(x) * _sinc(x / 3), 0.0)
    raise ValueError(f"no filter {name!r}")


def axis_weights(in_size: int, in0: float, in1: float, out_size: int, interpolation: str) -> torch.Tensor:
    """(out_size, in_size) float64: Pillow's resampling of [in0, in1) of an axis of `in_size`
    pixels to `out_size` (fl_coeffs_init's arithmetic, box rounded to float32 as Pillow does)."""
    in0, in1 = float(np.float32(in0)), float(np.float32(in1))
    scale = (in1 - in0) / out_size
    centers = in0 + (torch.arange(out_size, dtype=torch.float64) + 0.5) * scale
    dense = torch.zeros(out_size, in_size, dtype=torch.float64)
    rows = torch.arange(out_size)
    if interpolation == "nearest":
        dense[rows, centers.to(torch.int64).clamp(0, in_size - 1)] = 1.0
        return dense
    filterscale = max(scale, 1.0)
    support = _SUPPORT[interpolation] * filterscale
    ksize = math.ceil(support) * 2 + 1
    xmin = (centers - support + 0.5).trunc().clamp(min=0).to(torch.int64)
    xmax = (centers + support + 0.5).trunc().clamp(max=in_size).to(torch.int64)
    taps = xmin[:, None] + torch.arange(ksize)[None, :]
    valid = taps < xmax[:, None]
    w = _filter(interpolation, (taps - centers[:, None] + 0.5) / filterscale) * valid
    total = w.sum(1, keepdim=True)
    w = torch.where(total != 0, w / torch.where(total != 0, total, 1.0), w)
    dense.scatter_add_(1, taps.clamp(max=in_size - 1), w)
    return dense


def crop_resize_reference(
    images: Sequence[torch.Tensor], inputs: np.ndarray, out: torch.Tensor, interpolation: str
) -> None:
    """Fill `out` (n, H, W, 3) uint8 from CHW uint8 `images` and their `inputs` (see the module
    docstring), per sample, as two matrix products (on the images' device)."""
    _, height, width, _ = out.shape
    for i, image in enumerate(images):
        (ay, ax), (sh, sw), (y0, x0), (y1, x1) = inputs[i].tolist()
        ay, ax, sh, sw = int(ay), int(ax), int(sh), int(sw)
        flip = x0 > x1
        wy = axis_weights(sh, y0, y1, height, interpolation)
        wx = axis_weights(sw, min(x0, x1), max(x0, x1), width, interpolation)
        if flip:
            wx = wx.flip(0)
        crop = image[:3, ay : ay + sh, ax : ax + sw].to(torch.float64)
        wy, wx = wy.to(image.device), wx.to(image.device)
        pixels = torch.einsum("yh,chw,xw->yxc", wy, crop, wx)
        out[i] = (pixels + 0.5).floor().clamp(0, 255).to(torch.uint8)


def flatten(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(one flat uint8 buffer of the CHW `images` end to end, (n, 3) int64 [offset, H, W] each)."""
    sizes = np.array([(t.shape[1], t.shape[2]) for t in images], np.int64).reshape(-1, 2)
    offsets = np.zeros(len(images), np.int64)
    np.cumsum(3 * sizes[:-1, 0] * sizes[:-1, 1], out=offsets[1:])
    flat = torch.cat([t.reshape(-1) for t in images])
    return flat, torch.from_numpy(np.concatenate([offsets[:, None], sizes], axis=1))


def crop_resize(
    images: Sequence[torch.Tensor], inputs: np.ndarray, out: torch.Tensor, interpolation: str
) -> None:
    """Fill `out` from `images` (RGB CHW uint8, all on `out`'s device) and their `inputs`: one
    Triton kernel on CUDA where Triton imports, else `crop_resize_reference`."""
    kernel = _kernel() if out.is_cuda else None
    if kernel is None:
        crop_resize_reference(images, inputs, out, interpolation)
        return
    n, height, width, _ = out.shape
    if n == 0:
        return
    flat, layout = flatten(images)
    clip = inputs[:, :2].reshape(n, 4).astype(np.int64)  # anchor y, x, shape h, w
    meta = torch.from_numpy(np.concatenate([layout.numpy(), clip], axis=1)).to(out.device, non_blocking=True)
    box = torch.from_numpy(inputs[:, 2:].reshape(n, 4)[:, [0, 2, 1, 3]].copy())  # y0 y1 x0 x1
    box = box.to(out.device, non_blocking=True)
    block = 256
    grid = (n, triton_cdiv(height * width, block))
    kernel[grid](
        flat, meta, box, out, height, width,
        FILTER=FILTER_CODES[interpolation], SUPPORT=_SUPPORT[interpolation], BLOCK=block,
    )


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, compiled on first use; None where Triton cannot be imported."""
    try:
        from fastload._loading.decoding import crop_resize_triton
    except ImportError:
        return None
    return crop_resize_triton.crop_resize_kernel
