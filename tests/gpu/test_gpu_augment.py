"""The augmentation stages on a real GPU (NOTE [transform stages]): with device='cuda' the pixel
stage runs batched on the GPU after the copy, RandomErasing and MixUp/CutMix after normalization,
with the same parameters as the CPU path (workers), so batches agree within float rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import write_gpu_folder

from fastload import FastLoader
from fastload import transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLASSES = 2
PIXELS = [T.RandAugment(num_ops=2, magnitude=9), T.ColorJitter(0.4, 0.4, 0.4), T.RandomGrayscale(0.2)]
RECIPE = [
    T.RandomResizedCrop(64), T.RandomHorizontalFlip(), *PIXELS, T.RandomErasing(p=0.5),
    T.RandomChoice([T.MixUp(alpha=0.8, num_classes=CLASSES), T.CutMix(alpha=1.0, num_classes=CLASSES)]),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gpu_folder(tmp_path_factory.mktemp("gpu_augment_folder"), classes=CLASSES, seed=1)


def _loader(folder: Path, device: str, transform: list[T.Transform]) -> FastLoader:
    return FastLoader(
        folder, batch_size=8, shuffle=True, seed=3, num_workers=2, device=device,
        normalize=(MEAN, STD), transform=transform,
    )


def test_recipe_on_gpu_matches_the_workers_on_cpu(folder: Path) -> None:
    # uint8 rounding of float colour ops may differ by one level between devices on a few pixels:
    # in normalized units that is 1 / (255 * 0.224) ~ 0.018; labels are exact.
    with _loader(folder, "cpu", RECIPE) as cpu, _loader(folder, "cuda", RECIPE) as gpu:
        for (xc, yc), (xg, yg) in zip(cpu, gpu, strict=True):
            assert xg.is_cuda and yg.is_cuda and yg.shape == (xc.shape[0], CLASSES)
            diff = (xg.float().cpu() - xc).abs()
            assert float(diff.max()) < 0.05
            assert float((diff > 1e-3).float().mean()) < 0.01
            torch.testing.assert_close(yg.cpu(), yc)

