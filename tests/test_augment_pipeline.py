"""The augmentation stages inside the loader (NOTE [transform stages]).

Protects what a user of a modern recipe relies on: the same batches, bit for bit, for any worker
count, local or through the daemon; the pixel stage giving the same pixels whether the workers run
it (CPU batches) or the trainer's process does (the GPU path, run here on the CPU with the same
code); soft targets from MixUp/CutMix; and chains that cannot run as written refused at
construction with a message that says what to do.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from daemon_helpers import DaemonProcess

from fastload import ConfigError, FastLoader
from fastload import transforms as T
from fastload._augment.program import TrainerStages
from fastload._loading.order.plan import ShuffledPlan
from fastload.transforms._base import Stage

NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CLASSES = 3  # the session's image_folder
GEOMETRY = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
PIXELS = [T.RandAugment(num_ops=2, magnitude=9), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.3)]
RECIPE = [
    *GEOMETRY,
    *PIXELS,
    T.RandomErasing(p=0.5),
    T.RandomChoice([T.MixUp(alpha=0.8, num_classes=CLASSES), T.CutMix(alpha=1.0, num_classes=CLASSES)]),
]


Batches = list[list[list[torch.Tensor]]]  # epochs of batches of [images, labels]


def _epochs(root: Path, transform: list[Any], epochs: int = 2, **kwargs: Any) -> Batches:
    kwargs.setdefault("num_workers", 0)
    with FastLoader(
        root, batch_size=5, shuffle=True, seed=5, device="cpu", normalize=NORMALIZE, transform=transform,
        **kwargs,
    ) as loader:
        return [[[x.clone(), y.clone()] for x, y in loader] for _ in range(epochs)]


def _assert_same(a: Batches, b: Batches) -> None:
    assert len(a) == len(b)
    for epoch_a, epoch_b in zip(a, b, strict=True):
        assert len(epoch_a) == len(epoch_b)
        for batch_a, batch_b in zip(epoch_a, epoch_b, strict=True):
            for x, y in zip(batch_a, batch_b, strict=True):
                assert x.dtype == y.dtype and x.shape == y.shape
                assert torch.equal(x, y)


@pytest.fixture(scope="module")
def recipe_runs(image_folder: Path) -> dict[int, Batches]:
    return {n: _epochs(image_folder, RECIPE, num_workers=n) for n in (0, 1, 3)}


@pytest.mark.parametrize("num_workers", [1, 3])
def test_recipe_same_batches_for_any_worker_count(recipe_runs: dict[int, Any], num_workers: int) -> None:
    _assert_same(recipe_runs[0], recipe_runs[num_workers])


def test_recipe_batches_have_soft_targets_and_vary(recipe_runs: dict[int, Any]) -> None:
    epochs = recipe_runs[0]
    for x, y in epochs[0]:
        assert x.dtype == torch.float32 and x.shape[1:] == (3, 24, 24)
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert y.dtype == torch.float32 and y.shape == (x.shape[0], CLASSES)
        assert torch.allclose(y.sum(dim=1), torch.ones(x.shape[0]))
    assert not torch.equal(epochs[0][0][0], epochs[1][0][0])  # another epoch, other draws


def test_recipe_same_through_the_daemon(
    shared_daemon: DaemonProcess, image_folder: Path, recipe_runs: dict[int, Any]
) -> None:
    _assert_same(recipe_runs[0], _epochs(image_folder, RECIPE, num_workers=1, daemon=shared_daemon.address))


def test_pixel_stage_same_in_workers_and_in_the_trainer(image_folder: Path) -> None:
    # The GPU path runs the pixel stage in the trainer's process after the copy; here the same code
    # runs on the CPU over batches decoded without it, and must give the workers' pixels.
    with_pixels = _epochs(image_folder, [*GEOMETRY, *PIXELS], epochs=1, num_workers=2)
    with FastLoader(
        image_folder, batch_size=5, shuffle=True, seed=5, device="cpu", transform=GEOMETRY, num_workers=2
    ) as plain:
        batches = [x.clone() for x, _ in plain]
    plan = ShuffledPlan(len(_files(image_folder)), 5, shuffle=True, drop_last=False, seed=5)
    assert len(plan) == len(batches)  # the loader's own plan, rebuilt from the same seed
    stages = TrainerStages(T.compile_transforms([*GEOMETRY, *PIXELS]), seed=5, pixels_here=True)
    mean = torch.tensor(NORMALIZE[0]).view(1, 3, 1, 1)
    std = torch.tensor(NORMALIZE[1]).view(1, 3, 1, 1)
    for x_plain, (x_workers, _), indices in zip(batches, with_pixels[0], plan.iter_batches(0), strict=True):
        x = stages.before_normalize(x_plain.clone(), 0, indices)
        assert not torch.equal(x, x_plain)  # the pixel stage did run
        expected = (x.float() / 255 - mean) / std
        assert torch.allclose(expected, x_workers, atol=1e-5)


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_stages_out_of_order_are_refused(image_folder: Path) -> None:
    with pytest.raises(ConfigError, match=r"ColorJitter .*comes after .*RandomErasing.*reorder"):
        FastLoader(
            image_folder, batch_size=4, normalize=NORMALIZE, device="cpu",
            transform=[T.RandomResizedCrop(8), T.RandomErasing(), T.ColorJitter(0.2)],
        )
    with pytest.raises(ConfigError, match=r"RandomResizedCrop .*comes after .*ColorJitter"):
        FastLoader(
            image_folder, batch_size=4, device="cpu", transform=[T.ColorJitter(0.2), T.RandomResizedCrop(8)]
        )


def test_mixing_without_normalize_is_refused(image_folder: Path) -> None:
    with pytest.raises(ConfigError, match=r"MixUp run on normalized float images.*normalize="):
        FastLoader(
            image_folder, batch_size=4, device="cpu",
            transform=[T.RandomResizedCrop(8), T.MixUp(num_classes=CLASSES)],
        )


def test_one_batch_transform_per_chain(image_folder: Path) -> None:
    with pytest.raises(ConfigError, match=r"only one batch transform.*RandomChoice"):
        T.compile_transforms(
            [T.RandomResizedCrop(8), T.MixUp(num_classes=3), T.CutMix(num_classes=3)]
        )


PER_SAMPLE = [
    T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.5), T.GaussianBlur(5), T.RandomSolarize(100),
    T.RandomPosterize(3), T.RandomAutocontrast(), T.RandomEqualize(), T.RandAugment(), T.TrivialAugmentWide(),
    T.AutoAugment(), T.AugMix(),
]


@pytest.mark.parametrize("transform", PER_SAMPLE, ids=lambda t: type(t).__name__)
def test_the_device_path_never_makes_the_host_wait(transform: T.Transform) -> None:
    # On the `meta` device a tensor has no values: .item(), nonzero() and boolean-mask indexing
    # raise there, so a kernel that would synchronise a GPU with the host fails here (the CPU-only
    # native and chunked paths are not taken off the CPU).
    plan = T.compile_transforms([T.RandomResizedCrop(32), transform])
    stages = TrainerStages(plan, seed=1, pixels_here=True)
    x = torch.empty((8, 3, 32, 32), dtype=torch.uint8, device="meta")
    out = stages.before_normalize(x, 0, np.arange(8))
    assert out.shape == (8, 3, 32, 32) and out.device.type == "meta"


def test_a_transform_of_ones_own_is_pointed_to_the_dataset_path() -> None:
    @dataclasses.dataclass(frozen=True)
    class Sepia(T.Transform):
        stage: ClassVar[Stage] = "pixels"

    with pytest.raises(ConfigError, match=r"Sepia\(\) is not a fastload transform.*Dataset path"):
        T.compile_transforms([T.RandomResizedCrop(8), Sepia()])
