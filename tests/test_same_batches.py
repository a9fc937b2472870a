"""The same batches, bit for bit, across a rebuild of the package (issue 30's check): a few epochs
of every source kind (a folder, a pack, tar shards, HDF5 images; 0 and 2 workers; through a
daemon), shuffled and augmented, hashed, against hashes recorded on the tree before the rebuild
(`tests/fixtures/golden/hashes.json`).

The images are committed (`tests/fixtures/golden/`, 16 small JPEGs), so nothing depends on an
encoder's version; the hashes are the native decoder's (libjpeg-turbo's exact integer IDCT), and
the test is skipped where it is not built. Recording (only on the tree the hashes describe, and
only when a change of batches is intended and said so in its commit):

    FASTLOAD_RECORD_BATCHES=1 bash tools/test.sh tests/test_same_batches.py -n 0
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from daemon_helpers import DaemonPool

from fastload import FastLoader
from fastload import transforms as T
from fastload._native_jpeg import built_native_jpeg
from fastload.sources import HDF5, ImageFolder, Packed, TarShards, pack

FIXTURE = Path(__file__).parent / "fixtures" / "golden"
HASHES = FIXTURE / "hashes.json"
RECORD = os.environ.get("FASTLOAD_RECORD_BATCHES") == "1"

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        built_native_jpeg() is None, reason="the hashes are the native decoder's; it is not built here"
    ),
]


def _augment() -> list[Any]:
    # Integer paths only (the resampler's sums are exact, AVX2 or not): float colour ops may round
    # otherwise on another CPU's SIMD dispatch, and this check is about the package, not the CPU.
    return [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]


def _epochs_hash(source: Any, workers: int, **kwargs: Any) -> str:
    """The SHA-256 of two epochs' batches (images, then targets), in order."""
    digest = hashlib.sha256()
    options: dict[str, Any] = {
        "batch_size": 5, "shuffle": True, "seed": 7, "transform": _augment(), "num_workers": workers,
        "device": "cpu", "backend": "native", **kwargs,
    }
    with FastLoader(source, **options) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            for images, targets in loader:
                digest.update(np.ascontiguousarray(images.numpy()).tobytes())
                digest.update(np.ascontiguousarray(targets.numpy()).tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The committed folder, and the same samples as a pack, tar shards and an HDF5 file."""
    work = tmp_path_factory.mktemp("same-batches")
    folder = work / "folder"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns("*.json"))
    index = ImageFolder(str(folder)).open()
    files = [Path(index.path(i)) for i in range(len(index))]
    labels = [int(label) for label in index.labels]
    packed = pack(ImageFolder(str(folder)), work / "pack", progress=False, workers=1)
    shards = work / "shards"
    shards.mkdir()
    for number, first in enumerate(range(0, len(files), 6)):
        with tarfile.open(shards / f"train-{number:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(first, min(len(files), first + 6)):
                for suffix, payload in ((".jpg", files[i].read_bytes()), (".cls", str(labels[i]).encode())):
                    info = tarfile.TarInfo(f"s{i:05d}{suffix}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
    h5 = work / "images.h5"
    with h5py.File(h5, "w") as f:
        data = f.create_dataset("images", (len(files),), dtype=h5py.vlen_dtype(np.uint8))
        for i, path in enumerate(files):
            data[i] = np.frombuffer(path.read_bytes(), np.uint8)
        f.create_dataset("labels", data=np.array(labels, dtype=np.int64))
    return {
        "folder": str(folder),
        "pack": Packed(str(packed.path)),
        "tar": TarShards(f"{shards}/train-{{000000..000002}}.tar"),
        "hdf5": HDF5(str(h5)),
    }


def _check(kind: str, got: str, may_record: bool) -> None:
    """`got` is the hash recorded for `kind` (one per kind: any worker count, local or through a
    daemon, yields the same batches); recorded instead where asked to and `may_record`."""
    recorded = json.loads(HASHES.read_text()) if HASHES.exists() else {}
    if RECORD and may_record:
        recorded[kind] = got
        HASHES.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        return
    assert kind in recorded, f"no hash recorded for {kind}: record them on the tree before the change"
    assert got == recorded[kind], f"{kind}: the batches differ from those recorded (hashes.json)"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["folder", "pack", "tar", "hdf5"])
def test_the_batches_are_the_recorded_ones(sources: dict[str, Any], kind: str, workers: int) -> None:
    _check(kind, _epochs_hash(sources[kind], workers), may_record=workers == 0)


@pytest.mark.parametrize("kind", ["folder", "pack", "tar", "hdf5"])
def test_a_daemons_batches_are_the_recorded_ones(
    sources: dict[str, Any], kind: str, daemon_pool: DaemonPool
) -> None:
    daemon = daemon_pool.start(workers=2)
    _check(kind, _epochs_hash(sources[kind], 1, daemon=daemon.address), may_record=False)
