"""The `SampleOp`s of the geometric transforms run on the pixels after the decode (RandomVerticalFlip,
RandomRotation, RandomAffine, RandomPerspective: `fastload.transforms._warps`), in `KERNELS` by
kernel name.

Each draws its parameters per sample from the loader's uniforms on the host (`params`: the angle,
scale and shears, and the size-free part of torchvision's inverse matrix, in double precision with
`math`, as torchvision computes it); `apply` completes the matrices for the batch's size on its
device (`affine.thetas`: translations and centres depend on the size) and warps the samples with
the policies' kernels (`affine.warp_`, `affine.rot90_`), which equal torchvision's tensor `affine`
and `rotate` pixel for pixel.
"""

from __future__ import annotations

import numpy as np
import torch

from fastload._augment import groups
from fastload._augment.affine import Fill, grid_warp_, linear_parts, rot90_, thetas, warp_
from fastload._augment.ops import DeviceParams, Params, SampleKernel
from fastload._augment.perspective import coefficients, corners, perspective_grid
from fastload.transforms._policies import fill_values
from fastload.transforms._warps import RandomAffine, RandomPerspective, RandomRotation, RandomVerticalFlip

_TURNS = {0.0: 0, 90.0: 1, 180.0: 2, 270.0: 3}
"""torchvision's `rotate_image` fast path: an angle (mod 360) done as quarter turns of `rot90`."""


