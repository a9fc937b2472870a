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

from fastload._augment.pil_images import per_image, pillow, runs_on_pil

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
    """PIL's BICUBIC macro, `p1 + d (p2 + d (p3 + d p4))`, in its order of operations. The p
    terms of whole pixel values (int16) are exact in any type; only the Horner steps need float64."""
    p2 = v3 - v1  # -v1 + v3
    p3 = (v1 - v2).mul_(2).add_(v3).sub_(v4)
    p4 = (v2 - v1).sub_(v3).add_(v4)  # -v1 + v2 - v3 + v4
    f64 = torch.float64
    horner = p4.to(f64).mul_(d).add_(p3.to(f64)).mul_(d).add_(p2.to(f64)).mul_(d)
    return horner.add_(v2.to(f64))


def transform(
    x: torch.Tensor, matrix: Matrix, resample: str, fill: Sequence[float], use_pil: bool | None = None
) -> torch.Tensor:
    """PIL's affine transform of every sample of the uint8 batch x (N, C, H, W) with `matrix`,
    `resample` 'bilinear' or 'bicubic', `fill` (one value per channel) where the source is outside.
    On a CPU with Pillow, Pillow runs it image by image (`pil_images`: the same bits).
    The source pixels are gathered by flat index as rows of (H * W, N * C) (one index per tap, the
    same for every sample: each gathered row is contiguous), the arithmetic in float64 as PIL's."""
    n, channels, height, width = x.shape
    if runs_on_pil(x, use_pil):
        image = pillow()
        assert image is not None
        method = image.Resampling.BICUBIC if resample == "bicubic" else image.Resampling.BILINEAR
        colour = tuple(int(v) for v in fill)
        return per_image(
            x, lambda _, im: im.transform(im.size, image.Transform.AFFINE, matrix, method, fillcolor=colour)
        )
    a0, a1, a2, a3, a4, a5 = matrix
    dev = x.device
    ys = (torch.arange(height, device=dev, dtype=torch.float64) + 0.5).view(-1, 1)
    xs = (torch.arange(width, device=dev, dtype=torch.float64) + 0.5).view(1, -1)
    xin = (a0 * xs + a1 * ys + a2).reshape(-1, 1)
    yin = (a3 * xs + a4 * ys + a5).reshape(-1, 1)
    inside = (xin >= 0.0) & (xin < width) & (yin >= 0.0) & (yin < height)
    xf, yf = xin - 0.5, yin - 0.5
    x0, y0 = torch.floor(xf), torch.floor(yf)
    dx, dy = xf - x0, yf - y0
    x0, y0 = x0.to(torch.int64).view(-1), y0.to(torch.int64).view(-1)
    pixels = x.permute(2, 3, 0, 1).reshape(height * width, n * channels)
    taps = range(0, 2) if resample == "bilinear" else range(-1, 3)
    columns = [(x0 + k).clamp_(0, width - 1) for k in taps]

    def along_row(j: int) -> torch.Tensor:
        start = (y0 + j).clamp_(0, height - 1) * width
        v = [pixels.index_select(0, start + c).to(torch.int16) for c in columns]
        if resample == "bilinear":  # a + (b - a) dx
            return (v[1] - v[0]).to(torch.float64).mul_(dx).add_(v[0].to(torch.float64))
        return _cubic(v[0], v[1], v[2], v[3], dx)

    lines = [along_row(j) for j in taps]
    if resample == "bilinear":
        value = (lines[1] - lines[0]).mul_(dy).add_(lines[0])
    else:
        value = _cubic(lines[0], lines[1], lines[2], lines[3], dy).clamp_(0.0, 255.0)
    pixel = torch.tensor([float(v) for v in fill], dtype=torch.float64, device=dev).repeat(n)
    out = torch.where(inside, value, pixel).to(torch.uint8)
    return out.view(height, width, n, channels).permute(2, 3, 0, 1)
