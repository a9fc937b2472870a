"""The packed format (`sources.pack`, `sources.Packed`, `fastload pack`).

Protects: a pack holds the source's bytes unchanged, every sample 4096-aligned, data files within
the shard size; a loader over it gives the folder's batches bit for bit for any worker count and
resumes from a state_dict; `pack` interrupted anywhere and run again yields files byte-identical
to an uninterrupted run; a complete pack of the same source is left alone, another source's pack
or a foreign directory is refused, an incomplete pack cannot be loaded; the CLI works end to end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import epoch_with_ids, write_tar_shards

import fastload
from fastload import DatasetError, FastLoader, sources
from fastload import transforms as T
from fastload.sources._indexes.sample_index import PathIndex
from fastload.sources._packing import data_files
from fastload.sources._packing import writer as _pack_writer

AUGMENT = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]
SHARD = 40 << 10  # a few images a data file


@pytest.fixture(scope="module")
def packed(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("packs") / "train"
    sources.pack(image_folder, dst, shard_bytes=SHARD, progress=False)
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def test_layout(image_folder: Path, packed: Path) -> None:
    folder = sources.ImageFolder(str(image_folder)).open()
    manifest = json.loads((packed / "manifest.json").read_text())
    assert manifest["complete"] and manifest["count"] == 24 and manifest["classes"] == ["n00", "n01", "n02"]
    assert manifest["target"] == {"dtype": "int64", "shape": []}
    assert manifest["source"] == {"kind": "folder", "root": str(image_folder)}
    assert len(manifest["files"]) > 2
    assert not (packed / data_files.CHECKPOINT).exists()
    offsets = np.load(packed / "offsets.npy")
    sizes = np.load(packed / "sizes.npy")
    file_ids = np.load(packed / "file_ids.npy")
    assert np.all(offsets % 4096 == 0)
    data = [(packed / name).read_bytes() for name in manifest["files"]]
    assert all(len(d) <= SHARD for d in data)
    for i in range(24):
        stored = data[file_ids[i]][offsets[i] : offsets[i] + sizes[i]]
        assert stored == Path(folder.path(i)).read_bytes()
    index = sources.Packed(str(packed)).open()
    assert isinstance(index.offsets, np.memmap)  # shared pages, not a copy per process
    assert index.name(0) == "data-00000.bin:n00/img_000.JPEG"
    assert np.array_equal(index.labels, folder.labels)
    assert isinstance(sources.as_source(packed), sources.Packed)


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_batches_match_the_folder(image_folder: Path, packed: Path, num_workers: int) -> None:
    want = epoch_with_ids(image_folder, 0, seed=3)
    got = epoch_with_ids(packed, num_workers, seed=3)
    assert len(got) == len(want) == 5
    for (images, labels, ids), (want_images, want_labels, want_ids) in zip(got, want, strict=True):
        assert torch.equal(ids.indices, want_ids.indices)
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert all(name.startswith("data-0000") for name in ids.names)


def test_a_pack_keeps_the_folders_classes_class_to_idx_and_targets(image_folder: Path, packed: Path) -> None:
    options: dict[str, Any] = {"batch_size": 4, "num_workers": 0, "device": "cpu"}
    options["transform"] = [T.Resize((9, 9))]
    with FastLoader(image_folder, **options) as folder, FastLoader(packed, **options) as loader:
        assert loader.classes == folder.classes == ("n00", "n01", "n02")
        assert loader.class_to_idx == folder.class_to_idx == {"n00": 0, "n01": 1, "n02": 2}
        assert loader.targets == folder.targets == [i // 8 for i in range(24)]


def test_resume_mid_epoch(packed: Path) -> None:
    whole = epoch_with_ids(packed, 2, seed=3)  # on the CPU, as these loaders
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle": True, "transform": AUGMENT, "device": "cpu"}
    with FastLoader(packed, num_workers=2, seed=3, **kwargs) as saver:
        it = iter(saver)
        for _ in range(3):
            next(it)
        state = saver.state_dict()
    with FastLoader(packed, num_workers=0, **kwargs) as restored:
        restored.load_state_dict(state)
        tail = [(images.clone(), labels.clone()) for images, labels in restored]
    assert len(tail) == 2
    for (images, labels), want in zip(tail, whole[3:], strict=True):
        assert torch.equal(images, want[0]) and torch.equal(labels, want[1])


def test_coalesced_reads(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = sources.Packed(str(packed)).open()
    first = np.flatnonzero(index.file_ids == 1)
    calls: list[int] = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, at: calls.append(n) or real(fd, n, at))
    blobs = index.read(first[::-1].copy())
    assert len(calls) == 1 and len(first) > 1
    assert [len(b) for b in blobs] == index.sizes[first[::-1]].tolist()


class Interrupted(Exception):
    pass


def _interrupt_at(monkeypatch: pytest.MonkeyPatch, what: str, at: int) -> None:
    """Make the `at`-th source read (what="read") or index file save (what="save") raise."""
    count = [0]
    target, name = (PathIndex, "read") if what == "read" else (data_files, "save_durably")
    real = getattr(target, name)

    def hooked(*args: Any) -> Any:
        count[0] += 1
        if count[0] == at:
            raise Interrupted
        return real(*args)

    monkeypatch.setattr(target, name, hooked)


def interrupted_pack(
    monkeypatch: pytest.MonkeyPatch, src: Any, dst: Path, what: str = "read", at: int = 4, **options: Any
) -> None:
    """Pack `src` into `dst` 3 samples a read, a checkpoint every 4 (so that interrupts land
    between checkpoints too), stopped by `Interrupted` at the `at`-th read (or index save)."""
    monkeypatch.setattr(_pack_writer, "BATCH_SAMPLES", 3)
    monkeypatch.setattr(_pack_writer, "CHECKPOINT_SAMPLES", 4)
    with monkeypatch.context() as patch:
        _interrupt_at(patch, what, at)
        with pytest.raises(Interrupted):
            sources.pack(src, dst, progress=False, **options)


@pytest.mark.parametrize(("what", "at"), [("read", 1), ("read", 2), ("read", 5), ("save", 3), ("save", 9)])
def test_an_interrupted_pack_finishes_identical(
    image_folder: Path, packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, at: int
) -> None:
    dst = tmp_path / "train"
    interrupted_pack(monkeypatch, image_folder, dst, what, at, shard_bytes=SHARD)
    with pytest.raises(DatasetError, match=r"incomplete pack.*fastload pack"):
        sources.Packed(str(dst)).open()
    if what == "read" and at == 5:  # some samples were checkpointed, more written after
        assert np.load(dst / data_files.CHECKPOINT).shape[0] >= 8
    # A torn write past the checkpoint: junk at the end of the last data file, cut when resumed.
    last = max(dst.glob("data-*.bin"), default=None)
    if last is not None:
        with open(last, "ab") as f:
            f.write(b"torn" * SHARD)
    sources.pack(image_folder, dst, shard_bytes=SHARD, progress=False)
    # The folder's manifest names the same source: every file equals the uninterrupted pack's.
    assert _files(dst) == _files(packed)


def test_a_complete_pack_is_left_alone_and_others_are_refused(
    image_folder: Path, packed: Path, make_folder: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in packed.iterdir()}
    sources.pack(image_folder, packed, shard_bytes=SHARD)
    assert "already a complete pack" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in packed.iterdir()} == before
    with pytest.raises(DatasetError, match="pack of another source"):
        sources.pack(make_folder(), packed, shard_bytes=SHARD, progress=False)
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not empty and holds no fastload pack"):
        sources.pack(image_folder, stranger, progress=False)
    assert [p.name for p in stranger.iterdir()] == ["notes.txt"]
    with pytest.raises(fastload.ConfigError, match="inside the dataset"):
        sources.pack(image_folder, image_folder / "packed", progress=False)


def test_a_pack_resumed_with_another_shard_size_is_refused(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_pack_writer, "BATCH_SAMPLES", 3)
    with monkeypatch.context() as patch:
        _interrupt_at(patch, "read", 3)
        with pytest.raises(Interrupted):
            sources.pack(image_folder, tmp_path / "p", shard_bytes=SHARD, progress=False)
    with pytest.raises(DatasetError, match="started with shard size"):
        sources.pack(image_folder, tmp_path / "p", shard_bytes=2 * SHARD, progress=False)


def test_multi_label_targets_and_tar_sources_pack(image_folder: Path, tmp_path: Path) -> None:
    folder = sources.ImageFolder(str(image_folder)).open()
    listing = tmp_path / "tags.tsv"
    lines = [f"{folder.path(i)}\t{i % 4} {(i + 1) % 4}" for i in range(len(folder))]
    listing.write_text("\n".join(lines) + "\n")
    multi = sources.FileList(str(listing), multi_label=True)
    index = sources.pack(multi, tmp_path / "multi", progress=False).open()
    assert index.labels.dtype == np.float32 and np.array_equal(index.labels, multi.open().labels)
    shards = write_tar_shards(image_folder, tmp_path / "shards", per_shard=10)
    index = sources.pack(str(shards[0].parent / "train-*.tar"), tmp_path / "from-tar", progress=False).open()
    assert index.name(11) == "data-00000.bin:train-000001.tar:s00011"
    assert [bytes(b) for b in index.read(np.arange(24))] == [
        Path(folder.path(i)).read_bytes() for i in range(24)
    ]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(fastload.__file__).parent.parent)}
    return subprocess.run(
        [sys.executable, "-m", "fastload", "pack", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_cli(image_folder: Path, packed: Path, tmp_path: Path) -> None:
    dst = tmp_path / "train"
    done = _cli(str(image_folder), str(dst), "--shard-size", "40KiB")
    assert done.returncode == 0, done.stderr
    assert "24/24 samples" in done.stderr
    assert _files(dst) == _files(packed)
    again = _cli(str(image_folder), str(dst), "--shard-size", "40KiB", "--quiet")
    assert again.returncode == 0 and again.stderr == ""
    shards = write_tar_shards(image_folder, tmp_path / "shards", per_shard=10)
    done = _cli(str(shards[0].parent / "train-{000000..000002}.tar"), str(dst), "--quiet")
    assert done.returncode == 1 and "pack of another source" in done.stderr
    missing = _cli(str(tmp_path / "nope"), str(tmp_path / "out"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_a_pack_in_shuffled_order(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Samples stored in an order shuffled once from the seed (a folder is sorted by class): the
    # same bytes and labels, permuted; names still say where each came from; an interrupted pack
    # finishes in the same order, and another seed is refused.
    folder = sources.ImageFolder(str(image_folder)).open()
    whole = sources.pack(image_folder, tmp_path / "whole", shard_bytes=SHARD, progress=False, shuffle_seed=7)
    index = whole.open()
    names = [index.name(i).split(":", 1)[1] for i in range(len(index))]
    order = [folder.path(i) for i in range(len(folder))]
    position = [order.index(str(image_folder / name)) for name in names]
    assert sorted(position) == list(range(len(folder))) and position != sorted(position)
    assert index.labels.tolist() == folder.labels[position].tolist()
    assert [bytes(b) for b in index.read(np.arange(len(index)))] == [folder.read_sample(p) for p in position]
    dst = tmp_path / "resumed"
    interrupted_pack(monkeypatch, image_folder, dst, shard_bytes=SHARD, shuffle_seed=7)
    with pytest.raises(DatasetError, match="shuffle seed 7"):
        sources.pack(image_folder, dst, shard_bytes=SHARD, progress=False, shuffle_seed=8)
    sources.pack(image_folder, dst, shard_bytes=SHARD, progress=False, shuffle_seed=7)
    assert _files(dst) == _files(tmp_path / "whole")
