"""Batched geometric kernels of the augmentation policies (ShearX/Y, TranslateX/Y, Rotate), equal to
torchvision v2's tensor `affine` / `rotate` as `_AutoAugmentBase._apply_image_or_video_transform`
calls them, on uint8 (N, 3, H, W) batches (channels_last or contiguous), pixel for pixel.

How torchvision computes one image, and how this module reproduces it for a group of samples:

- the inverse matrix, in double precision (`inverse_affine_matrix`: torchvision's formula term for
  term, evaluated with `math` once per magnitude, never per sample), rounded to a float32 theta;
- `_affine_grid`: a base grid of pixel centres times the theta rescaled by (w/2, h/2), one float32
  (HW, 3) x (3, 2) matmul. `affine_grid` computes it for many thetas at once, elementwise on the
  CPU where that is bit-identical to the matmul (checked once per size), else by the same matmul;
- `grid_sample` with zeros padding (align_corners=False); when `fill` is not None, a plane of ones
  sampled alongside gives the mask the fill is blended in with (so None and 0 differ for bilinear,
  torchvision issue 6517); the float result rounded half to even and cast to uint8.

A policy's group shares one magnitude, so one grid: `policy_op_` caches it per (operation,
magnitude, size, device). Nearest never samples the image in float: `grid_sample` samples an image
of pixel numbers (1 + row * W + col, exact in float32 up to 2^24 pixels; 0 where the grid leaves
the image) once, and the uint8 pixels are gathered through that map from a copy of the group
prefixed by a fill pixel: the pixel torchvision's `grid_sample` picks on the same device, whatever
its rounding (~0.1 ms per 224 x 224 image on one core; sampling it in float costs several times that).
Bilinear samples the float image as torchvision does. Shortcuts taken where torchvision's result is
provably the same: rotations by quarter turns (torchvision's own fast path), whole-pixel
translations as shifts (`shifted`), zero shears as nothing.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import torch
import torch.nn.functional as F

from fastload._augment import groups

Fill = tuple[float, float, float] | None
"""The value of uncovered pixels per channel, or None (zeros padding: not the same as 0 for
bilinear, as in torchvision)."""

GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")

_EXACT_PIXELS = 2**24 - 1  # pixel numbers 1..H*W are exact in float32 up to here


def inverse_affine_matrix(
    center: Sequence[float], angle: float, translate: Sequence[float], scale: float, shear: Sequence[float]
) -> list[float]:
    """torchvision's `_get_inverse_affine_matrix(..., inverted=True)`, operation for operation (so
    that the float32 theta is the same): the 2x3 matrix from output to input pixel coordinates,
    relative to the image centre."""
    rot = math.radians(angle)
    sx = math.radians(shear[0])
    sy = math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    cos_sy = math.cos(sy)
    tan_sx = math.tan(sx)
    rot_minus_sy = rot - sy
    cx_plus_tx = cx + tx
    cy_plus_ty = cy + ty
    a = math.cos(rot_minus_sy) / cos_sy
    b = -(a * tan_sx + math.sin(rot))
    c = math.sin(rot_minus_sy) / cos_sy
    d = math.cos(rot) - c * tan_sx
    matrix = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    matrix[2] += cx - matrix[0] * cx_plus_tx - matrix[1] * cy_plus_ty
    matrix[5] += cy - matrix[3] * cx_plus_tx - matrix[4] * cy_plus_ty
    return matrix


def rotation_turns(magnitude: float, height: int, width: int) -> int | None:
    """torchvision's `rotate_image` fast path: the quarter turns (0 to 3, counter-clockwise, as
    `torch.rot90` counts them) when `magnitude` (degrees) is one it does without a grid, else None."""
    angle = magnitude % 360
    if angle == 0:
        return 0
    if angle == 180:
        return 2
    if height == width and angle in (90, 270):
        return 1 if angle == 90 else 3
    return None


def policy_matrix(op: str, magnitude: float, height: int, width: int) -> list[float]:
    """The inverse matrix torchvision's policies use for `op` (one of `GEOMETRIC_OPS`) at the
    signed `magnitude` on an `height` x `width` image: shears about the top-left corner (their
    centre [0, 0]), translations by int(magnitude) pixels, rotations about the centre (`rotate`
    negates the angle after taking it modulo 360)."""
    if op in ("ShearX", "ShearY"):
        degrees = math.degrees(math.atan(magnitude))
        shear = [degrees, 0.0] if op == "ShearX" else [0.0, degrees]
        center = [0.0 - width * 0.5, 0.0 - height * 0.5]
        return inverse_affine_matrix(center, 0.0, [0.0, 0.0], 1.0, shear)
    if op in ("TranslateX", "TranslateY"):
        pixels = float(int(magnitude))
        translate = [pixels, 0.0] if op == "TranslateX" else [0.0, pixels]
        return inverse_affine_matrix([0.0, 0.0], 0.0, translate, 1.0, [0.0, 0.0])
    if op == "Rotate":
        return inverse_affine_matrix([0.0, 0.0], -(magnitude % 360), [0.0, 0.0], 1.0, [0.0, 0.0])
    raise ValueError(f"not a geometric operation: {op}")


def _base_axes(height: int, width: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`_affine_grid`'s pixel-centre coordinates: x (width,) and y (height,), float32."""
    xs = torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width, device=device)
    ys = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height, device=device)
    return xs, ys


