"""backend="dali" with CUDA on a real GPU: nvJPEG (`mixed`) decoding and a GPU resize in the
trainer's process (`dali_executor`), batches handed to torch on the device. The same batches'
structure, labels and order as the CPU DALI path (fastload's workers), pixels close to its (nvJPEG
and the GPU resize are not libjpeg-turbo and the CPU resize: a PSNR bound, not equality),
channels_last, normalized float on the GPU, and the trainer's stream ordered after the batch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import write_gpu_folder

from fastload import FastLoader
from fastload import transforms as T

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed: `pip install fastload[dali]`")

from fastload._loading.running.dali_executor import DaliExecutor

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# nvJPEG's IDCT and upsampling and the GPU resize differ from the CPU operators by a few levels;
# a bound well below the CPU DALI path's distance to the native backend (45 dB there).
MIN_PSNR_DB = 35.0


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gpu_folder(tmp_path_factory.mktemp("gpu_dali_folder"), classes=2, seed=0)


def _loader(folder: Path, device: str, **kw: Any) -> FastLoader:
    return FastLoader(
        folder, batch_size=8, shuffle=True, seed=3, num_workers=2, device=device, backend="dali",
        transform=[T.RandomResizedCrop(64), T.RandomHorizontalFlip()], **kw,
    )


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def test_mixed_batches_on_the_gpu_match_the_cpu_dali_path(folder: Path) -> None:
    with _loader(folder, "cpu") as cpu, _loader(folder, "cuda") as gpu:
        reference = [[t.clone() for t in b] for b in cpu]
        got = [[t.clone() for t in b] for b in gpu]
        assert gpu._runs.pipeline is not None and isinstance(gpu._runs.pipeline.executor, DaliExecutor)
    assert len(got) == len(reference) > 0
    for (xg, yg), (xc, yc) in zip(got, reference, strict=True):
        assert xg.is_cuda and yg.is_cuda
        assert xg.dtype == torch.uint8 and xg.shape == xc.shape
        assert xg.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(yg.cpu(), yc, rtol=0, atol=0)  # labels and order
    images = torch.cat([b[0].cpu() for b in got])
    assert _psnr(images, torch.cat([b[0] for b in reference])) > MIN_PSNR_DB


def test_normalized_batches_on_the_gpu_in_the_asked_dtype(folder: Path) -> None:
    with (
        _loader(folder, "cuda") as raw,
        _loader(folder, "cuda", normalize=(MEAN, STD), dtype=torch.float16) as norm,
    ):
        for (x, _), (xn, _) in zip(raw, norm, strict=True):
            assert xn.is_cuda and xn.dtype == torch.float16
            assert xn.is_contiguous(memory_format=torch.channels_last)
            mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
            std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
            expected = ((x.float() / 255 - mean) / std).half()
            torch.testing.assert_close(xn, expected, rtol=1e-3, atol=1e-2)


def test_the_users_stream_is_ordered_after_the_batch(folder: Path) -> None:
    """A batch used on another stream than the one current at next(): with the user's stream made
    to wait on the executor's, reading it on the user's stream sees finished pixels."""
    with _loader(folder, "cuda") as gpu, _loader(folder, "cuda") as again:
        user = torch.cuda.Stream()
        with torch.cuda.stream(user):
            sums = [b[0].sum(dtype=torch.int64) for b in gpu]
        user.synchronize()
        expected = [b[0].sum(dtype=torch.int64) for b in again]
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == [e.item() for e in expected]
