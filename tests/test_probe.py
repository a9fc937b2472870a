"""`fastload probe`: a real probe of a small JPEG folder, then the arithmetic and advice on fixed figures."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from helpers import write_image

from fastload import sources
from fastload._diagnostics.probe import (
    KB,
    ProbeResult,
    advice_for,
    format_probe,
    images_per_s_from_storage,
    probe,
    probe_to_json,
    sample_indices,
    workers_needed,
)
from fastload._diagnostics.sysinfo import MB, BlockDevice
from fastload._errors import ConfigError, DatasetError
from fastload.sources._formats.folder import scan_image_folder

KINDS = {"nvme", "ssd", "hdd", "network", "memory", "virtual", "unknown"}


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 photo-like 300x200 JPEGs in 4 classes."""
    root = tmp_path_factory.mktemp("probe") / "train"
    for c in range(4):
        for i in range(10):
            write_image(root / f"class{c}" / f"{i:02d}.jpg", 200, 300, seed=100 * c + i)
    return root


# A real probe


def test_probe_measures_a_folder(jpeg_folder: Path) -> None:
    r = probe(jpeg_folder, target=500, sample=12, seconds=0.3)
    assert (r.path, r.images, r.classes, r.sampled) == (str(jpeg_folder), 40, 4, 12)
    index = scan_image_folder(jpeg_folder)
    sampled = [index.path(int(i)) for i in sample_indices(len(index), 12)]
    assert r.mean_file_bytes == sum(os.path.getsize(p) for p in sampled) / 12
    assert r.cold_mb_per_s > 0 and r.warm_mb_per_s > 0 and r.decode_images_per_s > 0
    assert r.backend in ("native", "pil") and r.decode_failures == ()
    assert r.device.kind in KINDS and r.device.mount_point and r.eviction_note
    assert r.cores >= 1 and r.memory_available_bytes > 0
    assert r.workers_needed == math.ceil(500 / r.decode_images_per_s)
    assert r.storage_images_per_s == pytest.approx(r.cold_mb_per_s * MB / r.mean_file_bytes)
    assert r.advice == tuple(advice_for(r)) and r.advice
    text = format_probe(r)
    assert str(jpeg_folder) in text and "images/s on one core" in text and "500 images/s needs" in text
    data = json.loads(json.dumps(probe_to_json(r)))
    assert data["images"] == 40 and data["workers_needed"] == r.workers_needed
    assert data["device"]["description"] == r.device.describe() and data["advice"] == list(r.advice)


def test_sample_is_deterministic_and_distinct(jpeg_folder: Path) -> None:
    index = scan_image_folder(jpeg_folder)
    picks = sample_indices(len(index), 15).tolist()
    assert picks == sample_indices(len(index), 15).tolist() and len(set(picks)) == 15
    assert sorted(sample_indices(len(index), 1000).tolist()) == list(range(40))


