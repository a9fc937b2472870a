"""PIL's `ImageFilter.GaussianBlur(radius)` on uint8 batches, bit for bit: the one job of this module.

PIL does not convolve with a Gaussian: it runs three box blurs of a fractional radius (Gwosdek et
al.'s extended box blur, `_gaussian_blur_radius` in Pillow's BoxBlur.c) along rows, then three
along columns, each pass rounding back to 8 bits. A pass of box radius r + a (r whole) gives the
2r + 1 pixels around x the weight `ww = int(2**24 / (2(r + a) + 1))` (float32 division, as PIL's)
and the two beyond them `fw = (2**24 - (2r + 1) ww) // 2`, pixels past an edge being the edge's,
then `(sum + 2**23) >> 24`. Here those are integer taps (int64: exact), per sample, the weights
made on the host (`box_weights`) and the passes batched over the samples (`gaussian_blur`).
"""

from __future__ import annotations

import numpy as np
import torch

PASSES = 3  # ImageFilter.GaussianBlur's


def box_radius(radius: float) -> np.float32:
    """PIL's `_gaussian_blur_radius(radius, 3)`, in its float32 (and double where it uses double)."""
    r = np.float32(radius)
    sigma2 = np.float32(r * r / np.float32(PASSES))
    length = np.float32(np.sqrt(12.0 * np.float64(sigma2) + 1.0))
    whole = np.float32(np.floor((np.float64(length) - 1.0) / 2.0))
    one, next_whole = np.float32(1), np.float32(whole + np.float32(1))
    a = np.float32((np.float32(2) * whole + one) * (whole * next_whole - np.float32(3) * sigma2))
    a = np.float32(a / (np.float32(6) * (sigma2 - next_whole * next_whole)))
    return np.float32(whole + a)


def box_weights(radii: np.ndarray) -> np.ndarray:
    """(N, 2R + 3) int64 taps of one pass for each sample's Gaussian radius (N,) (R: the largest
    whole box radius): `fw`, then 2r + 1 of `ww`, then `fw`, centred; zeros elsewhere. A radius of 0
    gives the identity tap (PIL copies the image)."""
    boxes = [box_radius(float(r)) for r in radii]
    whole = [int(b) for b in boxes]
    reach = max(whole, default=0) + 1
    taps = np.zeros((len(boxes), 2 * reach + 1), dtype=np.int64)
    for i, (b, r) in enumerate(zip(boxes, whole, strict=True)):
        if b == 0:
            taps[i, reach] = 1 << 24
            continue
        ww = int(np.float32(1 << 24) / (b * np.float32(2) + np.float32(1)))
        fw = ((1 << 24) - (2 * r + 1) * ww) // 2
        taps[i, reach - r : reach + r + 1] = ww
        taps[i, reach - r - 1] += fw
        taps[i, reach + r + 1] += fw
    return taps


def _pass(x: torch.Tensor, taps: torch.Tensor, dim: int) -> torch.Tensor:
    """One box pass along `dim` (int64 in, int64 out, in 0..255): edge pixels repeated."""
    size = x.shape[dim]
    reach = (taps.shape[1] - 1) // 2
    where = torch.arange(-reach, size + reach, device=x.device).clamp_(0, size - 1)
    padded = x.index_select(dim, where)
    acc = torch.zeros_like(x)
    for tap in range(taps.shape[1]):
        acc.add_(padded.narrow(dim, tap, size) * taps[:, tap].view(-1, 1, 1, 1))
    return acc.add_(1 << 23).bitwise_right_shift_(24)


def gaussian_blur(x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """PIL's GaussianBlur per sample of the uint8 batch x (N, C, H, W), with `taps` (N, K) from
    `box_weights`: three passes along rows, then three along columns."""
    if x.shape[0] == 0:
        return x
    work = x.to(torch.int64)
    taps = taps.to(device=x.device, dtype=torch.int64)
    for dim in (3, 3, 3, 2, 2, 2):
        work = _pass(work, taps, dim)
    return work.to(torch.uint8)
