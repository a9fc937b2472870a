"""One contract, every source: the same images through a folder, a file list, tar shards, a
packed copy and HDF5 give the same batches; and for each, batches do not depend on the worker
count, a killed worker changes nothing (exactly once), `state_dict` resumes mid-epoch, a block
shuffle works, the reads reach the statistics iostat shows, and ImageFolder's `classes`,
`class_to_idx` and `targets` mean the same.

And every declared kind, found in the registry (`source_kinds()`: a kind another test module
declares is checked too), keeps its declaration's promises (NOTE [a source kind is declared
once]): some plain path means it, each suffix and URL form it declares resolves back to it
through `as_source`, its config round-trips through `source_from_config`, and a kind a daemon
serves names the files it opens (what the daemon's allowlist checks).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from helpers import write_tar_shards

from fastload import FastLoader
from fastload import transforms as T
from fastload._errors import ConfigError, DatasetError
from fastload.sources import (
    DAEMON_SOURCE_KINDS,
    HDF5,
    FileList,
    ImageFolder,
    Mix,
    Naming,
    Source,
    TarShards,
    as_source,
    pack,
    source_from_config,
    source_kinds,
)
from fastload.sources._formats.folder import scan_image_folder
from fastload.sources._formats.hdf5_indexes import HDF5BytesIndex
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._indexes.sample_index import PathIndex

KINDS = ["folder", "file_list", "tar", "packed", "hdf5"]  # with the images below: every kind of the package
# Kinds made of other sources, named by no plain path: their behaviour has its own tests (tests/test_mix.py).
COMPOSED = {"mix": lambda tmp: Mix([str(tmp / "a.tar"), str(tmp / "b.csv")], weights=[2, 1], epoch_size=9)}
DECLARED = sorted(source_kinds())  # at collection: the package's kinds and any a test module declares
TF = [T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ColorJitter(0.3, 0.3)]


@pytest.fixture(scope="module")
def sources(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Source]:
    """The image folder's 24 images, in the folder's order, as every kind of source."""
    root = tmp_path_factory.mktemp("sources")
    index = scan_image_folder(image_folder)
    paths = [index.path(i) for i in range(len(index))]
    listing = root / "list.tsv"
    listing.write_text(
        "".join(f"{p}\t{index.classes[int(y)]}\n" for p, y in zip(paths, index.labels, strict=True))
    )
    shards = write_tar_shards(image_folder, root / "shards", per_shard=5)
    h5 = root / "images.h5"
    with h5py.File(h5, "w") as f:
        data = f.create_dataset("images", (len(paths),), dtype=h5py.vlen_dtype(np.uint8))
        for i, p in enumerate(paths):
            data[i] = np.frombuffer(Path(p).read_bytes(), np.uint8)
        f.create_dataset("labels", data=index.labels)
    return {
        "folder": ImageFolder(str(image_folder)),
        "file_list": FileList(str(listing), classes=index.classes),
        "tar": TarShards([str(s) for s in shards]),
        "packed": pack(image_folder, root / "packed", progress=False),
        "hdf5": HDF5(str(h5)),
    }


def _loader(source: Source, workers: int, **kw: Any) -> FastLoader:
    options: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 11, "device": "cpu", "transform": TF}
    options.update(kw)
    return FastLoader(source, num_workers=workers, **options)


def _epoch(loader: FastLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in loader]


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def _same(a: Batches, b: Batches) -> bool:
    pairs = zip(a, b, strict=False)
    return len(a) == len(b) and all(torch.equal(x, y) and torch.equal(u, v) for (x, u), (y, v) in pairs)


@pytest.fixture(scope="module")
def reference(sources: dict[str, Source]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with _loader(sources["folder"], 0) as loader:
        return _epoch(loader)


@pytest.mark.parametrize("kind", KINDS)
def test_every_source_gives_the_folders_batches_for_any_worker_count(
    sources: dict[str, Source], reference: list[tuple[torch.Tensor, torch.Tensor]], kind: str
) -> None:
    for workers in (0, 2):
        with _loader(sources[kind], workers) as loader:
            assert _same(_epoch(loader), reference), f"{kind} with {workers} workers"


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_worker_changes_nothing(
    sources: dict[str, Source],
    reference: list[tuple[torch.Tensor, torch.Tensor]],
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every read takes 50 ms (forked workers inherit the patch), so the epoch outlasts the
    # engine's liveness checks and the victim still holds tasks when it is killed after the first
    # batch: they are given again to its replacement.
    for index_type in (PathIndex, ExtentIndex, HDF5BytesIndex):
        monkeypatch.setattr(index_type, "read", _slowed(index_type.read))
    with _loader(sources[kind], 2) as loader:
        got = []
        for b, (images, labels) in enumerate(loader):
            got.append((images.clone(), labels.clone()))
            if b == 0:
                victim = loader.worker_pids[0]
                os.kill(victim, signal.SIGKILL)
        assert victim not in loader.worker_pids and len(loader.worker_pids) == 2
    assert _same(got, reference)


def _slowed(read: Callable[..., Any]) -> Callable[..., Any]:
    def slow(*args: Any) -> Any:
        time.sleep(0.05)
        return read(*args)

    return slow


@pytest.mark.parametrize("kind", KINDS)
def test_resume_mid_epoch(
    sources: dict[str, Source], reference: list[tuple[torch.Tensor, torch.Tensor]], kind: str
) -> None:
    with _loader(sources[kind], 1) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    with _loader(sources[kind], 2, seed=0) as resumed:
        resumed.load_state_dict(state)
        assert _same(_epoch(resumed), reference[2:])


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_shuffle_and_sample_ids(sources: dict[str, Source], kind: str) -> None:
    with _loader(
        sources[kind], 2, shuffle_block=4, shuffle_window=1, sample_ids=True, batch_size=4
    ) as loader:
        batches = list(loader)
        stats = loader.stats()
    ids = [batch[2].indices.tolist() for batch in batches]
    assert sorted(i for batch in ids for i in batch) == list(range(24))
    assert all(batch == list(range(batch[0], batch[0] + 4)) for batch in (sorted(b) for b in ids))
    names = batches[0][2].names
    assert names is not None and len(names) == 4 and all(names)
    assert stats is not None and stats.bytes_read > 0 and stats.samples >= 24


@pytest.mark.parametrize("kind", KINDS)
def test_imagefolders_attributes_mean_the_same_for_every_kind(
    sources: dict[str, Source], image_folder: Path, kind: str
) -> None:
    """`targets` is the folder's for every kind holding its images in its order; `class_to_idx`
    indexes whatever `classes` the kind names (none for integer labels: `{}`)."""
    with _loader(sources["folder"], 0) as folder, _loader(sources[kind], 0) as loader:
        assert loader.targets == folder.targets == scan_image_folder(image_folder).labels.tolist()
        assert loader.class_to_idx == {name: i for i, name in enumerate(loader.classes)}
        assert loader.classes in ((), folder.classes)


# -- the declaration, for every declared kind -------------------------------------------------


def test_the_behaviour_above_covers_every_kind_of_the_package() -> None:
    package = {k for k, cls in source_kinds().items() if cls.__module__.startswith("fastload.")}
    assert package == set(KINDS) | set(COMPOSED), "give the contract above an instance of every package kind"


def _example(kind: str, tmp_path: Path) -> Source:
    """A source of `kind`: by a plain path that means it, or, for a composed kind, its example."""
    if kind in COMPOSED:
        return COMPOSED[kind](tmp_path)
    return as_source(_named_path(source_kinds()[kind], tmp_path))


def _named_path(cls: type[Source], tmp_path: Path) -> str:
    """A plain path that means `cls`, by the first form it declares."""
    naming = cls.named_by
    if naming.suffixes:
        return str(tmp_path / f"data{naming.suffixes[0]}")
    if naming.marker:
        (tmp_path / "marked").mkdir()
        (tmp_path / "marked" / naming.marker).write_text("{}")
        return str(tmp_path / "marked")
    if naming.any_local:
        return str(tmp_path)
    assert naming.any_url, f"{cls.kind}: no plain path means it"
    return "s3://bucket/prefix"


@pytest.mark.parametrize("kind", DECLARED)
def test_a_kind_is_declared_completely(kind: str) -> None:
    cls = source_kinds()[kind]
    assert issubclass(cls, Source) and cls.kind == kind
    assert isinstance(cls.named_by, Naming)
    assert (kind in COMPOSED) == cls.named_by.empty, f"{kind}: no plain path means it"
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for declared in (cls.path_fields, cls.quiet_defaults, cls.size_fields, cls.machine_fields):
        assert set(declared) <= fields, f"{kind}: {set(declared) - fields} are not fields"
    assert (kind in DAEMON_SOURCE_KINDS) == cls.served_by_daemon


@pytest.mark.parametrize("kind", DECLARED)
def test_each_form_it_declares_resolves_back_to_it(kind: str, tmp_path: Path) -> None:
    cls = source_kinds()[kind]
    naming = cls.named_by
    for suffix in naming.suffixes:
        assert type(as_source(tmp_path / f"x{suffix.upper()}")) is cls, suffix
        url = f"s3://bucket/x{suffix}"
        if naming.at_urls:
            assert type(as_source(url)) is cls, url
        else:
            refusal = re.escape(naming.url_refusal or "read from local disk only")
            with pytest.raises(DatasetError, match=refusal):
                as_source(url)
    if naming.marker:
        (tmp_path / "marked").mkdir()
        (tmp_path / "marked" / naming.marker).write_text("{}")
        assert type(as_source(tmp_path / "marked")) is cls
    if naming.any_local:
        assert type(as_source(tmp_path)) is cls
        assert type(as_source(tmp_path / "no such path")) is cls
    if naming.any_url:
        assert type(as_source("s3://bucket/some/prefix")) is cls


@pytest.mark.parametrize("kind", DECLARED)
def test_its_config_round_trips(kind: str, tmp_path: Path) -> None:
    source = _example(kind, tmp_path)
    assert source.kind == kind
    assert source_from_config(json.loads(source.to_json())) == source
    assert source.resolved() == source  # a plain path is made absolute by `as_source`


@pytest.mark.parametrize("kind", DECLARED)
def test_a_kind_a_daemon_serves_names_the_files_it_opens(kind: str, tmp_path: Path) -> None:
    path = "" if kind in COMPOSED else _named_path(source_kinds()[kind], tmp_path)
    source = as_source(path) if path else _example(kind, tmp_path)
    if not source.served_by_daemon:
        with pytest.raises(ConfigError, match="a daemon does not serve"):
            source.check_served_by_daemon()
        return
    source.check_served_by_daemon()
    first = next(source.files_before_open())  # the path it was named by, checked first
    assert first.path == path and first.what and path not in first.what


def test_a_declaration_that_contradicts_another_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"declares suffix '\.tar', already declared by kind 'tar'"):

        class _Shards(Source, kind="other_shards", named_by=Naming((".tar",))):
            pass

    with pytest.raises(ConfigError, match="declares its name, already declared by kind 'folder'"):

        class _Folder(Source, kind="folder"):
            pass

    with pytest.raises(ConfigError, match="served by a daemon but names no file it opens"):

        class _Unnamed(Source, kind="unnamed", served_by_daemon=True):
            pass

    assert {"other_shards", "unnamed"}.isdisjoint(source_kinds()) and source_kinds()["folder"] is ImageFolder
