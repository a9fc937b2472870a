"""CPU batches with normalize: the workers normalize into float32 slots and run RandomErasing there
(NOTE [float slots] in `fastload._loading.jobs`); the trainer runs only MixUp/CutMix.

Protects that moving this work into the workers changes no value: batches are bit-identical to the
trainer-side path (uint8 batches normalized and augmented by `TrainerStages` in the trainer's
process), for any worker count, any output dtype and memory format; and that the batches are views
of the slot that stay valid while the user holds them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fastload import FastLoader
from fastload import transforms as T
from fastload._augment.program import TrainerStages
from fastload._loading.decoding.host_normalize import HostNormalizer
from fastload._loading.order.plan import ShuffledPlan
from fastload._loading.slots.delivery import ImageOutput

NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CLASSES = 3
GEOMETRY = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
PIXELS = [T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.3)]
ERASING = [
    T.RandomErasing(p=0.7),
    T.RandomErasing(p=0.7, value="random"),
    T.RandomErasing(p=0.5, value=(1, 2, 3)),
]
MIXING = T.RandomChoice([T.MixUp(alpha=0.8, num_classes=CLASSES), T.CutMix(alpha=1.0, num_classes=CLASSES)])
SEED, BATCH = 7, 5


def _loader(root: Path, transform: list[Any], **kwargs: Any) -> FastLoader:
    return FastLoader(
        root, batch_size=BATCH, shuffle=True, seed=SEED, device="cpu", transform=transform, **kwargs
    )


Batches = list[list[tuple[torch.Tensor, torch.Tensor]]]  # epochs of batches of (images, labels)


def _trainer_side(root: Path, chain: list[Any], epochs: int) -> Batches:
    """The batches as the trainer's process made them before: uint8 batches from the workers (the
    geometry and pixel stages), normalized and augmented by `TrainerStages` here."""
    plan = T.compile_transforms(chain)
    stages = TrainerStages(plan, SEED, pixels_here=False)
    normalize = HostNormalizer(*ImageOutput(*NORMALIZE).affine(torch.device("cpu")))  # type: ignore[misc]
    out = []
    with _loader(root, [*plan.geometry, *plan.pixels], num_workers=2) as loader:
        order = ShuffledPlan(loader._assembly.num_samples, BATCH, shuffle=True, drop_last=False, seed=SEED)
        for epoch in range(epochs):
            batches = []
            for (x, y), indices in zip(loader, order.iter_batches(epoch), strict=True):
                images = normalize(x.permute(0, 2, 3, 1).contiguous())
                images, labels = stages.after_normalize(images, y.clone(), epoch, np.asarray(indices))
                batches.append((images.clone(), labels.clone()))
            out.append(batches)
    return out


def _float_slots(root: Path, chain: list[Any], epochs: int, **kwargs: Any) -> Batches:
    with _loader(root, chain, normalize=NORMALIZE, **kwargs) as loader:
        assert loader._assembly.job is not None and loader._assembly.job.layout.leaves[0].dtype == "float32"  # type: ignore[union-attr]
        return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(epochs)]


@pytest.mark.parametrize("mixing", [False, True])
def test_bit_identical_to_the_trainer_side_path(image_folder: Path, mixing: bool) -> None:
    chain = [*GEOMETRY, *PIXELS, *ERASING, *([MIXING] if mixing else [])]
    expected = _trainer_side(image_folder, chain, epochs=2)
    erased = 0
    for workers in (0, 1, 3):
        got = _float_slots(image_folder, chain, epochs=2, num_workers=workers)
        for epoch_got, epoch_expected in zip(got, expected, strict=True):
            for (x, y), (ex, ey) in zip(epoch_got, epoch_expected, strict=True):
                assert x.dtype == ex.dtype == torch.float32
                assert x.is_contiguous(memory_format=torch.channels_last)
                assert torch.equal(x, ex) and torch.equal(y, ey)
                assert y.dtype == (torch.float32 if mixing else torch.int64)
                erased += int(((x[:, 0] == 1) & (x[:, 1] == 2) & (x[:, 2] == 3)).any())
    assert erased > 0  # RandomErasing did run (its fill (1, 2, 3) is no normalized pixel)


def test_other_dtypes_and_formats_are_the_float_batches_converted(image_folder: Path) -> None:
    chain = [*GEOMETRY, *ERASING, MIXING]
    base = _float_slots(image_folder, chain, epochs=1, num_workers=2)[0]
    half = _float_slots(image_folder, chain, epochs=1, num_workers=2, dtype=torch.bfloat16)[0]
    flat = _float_slots(
        image_folder, chain, epochs=1, num_workers=2, memory_format=torch.contiguous_format
    )[0]
    for (x, y), (xh, yh), (xc, yc) in zip(base, half, flat, strict=True):
        assert xh.dtype == torch.bfloat16 and torch.equal(xh, x.to(torch.bfloat16)) and torch.equal(yh, y)
        assert xc.is_contiguous() and torch.equal(xc, x) and torch.equal(yc, y)


def test_batches_are_slot_views_that_stay_valid_while_held(image_folder: Path) -> None:
    chain = [*GEOMETRY, *ERASING]
    cloned = _float_slots(image_folder, chain, epochs=1, num_workers=2)[0]
    with _loader(image_folder, chain, normalize=NORMALIZE, num_workers=2, prefetch=1) as loader:
        held = list(loader)  # every slot held at once: the ring grows, nothing is overwritten
        pipeline = loader._runs.pipeline
        assert pipeline is not None and pipeline.ring is not None
        slots = [np.frombuffer(s.buf, np.uint8).ctypes.data for s in pipeline.ring.segments.values()]
        for (x, y), (ex, ey) in zip(held, cloned, strict=True):
            assert torch.equal(x, ex) and torch.equal(y, ey)
            assert any(0 <= x.data_ptr() - base < pipeline.ring.slot_bytes for base in slots)  # no copy


def test_only_local_cpu_loaders_normalize_in_workers(image_folder: Path) -> None:
    with _loader(image_folder, [*GEOMETRY, *ERASING], normalize=NORMALIZE, num_workers=0) as loader:
        local = loader._assembly.spec
    assert local.normalize_in_workers and local.worker_normalize == NORMALIZE
    assert local.worker_transforms is not None and len(local.worker_transforms.tensor) == len(ERASING)
    # A daemon's sessions and GPU batches keep uint8 slots: the tensor stage stays in the trainer.
    for other in (
        dataclasses.replace(local, daemon="tcp://127.0.0.1:1"),
        dataclasses.replace(local, device=torch.device("cuda")),
    ):
        assert not other.normalize_in_workers and other.worker_normalize is None
        assert other.worker_transforms is not None and not other.worker_transforms.tensor
    with _loader(image_folder, GEOMETRY, num_workers=0) as plain:  # no normalize: uint8 slots
        assert not plain._assembly.spec.normalize_in_workers
