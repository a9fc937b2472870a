"""Moving a group of samples (an index array) out of a batch and back, fast on the CPU: `take`,
`put_`, and `apply_to` (a function run on the group, its result written over it, in place).

An operation runs on the samples that drew it, so every step takes groups out of the batch and
writes them back. torch's 4-D `index_select` of a channels_last batch returns an NCHW copy,
converting the layout element by element (~3 ms for 32 images of 224 x 224 on one core), and
`index_copy_` from a source laid out otherwise does the same (~8 ms). As whole rows in memory order
(one sample per row, `as_rows`) `index_select` copies each row in one go (~0.1 ms), and
`index_copy_` of the rows viewed as int64 moves 8 bytes an element rather than 1 (~0.5 ms rather
than ~2.7 ms). A group keeps the batch's memory format (channels_last or contiguous), so a function
sees what it would have.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Kernel = Callable[[torch.Tensor], torch.Tensor]
"""A batch in, the transformed batch out (parameters bound): what `apply_to` runs."""


def is_nhwc(x: torch.Tensor) -> bool:
    """Whether the batch x (N, 3, H, W) is laid out channels_last (and not also contiguous)."""
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def memory_format(x: torch.Tensor) -> torch.memory_format:
    """x's memory format: channels_last or contiguous."""
    return torch.channels_last if is_nhwc(x) else torch.contiguous_format


def as_rows(x: torch.Tensor) -> torch.Tensor | None:
    """x (N, C, H, W) as rows of machine words in memory order, (N, row bytes / word), a view of
    x's memory: the widest of int64, int32, int16 and uint8 that the row length and the address
    allow (x's own type when none does). None when x is not dense in NCHW or NHWC order."""
    if x.is_contiguous():
        rows = x.view(x.shape[0], -1)
    elif is_nhwc(x):
        rows = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
    else:
        return None
    row_bytes = rows.shape[1] * x.element_size()
    for word in (torch.int64, torch.int32, torch.int16):
        if row_bytes % word.itemsize == 0 and x.data_ptr() % word.itemsize == 0:
            return rows.view(word)
    return rows


def from_rows(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Rows (n, ...) of `as_rows(like)`'s form back to (n, C, H, W) samples of like's dtype in
    like's memory format (a view)."""
    n, (channels, height, width) = rows.shape[0], like.shape[1:]
    samples = rows.view(like.dtype)
    if is_nhwc(like):
        return samples.view(n, height, width, channels).permute(0, 3, 1, 2)
    return samples.view(n, channels, height, width)


def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The samples `index` (int64, on x's device) of x, copied, in x's memory format."""
    rows = as_rows(x)
    if rows is None:
        return x.index_select(0, index)
    return from_rows(rows.index_select(0, index), x)


def put_(x: torch.Tensor, index: torch.Tensor, samples: torch.Tensor) -> None:
    """Write `samples` (n, C, H, W) over the samples `index` of x, in place."""
    rows = as_rows(x)
    if rows is None:
        x.index_copy_(0, index, samples)
        return
    source = as_rows(samples.contiguous(memory_format=memory_format(x)))
    assert source is not None
    if source.dtype != rows.dtype:  # another alignment: byte by byte
        rows, source = rows.view(torch.uint8), source.view(torch.uint8)
    rows.index_copy_(0, index, source)


def apply_to(x: torch.Tensor, index: torch.Tensor, fn: Kernel) -> torch.Tensor:
    """Run `fn` on the samples `index` of the batch `x` and write its result over them, in place;
    returns x.

    `index` is an int64 tensor of increasing sample indices (from `np.flatnonzero` in an op's
    `params`): its length, known on the host, decides without a device synchronisation whether it
    is empty (nothing runs) or the whole batch (no gather, no scatter). Otherwise the samples are
    moved as rows (`take`, `put_`).
    """
    if index.numel() == 0:
        return x
    if index.shape[0] == x.shape[0]:
        result = fn(x)
        if result.data_ptr() != x.data_ptr():
            x.copy_(result)
        return x
    put_(x, index, fn(take(x, index)))
    return x
