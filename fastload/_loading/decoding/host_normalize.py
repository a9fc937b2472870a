"""Normalizing a CPU batch in one pass into a reused buffer.

torch's `x.float().mul_(scale).add_(bias)` makes three passes over a batch and writes a freshly
allocated float32 tensor; for 64 images of 224x224 that is 38 MiB, which the allocator maps anew
for every batch, so most of the ~0.43 ms an image costs is page faults, on the trainer's thread.
`HostNormalizer` makes one pass (the native extension's per-channel table, rounding exactly as
torch does) into buffers that come back when the last view of a batch dies, the way ring slots
do (NOTE [reused outputs]); without the extension, or for other dtypes, it is torch's three passes.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

import numpy as np
import torch

from fastload._native_jpeg import native_pass

# NOTE [reused outputs]: a batch handed to the user is a view of `np.frombuffer(buffer)`; torch
# keeps that array alive while any view of the batch lives (also slices the user keeps), so the
# array's finalizer runs only once nothing can read the buffer any more, and only then is the
# buffer offered to a later batch. At most `_KEPT` free buffers of each size are kept.
_KEPT = 4


class HostNormalizer:
    """(x / 255 - mean) / std of NHWC uint8 CPU batches, as float32 NCHW in channels_last memory."""

    def __init__(self, scale: torch.Tensor, bias: torch.Tensor) -> None:
        """`scale`, `bias`: (1, 3, 1, 1) float32, so that x * scale + bias is the normalization."""
        self._scale, self._bias = scale, bias
        self._scale3 = tuple(float(v) for v in scale.flatten())
        self._bias3 = tuple(float(v) for v in bias.flatten())
        self._normalize_u8 = native_pass("normalize_u8")
        self._free: defaultdict[int, list[bytearray]] = defaultdict(list)

    def into(self, nhwc: np.ndarray, out: np.ndarray) -> None:
        """Normalize NHWC uint8 rows `nhwc` into the float32 array `out` of the same shape (a
        worker's rows of a float slot, NOTE [float slots] in `jobs`); bit-identical to `__call__`."""
        if self._normalize_u8 is not None and nhwc.flags.c_contiguous and out.flags.c_contiguous:
            self._normalize_u8(nhwc, out, self._scale3, self._bias3)
            return
        dst = torch.from_numpy(out)
        dst.copy_(torch.from_numpy(nhwc))
        dst.mul_(self._scale.view(-1)).add_(self._bias.view(-1))

    def __call__(self, nhwc: torch.Tensor) -> torch.Tensor:
        """The normalized batch (a new tensor: the slot can be released at once)."""
        native = self._normalize_u8 is not None and nhwc.dtype == torch.uint8 and nhwc.dim() == 4
        if not native or not nhwc.is_contiguous():
            return nhwc.permute(0, 3, 1, 2).to(torch.float32).mul_(self._scale).add_(self._bias)
        out = self._buffer(nhwc.numel()).reshape(nhwc.shape)
        self.into(nhwc.numpy(), out)
        return torch.from_numpy(out).permute(0, 3, 1, 2)

    def _buffer(self, items: int) -> np.ndarray:
        nbytes = 4 * items
        free = self._free[nbytes]
        buffer = free.pop() if free else bytearray(nbytes)
        array = np.frombuffer(buffer, dtype=np.float32)
        weakref.finalize(array, _give_back, free, buffer)
        return array


def _give_back(free: list[bytearray], buffer: bytearray) -> None:
    """A batch's last view died: its buffer may take a later batch (see NOTE [reused outputs])."""
    if len(free) < _KEPT:
        free.append(buffer)
