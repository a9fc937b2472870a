"""What a kernel offers the programs that run a chain's stages: `SampleOp` for a per-sample
transform (pixel or tensor stage), `BatchOp` for one that mixes a batch, the rules they keep, and
how the registry makes them (`SampleKernel`, `BatchKernel`, handed the registry as `Kernels`).

Rules for every operation:
- Batched: on a GPU one call handles the whole batch (or each group of samples that share a
  sub-operation); never a Python loop over pixels. On a CPU, where a whole-batch temporary costs
  more than the arithmetic (fresh memory faulted in), a kernel may walk the batch a few samples
  at a time, or go native per sample; such CPU-only paths give the batched path's bits, and the
  tests compare them.
- Its random parameters come only from the uniforms it is given (drawn from (seed, epoch, sample
  index)), computed on the host in `params` with vectorized numpy; `apply` makes no random draw
  of its own, so a batch is the same on any worker count and, within float rounding, on a GPU
  (RandomErasing's "random" noise reads a fixed bank at a drawn offset: NOTE [erasing noise]).
- `apply` never synchronises the host with a GPU: no `.item()`, no boolean-mask indexing, no
  `nonzero`; which samples a sub-operation applies to is an index array computed in `params`.
- Images are (N, 3, H, W) views whose memory may be channels_last (NHWC); uint8 in the pixel
  stage (values rounded or truncated as torchvision's tensor kernels do), float in the tensor and
  batch stages. `apply` may work in place and returns the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

Params = dict[str, np.ndarray]
"""Per-sample (first dimension N) or per-group arrays, made on the host by `params`."""

DeviceParams = dict[str, torch.Tensor]
"""The same arrays as tensors on the batch's device."""


class SampleOp(Protocol):
    """One per-sample transform, batched."""

    draws: int
    """Uniforms in [0, 1) it needs per sample (a fixed number)."""

    def params(self, u: np.ndarray) -> Params:
        """The batch's parameters from `u`, (N, draws) uniforms: row i is sample i's."""
        ...

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Transform the batch `x` (N, 3, H, W) with parameters `p` (from `params`, on x's device)."""
        ...


class BatchOp(Protocol):
    """One transform that mixes the samples of a batch (labels become soft targets)."""

    draws: int
    """Uniforms in [0, 1) it needs per batch."""

    num_classes: int

    def apply(
        self, x: torch.Tensor, labels: torch.Tensor, u: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix the float batch `x` (N, 3, H, W) and its int64 `labels` (N,) with `u` (draws,):
        return (images, soft targets (N, num_classes) of x's dtype)."""
        ...


class Kernels(Protocol):
    """The kernel registry as a composite kernel (one over its members' kernels: RandomApply,
    RandomChoice) sees it: handed to it when it is made, never imported (`registry` imports the
    kernel modules)."""

    def sample_op(self, t: Any) -> SampleOp:
        """The kernel of a per-sample transform."""
        ...

    def batch_op(self, t: Any) -> BatchOp:
        """The kernel of a batch transform."""
        ...


SampleKernel = Callable[[Any, Kernels], SampleOp]
"""What the registry holds for a per-sample transform: `make(transform, kernels)` -> its op
(`kernels`: the registry, for a kernel made of its members' kernels; the others ignore it)."""

BatchKernel = Callable[[Any, Kernels], BatchOp]
"""What the registry holds for a batch transform, likewise."""


def to_device(params: Params, device: torch.device) -> DeviceParams:
    """Host parameters as tensors on `device` (small: copied, never synchronising the host)."""
    return {
        name: torch.from_numpy(np.ascontiguousarray(value)).to(device, non_blocking=True)
        for name, value in params.items()
    }
