"""The Triton kernel of `crop_resize`: a batch's crops, resizes, flips and uint8 rounding in one launch.

Imported only by `crop_resize._kernel` (ImportError where Triton is missing). One program per
(sample, block of output pixels); each output pixel sums its 2-D filter window (the product of
Pillow's two 1-D windows, each clipped to the sample's clip box and normalized) over the three
planes of the sample's CHW image in the flat buffer, then rounds and stores NHWC.

    src   uint8, every image's CHW pixels end to end
    meta  int64 (n, 7): offset in src, image height, width, clip top, left, height, width
    box   float32 (n, 4): the box within the clip, y0 y1 x0 x1 (x0 > x1: mirrored)
    out   uint8 (n, OH, OW, 3)
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _weight(x, FILTER: tl.constexpr):
    """Pillow's filter FILTER (crop_resize.FILTER_CODES) at x."""
    a = tl.abs(x)
    if FILTER == 1:  # box
        w = tl.where((x > -0.5) & (x <= 0.5), 1.0, 0.0)
    elif FILTER == 2:  # bilinear
        w = tl.maximum(1.0 - a, 0.0)
    elif FILTER == 3:  # hamming
        px = a * 3.141592653589793
        s = tl.sin(px) / tl.where(a == 0.0, 1.0, px)
        w = tl.where(a == 0.0, 1.0, tl.where(a >= 1.0, 0.0, s * (0.54 + 0.46 * tl.cos(px))))
    elif FILTER == 4:  # bicubic, a = -0.5
        near = (1.5 * a - 2.5) * a * a + 1.0
        far = (((a - 5.0) * a + 8.0) * a - 4.0) * -0.5
        w = tl.where(a < 1.0, near, tl.where(a < 2.0, far, 0.0))
    else:  # lanczos
        px = a * 3.141592653589793
        s1 = tl.where(a == 0.0, 1.0, tl.sin(px) / tl.where(a == 0.0, 1.0, px))
        s3 = tl.where(a == 0.0, 1.0, tl.sin(px / 3.0) / tl.where(a == 0.0, 1.0, px / 3.0))
        w = tl.where(a < 3.0, s1 * s3, 0.0)
    return w


@triton.jit
def _window(out_pos, in0, scale, in_size, SUPPORT: tl.constexpr):
    """An axis's window for output positions `out_pos`: (center, first tap, end tap, 1/filterscale,
    taps to visit) as fl_coeffs_init computes them."""
    center = in0 + (out_pos.to(tl.float32) + 0.5) * scale
    filterscale = tl.maximum(scale, 1.0)
    support = SUPPORT * filterscale
    first = tl.maximum((center - support + 0.5).to(tl.int32), 0)  # trunc, as C's (int)
    end = tl.minimum((center + support + 0.5).to(tl.int32), in_size)
    taps = tl.ceil(support).to(tl.int32) * 2 + 1
    return center, first, end, 1.0 / filterscale, taps


@triton.jit
def _axis_sum(center, first, end, inv_scale, taps, FILTER: tl.constexpr):
    """The sum of an axis's window weights (each window is normalized by it)."""
    total = tl.zeros(center.shape, tl.float32)
    for t in range(0, taps):
        pos = first + t
        w = _weight((pos.to(tl.float32) - center + 0.5) * inv_scale, FILTER)
        total += tl.where(pos < end, w, 0.0)
    return tl.where(total == 0.0, 1.0, total)


@triton.jit
def crop_resize_kernel(
    src, meta, box, out, OH, OW,
    FILTER: tl.constexpr, SUPPORT: tl.constexpr, BLOCK: tl.constexpr,
):
    n = tl.program_id(0)
    pix = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = pix < OH * OW
    oy = pix // OW
    ox = pix % OW
    base = tl.load(meta + n * 7)
    height = tl.load(meta + n * 7 + 1)
    width = tl.load(meta + n * 7 + 2)
    top = tl.load(meta + n * 7 + 3)
    left = tl.load(meta + n * 7 + 4)
    clip_h = tl.load(meta + n * 7 + 5).to(tl.int32)
    clip_w = tl.load(meta + n * 7 + 6).to(tl.int32)
    y0 = tl.load(box + n * 4)
    y1 = tl.load(box + n * 4 + 1)
    xa = tl.load(box + n * 4 + 2)
    xb = tl.load(box + n * 4 + 3)
    flip = xa > xb
    x0 = tl.minimum(xa, xb)
    x1 = tl.maximum(xa, xb)
    col = tl.where(flip, OW - 1 - ox, ox)  # a mirrored sample: the column its pixel comes from
    plane = height * width
    row0 = src + base + top * width + left  # the clip box's first pixel in the red plane
    acc_r = tl.zeros([BLOCK], tl.float32)
    acc_g = tl.zeros([BLOCK], tl.float32)
    acc_b = tl.zeros([BLOCK], tl.float32)
    if FILTER == 0:  # nearest: one tap, (int)center clamped into the clip box
        cy = y0 + (oy.to(tl.float32) + 0.5) * ((y1 - y0) / OH)
        cx = x0 + (col.to(tl.float32) + 0.5) * ((x1 - x0) / OW)
        yy = tl.minimum(tl.maximum(cy.to(tl.int32), 0), clip_h - 1)
        xx = tl.minimum(tl.maximum(cx.to(tl.int32), 0), clip_w - 1)
        p = row0 + yy.to(tl.int64) * width + xx
        acc_r = tl.load(p, mask=live, other=0).to(tl.float32)
        acc_g = tl.load(p + plane, mask=live, other=0).to(tl.float32)
        acc_b = tl.load(p + 2 * plane, mask=live, other=0).to(tl.float32)
    else:
        cy, fy, ey, sy, ty = _window(oy, y0, (y1 - y0) / OH, clip_h, SUPPORT)
        cx, fx, ex, sx, tx = _window(col, x0, (x1 - x0) / OW, clip_w, SUPPORT)
        norm = 1.0 / (_axis_sum(cy, fy, ey, sy, ty, FILTER) * _axis_sum(cx, fx, ex, sx, tx, FILTER))
        for j in range(0, ty):
            yy = fy + j
            wy = tl.where(yy < ey, _weight((yy.to(tl.float32) - cy + 0.5) * sy, FILTER), 0.0) * norm
            rows = row0 + yy.to(tl.int64) * width
            for i in range(0, tx):
                xx = fx + i
                ok = live & (yy < ey) & (xx < ex)
                w = tl.where(xx < ex, _weight((xx.to(tl.float32) - cx + 0.5) * sx, FILTER), 0.0) * wy
                p = rows + xx
                acc_r += w * tl.load(p, mask=ok, other=0).to(tl.float32)
                acc_g += w * tl.load(p + plane, mask=ok, other=0).to(tl.float32)
                acc_b += w * tl.load(p + 2 * plane, mask=ok, other=0).to(tl.float32)
    dst = out + (n * OH * OW + pix).to(tl.int64) * 3
    tl.store(dst, tl.minimum(tl.maximum(tl.floor(acc_r + 0.5), 0.0), 255.0).to(tl.uint8), mask=live)
    tl.store(dst + 1, tl.minimum(tl.maximum(tl.floor(acc_g + 0.5), 0.0), 255.0).to(tl.uint8), mask=live)
    tl.store(dst + 2, tl.minimum(tl.maximum(tl.floor(acc_b + 0.5), 0.0), 255.0).to(tl.uint8), mask=live)
