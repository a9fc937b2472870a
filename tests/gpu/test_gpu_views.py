"""Views on a real GPU (NOTE [views] in fastload/transforms/_views.py): with device='cuda' each
view's pixel stage runs batched on the GPU after the copy, under the view's own seed, so every view
agrees with the CPU path (the workers') within float rounding, and the labels are exact. Not run
where it was written (no GPU there): tests/test_views.py checks the same code on the CPU behind a
stand-in for torch.cuda."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import write_gpu_folder

from fastload import FastLoader
from fastload import transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
COLOUR = [T.RandomApply((T.ColorJitter(0.4, 0.4, 0.2, 0.1),), p=0.8), T.RandomGrayscale(0.2)]
VIEWS = T.Views(
    [[T.RandomResizedCrop(64, scale=(0.4, 1.0)), T.RandomHorizontalFlip(), *COLOUR, T.GaussianBlur(9)]] * 2
    + [[T.RandomResizedCrop(32, scale=(0.05, 0.4)), *COLOUR, T.RandomSolarize(128.0, p=0.5)]] * 4
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gpu_folder(tmp_path_factory.mktemp("gpu_views_folder"), classes=2, seed=2)


def _loader(folder: Path, device: str) -> FastLoader:
    return FastLoader(
        folder, batch_size=8, shuffle=True, seed=3, num_workers=2, device=device,
        normalize=(MEAN, STD), transform=VIEWS,
    )


def test_views_on_gpu_match_the_workers_on_cpu(folder: Path) -> None:
    # As test_gpu_augment: a uint8 level apart on a few pixels (~0.018 normalized); labels exact.
    with _loader(folder, "cpu") as cpu, _loader(folder, "cuda") as gpu:
        for (views_c, yc), (views_g, yg) in zip(cpu, gpu, strict=True):
            assert len(views_g) == len(views_c) == 6 and yg.is_cuda
            for xc, xg in zip(views_c, views_g, strict=True):
                assert xg.is_cuda and xg.shape == xc.shape
                diff = (xg.float().cpu() - xc).abs()
                assert float(diff.max()) < 0.05
                assert float((diff > 1e-3).float().mean()) < 0.01
            torch.testing.assert_close(yg.cpu(), yc)
