"""Running batched kernels chunk by chunk, at memory speed on a CPU: the layout helpers, per-thread
scratch memory and chunking they share, and `whole_batch` / `apply_kernel`, which run a registered
kernel over a whole batch or, in place, over a group of its samples.

A kernel registered in `CHUNKED_FORMS` (the functional kernels of `color`) is written for one
chunk of samples (`kernel(x, *per_sample, out)`, its temporaries in scratch memory); `whole_batch`
runs it over a batch into a new one, `apply_kernel` over the samples `index` of a batch, in place
(each chunk gathered into scratch memory, transformed there and scattered back while in cache).

NOTE [CPU speed]: on a CPU the photometric kernels are memory-bound, and four things decide their
speed (figures: one core, 224x224 images).
(1) Fresh memory: a float32 copy of 64 such images is 38 MB, beyond glibc's largest mmap threshold
(32 MB), so each such temporary is a new mapping whose pages fault in on first touch (x.float() of
that batch: ~330 us per image, ~7 us into memory already touched), and smaller ones are trimmed
and faulted in again often enough. So each kernel runs over chunks of a few samples (a working
set of about `CPU_CHUNK_BYTES`, in cache), and its temporaries are views of per-thread scratch
buffers (`scratch`), touched once and kept. Each chunk is batched; on a GPU the batch is one
chunk and temporaries come from its caching allocator.
(2) Broadcasting: torch's CPU loops vectorise only when each operand is contiguous along the
innermost (coalesced) dimension, or is its one stride-0 operand. A per-sample (N, 1, 1, 1) operand
in a comparison or next to another broadcast operand, or a per-channel (N, 3, 1, 1) one against an
NHWC batch, falls to a scalar loop (~10x slower). So per-sample and per-channel values are spread
over one image row first (`row`: (N, 3, 1, W) in the batch's layout), which broadcasts over rows.
(3) Layout: the batch is NHWC (channels_last); a channel plane is a stride-3 view, on which each
operation is a scalar loop (~20 us per image: luma, copying the gray plane into the channels);
converting the whole layout costs 45-70 us per image. So kernels stay in the batch's layout,
except hue (~50 operations on planes, so planar: its channels are copied in and out plane by
plane, the cheapest conversion).
(4) Slow operators, avoided: float to uint8 conversion (~40 us; through int16: ~14 us),
`torch.where` and `masked_fill_` (~180 us per plane: selections are products with exact 0/1
masks), `fmod`/`remainder` (x - floor(x), the same value here), `gather`, `index_copy_` of uint8
rows (`groups` moves rows as int64 words), torch's reflect padding of an NHWC batch (slice
copies instead), and depthwise `conv2d` (shifted integer sums; taps for the blur).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from fastload._augment.groups import apply_to, as_rows, from_rows

CPU_CHUNK_BYTES = 4 << 20
"""On a CPU, the working set (float32 planes and the like) a kernel's chunk of samples may take,
at least one sample's: NOTE [CPU speed] (1)."""

CHUNKED_FORMS: dict[Callable[..., torch.Tensor], tuple[Callable[..., None], float]] = {}
"""Each registered functional kernel's form on one chunk (`kernel(x, *per_sample, out,
**constants)`) and the float32 values per pixel it keeps (its chunks' size: NOTE [CPU speed] (1));
filled by the modules that define the kernels (`color`)."""

_scratch_buffers = threading.local()

# Layout, scratch memory and conversions


def channels_innermost(x: torch.Tensor) -> bool:
    """Whether x (N, C, H, W) is laid out NHWC (channels_last, or a view of it)."""
    return x.shape[1] > 1 and x.stride(1) < x.stride(3)


def memory_permutation(x: torch.Tensor) -> tuple[int, int, int, int]:
    """The permutation of x's dims that lists them in memory order: (0, 2, 3, 1) for NHWC."""
    return (0, 2, 3, 1) if channels_innermost(x) else (0, 1, 2, 3)


def _dense(x: torch.Tensor) -> torch.Tensor:
    """x itself when it is contiguous NCHW or NHWC, else a contiguous copy."""
    if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last):
        return x
    return x.contiguous()


