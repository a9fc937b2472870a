"""PIL's `Image.transform(size, AFFINE, matrix, BILINEAR | BICUBIC, fillcolor=fill)` on uint8
batches, bit for bit, and the matrices timm's rotate, shear and translate give it: the one job of
this module.

PIL maps each output pixel's centre (x + 0.5, y + 0.5) through the matrix to a source point
(float64); a point outside [0, W) x [0, H) leaves the fill colour; otherwise the source is sampled
at (point - 0.5), neighbours past an edge being the edge's: bilinear (two taps a side), or PIL's
bicubic (cubic convolution with a = -1, four taps a side), in double, clipped to 0..255 and
truncated (Pillow's Geometry.c: `affine_transform`, `bilinear_filter32RGB`, `bicubic_filter32RGB`).
All the samples of a call share one matrix (timm's groups share their argument).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

Matrix = tuple[float, float, float, float, float, float]


def timm_matrix(name: str, argument: float, height: int, width: int) -> Matrix:
    """The affine matrix (output pixel to source point) of timm's operation `name` at its argument:
    `rotate` (degrees, PIL's `Image.rotate` about the centre), `shear_x` / `shear_y` (factor),
    `translate_*_rel` (a fraction of the side)."""
    if name == "Rotate":
        angle = -math.radians(argument % 360.0)
        a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
        d, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
        cx, cy = width / 2, height / 2
        return (a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy)
    if name == "ShearX":
        return (1.0, argument, 0.0, 0.0, 1.0, 0.0)
    if name == "ShearY":
        return (1.0, 0.0, 0.0, argument, 1.0, 0.0)
    if name == "TranslateXRel":
        return (1.0, 0.0, argument * width, 0.0, 1.0, 0.0)
    if name == "TranslateYRel":
        return (1.0, 0.0, 0.0, 0.0, 1.0, argument * height)
    raise ValueError(f"no PIL matrix for {name!r}")


Tensor = torch.Tensor


def _cubic(v1: Tensor, v2: Tensor, v3: Tensor, v4: Tensor, d: Tensor) -> Tensor:
    """PIL's BICUBIC macro, in its order of operations."""
    p2 = -v1 + v3
    p3 = 2 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return v2 + d * (p2 + d * (p3 + d * p4))


def transform(x: torch.Tensor, matrix: Matrix, resample: str, fill: Sequence[float]) -> torch.Tensor:
    """PIL's affine transform of every sample of the uint8 batch x (N, C, H, W) with `matrix`,
    `resample` 'bilinear' or 'bicubic', `fill` (one value per channel) where the source is outside."""
    channels, height, width = x.shape[1:]
    a0, a1, a2, a3, a4, a5 = matrix
    dev = x.device
    ys = (torch.arange(height, device=dev, dtype=torch.float64) + 0.5).view(-1, 1)
    xs = (torch.arange(width, device=dev, dtype=torch.float64) + 0.5).view(1, -1)
    xin = a0 * xs + a1 * ys + a2
    yin = a3 * xs + a4 * ys + a5
    inside = (xin >= 0.0) & (xin < width) & (yin >= 0.0) & (yin < height)
    xf, yf = xin - 0.5, yin - 0.5
    x0, y0 = torch.floor(xf), torch.floor(yf)
    dx, dy = xf - x0, yf - y0
    x0, y0 = x0.to(torch.int64), y0.to(torch.int64)
    source = x.to(torch.float64)
    taps = range(0, 2) if resample == "bilinear" else range(-1, 3)

    def column(k: int) -> torch.Tensor:
        return (x0 + k).clamp_(0, width - 1)

    rows = []
    for j in taps:
        row = (y0 + j).clamp_(0, height - 1)
        values = [source[:, :, row, column(k)] for k in taps]
        if resample == "bilinear":
            rows.append(values[0] + (values[1] - values[0]) * dx)
        else:
            rows.append(_cubic(values[0], values[1], values[2], values[3], dx))
    if resample == "bilinear":
        value = rows[0] + (rows[1] - rows[0]) * dy
    else:
        value = _cubic(rows[0], rows[1], rows[2], rows[3], dy).clamp_(0.0, 255.0)
    pixel = torch.tensor([float(v) for v in fill], dtype=torch.float64, device=dev).view(1, channels, 1, 1)
    return torch.where(inside, value, pixel).to(torch.uint8)