def _uniform32(u: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """`u` (N,) mapped onto [low, high] as float32 values (torchvision draws them in float32), as
    float64 for the double-precision matrices."""
    low, high = bounds
    return np.float32(low) + u.astype(np.float32) * np.float32(high - low)


def _fill(fill: float | tuple[float, ...] | None) -> Fill:
    return None if fill is None else fill_values(fill)


def _centre(center: tuple[float, ...] | None, height: int, width: int) -> tuple[float, float]:
    """torchvision's `center_f`: the centre relative to the image's, (0, 0) when None."""
    if center is None:
        return 0.0, 0.0
    return center[0] - width * 0.5, center[1] - height * 0.5


class VerticalFlipOp:
    """RandomVerticalFlip: the samples whose uniform falls below p, flipped top-bottom."""

    draws = 1

    def __init__(self, transform: RandomVerticalFlip) -> None:
        self.p = float(transform.p)

    def params(self, u: np.ndarray) -> Params:
        """`index`: the samples it flips."""
        return {"index": np.flatnonzero(u[:, 0] < self.p).astype(np.int64)}

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Flip the chosen samples, in place."""
        return groups.apply_to(x, p["index"], lambda group: group.flip(-2))


class RotationOp:
    """RandomRotation: per sample an angle uniform in its range; angles torchvision turns by
    quarter turns (about the centre) done so, the others warped through their own grid."""

    draws = 1

    def __init__(self, transform: RandomRotation) -> None:
        self.range = transform.angle_range()
        self.center = transform.center
        self.interpolation = transform.interpolation
        self.fill = _fill(transform.fill)

    def params(self, u: np.ndarray) -> Params:
        """`angle` (N,) in degrees, `linear` (N, 4) float64 (torchvision's matrix of -angle mod
        360), and `turns@k` (k = 0..3, the samples whose angle is k quarter turns: only without a
        centre) and `warp` (the others)."""
        angle = _uniform32(u[:, 0], self.range).astype(np.float64)
        modulo = np.mod(angle, 360.0)
        linear = np.array([linear_parts(-float(a), 1.0, (0.0, 0.0)) for a in modulo]).reshape(-1, 4)
        turns = np.array([-1 if self.center is not None else _TURNS.get(float(a), -1) for a in modulo])
        params: Params = {"angle": angle, "linear": linear}
        params["warp"] = np.flatnonzero(turns < 0).astype(np.int64)
        for k in range(4):
            params[f"turns@{k}"] = np.flatnonzero(turns == k).astype(np.int64)
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Rotate the batch, in place."""
        height, width = x.shape[-2], x.shape[-1]
        warped = [p["warp"]]
        rot90_(x, p["turns@2"], 2)
        for k in (1, 3):  # torchvision turns only a square image by 90 or 270 degrees
            if height == width:
                rot90_(x, p[f"turns@{k}"], k)
            else:
                warped.append(p[f"turns@{k}"])
        index = warped[0] if len(warped) == 1 else torch.cat(warped)
        _warp(x, index, p["linear"], None, _centre(self.center, height, width), self.interpolation, self.fill)
        return x


class AffineOp:
    """RandomAffine: per sample an angle, a translation, a scale and two shears, each uniform in
    its range (torchvision's `make_params`), the sample warped through its own grid."""

    draws = 6
    """angle, translation x, translation y, scale, shear x, shear y."""

    def __init__(self, transform: RandomAffine) -> None:
        self.ranges = transform.ranges()
        self.translate = transform.translate
        self.center = transform.center
        self.interpolation = transform.interpolation
        self.fill = _fill(transform.fill)

    def params(self, u: np.ndarray) -> Params:
        """`angle`, `scale`, `shear` (N, 2) and `linear` (N, 4) float64; `shift` (N, 2): the
        translations' uniforms (the pixels they give depend on the size: `translations`)."""
        angle_range, scale_range, shear_x, shear_y = self.ranges
        angle = _uniform32(u[:, 0], angle_range).astype(np.float64)
        scale = _uniform32(u[:, 3], scale_range).astype(np.float64)
        shear = np.stack([_uniform32(u[:, 4], shear_x), _uniform32(u[:, 5], shear_y)], axis=1)
        shear = shear.astype(np.float64)
        linear = np.array(
            [linear_parts(float(a), float(s), (float(sx), float(sy)))
             for a, s, (sx, sy) in zip(angle, scale, shear, strict=True)]
        ).reshape(-1, 4)
        return {
            "angle": angle, "scale": scale, "shear": shear, "linear": linear,
            "shift": u[:, 1:3].astype(np.float32), "index": np.arange(u.shape[0], dtype=np.int64),
        }

    def translations(self, shift: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(N, 2) float64 whole pixels (tx, ty): round(uniform(-a * width, a * width)) and the same
        for b and the height (0 without `translate`), from the uniforms `shift` (N, 2) float32."""
        if self.translate is None:
            return torch.zeros(shift.shape, dtype=torch.float64, device=shift.device)
        most = torch.tensor(
            [float(self.translate[0] * width), float(self.translate[1] * height)], device=shift.device
        ).to(torch.float32)
        return (shift * (2 * most) - most).round_().to(torch.float64)

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Warp the batch, in place."""
        height, width = x.shape[-2], x.shape[-1]
        translate = self.translations(p["shift"], height, width)
        centre = _centre(self.center, height, width)
        _warp(x, p["index"], p["linear"], translate, centre, self.interpolation, self.fill)
        return x


class PerspectiveOp:
    """RandomPerspective: the samples whose first uniform falls below p, each warped by the corners
    its other 8 uniforms draw (`perspective`)."""

    draws = 9

    def __init__(self, transform: RandomPerspective) -> None:
        self.p = float(transform.p)
        self.distortion_scale = float(transform.distortion_scale)
        self.interpolation = transform.interpolation
        self.fill = _fill(transform.fill)

    def params(self, u: np.ndarray) -> Params:
        """`index`: the samples it warps; `corners` (n, 8) float32: their corners' uniforms."""
        index = np.flatnonzero(u[:, 0] < self.p).astype(np.int64)
        return {"index": index, "corners": u[index, 1:].astype(np.float64)}

    def coefficients(self, corner_u: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(n, 8) float32: the perspective coefficients of the chosen samples (torchvision's)."""
        return coefficients(corners(corner_u, height, width, self.distortion_scale), height, width)

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Warp the chosen samples, in place."""
        index = p["index"]
        if index.numel() == 0:
            return x
        height, width = x.shape[-2], x.shape[-1]
        grid = perspective_grid(self.coefficients(p["corners"], height, width), height, width)
        grid_warp_(x, index, grid, self.interpolation, self.fill)
        return x


def _warp(
    x: torch.Tensor, index: torch.Tensor, linear: torch.Tensor, translate: torch.Tensor | None,
    centre: tuple[float, float], interpolation: str, fill: Fill,
) -> None:
    """Warp the samples `index` of x in place by their matrices (`linear`, `translate`: per sample
    of the batch, all N rows)."""
    if index.numel() == 0:
        return
    rows = linear.index_select(0, index)
    shifts = torch.zeros((index.shape[0], 2), dtype=torch.float64, device=x.device)
    if translate is not None:
        shifts = translate.index_select(0, index)
    warp_(x, index, thetas(rows, shifts, centre), interpolation, fill)


KERNELS: dict[str, SampleKernel] = {
    "RandomVerticalFlip": lambda t, _: VerticalFlipOp(t),
    "RandomRotation": lambda t, _: RotationOp(t),
    "RandomAffine": lambda t, _: AffineOp(t),
    "RandomPerspective": lambda t, _: PerspectiveOp(t),
}
"""The kernels of the transforms of `fastload.transforms._warps`, by the names they declare."""
