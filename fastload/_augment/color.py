"""Batched photometric kernels (ColorJitter, grayscale, blur, solarize, posterize, autocontrast,
equalize, and the policies' brightness, contrast, sharpness, invert) on uint8 (N, 3, H, W) batches
with per-sample parameters, matching torchvision v2's tensor kernels; the `SampleOp`s of the seven
colour transforms.

Two layers. The functional kernels (`adjust_brightness` ... `gaussian_blur`) take a batch and one
parameter per sample and return a new uint8 batch in the input's memory format (the input is not
modified): each equals torchvision's `*_image` kernel applied to every sample with its own
parameter. `apply_to(x, index, fn)` runs any kernel on a group of samples in place;
`apply_kernel(x, index, kernel, *per_sample)` does the same for this module's kernels, faster (no
new batch, chunks gathered and scattered while in cache). The operations registered in `OPS` draw
the parameters from the loader's uniforms and run the kernels, in place, on the samples they pick.

NOTE [exactness]: the kernels repeat torchvision's float32 arithmetic operation for operation, so
that rounding and truncation land where torchvision's do: a uint8 value times a factor is the
float32 product; torchvision's `a.add_(b, alpha=w)` is the fused `a + b * w` (one rounding) on the
CPU, which `addcmul_` reproduces with a per-sample `w`; a float result goes back to uint8 by
truncation, rounding first only where torchvision rounds (blur). Equalize's integer algorithm is
PIL's, as torchvision's. Sharpness's smoothed image is (9-neighbourhood sum + 4 * centre) / 13
rounded: an integer that is never within float error of a half, so it is computed from integer
sums. The one approximation is `gaussian_blur`'s separable convolution (see there); the tests
check every kernel against torchvision sample by sample.

NOTE [CPU speed]: on a CPU these kernels are memory-bound, and four things decide their speed
(figures: one core, 224x224 images).
(1) Fresh memory: a float32 copy of 64 such images is 38 MB, beyond glibc's largest mmap threshold
(32 MB), so each such temporary is a new mapping whose pages fault in on first touch (x.float() of
that batch: ~330 us per image, ~7 us into memory already touched), and smaller ones are trimmed
and faulted in again often enough. So each kernel runs over chunks of a few samples (a working
set of about `CPU_CHUNK_BYTES`, in cache), and its temporaries are views of per-thread scratch
buffers (`_scratch`), touched once and kept. Each chunk is batched; on a GPU the batch is one
chunk and temporaries come from its caching allocator.
(2) Broadcasting: torch's CPU loops vectorise only when each operand is contiguous along the
innermost (coalesced) dimension, or is its one stride-0 operand. A per-sample (N, 1, 1, 1) operand
in a comparison or next to another broadcast operand, or a per-channel (N, 3, 1, 1) one against an
NHWC batch, falls to a scalar loop (~10x slower). So per-sample and per-channel values are spread
over one image row first (`_row`: (N, 3, 1, W) in the batch's layout), which broadcasts over rows.
(3) Layout: the batch is NHWC (channels_last); a channel plane is a stride-3 view, on which each
operation is a scalar loop (~20 us per image: luma, copying the gray plane into the channels);
converting the whole layout costs 45-70 us per image. So kernels stay in the batch's layout,
except hue (~50 operations on planes, so planar: its channels are copied in and out plane by
plane, the cheapest conversion).
(4) Slow operators, avoided: float to uint8 conversion (~40 us; through int16: ~14 us),
`torch.where` and `masked_fill_` (~180 us per plane: selections are products with exact 0/1
masks), `fmod`/`remainder` (x - floor(x), the same value here), `gather`, `index_copy_` of uint8
rows (`apply_to` moves rows as int64 words), torch's reflect padding of an NHWC batch (slice
copies instead), and depthwise `conv2d` (shifted integer sums; taps for the blur).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fastload._augment.ops import DeviceParams, Params, SampleOp
from fastload._loading.native import native_jpeg
from fastload.transforms._color import (
    ColorJitter,
    GaussianBlur,
    RandomAutocontrast,
    RandomEqualize,
    RandomGrayscale,
    RandomPosterize,
    RandomSolarize,
)

Kernel = Callable[[torch.Tensor], torch.Tensor]
"""A batch in, the transformed batch out (parameters bound): what `apply_to` runs."""

GRAY_WEIGHTS = (0.2989, 0.587, 0.114)
"""torchvision's luma weights for (r, g, b)."""

CPU_CHUNK_BYTES = 4 << 20
"""On a CPU, the working set (float32 planes and the like) a kernel's chunk of samples may take,
at least one sample's: NOTE [CPU speed] (1)."""

_MAX = 255
_TINY = 1e-30
"""A positive divisor that changes no quotient of the HSV conversion (its values are multiples of
1/255) but keeps 0 / 0 at 0, as torchvision's `where(eqc, ones, ...)` does."""

_scratch_buffers = threading.local()

# Layout, scratch memory and chunks


def _channels_innermost(x: torch.Tensor) -> bool:
    """Whether x (N, C, H, W) is laid out NHWC (channels_last, or a view of it)."""
    return x.shape[1] > 1 and x.stride(1) < x.stride(3)


def _memory_permutation(x: torch.Tensor) -> tuple[int, int, int, int]:
    """The permutation of x's dims that lists them in memory order: (0, 2, 3, 1) for NHWC."""
    return (0, 2, 3, 1) if _channels_innermost(x) else (0, 1, 2, 3)


