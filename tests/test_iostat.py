"""`fastload iostat` verdicts: on counters as a loader leaves them, and on real loaders.

The classifier is fed the counters of one interval, as a loader's statistics block holds them,
for the profiles that must not be confused: workers that compute while other processes take the
cores (their reads wait in the run queue) are decode-bound, not storage-bound; reads blocked on
storage are storage-bound, on an idle machine or a busy one.

Then real loaders run in a thread while the test samples their statistics block the way the
command does; the verdict must name the regime the test created: slow reads -> storage-bound,
workers decoding flat out for a fast trainer -> decode-bound, a trainer that sleeps per batch ->
not the bottleneck. Each regime is made wide enough that it holds on a machine whose cores are
busy with other work too (the stage times then include waiting for a CPU).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import build_folder, write_image
from torch.utils.data import Dataset

from fastload import FastLoader
from fastload import transforms as T
from fastload._diagnostics.iostat import Sampler, format_report
from fastload._diagnostics.loader_rates import LoaderRates, MachineRates, loader_rates
from fastload._diagnostics.verdict import classify
from fastload._loading.running.stats import LoaderStats
from fastload.sources._indexes import sample_index as _index

# ---------------------------------------------------------------------------------------------
# The classifier, on counters

_START = LoaderStats(
    pid=1234, dataset="Synthetic", mode="local", device="cpu", num_workers=2, batch_size=8,
    created=1000.0, batches=0, samples=0, bytes_read=0, read_s=0.0, decode_s=0.0, read_cpu_s=0.0,
    read_runq_s=0.0, slot_wait_s=0.0, h2d_s=0.0, h2d_batches=0, trainer_wait_s=0.0, next_calls=0,
    ready_batches=0, in_flight=2, failures=0, updated=1000.0,
)


def _one_second(**counters: Any) -> LoaderRates:
    """The loader's rates over one second in which its counters grew by `counters`."""
    after = dataclasses.replace(_START, updated=_START.updated + 1.0, **counters)
    return loader_rates("fastload_1234_stats_test", _START, after, 1.0)


def _machine(user: float, idle: float, iowait: float) -> MachineRates:
    return MachineRates(
        cpu={"user": user, "system": 0.0, "iowait": iowait, "idle": idle, "steal": 0.0},
        disk=None, device="network filesystem nfs4 on /data", device_kind="network",
        page_cache_bytes=0, shm_used_bytes=0, shm_total_bytes=0, gpu_percent=None,
    )


BUSY = _machine(user=100.0, idle=0.0, iowait=0.0)  # 4 other processes spinning on the 2 cores
IDLE = _machine(user=8.0, idle=87.0, iowait=5.0)


def test_workers_computing_on_oversubscribed_cores_are_decode_bound_not_storage_bound() -> None:
    # 2 workers running a Dataset that decodes in __getitem__ (all "read"), beside 4 busy
    # processes on 2 cores: each worker is on a CPU ~29% of the time and waits in the run
    # queue for the rest. Judged by its CPU share alone, the read stage looked blocked on I/O.
    r = _one_second(
        batches=10, samples=80, read_s=1.90, read_cpu_s=0.55, read_runq_s=1.30, decode_s=0.05,
        trainer_wait_s=0.95, next_calls=10,
    )
    assert r.ms_per_sample["read_cpu"] < 0.3 * r.ms_per_sample["read"]  # what misled it
    assert r.ms_per_sample["read_runq"] == pytest.approx(1300 / 80)
    verdict, advice = classify(r, BUSY, cores=2)
    assert verdict == "decode-bound", advice
    assert "oversubscribed" in advice[0] and "68%" in advice[0], advice  # 1.30 of 1.90 s queued
    assert "raise num_workers" not in advice[0]


def test_workers_busy_in_the_pixel_transforms_are_augment_bound() -> None:
    # 2 workers 95% busy, most of it in RandAugment + ColorJitter (the pixel stage), batches on
    # the CPU: the advice names the cost and where it would be cheaper.
    r = _one_second(
        batches=10, samples=80, read_s=0.10, read_cpu_s=0.08, decode_s=0.60, augment_s=1.20,
        trainer_wait_s=0.9, next_calls=10,
    )
    assert r.ms_per_sample["augment"] == pytest.approx(1200 / 80)
    assert r.worker_busy_percent == pytest.approx(95.0)
    verdict, advice = classify(r, IDLE, cores=2)
    assert verdict == "augment-bound", advice
    assert "15.00 ms/sample" in advice[0] and "device='cuda'" in advice[0], advice
    report = format_report([dataclasses.replace(r, verdict=verdict, advice=advice)], IDLE, True)
    assert "augment" in report and "15.000" in report


