"""`pack` keeps every declared field (NOTE [packed fields] in `_formats/pack_format.py`).

Protects: a pack of tar shards, a file list or an HDF5 file with `fields=` gives the same dict
batches as the source (images, label, text, JSON, bytes; 0 and 2 workers; through a daemon; resumed
mid-epoch; re-encoded with max_side, the same members);
its manifest records the declaration and is version 2; a missing member stays missing; an
interrupted pack with fields finishes byte-identical; a damaged field index is refused; a pack
without fields is written and read exactly as before (version 1, no field arrays).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_helpers import DaemonPool
from fields_helpers import AUGMENT, FIELDS, assert_same_batches, copied, epoch, write_field_shards
from helpers import resumed_tail
from test_fields_file_list import FIELDS as LIST_FIELDS
from test_fields_file_list import write_lists

from fastload import ConfigError, DatasetError, SampleError, sources
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._packing import writer as _pack_writer

SHARDS = "train-{000000..000002}.tar"


@pytest.fixture(scope="module")
def field_shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> sources.TarShards:
    directory = tmp_path_factory.mktemp("pack_fields")
    write_field_shards(directory, image_folder)
    return sources.TarShards(str(directory / SHARDS), fields=FIELDS)


@pytest.fixture(scope="module")
def packed(field_shards: sources.TarShards, tmp_path_factory: pytest.TempPathFactory) -> sources.Packed:
    return sources.pack(field_shards, tmp_path_factory.mktemp("packed") / "pack", progress=False)


def _ids_as_lists(batches: list[Any]) -> list[Any]:
    for batch in batches:
        batch["sample_ids"] = batch["sample_ids"].indices.tolist()
    return batches


def test_a_packed_tar_gives_the_sources_batches(
    field_shards: sources.TarShards, packed: sources.Packed
) -> None:
    want = _ids_as_lists(epoch(field_shards, 0, sample_ids=True))
    assert_same_batches(want, _ids_as_lists(epoch(packed, 0, sample_ids=True)))
    assert_same_batches(epoch(field_shards, 2), epoch(packed, 2))
    manifest = json.loads((Path(packed.path) / "manifest.json").read_text())
    assert manifest["version"] == 2
    assert manifest["fields"] == {
        "names": list(FIELDS),
        "kinds": ["image", "str", "json", "label", "bytes"],
        "named": True,
        "extensions": [["jpg", "jpeg", "png"], ["txt"], ["json"], ["cls"], ["bin"]],
    }


def test_a_packed_fields_source_resumes_mid_epoch(packed: sources.Packed) -> None:
    options: dict[str, Any] = {"batch_size": 5, "shuffle": True, "transform": AUGMENT, "device": "cpu"}
    assert_same_batches(epoch(packed, 0)[2:], resumed_tail(packed, options, copied))


def test_a_packed_file_list_gives_the_lists_batches(image_folder: Path, tmp_path: Path) -> None:
    rich, _ = write_lists(image_folder, tmp_path / "lists")
    source = sources.FileList(str(rich), fields=LIST_FIELDS)
    packed = sources.pack(source, tmp_path / "pack", progress=False)
    want = _ids_as_lists(epoch(source, 0, sample_ids=True))
    assert_same_batches(want, _ids_as_lists(epoch(packed, 0, sample_ids=True)))
    assert_same_batches(want, _ids_as_lists(epoch(packed, 2, sample_ids=True)))


def test_a_daemon_serves_a_packed_fields_source(
    field_shards: sources.TarShards, packed: sources.Packed, daemon_pool: DaemonPool
) -> None:
    daemon = daemon_pool.start(workers=2, extra=["--root", str(Path(packed.path).parent)])
    assert_same_batches(epoch(field_shards, 0), epoch(packed, 1, daemon=daemon.address))


def test_a_missing_member_stays_missing(image_folder: Path, tmp_path: Path) -> None:
    write_field_shards(tmp_path / "shards", image_folder, drop=((13, ".txt"),))
    source = sources.TarShards(str(tmp_path / "shards" / SHARDS), fields=FIELDS)
    packed = sources.pack(source, tmp_path / "pack", progress=False)
    assert int(np.load(tmp_path / "pack" / "field_sizes.npy")[0, 13]) == -1
    with pytest.raises(SampleError, match=r"s00013.*'text'"):
        epoch(packed, 0, shuffle=False)
    with pytest.warns(UserWarning, match=r"s00013.*no member for field 'text'"):
        kept = epoch(packed, 0, shuffle=False, on_error="skip")
    with pytest.warns(UserWarning, match=r"s00013.*no member for field 'text'"):
        assert_same_batches(kept, epoch(source, 0, shuffle=False, on_error="skip"))


class Interrupted(Exception):
    pass


def test_an_interrupted_pack_with_fields_finishes_identical(
    field_shards: sources.TarShards, packed: sources.Packed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dst = tmp_path / "pack"
    monkeypatch.setattr(_pack_writer, "BATCH_SAMPLES", 3)
    monkeypatch.setattr(_pack_writer, "CHECKPOINT_SAMPLES", 4)
    real, calls = ExtentIndex.read_member, [0]

    def failing(self: ExtentIndex, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 14:  # a few checkpoints in, between two of them
            raise Interrupted
        return real(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(ExtentIndex, "read_member", failing)
        with pytest.raises(Interrupted):
            sources.pack(field_shards, dst, progress=False)
    sources.pack(field_shards, dst, progress=False)
    for name in sorted(p.name for p in Path(packed.path).iterdir()):
        assert (dst / name).read_bytes() == (Path(packed.path) / name).read_bytes(), name


def test_a_damaged_field_index_is_refused(packed: sources.Packed, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in Path(packed.path).iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    sizes = np.load(copy / "field_sizes.npy")
    sizes[1, 3] = 1 << 40
    np.save(copy / "field_sizes.npy", sizes)
    with pytest.raises(DatasetError, match=r"field_sizes\.npy or field_offsets\.npy"):
        sources.Packed(str(copy)).open()
    np.save(copy / "field_sizes.npy", sizes[:, :-1])
    with pytest.raises(DatasetError, match=r"field_sizes\.npy is not an int64"):
        sources.Packed(str(copy)).open()


def test_a_pack_without_fields_is_unchanged(field_shards: sources.TarShards, tmp_path: Path) -> None:
    plain = sources.pack(sources.TarShards(field_shards.paths), tmp_path / "plain", progress=False)
    manifest = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    assert manifest["version"] == 1 and "fields" not in manifest
    assert not list((tmp_path / "plain").glob("field_*.npy"))
    index = plain.open()
    assert index.fields is None
    images, labels = epoch(plain, 0)[0]
    assert images.shape[0] == labels.shape[0] == 5


def test_ray_packing_refuses_fields(field_shards: sources.TarShards, tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="pack(ray=...) needs Ray")
    with pytest.raises(ConfigError, match=r"declares fields.*does not keep them yet"):
        sources.pack(field_shards, tmp_path / "pack", ray=True, progress=False)
    assert not (tmp_path / "pack").exists()


def test_a_reencoded_pack_keeps_the_fields(field_shards: sources.TarShards, tmp_path: Path) -> None:
    pytest.importorskip("PIL.Image", reason="max_side re-encodes with Pillow")
    reduced = sources.pack(field_shards, tmp_path / "pack", progress=False, max_side=16, workers=2)
    got = _ids_as_lists(epoch(reduced, 0, sample_ids=True))
    want = _ids_as_lists(epoch(field_shards, 0, sample_ids=True))
    for a, b in zip(got, want, strict=True):
        assert [a[k] for k in ("sample_ids", "text", "meta", "raw")] == [
            b[k] for k in ("sample_ids", "text", "meta", "raw")
        ]
        assert a["label"].tolist() == b["label"].tolist()


def test_a_packed_hdf5_file_gives_its_batches(image_folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("h5py", reason="HDF5 sources need h5py")
    from test_fields_hdf5 import FIELDS as H5_FIELDS
    from test_fields_hdf5 import write_h5

    source = sources.HDF5(str(write_h5(image_folder, tmp_path / "data.h5")), fields=H5_FIELDS)
    packed = sources.pack(source, tmp_path / "pack", progress=False)
    assert_same_batches(epoch(source, 0), epoch(packed, 0))
