"""PIL's `ImageFilter.GaussianBlur(radius)` on uint8 batches, bit for bit: the one job of this module.

PIL does not convolve with a Gaussian: it runs three box blurs of a fractional radius (Gwosdek et
al.'s extended box blur, `_gaussian_blur_radius` in Pillow's BoxBlur.c) along rows, then three
along columns, each pass rounding back to 8 bits. A pass of box radius r + a (r whole) gives the
2r + 1 pixels around x the weight `ww = int(2**24 / (2(r + a) + 1))` (float32 division, as PIL's)
and the two beyond them `fw = (2**24 - (2r + 1) ww) // 2`, pixels past an edge being the edge's,
then `(sum + 2**23) >> 24`. Here those are integer taps per sample, the weights
made on the host (`box_weights`) and the passes batched over the samples (`gaussian_blur`), in
float64 (every sum is a whole number below 2**33: exact).
"""

from __future__ import annotations

import numpy as np
import torch

from fastload._augment.pil_images import per_image, pillow, runs_on_pil

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
    """(N, 2R + 4) float64: each sample's taps of one pass for its Gaussian radius (R: the largest
    whole box radius): `fw`, then 2r + 1 of `ww`, then `fw`, centred, zeros elsewhere (a radius
    of 0: the identity tap, PIL copies the image); then the radius itself (for the PIL path)."""
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
    return np.concatenate([taps.astype(np.float64), np.asarray(radii, dtype=np.float64).reshape(-1, 1)], 1)


def _pass(x: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """One box pass along the last dimension of x (float64 (N, C, H, W), whole values in 0..255,
    contiguous), edge pixels repeated: `(sum of taps x pixels + 2**23) >> 24`, exact in float64."""
    size = x.shape[-1]
    reach = (taps.shape[1] - 1) // 2
    edges = (x[..., :1].expand(*x.shape[:-1], reach), x[..., -1:].expand(*x.shape[:-1], reach))
    padded = torch.cat([edges[0], x, edges[1]], -1)
    acc = torch.zeros_like(x)
    for tap in range(taps.shape[1]):
        acc.addcmul_(padded[..., tap : tap + size], taps[:, tap].view(-1, 1, 1, 1))
    return acc.add_(1 << 23).div_(1 << 24).floor_()


def gaussian_blur(x: torch.Tensor, weights: torch.Tensor, use_pil: bool | None = None) -> torch.Tensor:
    """PIL's GaussianBlur per sample of the uint8 batch x (N, C, H, W), with `weights` from
    `box_weights`: three passes along rows, then three along columns (on the transposed image, as
    PIL does). On a CPU with Pillow, Pillow runs it image by image (`pil_images`: the same bits)."""
    if x.shape[0] == 0:
        return x
    if runs_on_pil(x, use_pil):
        image = pillow()
        assert image is not None
        radii = weights[:, -1].tolist()
        return per_image(x, lambda i, im: im.filter(image.ImageFilter.GaussianBlur(radii[i])))
    taps = weights[:, :-1].to(device=x.device, dtype=torch.float64)
    work = x.to(torch.float64).contiguous()
    for _ in range(PASSES):
        work = _pass(work, taps)
    work = work.transpose(2, 3).contiguous()
    for _ in range(PASSES):
        work = _pass(work, taps)
    return work.transpose(2, 3).to(torch.uint8)
