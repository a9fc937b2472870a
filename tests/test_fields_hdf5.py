"""An HDF5 file's datasets as declared fields (`HDF5(path, fields={...})`, issue 31 item 1).

Protects: datasets named by the fields come with their images (a string dataset as str, one of
JSON strings parsed, vlen bytes as bytes), the images and labels equal to the plain source's,
for 0 and 2 workers and through a daemon (the values in the index's shared segment); a dataset
of the wrong length is a DatasetError naming it, and fields without names are refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from daemon_helpers import DaemonPool
from fields_helpers import assert_same_batches, caption, epoch, meta

from fastload import ConfigError, DatasetError, sources
from fastload.sources._formats.folder import scan_image_folder

h5py = pytest.importorskip("h5py", reason="h5py is not installed (pip install fastload[hdf5])")

FIELDS = {"images": "jpg", "captions": "txt", "meta": "json", "raw": "bin", "labels": "cls"}


def write_h5(folder: Path, path: Path, samples: int | None = None) -> Path:
    index = scan_image_folder(folder)
    n = len(index) if samples is None else samples
    with h5py.File(path, "w") as f:
        images = f.create_dataset("images", (len(index),), dtype=h5py.vlen_dtype(np.uint8))
        for i in range(len(index)):
            images[i] = np.frombuffer(Path(index.path(i)).read_bytes(), np.uint8)
        f.create_dataset("labels", data=index.labels)
        f.create_dataset("captions", data=[caption(i) for i in range(n)], dtype=h5py.string_dtype())
        f.create_dataset("meta", data=[json.dumps(meta(i)) for i in range(n)], dtype=h5py.string_dtype())
        raw = f.create_dataset("raw", (n,), dtype=h5py.vlen_dtype(np.uint8))
        for i in range(n):
            raw[i] = np.arange(i % 7, dtype=np.uint8)
    return path


def test_datasets_come_with_their_images(image_folder: Path, tmp_path: Path, daemon_pool: DaemonPool) -> None:
    path = write_h5(image_folder, tmp_path / "pairs.h5")
    source = sources.HDF5(str(path), fields=FIELDS)
    got = epoch(source, 0, sample_ids=True)
    want = epoch(sources.HDF5(str(path)), 0)
    for batch, (images, labels) in zip(got, want, strict=True):
        indices = batch.pop("sample_ids").indices.tolist()
        assert list(batch) == list(FIELDS)
        assert torch.equal(batch["images"], images) and torch.equal(batch["labels"], labels)
        assert batch["captions"] == [caption(i) for i in indices]
        assert batch["meta"] == [meta(i) for i in indices]
        assert batch["raw"] == [bytes(range(i % 7)) for i in indices]
    local = epoch(source, 0)
    assert_same_batches(local, epoch(source, 2))
    daemon = daemon_pool.start(workers=2, extra=["--root", str(tmp_path)])
    assert_same_batches(local, epoch(source, 1, daemon=daemon.address))


def test_a_field_dataset_of_another_length_is_named(image_folder: Path, tmp_path: Path) -> None:
    path = write_h5(image_folder, tmp_path / "short.h5", samples=5)
    with pytest.raises(DatasetError, match=r"/captions has shape \(5,\)"):
        sources.HDF5(str(path), fields=FIELDS).open()
    with pytest.raises(ConfigError, match="name their datasets"):
        sources.HDF5(str(path), fields=("jpg", "txt"))