def _rescaled(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """`_affine_grid`'s theta (n, 2, 3) transposed to (n, 3, 2) and divided by (w/2, h/2)."""
    scale = torch.tensor([0.5 * width, 0.5 * height], dtype=theta.dtype, device=theta.device)
    return theta.transpose(1, 2).div(scale)


def _matmul_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The grid as torchvision computes it: the base grid times the rescaled theta (batched)."""
    xs, ys = _base_axes(height, width, theta.device)
    base = torch.empty(1, height, width, 3, dtype=theta.dtype, device=theta.device)
    base[..., 0].copy_(xs)
    base[..., 1].copy_(ys.unsqueeze(-1))
    base[..., 2].fill_(1)
    n = theta.shape[0]
    grid = base.view(1, height * width, 3).expand(n, -1, -1).bmm(_rescaled(theta, height, width))
    return grid.view(n, height, width, 2)


def _elementwise_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The same grid as (x * t0 + y * t1) + t2, each product and sum rounded to float32 in that
    order: what the CPU's matmul does with its three terms, at a tenth of the cost (it is separable:
    x * t0 is one row, y * t1 one column). Returned as a (n, H, W, 2) view of a (n, 2, H, W) tensor."""
    n = theta.shape[0]
    xs, ys = _base_axes(height, width, theta.device)
    r = _rescaled(theta, height, width)  # (n, 3, 2)
    grid = torch.empty(n, 2, height, width, dtype=theta.dtype, device=theta.device)
    torch.add(
        xs.view(1, 1, 1, width) * r[:, 0].reshape(n, 2, 1, 1),
        ys.view(1, 1, height, 1) * r[:, 1].reshape(n, 2, 1, 1),
        out=grid,
    )
    grid.add_(r[:, 2].reshape(n, 2, 1, 1))
    return grid.permute(0, 2, 3, 1)


_ELEMENTWISE_EXACT: dict[tuple[int, int], bool] = {}


def _elementwise_is_exact(height: int, width: int) -> bool:
    """Whether, on this CPU, the elementwise grid equals torchvision's matmul bit for bit at this
    size (checked once per size with a few shears and rotations; the CPU's BLAS decides)."""
    key = (height, width)
    known = _ELEMENTWISE_EXACT.get(key)
    if known is None:
        probe = torch.tensor(
            [
                policy_matrix(op, m, height, width)
                for op, m in (
                    ("ShearX", 0.3),
                    ("ShearY", -0.17),
                    ("Rotate", 29.7),
                    ("Rotate", -133.3),
                    ("TranslateX", -7.0),
                )
            ],
            dtype=torch.float32,
        ).view(-1, 2, 3)
        single = torch.cat([_matmul_grid(probe[i : i + 1], height, width) for i in range(len(probe))])
        known = bool(torch.equal(_elementwise_grid(probe, height, width), single))
        if len(_ELEMENTWISE_EXACT) > 256:
            _ELEMENTWISE_EXACT.clear()
        _ELEMENTWISE_EXACT[key] = known
    return known


def affine_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """torchvision's `_affine_grid(theta, w, h, ow=w, oh=h)` for a batch of float32 thetas (n, 2, 3):
    the (n, H, W, 2) sampling grid, bit-identical to torchvision's per image on the same device."""
    if theta.device.type == "cpu" and _elementwise_is_exact(height, width):
        return _elementwise_grid(theta, height, width)
    return _matmul_grid(theta, height, width)


_PIXEL_NUMBERS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _pixel_numbers(height: int, width: int, device: torch.device) -> torch.Tensor:
    """(1, 1, H, W) float32: 1 + the pixel's row-major number (cached per size and device)."""
    key = (height, width, device)
    numbers = _PIXEL_NUMBERS.get(key)
    if numbers is None:
        numbers = torch.arange(1, height * width + 1, dtype=torch.float32, device=device).view(
            1, 1, height, width
        )
        if len(_PIXEL_NUMBERS) > 16:
            _PIXEL_NUMBERS.clear()
        _PIXEL_NUMBERS[key] = numbers
    return numbers


class _Cache:
    """Least-recently-used tensors (sampling maps, grids) up to a byte budget, per process."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._used = 0
        self._items: OrderedDict[Hashable, torch.Tensor] = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The tensor under `key`, made (and the oldest evicted past the budget) when missing."""
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
            return value
        value = make()
        size = value.numel() * value.element_size()
        while self._items and self._used + size > self._budget:
            _, old = self._items.popitem(last=False)
            self._used -= old.numel() * old.element_size()
        if size <= self._budget:
            self._items[key] = value
            self._used += size
        return value


_MAPS = _Cache(32 << 20)
"""Sampling maps and grids of the (operation, magnitude, size) a policy uses: RandAugment and
AutoAugment use a handful, so their grids are computed once per process."""


def fill_pixel(fill: Fill, device: torch.device) -> torch.Tensor:
    """The uint8 pixel (3,) a nearest warp writes where its grid leaves the image: the fill
    rounded half to even, as torchvision's `round_()` before the cast does (0 for None)."""
    values = [0.0, 0.0, 0.0] if fill is None else list(fill)
    return torch.tensor(values, dtype=torch.float32).round_().to(torch.uint8).to(device, non_blocking=True)


def nearest_maps(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(t, H*W) int64: for each output pixel of each theta (t, 2, 3), 1 + the number of the input
    pixel torchvision's nearest `grid_sample` takes, 0 where it takes the zero padding."""
    return grid_maps(affine_grid(theta, height, width))


def grid_maps(grid: torch.Tensor) -> torch.Tensor:
    """`nearest_maps` of any sampling grid (t, H, W, 2) of an H x W image (a perspective's too)."""
    t, height, width = grid.shape[0], grid.shape[1], grid.shape[2]
    numbers = _pixel_numbers(height, width, grid.device).expand(t, 1, height, width)
    chosen = F.grid_sample(numbers, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    return chosen.view(t, height * width).to(torch.int64)


def gather_(x: torch.Tensor, index: torch.Tensor, maps: torch.Tensor, fill: Fill) -> None:
    """Replace the samples `index` of x, in place, by their pixels taken through `maps` (from
    `nearest_maps`: one per sample, or one shared by all), 0 taking the fill pixel."""
    n, height, width = index.shape[0], x.shape[-2], x.shape[-1]
    pixels = height * width
    # The group in x's memory format, as (n, 3, 1 + H*W) whose pixel 0 is the fill.
    if groups.is_nhwc(x):
        rows = torch.empty(n, 3 * (pixels + 1), dtype=x.dtype, device=x.device)
        padded = rows.view(n, pixels + 1, 3).permute(0, 2, 1)
        torch.index_select(x.permute(0, 2, 3, 1).reshape(x.shape[0], -1), 0, index, out=rows[:, 3:])
    else:
        padded = torch.empty(n, 3, pixels + 1, dtype=x.dtype, device=x.device)
        padded[:, :, 1:] = groups.take(x, index).reshape(n, 3, pixels)
    padded[:, :, 0] = fill_pixel(fill, x.device)
    out = torch.empty(
        (n, 3, height, width), dtype=x.dtype, device=x.device, memory_format=groups.memory_format(x)
    )
    torch.gather(padded, 2, maps.view(-1, 1, pixels).expand(n, 3, pixels), out=out.view(n, 3, pixels))
    groups.put_(x, index, out)


def coverage(grid: torch.Tensor) -> torch.Tensor:
    """(t, 1, H, W) float32: how much of each output pixel a grid (t, H, W, 2) takes from inside the
    image: torchvision's mask channel (a plane of ones sampled like the image, the same weights)."""
    t, height, width = grid.shape[0], grid.shape[1], grid.shape[2]
    ones = torch.ones(1, 1, height, width, dtype=torch.float32, device=grid.device).expand(
        t, 1, height, width
    )
    return F.grid_sample(ones, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


_SAMPLE_BLOCK = 1 << 19
"""Float elements of the image `grid_sample` takes at once on the CPU (2 MiB: 3 images of 224 x
224). Past a few MiB of input and output its random reads leave the cache and it runs 3-4 times
slower per image (measured on one core); a GPU takes the group at once."""


def _sample_(
    x: torch.Tensor, index: torch.Tensor, grid: torch.Tensor, fill: Fill, mode: str, mask: torch.Tensor | None
) -> None:
    """torchvision's `_apply_grid_transform` on the samples `index` of x, in place: the float image
    sampled through `grid` (one per sample, or one shared), the fill blended in through `mask`
    (`coverage(grid)`, needed when `fill` is not None): what torchvision's mask channel holds, as
    `grid_sample` computes each output channel alone, the same way whatever the others."""
    n = index.shape[0]
    group = groups.take(x, index)
    out = torch.empty_like(group)
    fill_img = None
    if fill is not None:
        fill_img = torch.tensor(fill, dtype=torch.float32).to(x.device, non_blocking=True).view(1, -1, 1, 1)
    block = max(1, _SAMPLE_BLOCK // group[0].numel()) if x.device.type == "cpu" else n
    for start in range(0, n, block):
        rows = slice(start, min(start + block, n))
        image = group[rows].to(torch.float32)  # in x's layout: channels_last samples as fast
        samples = image.shape[0]
        grid_rows = grid.expand(samples, -1, -1, -1) if grid.shape[0] == 1 else grid[rows]
        image = F.grid_sample(image, grid_rows, mode=mode, padding_mode="zeros", align_corners=False)
        if fill_img is not None:
            assert mask is not None
            coverage_rows = mask if mask.shape[0] == 1 else mask[rows]
            if mode == "nearest":
                image = torch.where(coverage_rows < 0.5, fill_img, image)
            else:
                image = image.sub_(fill_img).mul_(coverage_rows).add_(fill_img)
        out[rows] = image.round_()  # truncating the rounded values to uint8, as torchvision
    groups.put_(x, index, out)


def warp_(x: torch.Tensor, index: torch.Tensor, theta: torch.Tensor, interpolation: str, fill: Fill) -> None:
    """Warp the samples `index` (int64, on x's device) of the uint8 batch x (N, 3, H, W) in place,
    sample `index[i]` by the float32 inverse matrix `theta[i]` (2, 3) (or all by `theta[0]` when
    theta is (1, 2, 3)), as torchvision's tensor `affine` / `rotate` (expand=False) do with that
    matrix: `interpolation` "nearest" or "bilinear", `fill` per channel or None."""
    grid_warp_(x, index, affine_grid(theta, x.shape[-2], x.shape[-1]), interpolation, fill)


def grid_warp_(
    x: torch.Tensor, index: torch.Tensor, grid: torch.Tensor, interpolation: str, fill: Fill
) -> None:
    """Warp the samples `index` of x in place through their sampling grids (n, H, W, 2) (or one
    shared), as torchvision's `_apply_grid_transform` does with each (`warp_`'s rules)."""
    height, width = x.shape[-2], x.shape[-1]
    if interpolation == "nearest" and height * width <= _EXACT_PIXELS:
        gather_(x, index, grid_maps(grid), fill)
    else:
        _sample_(x, index, grid, fill, interpolation, None if fill is None else coverage(grid))


def linear_parts(angle: float, scale: float, shear: Sequence[float]) -> list[float]:
    """The size-free part of `inverse_affine_matrix` (about the centre, no translation):
    [m0, m1, m3, m4], the same doubles torchvision computes; `thetas` adds the rest per size."""
    matrix = inverse_affine_matrix([0.0, 0.0], angle, [0.0, 0.0], scale, shear)
    return [matrix[0], matrix[1], matrix[3], matrix[4]]


def thetas(linear: torch.Tensor, translate: torch.Tensor, center: Sequence[float]) -> torch.Tensor:
    """(n, 2, 3) float32 inverse matrices from `linear` (n, 4) float64 (`linear_parts`), the
    translations `translate` (n, 2) float64 in pixels and the centre (cx, cy) relative to the
    image's: `inverse_affine_matrix`'s last column, operation for operation in double precision
    (IEEE on any device, so the float32 theta is torchvision's), computed on the batch's device."""
    cx, cy = float(center[0]), float(center[1])
    m0, m1, m3, m4 = linear.unbind(1)
    cx_plus_tx = translate[:, 0] + cx
    cy_plus_ty = translate[:, 1] + cy
    m2 = ((cx - m0 * cx_plus_tx) - m1 * cy_plus_ty) + 0.0
    m5 = ((cy - m3 * cx_plus_tx) - m4 * cy_plus_ty) + 0.0
    return torch.stack((m0, m1, m2, m3, m4, m5), dim=1).to(torch.float32).view(-1, 2, 3)


def rot90_(x: torch.Tensor, index: torch.Tensor, turns: int) -> None:
    """Rotate the samples `index` of x by `turns` quarter turns in place (`torch.rot90` on (H, W),
    torchvision's fast path for 90, 180 and 270 degrees); 90 and 270 need a square image."""
    if turns % 4:
        groups.apply_to(x, index, lambda group: torch.rot90(group, k=turns, dims=(-2, -1)))


def shifted(x: torch.Tensor, dx: int, dy: int, fill: Fill) -> torch.Tensor:
    """The batch x translated by whole pixels (output (r, c) = input (r - dy, c - dx)), the
    uncovered pixels taking the fill rounded half to even (0 for None); in x's memory format.

    This is torchvision's translation exactly, nearest or bilinear, when the fill is None or whole
    numbers: its grid then falls within float32 rounding of pixel centres (no nearest tie, bilinear
    weights of 1 and ~1e-5 that round away), and the uncovered pixels are the fill itself."""
    height, width = x.shape[-2], x.shape[-1]
    out = torch.empty_like(x, memory_format=groups.memory_format(x))
    if abs(dx) >= width or abs(dy) >= height:
        out[:] = fill_pixel(fill, x.device).view(1, 3, 1, 1)
        return out
    rows_out, rows_in = _span(dy, height)
    cols_out, cols_in = _span(dx, width)
    out[:, :, rows_out, cols_out] = x[:, :, rows_in, cols_in]
    pixel = fill_pixel(fill, x.device).view(1, 3, 1, 1)
    if dy:  # the uncovered rows, then the uncovered columns of the others
        out[:, :, slice(0, dy) if dy > 0 else slice(height + dy, height)] = pixel
    if dx:
        out[:, :, rows_out, slice(0, dx) if dx > 0 else slice(width + dx, width)] = pixel
    return out


def _span(shift: int, size: int) -> tuple[slice, slice]:
    """The output and input ranges of a shift by `shift` along an axis of `size` (|shift| < size)."""
    if shift >= 0:
        return slice(shift, size), slice(0, size - shift)
    return slice(0, size + shift), slice(-shift, size)


def whole_pixel_fill(fill: Fill) -> bool:
    """Whether `fill` is None or whole numbers (translations are then exact shifts, `shifted`)."""
    return fill is None or all(float(v).is_integer() for v in fill)


def policy_op_(
    x: torch.Tensor, index: torch.Tensor, op: str, magnitude: float, interpolation: str, fill: Fill
) -> None:
    """Apply torchvision's policy operation `op` (one of `GEOMETRIC_OPS`) at the signed
    `magnitude`, the same for all the samples `index` of x, in place, exactly as
    `_apply_image_or_video_transform` does per image: rotations by quarter turns as `rotate`'s fast
    path, whole-pixel translations as shifts (`shifted`), the rest through one cached sampling map
    (nearest) or grid (bilinear)."""
    height, width = x.shape[-2], x.shape[-1]
    if op == "Rotate":
        turns = rotation_turns(magnitude, height, width)
        if turns is not None:
            rot90_(x, index, turns)
            return
    if op in ("TranslateX", "TranslateY") and (interpolation == "nearest" or whole_pixel_fill(fill)):
        dx = int(magnitude) if op == "TranslateX" else 0
        dy = int(magnitude) if op == "TranslateY" else 0
        if dx or dy:
            groups.apply_to(x, index, lambda group: shifted(group, dx, dy, fill))
        return
    if op in ("ShearX", "ShearY") and magnitude == 0:
        # torchvision's grid is then the pixel centres within float32 rounding (~1e-5 px): nearest
        # takes the same pixels, bilinear weights of 1 - 1e-5 round back to them. Nothing changes.
        return
    key = (op, magnitude, height, width, x.device, interpolation)

    def theta() -> torch.Tensor:
        matrix = policy_matrix(op, magnitude, height, width)
        return torch.tensor(matrix, dtype=torch.float32).view(1, 2, 3).to(x.device, non_blocking=True)

    if interpolation == "nearest" and height * width <= _EXACT_PIXELS:
        gather_(x, index, _MAPS.get(key, lambda: nearest_maps(theta(), height, width)), fill)
    else:
        grid = _MAPS.get(key, lambda: affine_grid(theta(), height, width).contiguous())
        mask = None if fill is None else _MAPS.get((*key, "mask"), lambda: coverage(grid))
        _sample_(x, index, grid, fill, interpolation, mask)
