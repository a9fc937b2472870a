"""Moving a group of samples (an index array) out of a uint8 batch and back, fast on the CPU.

A geometric operation runs on the samples that drew it, so every step takes groups out of the
batch and writes them back. torch's 4-D `index_select` of a channels_last batch returns an NCHW
copy, converting the layout element by element (~3 ms for 32 images of 224 x 224 on one core), and
`index_copy_` from a source laid out otherwise does the same (~8 ms). As whole rows in memory order
(one sample per row) `index_select` copies each row in one go (~0.1 ms), and `index_copy_` of the
rows viewed as int64 moves 8 bytes an element (~0.5 ms). A group keeps the batch's memory format
(channels_last or contiguous), so a kernel sees what it would have.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Kernel = Callable[[torch.Tensor], torch.Tensor]


def is_nhwc(x: torch.Tensor) -> bool:
    """Whether the batch x (N, 3, H, W) is laid out channels_last (and not also contiguous)."""
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def memory_format(x: torch.Tensor) -> torch.memory_format:
    """x's memory format: channels_last or contiguous."""
    return torch.channels_last if is_nhwc(x) else torch.contiguous_format


def _rows(x: torch.Tensor) -> torch.Tensor | None:
    """x (N, C, H, W) as (N, C*H*W) uint8 rows in memory order (a view), or None when x is not
    dense in NCHW or NHWC order."""
    if x.is_contiguous():
        return x.view(x.shape[0], -1)
    if is_nhwc(x):
        return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
    return None


def _wide(rows: torch.Tensor) -> torch.Tensor:
    """uint8 rows viewed as the widest integer type that divides them (and their alignment)."""
    for dtype, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if rows.shape[1] % size == 0 and rows.data_ptr() % size == 0:
            return rows.view(dtype)
    return rows


def _unrows(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Rows (n, C*H*W) back to (n, C, H, W) in `like`'s memory format."""
    n, (channels, height, width) = rows.shape[0], like.shape[1:]
    if is_nhwc(like):
        return rows.view(n, height, width, channels).permute(0, 3, 1, 2)
    return rows.view(n, channels, height, width)


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The samples `index` (int64, on x's device) of x, copied, in x's memory format."""
    rows = _rows(x)
    if rows is None:
        return x.index_select(0, index)
    return _unrows(rows.index_select(0, index), x)


def put_(x: torch.Tensor, index: torch.Tensor, samples: torch.Tensor) -> None:
    """Write `samples` (n, C, H, W) over the samples `index` of x, in place."""
    rows = _rows(x)
    if rows is None:
        x.index_copy_(0, index, samples)
        return
    source = _rows(samples.contiguous(memory_format=memory_format(x)))
    assert source is not None
    wide, wide_source = _wide(rows), _wide(source)
    if wide.dtype != wide_source.dtype:
        wide, wide_source = rows, source
    wide.index_copy_(0, index, wide_source)


def apply_group(x: torch.Tensor, index: torch.Tensor, fn: Kernel) -> torch.Tensor:
    """Run `fn` on the samples `index` (increasing int64) of x and write its result over them, in
    place; returns x. An empty index (known on the host: no device synchronisation) runs nothing;
    the whole batch is handed to `fn` without a gather."""
    if index.shape[0] == 0:
        return x
    if index.shape[0] == x.shape[0]:
        result = fn(x)
        if result.data_ptr() != x.data_ptr():
            x.copy_(result)
        return x
    put_(x, index, fn(take(x, index)))
    return x