def _inverse(permutation: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The permutation that undoes `permutation`."""
    inverse = [0, 0, 0, 0]
    for position, dim in enumerate(permutation):
        inverse[dim] = position
    return inverse[0], inverse[1], inverse[2], inverse[3]


def _dense(x: torch.Tensor) -> torch.Tensor:
    """x itself when it is contiguous NCHW or NHWC, else a contiguous copy."""
    if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last):
        return x
    return x.contiguous()


def _scratch_words(slot: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """`numel` uninitialised CPU values of `dtype`: a view of this thread's buffer `slot`, kept
    between calls and grown as needed, so that its pages are touched once (NOTE [CPU speed] (1)).
    The slots: "image" (a chunk's float32 copy), "work1" ... "work4" (each kernel's other
    temporaries, in that order), "store" and "store_bytes" (`_store`), "picked" (the rows
    `_transform_samples` gathers). A kernel never uses a slot twice at once and never returns one;
    kernels run one at a time in a thread, so they share the slots (~15 MB in all at 224x224)."""
    nbytes = numel * dtype.itemsize
    buffers: dict[str, torch.Tensor] = _scratch_buffers.__dict__.setdefault("buffers", {})
    buffer = buffers.get(slot)
    if buffer is None or buffer.numel() < nbytes:
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        buffers[slot] = buffer
    return buffer[:nbytes].view(dtype)


def _scratch(
    slot: str, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device, nhwc: bool
) -> torch.Tensor:
    """An uninitialised (N, C, H, W) tensor of `dtype`, NHWC or not: on a CPU in the scratch
    buffer `slot` (`_scratch_words`), elsewhere a new tensor."""
    n, channels, height, width = shape
    if device.type != "cpu":
        layout = torch.channels_last if nhwc else torch.contiguous_format
        return torch.empty(shape, dtype=dtype, device=device, memory_format=layout)
    flat = _scratch_words(slot, n * channels * height * width, dtype)
    if nhwc:
        return flat.view(n, height, width, channels).permute(0, 3, 1, 2)
    return flat.view(n, channels, height, width)


def _scratch_like(slot: str, like: torch.Tensor, dtype: torch.dtype, channels: int = 3) -> torch.Tensor:
    """A scratch tensor with like's batch and image size, `channels` channels, and like's layout."""
    n, _, height, width = like.shape
    return _scratch(slot, (n, channels, height, width), dtype, like.device, _channels_innermost(like))


def _row(values: torch.Tensor, like: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-sample (N,) or per-channel (N, 3) values spread over one row of `like` (N, 3, H, W):
    (N, 3, 1, W) of `dtype` in like's layout, broadcasting over rows (NOTE [CPU speed] (2))."""
    n, channels, _, width = like.shape
    row = values.to(dtype).reshape(n, -1, 1, 1).expand(n, channels, 1, width)
    layout = torch.channels_last if _channels_innermost(like) else torch.contiguous_format
    return row.contiguous(memory_format=layout)


def _one_minus(factor: torch.Tensor) -> torch.Tensor:
    """(1 - factor) per sample as torchvision gets it: computed in double (a Python float), then
    used as a float32 scalar."""
    return (1.0 - factor.to(torch.float64)).to(torch.float32)


def _store(values: torch.Tensor, out: torch.Tensor) -> None:
    """Float `values` (within [0, 255]) truncated into the uint8 `out`: through int16, a faster
    conversion than float to uint8 on a CPU, with the same truncation; into another layout plane
    by plane (NOTE [CPU speed] (3), (4))."""
    as_int16 = _scratch_like("store", values, torch.int16)
    as_int16.copy_(values)
    if as_int16.stride() == out.stride():
        out.copy_(as_int16)
        return
    as_uint8 = _scratch_like("store_bytes", values, torch.uint8)
    as_uint8.copy_(as_int16)
    for channel in range(out.shape[1]):
        out[:, channel].copy_(as_uint8[:, channel])


def _chunk_samples(x: torch.Tensor, planes: float) -> int:
    """How many samples of x a chunk holds when a kernel keeps `planes` float32 values per pixel:
    on a CPU those that fit in `CPU_CHUNK_BYTES` (at least one), elsewhere the whole batch."""
    if x.device.type != "cpu":
        return max(1, x.shape[0])
    per_sample = planes * 4 * x.shape[-2] * x.shape[-1]
    return max(1, int(CPU_CHUNK_BYTES // max(1.0, per_sample)))


def _by_chunks(
    kernel: Callable[..., None],
    planes: float,
    x: torch.Tensor,
    *per_sample: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`kernel(x_chunk, *per_sample_chunks, out_chunk)` chunk by chunk (NOTE [CPU speed] (1)), a
    kernel keeping `planes` float32 values per pixel, into `out` (x itself is fine: a kernel reads
    its chunk before it writes it) or a new uint8 batch like x; returns the result."""
    x = _dense(x)
    if out is None:
        out = torch.empty_like(x)
    if x.numel() == 0:
        return out
    step = _chunk_samples(x, planes)
    for start in range(0, x.shape[0], step):
        rows = slice(start, start + step)
        kernel(x[rows], *(values[rows] for values in per_sample), out[rows])
    return out


def _as_rows(x: torch.Tensor) -> torch.Tensor | None:
    """x's samples as rows of machine words, (N, row bytes / word), a view of x's memory: the
    widest of int64, int32, int16 and uint8 that the row length and the address allow. None when
    x is not dense in memory order."""
    permuted = x.permute(_memory_permutation(x))
    if not permuted.is_contiguous():
        return None
    rows = permuted.reshape(x.shape[0], -1)
    row_bytes = rows.shape[1] * x.element_size()
    for word in (torch.int64, torch.int32, torch.int16):
        if row_bytes % word.itemsize == 0 and x.data_ptr() % word.itemsize == 0:
            return rows.view(word)
    return rows


def apply_to(x: torch.Tensor, index: torch.Tensor, fn: Kernel) -> torch.Tensor:
    """Run `fn` on the samples `index` of the batch `x` and write its result over them, in place;
    returns x.

    `index` is an int64 tensor of increasing sample indices (from `np.flatnonzero` in an op's
    `params`): its length, known on the host, decides without a device synchronisation whether it
    is empty (nothing runs) or the whole batch (no gather, no scatter). Samples are gathered and
    scattered as rows of machine words in x's memory order (so they keep x's layout, and
    `index_copy_` moves 8 bytes per element rather than 1: NOTE [CPU speed] (4)).
    """
    if index.numel() == 0:
        return x
    if index.shape[0] == x.shape[0]:
        result = fn(x)
        if result.data_ptr() != x.data_ptr():
            x.copy_(result)
        return x
    rows = _as_rows(x)
    if rows is None:
        x.index_copy_(0, index, fn(x.index_select(0, index)))
        return x
    permutation = _memory_permutation(x)
    shape_in_memory_order = (index.shape[0], *x.permute(permutation).shape[1:])
    picked = rows.index_select(0, index).view(x.dtype).view(shape_in_memory_order)
    result = fn(picked.permute(_inverse(permutation)))
    result_rows = result.permute(permutation).contiguous().view(index.shape[0], -1).view(rows.dtype)
    rows.index_copy_(0, index, result_rows)
    return x


def _transform_samples(
    kernel: Callable[..., None],
    planes: float,
    x: torch.Tensor,
    index: torch.Tensor,
    *per_sample: torch.Tensor,
) -> torch.Tensor:
    """`_by_chunks` in place on the samples `index` of x (`per_sample` lined up with index): chunk
    by chunk, the chunk's rows are gathered into scratch memory, transformed there and scattered
    back while in cache. Returns x."""
    if index.numel() == 0:
        return x
    if index.shape[0] == x.shape[0]:  # increasing indices: every sample, in order
        dense = _dense(x)
        _by_chunks(kernel, planes, dense, *per_sample, out=dense)
        if dense is not x:
            x.copy_(dense)
        return x
    rows = _as_rows(x)
    if rows is None or x.device.type != "cpu":
        return apply_to(x, index, lambda samples: _by_chunks(kernel, planes, samples, *per_sample))
    permutation = _memory_permutation(x)
    sample_shape = x.permute(permutation).shape[1:]
    step = _chunk_samples(x, planes)
    for start in range(0, index.shape[0], step):
        chunk_index = index[start : start + step]
        picked_rows = _scratch_words("picked", chunk_index.shape[0] * rows.shape[1], rows.dtype)
        picked_rows = torch.index_select(rows, 0, chunk_index, out=picked_rows.view(-1, rows.shape[1]))
        picked = picked_rows.view(x.dtype).view(-1, *sample_shape).permute(_inverse(permutation))
        kernel(picked, *(values[start : start + step] for values in per_sample), picked)
        rows.index_copy_(0, chunk_index, picked_rows)
    return x


# Functional kernels: torchvision v2's `*_image` kernels, one parameter per sample


def _luma_into(image: torch.Tensor, luma: torch.Tensor) -> torch.Tensor:
    """torchvision's float grayscale of the batch `image` (uint8 or float32) into the float32
    plane `luma` (N, H, W): r * 0.2989, then g and b added with their weights (fused multiply-adds),
    not rounded. Returns luma."""
    red, green, blue = image.unbind(1)
    torch.mul(red, GRAY_WEIGHTS[0], out=luma)
    return luma.add_(green, alpha=GRAY_WEIGHTS[1]).add_(blue, alpha=GRAY_WEIGHTS[2])


def _float_copy(x: torch.Tensor) -> torch.Tensor:
    """The chunk x as float32, in a scratch tensor of x's layout."""
    image = _scratch_like("image", x, torch.float32)
    return image.copy_(x)


def _blend_into(
    image: torch.Tensor, ratio: torch.Tensor, other: torch.Tensor | None, out: torch.Tensor
) -> None:
    """torchvision's `_blend(image, other, ratio)` per sample into the uint8 `out`: image * ratio +
    other * (1 - ratio), clamped and truncated. `image` is the float32 copy of a uint8 chunk (it is
    overwritten); `other` None blends with 0 (brightness), else float32 broadcasting to image."""
    image.mul_(_row(ratio, image))
    if other is not None:
        image.addcmul_(other, _row(_one_minus(ratio), image))  # torchvision: add_(other, alpha=1 - ratio)
    _store(image.clamp_(0, _MAX), out)


def _brightness_into(x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_brightness` on one chunk."""
    _blend_into(_float_copy(x), factor, None, out)


def _contrast_into(x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_contrast` on one chunk."""
    image = _float_copy(x)
    luma = _luma_into(image, _scratch_like("work1", x, torch.float32, channels=1)[:, 0])
    mean = torch.mean(luma.floor_(), dim=(-2, -1))
    _blend_into(image, factor, _row(mean, image), out)


def _saturation_into(x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_saturation` on one chunk: the gray plane is copied into each channel first, so that
    the blend runs on matching layouts (NOTE [CPU speed] (2))."""
    image = _float_copy(x)
    luma = _luma_into(image, _scratch_like("work1", x, torch.float32, channels=1)[:, 0]).floor_()
    gray_image = _scratch_like("work2", x, torch.float32)
    for channel in range(3):
        gray_image[:, channel].copy_(luma)
    _blend_into(image, factor, gray_image, out)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_brightness_image` per sample: x * factor, clamped, truncated.
    `factor` (N,) >= 0."""
    return _whole_batch(adjust_brightness, x, factor)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_contrast_image` per sample: a blend of x with the mean of its floored
    grayscale. `factor` (N,) >= 0."""
    return _whole_batch(adjust_contrast, x, factor)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_saturation_image` per sample: a blend of x with its floored grayscale.
    `factor` (N,) >= 0."""
    return _whole_batch(adjust_saturation, x, factor)


def _grayscale_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """`rgb_to_grayscale` on one chunk."""
    luma = _luma_into(x, _scratch_like("work1", x, torch.float32, channels=1)[:, 0])
    gray = _scratch_like("work2", x, torch.uint8, channels=1)[:, 0].copy_(luma)
    for channel in range(3):
        out[:, channel].copy_(gray)


def rgb_to_grayscale(x: torch.Tensor) -> torch.Tensor:
    """torchvision's `rgb_to_grayscale_image(x, num_output_channels=3)`: the truncated luma, in
    all three channels."""
    return _whole_batch(rgb_to_grayscale, x)


def _pulse(values: torch.Tensor, center: float, out: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """1.0 where `values` equal `center`, else 0.0 (exactly), into `out`: max(0, 1 - |values -
    center| * scale), for values whose distance to the center is 0 or at least 1 / scale."""
    torch.sub(values, center, out=out)
    return out.abs_().mul_(-scale).add_(1.0).clamp_(min=0.0)


def _hue_into(x: torch.Tensor, shift: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_hue` on one chunk: torchvision's `_rgb_to_hsv`, hue shift and `_hsv_to_rgb`, value
    for value, on planes (NOTE [CPU speed] (3)). Its selections (`where`, bool masks, `gather`)
    become sums of products with exact 0/1 masks, and its `fmod`/`remainder` by 1 become
    x - floor(x): the same values (NOTE [CPU speed] (4))."""
    n, _, height, width = x.shape
    planes = _scratch("work1", (n, _HUE_PLANES, height, width), torch.float32, x.device, nhwc=False)
    image = planes[:, 0:3]
    for channel in range(3):
        image[:, channel].copy_(x[:, channel])
    image.mul_(1.0 / _MAX)
    red, green, blue = image.unbind(1)
    value, low, chroma, saturation, divisor, hue, temporary = planes[:, 3:10].unbind(1)
    distances = planes[:, 10:13]  # torchvision's rc, gc, bc: (max - r, max - g, max - b) / chroma
    is_red, is_green, is_blue = planes[:, 13:16].unbind(1)  # where the max is: r first, then g

    # _rgb_to_hsv
    torch.maximum(torch.maximum(red, green, out=value), blue, out=value)
    torch.minimum(torch.minimum(red, green, out=low), blue, out=low)
    torch.sub(value, low, out=chroma)
    # torchvision divides by where(max == min, 1, ...), and the numerator is then 0 too
    torch.div(chroma, torch.clamp(value, min=_TINY, out=saturation), out=saturation)
    torch.clamp(chroma, min=_TINY, out=divisor)
    torch.sub(value.unsqueeze(1), image, out=distances).div_(divisor.unsqueeze(1))
    rc, gc, bc = distances.unbind(1)
    _pulse(rc, 0.0, is_red, scale=1024.0)  # rc, gc: 0, or at least 1/255 (chroma <= 1)
    _pulse(gc, 0.0, is_green, scale=1024.0)
    torch.sub(1.0, is_red, out=is_blue)
    is_green.mul_(is_blue)
    is_blue.sub_(is_green)
    # hr = bc - gc, hg = rc + 2 - bc, hb = gc + 4 - rc, each masked, summed in torchvision's order
    torch.sub(bc, gc, out=hue).mul_(is_red)
    hue.add_(torch.add(rc, 2.0, out=temporary).sub_(bc).mul_(is_green))
    hue.add_(torch.add(gc, 4.0, out=temporary).sub_(rc).mul_(is_blue))
    hue.mul_(1.0 / 6.0).add_(1.0)
    hue.sub_(torch.floor(hue, out=temporary))  # fmod(hue, 1), hue in [0, 2)

    # the shift
    hue.add_(shift.to(torch.float32).view(-1, 1, 1))
    hue.sub_(torch.floor(hue, out=temporary))  # remainder(hue, 1)

    # _hsv_to_rgb
    h6 = hue.mul_(6)
    sextant = torch.floor(h6, out=temporary)
    fraction = h6.sub_(sextant)
    sextant.sub_(torch.div(sextant, 6, out=low).floor_().mul_(6))  # modulo 6
    sxf, one_minus_s, q = low, chroma, divisor
    t, p = distances.unbind(1)[:2]
    torch.mul(saturation, fraction, out=sxf)
    torch.sub(1.0, saturation, out=one_minus_s)
    torch.sub(1.0, sxf, out=q).mul_(value).clamp_(0.0, 1.0)
    torch.add(sxf, one_minus_s, out=t).mul_(value).clamp_(0.0, 1.0)
    torch.mul(one_minus_s, value, out=p).clamp_(0.0, 1.0)
    in_sextant = planes[:, 12:18]  # 1 where the sextant is 0, 1, ..., 5
    for index in range(6):
        _pulse(sextant, float(index), in_sextant[:, index])
    # in sextant i, r is (v, q, p, p, t, v)[i], g (t, v, v, q, p, p)[i], b (p, p, t, v, v, q)[i]
    picks = ((value, q, p, p, t, value), (t, value, value, q, p, p), (p, p, t, value, value, q))
    rgb = planes[:, 0:3]  # the input is read no more
    for channel, channel_picks in enumerate(picks):
        plane = torch.mul(channel_picks[0], in_sextant[:, 0], out=rgb[:, channel])
        for index in range(1, 6):
            plane.addcmul_(channel_picks[index], in_sextant[:, index])
    _store(rgb.mul_(_MAX + 1.0 - 1e-3), out)  # torchvision's float-to-uint8 conversion


_HUE_PLANES = 18
"""The float32 planes per sample `_hue_into` works in."""


def adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_hue_image` per sample: the hue (in HSV, in turns) shifted by `shift`
    (N,) in [-0.5, 0.5]; converted back as torchvision does (x 255.999, truncated)."""
    return _whole_batch(adjust_hue, x, shift)


def _sharpness_into(x: torch.Tensor, factor: torch.Tensor, out: torch.Tensor) -> None:
    """`adjust_sharpness` on one chunk: the smoothed interior from integer sums (NOTE [exactness])."""
    n, _, height, width = x.shape
    if height <= 2 or width <= 2:  # torchvision leaves them be
        out.copy_(x)
        return
    nhwc = _channels_innermost(x)
    pixels = _scratch_like("work1", x, torch.int16).copy_(x)
    across = _scratch("work2", (n, 3, height, width - 2), torch.int16, x.device, nhwc)
    torch.add(pixels[..., :-2], pixels[..., 1:-1], out=across).add_(pixels[..., 2:])
    box = _scratch("work3", (n, 3, height - 2, width - 2), torch.int16, x.device, nhwc)
    torch.add(across[..., :-2, :], across[..., 1:-1, :], out=box).add_(across[..., 2:, :])
    box.add_(pixels[..., 1:-1, 1:-1], alpha=4)  # 1 1 1 / 1 5 1 / 1 1 1
    smoothed = _scratch("work4", (n, 3, height - 2, width - 2), torch.float32, x.device, nhwc)
    smoothed.copy_(box).div_(13).round_()
    image = _float_copy(x)
    interior = image[..., 1:-1, 1:-1]
    interior.addcmul_(smoothed.sub_(interior), _row(_one_minus(factor), interior))  # add_(alpha=1 - f)
    _store(image.clamp_(0, _MAX), out)


def adjust_sharpness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's `adjust_sharpness_image` per sample: a blend of x with its 3x3-smoothed image
    (kernel 1 1 1 / 1 5 1 / 1 1 1, over 13, rounded) inside a one-pixel border that stays as it is.
    `factor` (N,) >= 0; images of height or width <= 2 come back unchanged."""
    return _whole_batch(adjust_sharpness, x, factor)


def _posterize_into(x: torch.Tensor, bits: torch.Tensor, out: torch.Tensor) -> None:
    """`posterize` on one chunk."""
    bits = bits.to(torch.int64).view(-1, 1, 1, 1)
    mask = (bits.new_ones(()).bitwise_left_shift(bits) - 1).bitwise_left_shift_(8 - bits)
    torch.bitwise_and(x, mask.to(torch.uint8), out=out)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """torchvision's `posterize_image` per sample: keep the `bits` (N,) int64 in 0..8 most
    significant bits of every channel value."""
    return _whole_batch(posterize, x, bits)


def _solarize_into(x: torch.Tensor, threshold: torch.Tensor, out: torch.Tensor) -> None:
    """`solarize` on one chunk."""
    lowest_inverted = torch.ceil(threshold.to(torch.float32)).clamp_(0, _MAX)
    inverted = x >= _row(lowest_inverted, x, torch.uint8)
    torch.bitwise_xor(x, inverted.view(torch.uint8).neg_(), out=out)  # XOR 255 where inverted


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """torchvision's `solarize_image` per sample: invert every value >= `threshold` (N,), a float
    in [0, 255] compared as float32 (as torchvision compares a uint8 image with a Python float)."""
    return _whole_batch(solarize, x, threshold)


def _invert_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """`invert` on one chunk."""
    torch.bitwise_not(x, out=out)


def invert(x: torch.Tensor) -> torch.Tensor:
    """torchvision's `invert_image`: 255 - x."""
    return _whole_batch(invert, x)


def _channel_extremes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's and channel's (min, max), (N, 3) uint8; an NHWC batch is reduced down its
    rows (contiguous) rather than across its interleaved channels."""
    n, _, height, width = x.shape
    if _channels_innermost(x):
        rows = x.permute(0, 2, 3, 1).reshape(n, height, width * 3)
        return (
            rows.amin(dim=1).view(n, width, 3).amin(dim=1),
            rows.amax(dim=1).view(n, width, 3).amax(dim=1),
        )
    return x.amin(dim=(-2, -1)), x.amax(dim=(-2, -1))


def _autocontrast_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """`autocontrast` on one chunk."""
    low, high = (extreme.to(torch.float32) for extreme in _channel_extremes(x))
    constant = high == low
    inv_scale = high.sub_(low).mul_(1.0 / _MAX)
    low = torch.where(constant, 0.0, low)
    inv_scale = torch.where(constant, 1.0, inv_scale)
    image = _float_copy(x).sub_(_row(low, x)).div_(_row(inv_scale, x))
    _store(image.clamp_(0, _MAX), out)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    """torchvision's `autocontrast_image`: each channel of each sample stretched linearly from its
    (min, max) to (0, 255); a constant channel is left as it is."""
    return _whole_batch(autocontrast, x)


def _count_values(values: torch.Tensor, bins: int) -> torch.Tensor:
    """How often each of 0 ... bins - 1 occurs in the flat int32 `values`: `bincount` on a CPU (the
    fastest there); elsewhere `_count_values_by_index_add` (a GPU's bincount synchronises to size
    its output)."""
    if values.device.type == "cpu":
        return torch.bincount(values, minlength=bins)
    return _count_values_by_index_add(values, bins)


def _count_values_by_index_add(values: torch.Tensor, bins: int) -> torch.Tensor:
    """`_count_values` without a host synchronisation: ones added at the values."""
    ones = torch.ones(1, dtype=torch.int64, device=values.device).expand(values.shape[0])
    return torch.zeros(bins, dtype=torch.int64, device=values.device).index_add_(0, values, ones)


def _equalize_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """`equalize` on one chunk: per-channel histograms (one bincount of value + 256 * (sample,
    channel)), PIL's lookup tables from them, and one lookup (index_select) through the same index."""
    n, _, height, width = x.shape
    permutation = _memory_permutation(x)
    index = _scratch_like("work1", x, torch.int32).copy_(x)
    offsets = torch.arange(0, n * 3 * 256, 256, dtype=torch.int32, device=x.device)
    index.add_(_row(offsets.view(n, 3), x, torch.int32))
    flat_index = index.permute(permutation).reshape(-1)
    hist = _count_values(flat_index, n * 3 * 256).view(n, 3, 256)
    cum_hist = hist.cumsum(dim=-1)
    last_value = cum_hist.argmax(dim=-1, keepdim=True)
    step = (height * width - hist.gather(-1, last_value)).div_(255, rounding_mode="floor")
    tables = (cum_hist[..., :-1] + step // 2).div_(step.clamp(min=1), rounding_mode="floor").clamp_(0, _MAX)
    tables = torch.cat([tables.new_zeros(n, 3, 1), tables], dim=-1)
    identity = torch.arange(256, device=x.device).expand(n, 3, 256)
    tables = torch.where(step != 0, tables, identity).to(torch.uint8)
    torch.index_select(tables.view(-1), 0, flat_index, out=out.permute(permutation).view(-1))


def equalize(x: torch.Tensor) -> torch.Tensor:
    """torchvision's `equalize_image` (PIL's algorithm): each channel of each sample mapped through
    its cumulative histogram; a channel whose pixels but those of its highest value number fewer
    than 255 is left as it is."""
    return _whole_batch(equalize, x)


def _gaussian_kernels(size: int, sigma: torch.Tensor) -> torch.Tensor:
    """torchvision's 1-D Gaussian kernel of `size` taps for each sigma (N,): (N, size) float32."""
    lim = (size - 1) / (2.0 * math.sqrt(2.0))
    taps = torch.linspace(-lim, lim, steps=size, dtype=torch.float32, device=sigma.device)
    return torch.softmax(taps.div(sigma.to(torch.float32).view(-1, 1)).pow(2).neg(), dim=1)


def _reflect_pad(image: torch.Tensor, pad_x: int, pad_y: int) -> torch.Tensor:
    """`torch.nn.functional.pad(image, [pad_x, pad_x, pad_y, pad_y], mode="reflect")` in image's
    layout, into scratch memory (torch's reflect padding of an NHWC batch is ~20x slower than these
    slice copies)."""
    n, channels, height, width = image.shape
    if pad_x >= width or pad_y >= height:
        raise ValueError(f"reflect padding ({pad_x}, {pad_y}) needs a larger image than {height}x{width}")
    shape = (n, channels, height + 2 * pad_y, width + 2 * pad_x)
    padded = _scratch("work1", shape, image.dtype, image.device, _channels_innermost(image))
    middle = padded[..., pad_y : pad_y + height, :]
    middle[..., pad_x : pad_x + width].copy_(image)
    if pad_x:
        middle[..., :pad_x].copy_(image[..., 1 : pad_x + 1].flip(-1))
        middle[..., pad_x + width :].copy_(image[..., width - pad_x - 1 : width - 1].flip(-1))
    if pad_y:
        padded[..., :pad_y, :].copy_(padded[..., pad_y + 1 : 2 * pad_y + 1, :].flip(-2))
        padded[..., pad_y + height :, :].copy_(padded[..., height - 1 : pad_y + height - 1, :].flip(-2))
    return padded


def _blur_into(x: torch.Tensor, sigma: torch.Tensor, out: torch.Tensor, kernel_size: tuple[int, int]) -> None:
    """`gaussian_blur` on one chunk: tap by tap, each a multiply-add of a shifted view with the
    per-sample weight spread over a row (NOTE [CPU speed] (2)); rows first, then columns."""
    n, _, height, width = x.shape
    nhwc = _channels_innermost(x)
    size_x, size_y = kernel_size
    padded = _reflect_pad(_float_copy(x), size_x // 2, size_y // 2)
    weights_x = _gaussian_kernels(size_x, sigma)
    weights_y = _gaussian_kernels(size_y, sigma)
    across = _scratch("work2", (n, 3, padded.shape[2], width), torch.float32, x.device, nhwc)
    torch.mul(padded[..., :width], _row(weights_x[:, 0], across), out=across)
    for tap in range(1, size_x):
        across.addcmul_(padded[..., tap : tap + width], _row(weights_x[:, tap], across))
    blurred = _scratch_like("work3", x, torch.float32)
    torch.mul(across[..., :height, :], _row(weights_y[:, 0], out), out=blurred)
    for tap in range(1, size_y):
        blurred.addcmul_(across[..., tap : tap + height, :], _row(weights_y[:, tap], out))
    _store(blurred.round_(), out)


def gaussian_blur(x: torch.Tensor, kernel_size: tuple[int, int], sigma: torch.Tensor) -> torch.Tensor:
    """torchvision's `gaussian_blur_image(x, kernel_size, [s, s])` per sample: `kernel_size` is
    torchvision's (along the width, along the height), odd and positive; `sigma` (N,) > 0; reflect
    padding (each half-size must be less than the image's side); rounded back to uint8.

    Separable (a pass along rows, then one along columns) where torchvision convolves with the 2-D
    outer product of the same 1-D kernels: the same sum in another order, so a value can land on
    the other side of a rounding half: at most 1 apart, rarely (tests/test_augment_color.py).
    """
    return _whole_batch(gaussian_blur, x, sigma, kernel_size=kernel_size)


_CHUNKED_FORMS: dict[Callable[..., torch.Tensor], tuple[Callable[..., None], float]] = {
    adjust_brightness: (_brightness_into, 4.5),
    adjust_contrast: (_contrast_into, 5.5),
    adjust_saturation: (_saturation_into, 8.5),
    adjust_hue: (_hue_into, _HUE_PLANES + 1.5),
    adjust_sharpness: (_sharpness_into, 7.5),
    rgb_to_grayscale: (_grayscale_into, 1.5),
    posterize: (_posterize_into, 0.5),
    solarize: (_solarize_into, 0.5),
    invert: (_invert_into, 0.5),
    autocontrast: (_autocontrast_into, 4.5),
    equalize: (_equalize_into, 3.0),
    gaussian_blur: (_blur_into, 6.0),  # keeps ~12, but its per-tap overhead wants larger chunks
}
"""Each functional kernel's form on one chunk (`kernel(x, *per_sample, out, **constants)`) and
the float32 values per pixel it keeps (its chunks' size: NOTE [CPU speed] (1))."""


def _whole_batch(
    kernel: Callable[..., torch.Tensor], x: torch.Tensor, *per_sample: torch.Tensor, **constants: Any
) -> torch.Tensor:
    """The functional `kernel` on the whole batch x: its chunk form, into a new batch."""
    chunk_kernel, planes = _CHUNKED_FORMS[kernel]
    if constants:
        chunk_kernel = functools.partial(chunk_kernel, **constants)
    return _by_chunks(chunk_kernel, planes, x, *per_sample)


def apply_kernel(
    x: torch.Tensor,
    index: torch.Tensor,
    kernel: Callable[..., torch.Tensor],
    *per_sample: torch.Tensor,
    **constants: Any,
) -> torch.Tensor:
    """`apply_to(x, index, lambda s: kernel(s, *per_sample, **constants))` for one of this module's
    functional kernels, faster: in place, chunk by chunk (gather, transform, scatter while in
    cache, no new batch). `per_sample` are the kernel's per-sample parameters for the samples
    `index` (lined up with it); `constants` its other arguments (gaussian_blur's kernel_size).
    Returns x. Kernels of other modules go through `apply_to`."""
    form = _CHUNKED_FORMS.get(kernel)
    if form is None:
        return apply_to(x, index, lambda samples: kernel(samples, *per_sample, **constants))
    chunk_kernel, planes = form
    if constants:
        chunk_kernel = functools.partial(chunk_kernel, **constants)
    return _transform_samples(chunk_kernel, planes, x, index, *per_sample)


# The transforms' operations: parameters from uniforms, kernels on the samples they pick


def _chosen(u: np.ndarray, p: float) -> np.ndarray:
    """The samples (increasing int64 indices) whose uniform `u` (N,) falls below `p`."""
    return np.flatnonzero(u < p).astype(np.int64)


def _uniform(u: np.ndarray, bounds: tuple[float, float]) -> np.ndarray:
    """`u` (N,) mapped onto [low, high), as float32 (torchvision draws its factors in float32)."""
    low, high = bounds
    return (low + u * (high - low)).astype(np.float32)


class RandomApplyOp:
    """A functional kernel run on the samples whose uniform falls below `p`: the random-apply
    transforms (grayscale, solarize, posterize, autocontrast, equalize). `per_sample` are the
    kernel's per-sample arguments, in order, each one value for every sample."""

    draws = 1

    def __init__(self, p: float, kernel: Callable[..., torch.Tensor], **per_sample: np.ndarray) -> None:
        self.p = p
        self.kernel = kernel
        self.per_sample = per_sample

    def params(self, u: np.ndarray) -> Params:
        """`index`: the samples it applies to; and each of `per_sample`, for each of them."""
        index = _chosen(u[:, 0], self.p)
        params = {"index": index}
        for name, value in self.per_sample.items():
            params[name] = np.full(index.shape[0], value)
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the kernel on the chosen samples, in place."""
        return apply_kernel(x, p["index"], self.kernel, *(p[name] for name in self.per_sample))


JITTER_KERNELS: tuple[tuple[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]], ...] = (
    ("brightness", adjust_brightness),
    ("contrast", adjust_contrast),
    ("saturation", adjust_saturation),
    ("hue", adjust_hue),
)
"""ColorJitter's operations, by torchvision's `fn_idx` (0 brightness ... 3 hue)."""


class ColorJitterOp:
    """ColorJitter: per sample, each present factor uniform in its range and the four operations in
    a random order (torchvision: `randperm(4)`; here the argsort of 4 uniforms). Position by
    position, the samples are grouped by the operation they run there."""

    draws = 8
    """4 for the order, then one per factor (brightness, contrast, saturation, hue)."""

    def __init__(self, transform: ColorJitter) -> None:
        self.ranges = dict(zip((name for name, _ in JITTER_KERNELS), transform.ranges(), strict=True))
        # CPU batches without a hue shift: one native pass per sample (`fastload._jpeg.color_jitter`,
        # the same bits as these kernels, ~2.3x faster).
        native = native_jpeg()
        self._native = native if self.ranges["hue"] is None and hasattr(native, "color_jitter") else None

    def params(self, u: np.ndarray) -> Params:
        """`order` (N, 4): the operation (0 brightness ... 3 hue) at each position; each present
        factor (N,) float32; and per position k and present operation, `index@k:name` (the samples
        that run it there) and `name@k` (their factors)."""
        order = np.argsort(u[:, :4], axis=1, kind="stable").astype(np.int64)
        params: Params = {"order": order}
        for op_id, (name, _) in enumerate(JITTER_KERNELS):
            bounds = self.ranges[name]
            if bounds is None:
                continue
            factor = _uniform(u[:, 4 + op_id], bounds)
            params[name] = factor
            for position in range(4):
                index = np.flatnonzero(order[:, position] == op_id).astype(np.int64)
                params[f"index@{position}:{name}"] = index
                params[f"{name}@{position}"] = factor[index]
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the four positions in turn, each on its groups of samples, in place."""
        if self._native is not None and x.device.type == "cpu" and x.shape[0]:
            nhwc = x.permute(0, 2, 3, 1)
            if nhwc.is_contiguous():  # a worker's rows of a slot
                self._run_native(nhwc, p)
                return x
        for position in range(4):
            for name, kernel in JITTER_KERNELS:
                if self.ranges[name] is not None:
                    apply_kernel(x, p[f"index@{position}:{name}"], kernel, p[f"{name}@{position}"])
        return x


    def _run_native(self, nhwc: torch.Tensor, p: DeviceParams) -> None:
        n = nhwc.shape[0]
        order = p["order"].to(torch.int64).clone()
        factors = torch.ones((n, 3), dtype=torch.float32)
        for op_id, (name, _) in enumerate(JITTER_KERNELS[:3]):
            if self.ranges[name] is None:
                order[order == op_id] = -1  # absent: the position does nothing
            else:
                factors[:, op_id] = p[name]
        order[order == 3] = -1  # hue: absent on this path
        assert self._native is not None
        self._native.color_jitter(nhwc.numpy(), n, order.numpy(), factors.numpy())


class GaussianBlurOp:
    """GaussianBlur: every sample, with its sigma uniform in the range (both axes, as torchvision)."""

    draws = 1

    def __init__(self, transform: GaussianBlur) -> None:
        self.kernel_size = transform.kernel()
        self.sigma_range = transform.sigma_range()

    def params(self, u: np.ndarray) -> Params:
        """`index` (every sample) and `sigma` (N,) float32."""
        return {"index": np.arange(u.shape[0], dtype=np.int64), "sigma": _uniform(u[:, 0], self.sigma_range)}

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Blur the batch, in place."""
        return apply_kernel(x, p["index"], gaussian_blur, p["sigma"], kernel_size=self.kernel_size)


OPS: dict[type, Callable[[Any], SampleOp]] = {
    ColorJitter: ColorJitterOp,
    GaussianBlur: GaussianBlurOp,
    RandomGrayscale: lambda t: RandomApplyOp(t.p, rgb_to_grayscale),
    RandomSolarize: lambda t: RandomApplyOp(t.p, solarize, threshold=np.asarray(float(t.threshold))),
    RandomPosterize: lambda t: RandomApplyOp(t.p, posterize, bits=np.asarray(t.bits, dtype=np.int64)),
    RandomAutocontrast: lambda t: RandomApplyOp(t.p, autocontrast),
    RandomEqualize: lambda t: RandomApplyOp(t.p, equalize),
}