def test_undecodable_files_are_reported(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for i in range(3):
        write_image(root / "a" / f"{i}.jpg", 120, 160, seed=i)
    (root / "a" / "broken.jpg").write_bytes(b"not an image at all")
    r = probe(root, sample=10, seconds=0.1)
    assert r.sampled == 4 and len(r.decode_failures) == 1 and "broken.jpg" in r.decode_failures[0]
    assert any("did not decode" in line and "broken.jpg" in line for line in r.advice)


def test_nothing_decodes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.jpg").write_bytes(b"junk")
    with pytest.raises(DatasetError, match="none of the 1 sampled files could be decoded"):
        probe(tmp_path, sample=5, seconds=0.1)


def test_bad_paths_and_arguments(tmp_path: Path, jpeg_folder: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        probe(tmp_path / "missing")
    with pytest.raises(DatasetError, match="no class subfolders"):
        probe(tmp_path)
    for kwargs in ({"workers": 0}, {"target": -5.0}, {"sample": 0}, {"seconds": 0.0}):
        with pytest.raises(ConfigError):
            probe(jpeg_folder, **kwargs)


# Arithmetic


def test_workers_needed_arithmetic() -> None:
    assert workers_needed(2000, 312.5) == 7  # 6.4 -> 7
    assert workers_needed(1000, 250) == 4  # exact: no spare worker
    assert workers_needed(1001, 250) == 5
    assert workers_needed(1, 5000) == 1
    with pytest.raises(ConfigError):
        workers_needed(1000, 0)


def test_storage_arithmetic() -> None:
    assert images_per_s_from_storage(40, 110 * KB) == pytest.approx(40 * 1024 / 110)  # ~372
    assert images_per_s_from_storage(100, 1 * MB) == 100
    assert images_per_s_from_storage(100, 0) == 0


# Advice on fabricated results


def _result(**changes: object) -> ProbeResult:
    base = ProbeResult(
        path="/mnt/nfs/imagenet/train",
        images=1_281_167,
        classes=1000,
        sampled=200,
        mean_file_bytes=110 * KB,
        cold_mb_per_s=1000.0,
        warm_mb_per_s=4000.0,
        evicted=True,
        eviction_note="dropped from the page cache with posix_fadvise(DONTNEED) before reading",
        backend="native",
        decode_images_per_s=400.0,
        decode_failures=(),
        device=BlockDevice("/mnt/nfs/imagenet/train", "/", "ext4", "nvme0n1p2", "nvme0n1", "nvme"),
        cores=16,
        memory_available_bytes=64 << 30,
        workers=None,
        target=2000.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_advice_names_storage_when_cold_reads_limit() -> None:
    nfs = BlockDevice("/mnt/nfs/imagenet/train", "/mnt/nfs", "nfs4", None, None, "network")
    r = _result(cold_mb_per_s=40.0, device=nfs)
    assert r.workers_needed == 5 and r.storage_images_per_s < r.target  # type: ignore[operator]
    advice = advice_for(r)
    assert advice[0] == (
        "storage reads 40 MB/s cold: at 110 KB per image that caps loading at ~372 images/s "
        "whatever the workers; copy the data to local NVMe or pack it into shards"
    )
    assert advice[1] == "2,000 images/s needs 5 of 16 cores"
    assert "cold storage does not keep up" in format_probe(dataclasses.replace(r, advice=tuple(advice)))
    # ~134 GB does not fit in 64 GB: no page-cache consolation.
    assert not any("page cache" in line for line in advice)


def test_advice_when_the_dataset_fits_in_memory() -> None:
    r = _result(cold_mb_per_s=40.0, images=10_000)  # ~1 GB
    advice = advice_for(r)
    assert advice[0].startswith("storage reads 40 MB/s cold") and "pack the files into shards" in advice[0]
    assert "fits in available memory" in advice[1] and "~37,236 images/s" in advice[1]


def test_advice_without_a_storage_limit() -> None:
    assert advice_for(_result()) == ["2,000 images/s needs 5 of 16 cores"]
    assert advice_for(_result(target=6400.0)) == [
        "6,400 images/s needs 16 of 16 cores (every core: none is left for the training process)"
    ]


def test_advice_when_cores_or_workers_limit() -> None:
    (line,) = advice_for(_result(cores=4))
    assert line.startswith("2,000 images/s needs 5 workers at 400 images/s per core") and "4 cores" in line
    short = "--workers 2 decodes ~800 images/s, short of 2,000: use --workers 5"
    assert advice_for(_result(workers=2)) == [short]
    (line,) = advice_for(_result(target=None, workers=3))
    assert line.startswith("at 3 workers expect ~1,200 images/s (400 per core)")


def test_advice_without_a_target_compares_storage_with_decode_capacity() -> None:
    # 16 cores x 400/s = 6,400 images/s of decoding against ~3,723 images/s of 400 MB/s reads.
    advice = advice_for(_result(target=None, cold_mb_per_s=400.0))
    assert advice[0].startswith("storage reads 400 MB/s cold") and "~3,724 images/s" in advice[0]
    assert advice[-1].startswith("at 16 workers expect ~3,724 images/s")


def test_measurement_caveats() -> None:
    advice = advice_for(_result(evicted=False, eviction_note="posix_fadvise failed", backend="pil"))
    assert "upper bound" in advice[0] and "posix_fadvise failed" in advice[0]
    assert "pil backend" in advice[1] and "libjpeg-turbo" in advice[1]
    shm = BlockDevice("/dev/shm/data", "/dev/shm", "tmpfs", None, None, "memory")
    assert not any("upper bound" in line for line in advice_for(_result(evicted=False, device=shm)))
    big = advice_for(_result(mean_file_bytes=1200 * KB, cold_mb_per_s=4000.0))
    assert any(line.startswith("images average 1,200 KB") for line in big)


# fastload iostat --plot (fastload._diagnostics.plot)


def _history() -> list[dict[str, Any]]:
    records = []
    for t in range(12):
        loaders = [
            {
                "name": "fastload",
                "samples_per_s": 2000.0 + 50 * t,
                "ms_per_sample": {
                    "read": 0.2, "decode": 3.1, "wait_slot": 0.05 * t, "h2d": 0.1,
                    "read_cpu": 0.15, "read_runq": 0.03,  # parts of "read", as iostat records them
                },
                "trainer_wait_percent": max(0.0, 20.0 - 2 * t),
            }
        ]
        if t >= 4:  # a second loader that starts later
            loaders.append(
                {
                    "name": "torch",
                    "samples_per_s": 900.0,
                    "ms_per_sample": {"read": 0.4, "decode": 6.0, "collate": 0.3},
                    "trainer_wait_percent": 55.0,
                }
            )
        records.append(
            {"time": 2.0 * t, "loaders": loaders, "cpu": {"user": 60.0, "system": 12.0, "iowait": 3.0}}
        )
    return records


def test_plot_history_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib, which is not installed here")
    from fastload._diagnostics.plot import loader_names, plot_history, stage_names

    history = _history()
    assert loader_names(history) == ["fastload", "torch"]
    assert stage_names(history, "torch") == ["read", "decode", "collate"]
    assert stage_names(history, "fastload") == ["read", "decode", "wait_slot", "h2d"]  # no part twice
    out = tmp_path / "iostat.png"
    plot_history(history, str(out))
    assert out.stat().st_size > 10_000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastload._diagnostics.plot import plot_history

    if importlib.util.find_spec("matplotlib") is not None:
        with pytest.raises(ConfigError, match="nothing to draw"):
            plot_history([], str(tmp_path / "empty.png"))
        with pytest.raises(ConfigError, match="cannot write the plot"):
            plot_history(_history(), str(tmp_path / "no-such-dir" / "x.png"))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(ConfigError, match="--plot needs matplotlib: pip install matplotlib"):
        plot_history(_history(), str(tmp_path / "x.png"))


def test_probe_measures_any_source(jpeg_folder: Path, tmp_path: Path) -> None:
    # A pack of the folder: the same samples, read from one data file (evicted whole).
    packed = sources.pack(jpeg_folder, tmp_path / "packed", progress=False)
    r = probe(packed, sample=12, seconds=0.2)
    assert (r.path, r.images, r.classes, r.sampled) == (str(tmp_path / "packed"), 40, 4, 12)
    assert r.cold_mb_per_s > 0 and r.decode_images_per_s > 0 and r.decode_failures == ()
    folder = probe(jpeg_folder, sample=12, seconds=0.2)
    assert r.mean_file_bytes == folder.mean_file_bytes  # the same 12 samples, the same bytes
    arrays = tmp_path / "rows.h5"
    with h5py.File(arrays, "w") as f:
        f.create_dataset("images", data=np.zeros((4, 8), np.float32))
        f.create_dataset("labels", data=np.zeros(4, np.int64))
    with pytest.raises(DatasetError, match="nothing to decode"):
        probe(arrays)



def test_probe_of_tar_shards_counts_classes_and_times_the_users_chain(
    jpeg_folder: Path, tmp_path: Path
) -> None:
    """Tar shards name no classes: their distinct labels are counted. A chain given (RandAugment
    after the crop) is what is timed with the decode, and named; it costs more than crop + flip."""
    from helpers import write_tar_shards

    from fastload import transforms as T

    write_tar_shards(jpeg_folder, tmp_path / "shards", per_shard=16)
    shards = str(tmp_path / "shards" / "train-{000000..000002}.tar")
    plain = probe(shards, sample=12, seconds=0.5)
    assert (plain.images, plain.classes) == (40, 4)
    assert "RandomResizedCrop + RandomHorizontalFlip" in format_probe(plain)
    chain = [T.RandomResizedCrop(224), T.RandAugment(num_ops=3, magnitude=9)]
    heavy = probe(shards, sample=12, seconds=0.5, transform=chain)
    assert heavy.chain == "RandomResizedCrop + RandAugment" and heavy.chain in format_probe(heavy)
    assert heavy.decode_images_per_s < plain.decode_images_per_s
    done = subprocess.run(
        [sys.executable, "-m", "fastload", "iostat", "--probe", shards, "--json", "--transform",
         json.dumps(T.to_config(chain))], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["chain"] == "RandomResizedCrop + RandAugment"
