"""The CUDA path on a real GPU: pinned slots, side-stream copies, GPU normalize, event release."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import write_gpu_folder

from fastload import FastLoader
from fastload import transforms as T
from fastload._loading.slots.ring_plan import EXTRA_SLOTS

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gpu_folder(tmp_path_factory.mktemp("gpu_folder"), classes=2, seed=0)


def _loader(folder: Path, device: str, **kw: object) -> FastLoader:
    return FastLoader(
        folder, batch_size=8, shuffle=True, seed=3, num_workers=2, device=device,
        transform=[T.RandomResizedCrop(64), T.RandomHorizontalFlip()], **kw,  # type: ignore[arg-type]
    )


def test_uint8_batches_match_cpu_bit_for_bit(folder: Path) -> None:
    with _loader(folder, "cpu") as cpu, _loader(folder, "cuda") as gpu:
        for (xc, yc), (xg, yg) in zip(cpu, gpu, strict=True):
            assert xg.is_cuda and yg.is_cuda
            assert xg.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(xg.cpu(), xc, rtol=0, atol=0)
            torch.testing.assert_close(yg.cpu(), yc)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_normalize_on_gpu_matches_cpu(folder: Path, dtype: torch.dtype) -> None:
    with _loader(folder, "cpu", normalize=(MEAN, STD), dtype=torch.float32) as cpu, \
            _loader(folder, "cuda", normalize=(MEAN, STD), dtype=dtype,
                    memory_format=torch.contiguous_format) as gpu:
        for (xc, _), (xg, _) in zip(cpu, gpu, strict=True):
            assert xg.dtype == dtype and xg.is_contiguous()
            torch.testing.assert_close(xg.float().cpu(), xc, rtol=2e-2, atol=2e-2)


def test_slots_are_pinned_and_released_after_copy(folder: Path) -> None:
    # A ring of prefetch + EXTRA_SLOTS = 4 slots, fewer than the epoch's 6 batches: on the CPU path
    # holding every batch holds every slot and grows the ring; on CUDA a slot is free once copied.
    with _loader(folder, "cuda", prefetch=2) as gpu:
        batches = list(gpu)
        pipeline = gpu._runs.pipeline
        assert pipeline is not None and pipeline.ring is not None
        assert len(batches) > pipeline.window.limit + EXTRA_SLOTS
        grown = len(pipeline.ring) != pipeline.window.limit + EXTRA_SLOTS
        assert not grown, "ring grew although copies completed"
        segment = next(iter(pipeline.ring.segments.values()))
        view = torch.from_numpy(np.ndarray((segment.size,), np.uint8, buffer=segment.buf))
        assert view.is_pinned()
        assert len(batches) == len(gpu)


def test_user_stream_waits_for_copy(folder: Path) -> None:
    """A busy user stream still sees complete batches: it waits on the copy event, not the host."""
    with _loader(folder, "cpu") as cpu:
        expected = [x.clone() for x, _ in cpu]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), _loader(folder, "cuda") as gpu:
        busy = torch.randn(4096, 4096, device="cuda")
        for (x, _), want in zip(gpu, expected, strict=True):
            busy = busy @ busy  # keep the user's stream busy while the next copy is queued
            busy /= busy.norm()
            torch.testing.assert_close(x.cpu(), want, rtol=0, atol=0)


def test_dataset_mode_to_cuda() -> None:
    data = [(np.full((4, 4), i, np.float32), i) for i in range(20)]
    with FastLoader(data, batch_size=5, num_workers=2, device="cuda") as loader:  # type: ignore[arg-type]
        for k, (x, y) in enumerate(loader):
            assert x.is_cuda and y.is_cuda
            assert y.cpu().tolist() == list(range(5 * k, 5 * k + 5))
