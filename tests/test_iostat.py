"""`fastload iostat` verdicts on real loaders driven into each regime, and its report format.

A loader runs in a thread while the test samples its statistics block the way the command does;
the verdict must name the regime the test created: slow reads -> storage-bound, workers decoding
flat out for a fast trainer -> decode-bound, a trainer that sleeps per batch -> not the
bottleneck.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import build_folder, write_image
from torch.utils.data import Dataset

from fastload import FastLoader
from fastload import transforms as T
from fastload._diagnostics.iostat import LoaderRates, Sampler, format_report
from fastload._loading import jobs as _jobs


def _run_and_sample(loader: FastLoader, per_batch: Callable[[], None], seconds: float = 1.5) -> LoaderRates:
    stop = threading.Event()

    def train() -> None:
        while not stop.is_set():
            for _ in loader:
                per_batch()
                if stop.is_set():
                    return

    thread = threading.Thread(target=train)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while loader.stats() is None or loader.stats().batches < 2:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the loader made no batch"
            time.sleep(0.05)
        sampler = Sampler()
        sampler.sample()
        time.sleep(seconds)
        loaders, machine = sampler.sample()
        report = format_report(loaders, machine, extended=True)
        mine = [r for r in loaders if r.pid == os.getpid()]
        assert len(mine) == 1, report
        assert "verdict" in report and mine[0].verdict in report
        return mine[0]
    finally:
        stop.set()
        thread.join(30)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("iostat")
    build_folder(root, classes=2, per_class=4)
    for k in range(40):  # most images big enough that decoding takes real time
        write_image(root / f"n{k % 2:02d}" / f"big_{k:03d}.jpg", 360, 480, seed=100 + k)
    return root


def _loader(folder: Path, **kw: object) -> FastLoader:
    return FastLoader(folder, batch_size=8, shuffle=True, num_workers=2, device="cpu",  # type: ignore[arg-type]
                      transform=[T.RandomResizedCrop(128), T.RandomHorizontalFlip()], **kw)


@pytest.fixture
def slow_storage(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = _jobs.read_file

    def slow(path: str) -> bytes:
        time.sleep(0.01)  # a 10 ms read per file: a slow network filesystem
        return real(path)

    monkeypatch.setattr(_jobs, "read_file", slow)  # forked workers inherit it
    yield


def test_slow_reads_are_storage_bound(folder: Path, slow_storage: None) -> None:
    with _loader(folder) as loader:
        r = _run_and_sample(loader, lambda: None)
    assert r.verdict == "storage-bound", r
    assert r.ms_per_sample["read"] > r.ms_per_sample["decode"]
    assert r.ms_per_sample["read_cpu"] < 0.3 * r.ms_per_sample["read"]  # reading waits
    assert any("storage-bound" in a for a in r.advice)


class HeavyDecode(Dataset[tuple[np.ndarray, int]]):
    """Samples that cost ~4 ms of pure CPU each (a decoder), never reaching an epoch's end."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        x = np.full((64, 64), i % 251, np.float32)
        end = time.process_time() + 0.004
        while time.process_time() < end:
            x = np.sqrt(x * x + 1.0)
        return x, i


def test_busy_decoders_and_a_fast_trainer_are_decode_bound() -> None:
    with FastLoader(HeavyDecode(), batch_size=8, num_workers=2) as loader:
        r = _run_and_sample(loader, lambda: None)
    assert r.verdict == "decode-bound", r
    assert r.worker_busy_percent > 80 and r.trainer_wait_percent > 50
    assert r.ms_per_sample["read_cpu"] > 0.3 * r.ms_per_sample["read"]  # reading computes


def test_a_slow_trainer_means_the_loader_is_not_the_bottleneck(folder: Path) -> None:
    with _loader(folder) as loader:
        r = _run_and_sample(loader, lambda: time.sleep(0.25))
    assert r.verdict == "not the bottleneck", r
    assert r.trainer_wait_percent < 10
    assert r.worker_busy_percent < 50  # the workers had time to spare


def test_batch_size_not_a_multiple_of_8_is_flagged(folder: Path) -> None:
    with FastLoader(folder, batch_size=6, num_workers=1, device="cpu",  # type: ignore[arg-type]
                    transform=[T.CenterCrop(64)]) as loader:
        r = _run_and_sample(loader, lambda: time.sleep(0.2), seconds=0.5)
    assert any("batch size 6 is not a multiple of 8" in a for a in r.advice)


def test_stats_count_every_sample(folder: Path) -> None:
    with _loader(folder, drop_last=True) as loader:
        batches = sum(1 for _ in loader)
        stats = loader.stats()
    assert stats is not None
    assert stats.batches >= batches and stats.samples >= batches * 8
    assert stats.read_s > 0 and stats.decode_s > 0 and stats.next_calls == batches + 1