@pytest.mark.parametrize(
    ("machine", "runq_s"),
    [(IDLE, 0.01), (BUSY, 0.30), (IDLE, 0.0)],
    ids=["idle-machine", "busy-machine", "no-run-queue-figure"],
)
def test_reads_blocked_on_storage_are_storage_bound(machine: MachineRates, runq_s: float) -> None:
    # Reads taking 1.8 s of worker time per second, 0.04 s of it on a CPU: blocked on a network
    # filesystem, whether or not other work keeps the cores busy (waking up then takes a while:
    # run-queue time), and where the kernel reports no run-queue delay (0).
    r = _one_second(
        batches=10, samples=80, bytes_read=8 << 20, read_s=1.80, read_cpu_s=0.04, read_runq_s=runq_s,
        decode_s=0.15, trainer_wait_s=0.9, next_calls=10,
    )
    verdict, advice = classify(r, machine, cores=2)
    assert verdict == "storage-bound", advice
    assert "network filesystem" in advice[0] and "shards" in advice[0], advice


def test_reads_waiting_for_object_storage_are_storage_bound_with_its_advice() -> None:
    # A cold first epoch from s3://: 1.5 of the 1.8 s of reading waits for chunks being fetched
    # (30 MB/s of them), most chunk reads miss the node cache. The columns show the network.
    cold = _one_second(
        batches=10, samples=80, bytes_read=8 << 20, read_s=1.80, read_cpu_s=0.04, decode_s=0.15,
        trainer_wait_s=0.9, next_calls=10, epochs=1, net_bytes=30_000_000, net_wait_s=1.5,
        cache_hits=5, cache_misses=15,
    )
    assert cold.ms_per_sample["net_wait"] == pytest.approx(1500 / 80)
    assert cold.cache_hit_percent == pytest.approx(25.0) and cold.net_mb_per_s == pytest.approx(30.0)
    verdict, advice = classify(cold, IDLE, cores=2)
    assert verdict == "storage-bound", advice
    assert "object storage" in advice[0] and "FASTLOAD_REMOTE_REQUESTS" in advice[0], advice
    assert "shuffle_block" in advice[0] and "cache_limit" not in advice[0], advice
    report = format_report([dataclasses.replace(cold, verdict=verdict, advice=advice)], IDLE, True)
    head, row = report.splitlines()[2:4]
    assert "netMB/s" in head and "hit%" in head and " 30.0    25 " in row, report
    # Its third epoch misses as much: the cache is too small for the data.
    later = dataclasses.replace(cold, epochs_so_far=3)
    verdict, advice = classify(later, IDLE, cores=2)
    assert verdict == "storage-bound" and "raise cache_limit" in advice[0], advice
    # A local loader's report has no network columns.
    local = _one_second(batches=10, samples=80, read_s=0.1, decode_s=1.5, trainer_wait_s=0.5, next_calls=10)
    assert "netMB/s" not in format_report([local], IDLE, True)


# ---------------------------------------------------------------------------------------------
# Real loaders


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
        deadline = time.monotonic() + 60  # a hang guard: the first batches come in well under 1 s
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
    real = _index.read_file

    def slow(path: str, *args: Any) -> bytes | memoryview:
        time.sleep(0.05)  # a 50 ms read per file: a slow network filesystem
        return real(path, *args)

    monkeypatch.setattr(_index, "read_file", slow)  # forked workers inherit it
    yield


def test_slow_reads_are_storage_bound(image_folder: Path, slow_storage: None) -> None:
    # Small images (about 1 ms to decode and crop): reading dominates by far even when other
    # processes slow the decoding down several times, so the regime cannot flip under load.
    with _loader(image_folder) as loader:
        r = _run_and_sample(loader, lambda: None)
    assert r.verdict == "storage-bound", r
    assert r.ms_per_sample["read"] > r.ms_per_sample["decode"]
    ms = r.ms_per_sample
    assert ms["read_cpu"] + ms["read_runq"] < 0.3 * ms["read"]  # reading waits, and not for a CPU
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
    ms = r.ms_per_sample
    # Reading computes: on a CPU, or (when other processes share the cores) waiting for one.
    assert ms["read_cpu"] + ms["read_runq"] > 0.7 * ms["read"], ms


def test_a_slow_trainer_means_the_loader_is_not_the_bottleneck(folder: Path) -> None:
    with _loader(folder) as loader:
        r = _run_and_sample(loader, lambda: time.sleep(0.25))
    assert r.verdict == "not the bottleneck", r
    assert r.trainer_wait_percent < 10
    assert r.worker_busy_percent < 50  # the workers had time to spare