def _scratch_words(slot: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """`numel` uninitialised CPU values of `dtype`: a view of this thread's buffer `slot`, kept
    between calls and grown as needed, so that its pages are touched once (NOTE [CPU speed] (1)).
    The slots: "image" (a chunk's float32 copy), "work1" ... "work4" (each kernel's other
    temporaries, in that order), "store" and "store_bytes" (`store`), "picked" (the rows
    `_transform_samples` gathers). A kernel never uses a slot twice at once and never returns one;
    kernels run one at a time in a thread, so they share the slots (~15 MB in all at 224x224)."""
    nbytes = numel * dtype.itemsize
    buffers: dict[str, torch.Tensor] = _scratch_buffers.__dict__.setdefault("buffers", {})
    buffer = buffers.get(slot)
    if buffer is None or buffer.numel() < nbytes:
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        buffers[slot] = buffer
    return buffer[:nbytes].view(dtype)


def scratch(
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


def scratch_like(slot: str, like: torch.Tensor, dtype: torch.dtype, channels: int = 3) -> torch.Tensor:
    """A scratch tensor with like's batch and image size, `channels` channels, and like's layout."""
    n, _, height, width = like.shape
    return scratch(slot, (n, channels, height, width), dtype, like.device, channels_innermost(like))


def row(values: torch.Tensor, like: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-sample (N,) or per-channel (N, 3) values spread over one row of `like` (N, 3, H, W):
    (N, 3, 1, W) of `dtype` in like's layout, broadcasting over rows (NOTE [CPU speed] (2))."""
    n, channels, _, width = like.shape
    spread = values.to(dtype).reshape(n, -1, 1, 1).expand(n, channels, 1, width)
    layout = torch.channels_last if channels_innermost(like) else torch.contiguous_format
    return spread.contiguous(memory_format=layout)


def channel_extremes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's and channel's (min, max), (N, 3) uint8; an NHWC batch is reduced down its
    rows (contiguous) rather than across its interleaved channels."""
    n, _, height, width = x.shape
    if channels_innermost(x):
        rows = x.permute(0, 2, 3, 1).reshape(n, height, width * 3)
        return (
            rows.amin(dim=1).view(n, width, 3).amin(dim=1),
            rows.amax(dim=1).view(n, width, 3).amax(dim=1),
        )
    return x.amin(dim=(-2, -1)), x.amax(dim=(-2, -1))


def reflect_pad(image: torch.Tensor, pad_x: int, pad_y: int) -> torch.Tensor:
    """`torch.nn.functional.pad(image, [pad_x, pad_x, pad_y, pad_y], mode="reflect")` in image's
    layout, into the scratch slot "work1" (torch's reflect padding of an NHWC batch is ~20x slower
    than these slice copies)."""
    n, channels, height, width = image.shape
    if pad_x >= width or pad_y >= height:
        raise ValueError(f"reflect padding ({pad_x}, {pad_y}) needs a larger image than {height}x{width}")
    shape = (n, channels, height + 2 * pad_y, width + 2 * pad_x)
    padded = scratch("work1", shape, image.dtype, image.device, channels_innermost(image))
    middle = padded[..., pad_y : pad_y + height, :]
    middle[..., pad_x : pad_x + width].copy_(image)
    if pad_x:
        middle[..., :pad_x].copy_(image[..., 1 : pad_x + 1].flip(-1))
        middle[..., pad_x + width :].copy_(image[..., width - pad_x - 1 : width - 1].flip(-1))
    if pad_y:
        padded[..., :pad_y, :].copy_(padded[..., pad_y + 1 : 2 * pad_y + 1, :].flip(-2))
        padded[..., pad_y + height :, :].copy_(padded[..., height - 1 : pad_y + height - 1, :].flip(-2))
    return padded


def store(values: torch.Tensor, out: torch.Tensor) -> None:
    """Float `values` (within [0, 255]) truncated into the uint8 `out`: through int16, a faster
    conversion than float to uint8 on a CPU, with the same truncation; into another layout plane
    by plane (NOTE [CPU speed] (3), (4))."""
    as_int16 = scratch_like("store", values, torch.int16)
    as_int16.copy_(values)
    if as_int16.stride() == out.stride():
        out.copy_(as_int16)
        return
    as_uint8 = scratch_like("store_bytes", values, torch.uint8)
    as_uint8.copy_(as_int16)
    for channel in range(out.shape[1]):
        out[:, channel].copy_(as_uint8[:, channel])


# Chunks


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
    rows = as_rows(x)
    if rows is None or x.device.type != "cpu":
        return apply_to(x, index, lambda samples: _by_chunks(kernel, planes, samples, *per_sample))
    step = _chunk_samples(x, planes)
    for start in range(0, index.shape[0], step):
        chunk_index = index[start : start + step]
        picked_rows = _scratch_words("picked", chunk_index.shape[0] * rows.shape[1], rows.dtype)
        picked_rows = torch.index_select(rows, 0, chunk_index, out=picked_rows.view(-1, rows.shape[1]))
        picked = from_rows(picked_rows, x)
        kernel(picked, *(values[start : start + step] for values in per_sample), picked)
        rows.index_copy_(0, chunk_index, picked_rows)
    return x


# Whole batches, groups of samples


def whole_batch(
    kernel: Callable[..., torch.Tensor], x: torch.Tensor, *per_sample: torch.Tensor, **constants: Any
) -> torch.Tensor:
    """The registered functional `kernel` on the whole batch x: its chunk form, into a new batch
    (what each functional kernel of `color` runs)."""
    chunk_kernel, planes = CHUNKED_FORMS[kernel]
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
    """`apply_to(x, index, lambda s: kernel(s, *per_sample, **constants))` for a functional kernel
    registered in `CHUNKED_FORMS`, faster: in place, chunk by chunk (gather, transform, scatter
    while in cache, no new batch). `per_sample` are the kernel's per-sample parameters for the
    samples `index` (lined up with it); `constants` its other arguments (gaussian_blur's
    kernel_size). Returns x. Other kernels go through `apply_to`."""
    form = CHUNKED_FORMS.get(kernel)
    if form is None:
        return apply_to(x, index, lambda samples: kernel(samples, *per_sample, **constants))
    chunk_kernel, planes = form
    if constants:
        chunk_kernel = functools.partial(chunk_kernel, **constants)
    return _transform_samples(chunk_kernel, planes, x, index, *per_sample)
