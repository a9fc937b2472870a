"""backend="nvjpeg" on a real GPU, and `crop_resize`'s Triton kernel against its reference.

The kernel must give the reference's pixels (the same weights; float32 against float64: a level at
most, and only where a weight sits on a filter's edge); the loader's batches must have the native
backend's structure, labels and order, pixels close to its (nvJPEG is not libjpeg-turbo: a PSNR
bound), be the same in two runs, resume from a `state_dict`, and name a corrupt file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import epoch_outcomes, split_outcomes, write_gpu_folder

from fastload import FastLoader
from fastload import transforms as T
from fastload._loading.decoding import crop_resize as cr

MIN_PSNR_DB = 28.0  # nvJPEG against libjpeg-turbo's DCT-scaled region decode: a few levels


def _random_batch(seed: int, n: int, device: str) -> tuple[list[torch.Tensor], np.ndarray]:
    rng = np.random.default_rng(seed)
    images, inputs = [], np.zeros((n, 4, 2), np.float32)
    for i in range(n):
        h, w = int(rng.integers(12, 300)), int(rng.integers(12, 300))
        images.append(torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)).to(device))
        ay, ax = int(rng.integers(0, h // 3)), int(rng.integers(0, w // 3))
        sh, sw = int(rng.integers(h // 2, h - ay + 1)), int(rng.integers(w // 2, w - ax + 1))
        y0, y1 = rng.uniform(0, 1), sh - rng.uniform(0, 1)
        x0, x1 = rng.uniform(0, 1), sw - rng.uniform(0, 1)
        if i % 2:
            x0, x1 = x1, x0  # a mirrored sample
        inputs[i] = [[ay, ax], [sh, sw], [y0, x0], [y1, x1]]
    return images, inputs


@pytest.mark.parametrize("interpolation", sorted(cr.FILTER_CODES))
def test_kernel_gives_the_references_pixels(interpolation: str) -> None:
    pytest.importorskip("triton", reason="Triton is not installed (it ships with PyTorch's CUDA builds)")
    images, inputs = _random_batch(7, 12, "cuda")
    out = torch.empty((12, 37, 29, 3), dtype=torch.uint8, device="cuda")
    cr.crop_resize(images, inputs, out, interpolation)
    ref = torch.empty((12, 37, 29, 3), dtype=torch.uint8)
    cr.crop_resize_reference([t.cpu() for t in images], inputs, ref, interpolation)
    diff = (out.cpu().int() - ref.int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torchvision", reason="backend='nvjpeg' needs torchvision")
    return write_gpu_folder(tmp_path_factory.mktemp("gpu_nvjpeg_folder"), classes=2, seed=0)


def _loader(folder: Path, backend: str, **kw: Any) -> FastLoader:
    return FastLoader(
        folder, batch_size=8, shuffle=True, seed=3, num_workers=2, device="cuda", backend=backend,
        transform=[T.RandomResizedCrop(64), T.RandomHorizontalFlip()], **kw,
    )


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def _epoch(loader: FastLoader) -> list[list[torch.Tensor]]:
    return [[t.cpu() for t in batch] for batch in loader]


def test_batches_match_the_native_backend(folder: Path) -> None:
    with _loader(folder, "native") as native, _loader(folder, "nvjpeg") as gpu:
        reference = _epoch(native)
        got = [[t.clone() for t in b] for b in gpu]
    assert len(got) == len(reference) > 0
    for (xg, yg), (xn, yn) in zip(got, reference, strict=True):
        assert xg.is_cuda and yg.is_cuda and xg.dtype == torch.uint8 and xg.shape == xn.shape
        assert xg.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(yg.cpu(), yn)  # labels and order
    assert _psnr(torch.cat([b[0].cpu() for b in got]), torch.cat([b[0] for b in reference])) > MIN_PSNR_DB


def test_same_batches_twice_and_resumed(folder: Path) -> None:
    with _loader(folder, "nvjpeg") as a:
        first = _epoch(a)
    with _loader(folder, "nvjpeg") as b:
        it = iter(b)
        head = [[t.cpu() for t in next(it)] for _ in range(2)]
        state = b.state_dict()
    with _loader(folder, "nvjpeg") as c:
        c.load_state_dict(state)
        tail = _epoch(c)
    for got, want in zip(head + tail, first, strict=True):
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_a_corrupt_file_is_a_sample_error_naming_it(tmp_path: Path) -> None:
    bad = write_gpu_folder(tmp_path, classes=2, seed=1)
    victim = sorted(bad.rglob("*.jpg"))[3]
    victim.write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8)  # a JPEG's magic, then junk
    with _loader(bad, "nvjpeg") as loader:
        batches, errors = split_outcomes(epoch_outcomes(loader))
    assert len(errors) == 1 and f"{victim.parent.name}/{victim.name}" in str(errors[0])
    assert len(batches) == 48 // 8 - 1