def test_batch_size_not_a_multiple_of_8_is_flagged_for_gpu_batches_only(folder: Path) -> None:
    with FastLoader(folder, batch_size=6, num_workers=1, device="cpu",  # type: ignore[arg-type]
                    transform=[T.CenterCrop(64)]) as loader:
        r = _run_and_sample(loader, lambda: time.sleep(0.2), seconds=0.5)
    assert not any("multiple of 8" in a for a in r.advice), r.advice  # tensor cores: a GPU's matter
    rates = _one_second(batches=10, samples=60, decode_s=0.2, trainer_wait_s=0.05, next_calls=10)
    for device, flagged in (("cpu", False), ("cuda", True)):
        _, advice = classify(dataclasses.replace(rates, batch_size=6, device=device), IDLE, cores=2)
        assert any("batch size 6 is not a multiple of 8" in a for a in advice) == flagged, advice


def test_decode_bound_advice_names_the_gpu_only_for_gpu_batches() -> None:
    rates = _one_second(batches=10, samples=80, decode_s=1.9, read_s=0.05, read_cpu_s=0.05,
                        trainer_wait_s=0.9, next_calls=10)
    for device in ("cpu", "cuda"):
        verdict, advice = classify(dataclasses.replace(rates, device=device), IDLE, cores=2)
        assert verdict == "decode-bound", advice
        assert "--max-side" in advice[0]
        assert ("GPU" in advice[0]) == (device == "cuda"), advice


def test_stats_count_every_sample(folder: Path) -> None:
    with _loader(folder, drop_last=True) as loader:
        batches = sum(1 for _ in loader)
        stats = loader.stats()
    assert stats is not None
    assert stats.batches >= batches and stats.samples >= batches * 8
    assert stats.read_s > 0 and stats.decode_s > 0 and stats.next_calls == batches + 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stats_count_batches_collated_in_the_workers(num_workers: int) -> None:
    # A collate_fn makes batches opaque objects (no slot): they are counted all the same.
    data = [(np.full(3, i, np.float32), i) for i in range(20)]
    with FastLoader(data, batch_size=4, num_workers=num_workers, collate_fn=list) as loader:  # type: ignore[arg-type]
        batches = sum(1 for _ in loader)
        stats = loader.stats()
    assert stats is not None and batches == 5
    assert stats.batches == 5 and stats.samples == 20 and stats.decode_s > 0


# ---------------------------------------------------------------------------------------------
# Epoch starts (issue 11): a pipeline that drains at epoch ends makes the trainer wait there


def test_waits_at_epoch_starts_are_named_in_the_advice() -> None:
    def two_epochs(start_wait_s: float) -> LoaderRates:
        return _one_second(
            batches=10, samples=80, read_s=0.2, read_cpu_s=0.18, decode_s=0.4, trainer_wait_s=0.5,
            next_calls=10, epochs=2, epoch_start_wait_s=start_wait_s,
        )

    verdict, advice = classify(two_epochs(0.45), IDLE, cores=2)
    # Issue 28: mostly epoch starts is not "transport-bound, raise prefetch"; and the advice names
    # what makes an epoch start cold, not set_epoch(e + 1), which a training loop already calls.
    assert verdict == "epoch-start-bound", verdict
    assert any("first batch of 2 epoch(s)" in a and "outlives the epoch" in a for a in advice), advice
    assert not any("first batch" in line for line in classify(two_epochs(0.02), IDLE, cores=2)[1])
    # Steady waits besides the epoch starts: the loader's own verdict, and the epoch-start line.
    steady = dataclasses.replace(two_epochs(0.2), trainer_wait_percent=60.0)
    verdict, advice = classify(steady, IDLE, cores=2)
    assert verdict != "epoch-start-bound" and any("first batch" in line for line in advice), verdict


class _Slow(Dataset[int]):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> int:
        time.sleep(0.002)
        return i


def test_a_loader_counts_its_epochs_and_the_waits_for_their_first_batches() -> None:
    with FastLoader(_Slow(), batch_size=4, num_workers=2, persistent_workers=True) as loader:
        for epoch in range(3):
            loader.set_epoch(epoch)
            assert sum(len(b) for b in loader) == 24
        stats = loader.stats()
    assert stats is not None and stats.epochs == 3
    assert 0.0 < stats.epoch_start_wait_s <= stats.trainer_wait_s


def test_skipped_samples_are_counted_and_named_in_the_advice(tmp_path: Path) -> None:
    """A loader with on_error="skip" over a folder with a broken file: iostat reads its count."""
    import warnings

    root = build_folder(tmp_path / "broken", classes=2, per_class=4)
    sorted(root.glob("n00/*.jpg"))[0].write_bytes(b"not an image" * 20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FastLoader(root, batch_size=2, num_workers=1, device="cpu", on_error="skip", max_skipped=1,
                        transform=[T.CenterCrop(64)]) as loader:
            r = _run_and_sample(loader, lambda: time.sleep(0.05), seconds=0.5)
    assert r.skipped >= 1
    assert any("broken sample(s) replaced" in a and "fastload verify" in a for a in r.advice), r.advice
