"""The stages of a compiled chain after its geometry, as the loader runs them (NOTE [transform
stages] in `fastload.transforms._plan`): `SampleProgram` runs a stage's per-sample operations on a
batch (or a worker's rows of one), `TrainerStages` runs what the trainer's process owns; each
transform's kernel comes from the one registry (`registry`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fastload._augment.ops import Params, to_device
from fastload._augment.registry import batch_op, sample_op
from fastload._errors import ConfigError
from fastload._sample_random import BATCH_STREAM, PIXELS_STREAM, TENSOR_STREAM, sample_uniforms
from fastload.transforms import Transform, TransformPlan


class SampleProgram:
    """A stage's per-sample operations, in chain order; parameters from (seed, epoch, index)."""

    def __init__(self, transforms: Sequence[Transform], stream: int) -> None:
        self.ops = [sample_op(t) for t in transforms]
        self.draws = sum(op.draws for op in self.ops)
        self._stream = stream

    def __bool__(self) -> bool:
        return bool(self.ops)

    def params(self, seed: int, epoch: int, indices: np.ndarray) -> list[Params]:
        """Each operation's parameters for the samples `indices` (vectorized, on the host)."""
        u = sample_uniforms(seed, epoch, np.asarray(indices), max(1, self.draws), self._stream)
        params, start = [], 0
        for op in self.ops:
            params.append(op.params(u[:, start : start + op.draws]))
            start += op.draws
        return params

    def run(self, x: torch.Tensor, seed: int, epoch: int, indices: np.ndarray) -> torch.Tensor:
        """Run the stage on `x` (N, 3, H, W), sample i being `indices[i]`; the result (x itself
        when every operation works in place)."""
        for op, p in zip(self.ops, self.params(seed, epoch, indices), strict=True):
            x = op.apply(x, to_device(p, x.device))
        return x

    def run_in_slot(self, images: np.ndarray, seed: int, epoch: int, indices: np.ndarray) -> None:
        """Run the stage in place on a worker's rows of a slot, `images` (N, H, W, 3): uint8 (the
        pixel stage), or float32 normalized (the tensor stage, NOTE [float slots] in `jobs`)."""
        view = torch.from_numpy(images).permute(0, 3, 1, 2)
        out = self.run(view, seed, epoch, indices)
        if out.data_ptr() != view.data_ptr() or out.stride() != view.stride():
            view.copy_(out)


class TrainerStages:
    """What runs in the trainer's process after a batch arrives: the pixel stage when it is not the
    workers' (batches going to a GPU), then, after normalization, RandomErasing (unless the workers
    ran it: `tensor_here` False, NOTE [float slots] in `jobs`) and MixUp/CutMix."""

    def __init__(self, plan: TransformPlan, seed: int, pixels_here: bool, tensor_here: bool = True) -> None:
        self.seed = seed
        self.pixels = SampleProgram(plan.pixels if pixels_here else (), PIXELS_STREAM)
        self.tensor = SampleProgram(plan.tensor if tensor_here else (), TENSOR_STREAM)
        self.mix = batch_op(plan.batch) if plan.batch is not None else None

    def __bool__(self) -> bool:
        return bool(self.pixels or self.tensor or self.mix)

    def before_normalize(self, images: torch.Tensor, epoch: int, indices: np.ndarray) -> torch.Tensor:
        """The pixel stage on the uint8 batch (N, 3, H, W), when it runs here."""
        if not self.pixels:
            return images
        return self.pixels.run(images, self.seed, epoch, indices)

    def after_normalize(
        self, images: torch.Tensor, labels: torch.Tensor | None, epoch: int, indices: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """RandomErasing per sample, then the batch's MixUp/CutMix (labels become soft targets;
        a batch without labels, of declared fields without one, is refused it when the loader is made)."""
        if self.tensor:
            images = self.tensor.run(images, self.seed, epoch, indices)
        if self.mix is not None:
            if labels is None:  # refused when the loader is made (`assembly`); never mixed silently
                raise ConfigError(f"{type(self.mix).__name__} needs labels, and these batches carry none")
            key = np.asarray(indices[:1])  # a batch's draws are keyed by its first sample
            u = sample_uniforms(self.seed, epoch, key, max(1, self.mix.draws), BATCH_STREAM)[0]
            images, labels = self.mix.apply(images, labels, u)
        return images, labels
