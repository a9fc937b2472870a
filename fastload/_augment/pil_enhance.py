"""PIL's `ImageEnhance.Color`, `Contrast`, `Brightness` and `Sharpness` and `ImageOps.autocontrast`
on uint8 batches, bit for bit, a factor per sample: the one job of this module (timm's operations
call them; torchvision's tensor versions round differently, by a level here and there).

`enhance(factor)` is `Image.blend(degenerate, image, factor)`: `degenerate + factor (image -
degenerate)` in float32, clipped to 0..255 and truncated (Pillow's Blend.c), the degenerate image
being PIL's grey (`convert('L')`: (19595 R + 38470 G + 7471 B + 2**15) >> 16) for Color, the
grey's mean rounded (`int(mean + 0.5)`) for Contrast, black for Brightness, and PIL's SMOOTH
filter for Sharpness. autocontrast maps
each channel's [lo, hi] onto [0, 255] through `int(v * scale + offset)`, in float64.
"""

from __future__ import annotations

import torch


def pil_blend(degenerate: torch.Tensor, image: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's `Image.blend(degenerate, image, factor)` per sample (factor (N,), any value >= 0):
    float32, clipped, truncated to uint8."""
    a = factor.to(torch.float32).view(-1, 1, 1, 1)
    base = degenerate.to(torch.float32)
    return base.add_(image.to(torch.float32).sub_(base).mul_(a)).clamp_(0.0, 255.0).to(torch.uint8)


def grey(x: torch.Tensor) -> torch.Tensor:
    """PIL's `convert('L')` of RGB uint8 x (N, 3, H, W): (N, 1, H, W) int64."""
    r, g, b = (x[:, c : c + 1].to(torch.int64) for c in range(3))
    return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16


def color(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """`ImageEnhance.Color(image).enhance(factor)` per sample."""
    return pil_blend(grey(x).expand_as(x), x, factor)


def contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """`ImageEnhance.Contrast(image).enhance(factor)` per sample."""
    mean = grey(x).to(torch.float64).mean(dim=(1, 2, 3), keepdim=True)
    return pil_blend(torch.floor(mean + 0.5).expand_as(x), x, factor)


def brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """`ImageEnhance.Brightness(image).enhance(factor)` per sample."""
    return pil_blend(torch.zeros_like(x), x, factor)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """`ImageOps.autocontrast(image)` (no cutoff) per sample and channel: a channel whose values
    are all one stays as it is."""
    lo = x.amin(dim=(2, 3), keepdim=True).to(torch.float64)
    hi = x.amax(dim=(2, 3), keepdim=True).to(torch.float64)
    flat = hi <= lo
    # a tensor over a tensor: torch's `255.0 / t` multiplies by t's reciprocal (not PIL's quotient)
    scale = torch.full_like(hi, 255.0) / torch.where(flat, torch.ones_like(hi), hi - lo)
    offset = -lo * scale
    mapped = (x.to(torch.float64) * scale + offset).trunc_().clamp_(0.0, 255.0)
    return torch.where(flat, x.to(torch.float64), mapped).to(torch.uint8)


def _smooth(x: torch.Tensor) -> torch.Tensor:
    """PIL's `filter(ImageFilter.SMOOTH)` (3x3: 1 1 1 / 1 5 1 / 1 1 1, over 13) of uint8 x: float32
    taps (each weight k / 13 in float32) summed row below, row, row above, from 0.5, truncated and
    clipped (Pillow's ImagingFilter3x3); the one-pixel border as it is."""
    height, width = x.shape[-2], x.shape[-1]
    if height < 3 or width < 3:
        return x.clone()
    src = x.to(torch.float32)
    side = torch.tensor(1.0 / 13.0, dtype=torch.float32)
    centre = torch.tensor(5.0 / 13.0, dtype=torch.float32)
    acc = torch.full((*x.shape[:2], height - 2, width - 2), 0.5, dtype=torch.float32, device=x.device)
    for dy in (1, 0, -1):  # PIL's order: kernel rows 0, 1, 2 on the rows y + 1, y, y - 1
        rows = src[:, :, 1 + dy : height - 1 + dy]
        middle = centre if dy == 0 else side
        left, mid, right = rows[..., 0 : width - 2], rows[..., 1 : width - 1], rows[..., 2:width]
        acc.add_(left * side + mid * middle + right * side)
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = acc.clamp_(0.0, 255.0).to(torch.uint8)
    return out


def sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """`ImageEnhance.Sharpness(image).enhance(factor)` per sample."""
    return pil_blend(_smooth(x), x, factor)
