"""RandomPerspective's arithmetic, batched, as torchvision v2 computes it per image: the corners a
sample moves to (`corners`: its `make_params`' randint draws, from the sample's uniforms), the
eight coefficients that map them back (`coefficients`: `_get_perspective_coeffs`' least squares
in double precision, rounded to float32) and the sampling grid (`perspective_grid`:
`_perspective_grid`'s float32 arithmetic); `affine.grid_warp_` samples the image through it.
Everything after the uniforms runs on the batch's device (the corners depend on the size).
"""

from __future__ import annotations

import torch


def corners(u: torch.Tensor, height: int, width: int, distortion_scale: float) -> torch.Tensor:
    """(n, 4, 2) float64 (x, y) ends of the top-left, top-right, bottom-right and bottom-left
    corners, from the uniforms `u` (n, 8) (torchvision's 8 `randint` draws, in its order)."""
    bound_h = int(distortion_scale * (height // 2)) + 1
    bound_w = int(distortion_scale * (width // 2)) + 1
    low_x = [0, width - bound_w, width - bound_w, 0]
    low_y = [0, 0, height - bound_h, height - bound_h]
    low = torch.tensor([v for pair in zip(low_x, low_y, strict=True) for v in pair], dtype=torch.float64)
    span = torch.tensor([bound_w, bound_h] * 4, dtype=torch.float64)
    ends = (u.to(torch.float64) * span.to(u.device)).floor_().clamp_(max=span.to(u.device) - 1)
    return (ends + low.to(u.device)).view(-1, 4, 2)


def coefficients(ends: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(n, 8) float32: `_get_perspective_coeffs(startpoints, endpoints)` for each sample's `ends`
    (n, 4, 2), the start points being the image's corners."""
    n = ends.shape[0]
    start = torch.tensor(
        [[0, 0], [width - 1, 0], [width - 1, height - 1], [0, height - 1]],
        dtype=torch.float64,
        device=ends.device,
    )
    a = torch.zeros(n, 8, 8, dtype=torch.float64, device=ends.device)
    x, y = ends[..., 0], ends[..., 1]  # (n, 4)
    a[:, 0::2, 0], a[:, 0::2, 1], a[:, 0::2, 2] = x, y, 1.0
    a[:, 1::2, 3], a[:, 1::2, 4], a[:, 1::2, 5] = x, y, 1.0
    a[:, 0::2, 6], a[:, 0::2, 7] = -start[:, 0] * x, -start[:, 0] * y
    a[:, 1::2, 6], a[:, 1::2, 7] = -start[:, 1] * x, -start[:, 1] * y
    b = start.reshape(1, 8, 1).expand(n, 8, 1)
    solution: torch.Tensor = torch.linalg.lstsq(a, b, driver="gels").solution
    return solution.view(n, 8).to(torch.float32)


def perspective_grid(coeffs: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(n, H, W, 2) float32: torchvision's `_perspective_grid` for each sample's coefficients."""
    n, device = coeffs.shape[0], coeffs.device
    theta1 = coeffs[:, :6].reshape(n, 2, 3)
    ones = torch.ones(n, 1, dtype=torch.float32, device=device)
    row = torch.cat((coeffs[:, 6:8], ones), dim=1)
    theta2 = torch.stack((row, row), dim=1)  # (n, 2, 3)
    base = torch.empty(1, height, width, 3, dtype=torch.float32, device=device)
    base[..., 0].copy_(torch.linspace(0.5, width - 0.5, steps=width, device=device))
    base[..., 1].copy_(torch.linspace(0.5, height - 0.5, steps=height, device=device).unsqueeze_(-1))
    base[..., 2].fill_(1)
    scale = torch.tensor([0.5 * width, 0.5 * height], dtype=torch.float32, device=device)
    flat = base.view(1, height * width, 3).expand(n, -1, -1)
    grid = flat.bmm(theta1.transpose(1, 2).div(scale)).div_(flat.bmm(theta2.transpose(1, 2))).sub_(1.0)
    return grid.view(n, height, width, 2)
