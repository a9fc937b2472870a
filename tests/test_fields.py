"""Samples as declared fields (`TarShards(fields=...)`, issue 31 item 1), loaded locally.

Protects: each field kind end to end (image decoded as without fields, cls as int64 labels,
txt as str, json parsed, any other extension as bytes), dict and tuple batches, the default
(image, label) unchanged by the fields' code, unlabelled shards loading when no label is asked
for, 0 and 2 workers giving the same batches, resume mid-epoch exact, sample_ids, the slot's
ragged capacity (the largest member), a missing member raised naming shard and key or skipped,
and declarations refused with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fields_helpers import (
    AUGMENT,
    FIELDS,
    assert_same_batches,
    caption,
    copied,
    epoch,
    meta,
    write_field_shards,
)
from helpers import epoch_with_ids, resumed_tail

from fastload import ConfigError, DatasetError, FastLoader, SampleError, sources
from fastload import transforms as T
from fastload.sources._formats import tar_scan


@pytest.fixture(scope="module")
def field_shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("fields")
    write_field_shards(directory, image_folder)
    return str(directory / "train-{000000..000002}.tar")


def test_every_kind_of_field_end_to_end(image_folder: Path, field_shards: str) -> None:
    plain = epoch_with_ids(sources.TarShards(field_shards), 0, seed=7)
    got = epoch(sources.TarShards(field_shards, fields=FIELDS), 0, sample_ids=True)
    assert len(got) == len(plain) == 5
    for batch, (images, labels, plain_ids) in zip(got, plain, strict=True):
        ids = batch.pop("sample_ids")
        assert list(batch) == list(FIELDS)
        indices = ids.indices.tolist()
        assert indices == plain_ids.indices.tolist()
        assert torch.equal(batch["image"], images) and torch.equal(batch["label"], labels)
        assert batch["label"].dtype == torch.int64
        assert batch["text"] == [caption(i) for i in indices]
        assert batch["meta"] == [meta(i) for i in indices]
        assert batch["raw"] == [bytes(range(i % 256)) * 3 for i in indices]


def test_a_sequence_gives_lists_in_its_order(field_shards: str) -> None:
    got = epoch(sources.TarShards(field_shards, fields=("txt", "jpg;jpeg;png")), 0, sample_ids=True)
    for text, images, ids in got:
        assert text == [caption(i) for i in ids.indices.tolist()]
        assert images.shape == (len(text), 3, 32, 32) and images.dtype == torch.uint8


def test_the_default_is_unchanged_by_extra_members(image_folder: Path, field_shards: str) -> None:
    # Shards holding captions and metadata load as (image, label) without fields=, as the folder.
    want = epoch_with_ids(image_folder, 0, seed=7)
    got = epoch_with_ids(sources.TarShards(field_shards), 0, seed=7)
    for (images, labels, _), (want_images, want_labels, _) in zip(got, want, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_unlabelled_shards_load_without_a_label_field(image_folder: Path, tmp_path: Path) -> None:
    write_field_shards(tmp_path, image_folder, label_as=None)
    pattern = str(tmp_path / "train-{000000..000002}.tar")
    with pytest.raises(DatasetError, match="label"):
        sources.TarShards(pattern).open()
    source = sources.TarShards(pattern, fields={"image": "jpg;jpeg;png", "text": "txt"})
    index = source.open()
    assert index.classes == () and (index.labels == -1).all()
    batches = epoch(source, 0)
    assert sum(len(b["text"]) for b in batches) == 24 and set(batches[0]) == {"image", "text"}
    with FastLoader(source, batch_size=5, transform=AUGMENT, device="cpu") as loader:
        assert list(loader.classes) == [] and loader.class_to_idx == {}


def test_workers_and_resume_give_the_same_batches(field_shards: str) -> None:
    source = sources.TarShards(field_shards, fields=FIELDS)
    alone = epoch(source, 0)
    with_workers = epoch(source, 2)
    assert_same_batches(alone, with_workers)
    options: dict[str, Any] = {"batch_size": 5, "shuffle": True, "transform": AUGMENT, "device": "cpu"}
    assert_same_batches(alone[2:], resumed_tail(source, options, copied))


def test_the_slot_holds_the_largest_member_per_row(field_shards: str) -> None:
    index = sources.TarShards(field_shards, fields=FIELDS).open()
    fields = index.fields
    assert fields is not None and fields.names == tuple(FIELDS)
    largest = max(len(caption(i).encode()) for i in range(24))
    assert fields.capacity(0) == largest
    assert fields.capacity(1) == max(len(json.dumps(meta(i))) for i in range(24))


def test_a_missing_member_is_named_or_skipped(image_folder: Path, tmp_path: Path) -> None:
    write_field_shards(tmp_path, image_folder, drop=((13, ".txt"),))
    source = sources.TarShards(str(tmp_path / "train-{000000..000002}.tar"), fields=FIELDS)
    with pytest.raises(SampleError, match=r"train-000001\.tar:s00013.*'text'"):
        epoch(source, 0, shuffle=False)
    with pytest.warns(UserWarning, match=r"s00013.*no member for field 'text'"):
        skipped = epoch(source, 0, shuffle=False, on_error="skip", sample_ids=True)
    texts = [t for batch in skipped for t in batch["text"]]
    assert 13 not in torch.cat([b["sample_ids"].indices for b in skipped]).tolist()
    assert len(texts) == 24 and caption(13) not in texts


def test_declarations_are_checked_when_made(field_shards: str) -> None:
    for bad, reason in (
        ({"text": "txt"}, "exactly one image"),
        ({"a": "jpg", "b": "png"}, "exactly one image"),
        ({"image": "jpg;txt"}, "mixes kinds"),
        ({"image": "jpg", "a": "cls", "b": "cls"}, "at most one label"),
        ("jpg", "a dict"),
        ({"image": "jpg", "x": "a/b"}, "member extensions"),
        ({"image": "jpg", "x" * 300: "txt"}, "member extensions"),
        ({"image": "jpg", "sample_ids": "txt"}, "name the field otherwise"),
        ({"image": "jpg", "a=b": "txt"}, "no '='"),
    ):
        with pytest.raises(ConfigError, match=reason):
            sources.TarShards(field_shards, fields=bad)  # type: ignore[arg-type]


def test_mixup_needs_a_label_field(field_shards: str) -> None:
    source = sources.TarShards(field_shards, fields={"image": "jpg;jpeg;png", "text": "txt"})
    with pytest.raises(ConfigError, match="label"):
        FastLoader(
            source, batch_size=4, transform=[T.RandomResizedCrop(32), T.MixUp(num_classes=3)], device="cpu",
            normalize=((0.5, 0.5, 0.5), (0.2, 0.2, 0.2)),
        )  # fmt: skip


def test_normalized_batches_without_a_label(field_shards: str) -> None:
    # Float slots (the workers normalize and erase) and the trainer's stages with no label leaf.
    source = sources.TarShards(field_shards, fields={"image": "jpg;jpeg;png", "text": "txt"})
    chain = [*AUGMENT, T.RandomErasing(p=1.0)]
    normalize = ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    batches = epoch(source, 2, normalize=normalize, transform=chain, sample_ids=True)
    for batch in batches:
        assert batch["image"].dtype == torch.float32 and batch["image"].shape[1:] == (3, 32, 32)
        assert batch["text"] == [caption(i) for i in batch["sample_ids"].indices.tolist()]


def test_fields_scans_are_cached_apart_from_plain_ones(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    write_field_shards(tmp_path / "shards", image_folder, drop=((3, ".json"),))
    pattern = str(tmp_path / "shards" / "train-{000000..000002}.tar")
    scans: list[str] = []
    real = tar_scan._scan_shard

    def counted(shard: str, *args: Any) -> int:
        scans.append(shard)
        return real(shard, *args)

    monkeypatch.setattr(tar_scan, "_scan_shard", counted)
    unlabelled = {"image": "jpg;jpeg;png", "meta": "json"}
    first = sources.TarShards(pattern, fields=unlabelled).open()
    plain = sources.TarShards(pattern, fields=("jpg;jpeg;png", "cls", "txt")).open()
    assert len(scans) == 6  # each declaration scanned once
    again = sources.TarShards(pattern, fields=unlabelled).open()
    assert len(scans) == 6  # from the cache: labels -1 and a missing member's -1 kept
    assert first.fields is not None and again.fields is not None and plain.fields is not None
    assert np.array_equal(first.fields.sizes, again.fields.sizes) and again.fields.sizes[0, 3] == -1
    assert np.array_equal(first.labels, again.labels) and (again.labels == -1).all()
    assert (plain.labels >= 0).all() and plain.fields.names == ("jpg;jpeg;png", "cls", "txt")
