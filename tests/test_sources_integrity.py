"""Packs and HDF5 files as an attacker would write them (issue 20): a tampered manifest or index,
a pack resumed after its source changed, HDF5 targets out of range or declared absurdly large;
each a DatasetError naming the file, never ValueError/KeyError/TypeError or a huge allocation."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastload import DatasetError, sources
from fastload.sources._indexes.sample_index import PathIndex
from fastload.sources._packing import writer as _pack_writer

pytestmark = pytest.mark.hostile

SHARD = 40 << 10


class Interrupted(Exception):
    pass


@pytest.fixture(scope="module")
def pack_dir(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("pack") / "p"
    sources.pack(image_folder, dst, shard_bytes=SHARD, progress=False)
    return dst


def _tampered(pack_dir: Path, tmp_path: Path, **fields: Any) -> Path:
    copy = tmp_path / "copy"
    copy.mkdir()
    for entry in pack_dir.iterdir():
        (copy / entry.name).write_bytes(entry.read_bytes())
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest.update(fields)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


@pytest.mark.parametrize(
    "fields",
    [
        {"files": ["../outside.bin"]},
        {"files": ["/etc/passwd"]},
        {"files": "data-00000.bin"},
        {"files": [3]},
        {"count": "24"},
        {"count": -1},
        {"classes": {"a": 1}},
        {"version": "1"},
    ],
)
def test_a_tampered_manifest_is_a_dataset_error_naming_it(
    pack_dir: Path, tmp_path: Path, fields: dict[str, Any]
) -> None:
    copy = _tampered(pack_dir, tmp_path, **fields)
    with pytest.raises(DatasetError) as info:
        sources.Packed(str(copy)).open()
    assert str(copy) in str(info.value)


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("file_ids", lambda a: np.where(np.arange(len(a)) == 0, -1, a).astype(np.int32)),
        ("sizes", lambda a: a + (1 << 40)),
        ("offsets", lambda a: a - (1 << 20)),
        ("labels", lambda a: a.astype(np.float64)),
        ("name_offsets", lambda a: a[::-1].copy()),
    ],
)
def test_a_tampered_index_is_a_dataset_error(pack_dir: Path, tmp_path: Path, name: str, change: Any) -> None:
    copy = _tampered(pack_dir, tmp_path)
    np.save(copy / f"{name}.npy", change(np.load(copy / f"{name}.npy")))
    with pytest.raises(DatasetError, match=re.escape(str(copy))):
        sources.Packed(str(copy)).open()


def test_a_deeply_nested_manifest_is_a_dataset_error(pack_dir: Path, tmp_path: Path) -> None:
    copy = _tampered(pack_dir, tmp_path)
    (copy / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(DatasetError, match=r"manifest\.json"):
        sources.Packed(str(copy)).open()


def test_a_pack_resumed_after_its_source_changed_is_refused(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = tmp_path / "list.csv"
    paths = sorted(p for p in image_folder.rglob("*") if p.is_file())
    listing.write_text("".join(f"{p},{i % 3}\n" for i, p in enumerate(paths)))
    monkeypatch.setattr(_pack_writer, "BATCH_SAMPLES", 3)
    real = PathIndex.read
    calls = [0]

    def interrupted(*args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            raise Interrupted
        return real(*args)

    with monkeypatch.context() as patch:
        patch.setattr(PathIndex, "read", interrupted)
        with pytest.raises(Interrupted):
            sources.pack(str(listing), tmp_path / "p", shard_bytes=SHARD, progress=False)
    # The same count, the same classes, other labels: resuming would mislabel every later sample.
    listing.write_text("".join(f"{p},{(i + 1) % 3}\n" for i, p in enumerate(paths)))
    with pytest.raises(DatasetError, match="source changed"):
        sources.pack(str(listing), tmp_path / "p", shard_bytes=SHARD, progress=False)


# -- HDF5 ----------------------------------------------------------------------------------------


@pytest.fixture
def h5py() -> Any:
    return pytest.importorskip("h5py")


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (np.array([0, -5, 1], np.int64), "got -5"),
        (np.array([0, np.iinfo(np.uint64).max, 1], np.uint64), "< 2\\^63"),
    ],
)
def test_hdf5_labels_are_range_checked(h5py: Any, tmp_path: Path, labels: np.ndarray, message: str) -> None:
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((3, 4, 4, 3), np.uint8)
        f["labels"] = labels
    with pytest.raises(DatasetError, match=message):
        sources.HDF5(str(path)).open()


def test_hdf5_declared_shapes_are_bounded_before_reading(h5py: Any, tmp_path: Path) -> None:
    path = tmp_path / "d.h5"
    rows = 1 << 29
    with h5py.File(path, "w") as f:  # nothing written: a small file declaring 4 GiB of targets
        f.create_dataset("images", (rows, 1), np.uint8, chunks=(1024, 1))
        f.create_dataset("labels", (rows,), np.int64, chunks=(1024,))
    assert os.path.getsize(path) < 64 << 10
    with pytest.raises(DatasetError, match="budget of targets"):
        sources.HDF5(str(path)).open()
    with pytest.raises(DatasetError, match="budget of targets"):
        sources.HDF5(str(path), labels=None).open()
