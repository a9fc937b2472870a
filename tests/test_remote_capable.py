"""The declared extension point of remote reads: `RemoteCapable` (`sources/_indexes/sample_index.py`).

Every index type a daemon's workers may attach (the `SHARED_INDEX_TYPES` registry, so a new one
is checked without editing this file) implements all of the protocol or none of it: an index
half remote (a `remote` flag and no `node_cache`) is what the former `getattr` probing let by.
The loader finds remote reads only through `remote_reads`: none for a local index, the typed
objects and chunks of a remote one, which keep their entries' text (and so the shared segment's
bytes) and leave the cache settings to the attaching process (issue 29: a daemon uses its own).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from helpers import write_tar_shards
from remote_helpers import range_http_server

import fastload.sources  # noqa: F401  # every index type registers
from fastload.sources import Packed, TarShards, pack
from fastload.sources._formats.folder import scan_image_folder
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._indexes.sample_index import RemoteCapable, remote_reads
from fastload.sources._shared_indexes import SHARED_INDEX_TYPES
from fastload.sources._storage.remote_file import RemoteFile

MEMBERS = sorted(name for name in vars(RemoteCapable) if not name.startswith("_"))


def test_the_protocol_names_what_the_loader_uses() -> None:
    assert MEMBERS == ["node_cache", "remote", "remote_bytes", "remote_chunk_count", "remote_chunks"]


@pytest.mark.parametrize("kind", sorted(SHARED_INDEX_TYPES))
def test_an_index_type_implements_all_of_remote_capable_or_none(kind: str) -> None:
    index_type = SHARED_INDEX_TYPES[kind]
    has = [name for name in MEMBERS if hasattr(index_type, name)]
    assert has in ([], MEMBERS), f"{index_type.__name__} implements {has} of {MEMBERS}"


@pytest.mark.parametrize("kind", sorted(SHARED_INDEX_TYPES))
def test_a_shared_index_type_says_what_it_shares_and_the_files_it_reads(kind: str) -> None:
    """What a daemon needs of an index it shares: its segment both ways, and `files_read` (what
    its allowlist checks, NOTE in `_daemon/confine.py`), declared on the type, never probed."""
    index_type = SHARED_INDEX_TYPES[kind]
    for member in ("to_segment", "from_segment", "files_read"):
        assert callable(getattr(index_type, member, None)), f"{index_type.__name__} lacks {member}"


def test_files_read_names_every_file_a_worker_reads(image_folder: Path, tmp_path: Path) -> None:
    folder = scan_image_folder(image_folder)
    assert [f.path for f in folder.files_read()] == [folder.path(i) for i in range(len(folder))]
    shards = write_tar_shards(image_folder, tmp_path / "shards", per_shard=5)
    tar = TarShards([str(s) for s in shards]).open()
    expected = [(shard, f"data file {k}") for k, shard in enumerate(tar.files)]
    assert [(f.path, f.what) for f in tar.files_read()] == expected


def test_a_local_index_has_no_remote_reads(image_folder: Path, tmp_path: Path) -> None:
    shards = write_tar_shards(image_folder, tmp_path / "shards", per_shard=5)
    local = TarShards([str(s) for s in shards]).open()
    assert isinstance(local, RemoteCapable) and remote_reads(local) is None
    assert local.remote_bytes == 0 and local.remote_chunks(np.arange(len(local))) == []
    assert remote_reads(scan_image_folder(image_folder)) is None  # not remote-capable at all


def test_a_pack_at_a_url_reads_typed_objects_and_chunks(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))  # the default cache, this test's
    pack(image_folder, tmp_path / "served" / "pack", progress=False)
    data = sorted(p for p in (tmp_path / "served" / "pack").iterdir() if p.suffix == ".bin")
    with range_http_server(tmp_path / "served") as base:
        index = Packed(f"{base}/pack", cache_limit="1GiB").open()
        remote = remote_reads(index)
        assert remote is not None and remote.remote_bytes == sum(os.path.getsize(p) for p in data)
        chunks = remote.remote_chunks(np.arange(len(index)))
        objects = {f for f, _ in chunks}
        assert all(isinstance(f, RemoteFile) for f in objects)
        assert {f.url for f in objects} == {f"{base}/pack/{p.name}" for p in data}
        assert index.files == tuple(sorted((f.entry for f in objects), key=index.files.index))
        assert remote.remote_chunk_count == sum(f.chunks for f in objects)
        assert index.cache_limit == 1 << 30
        segment = index.to_segment()
        try:
            attached = ExtentIndex.from_segment(segment)
            # The objects travel as their entries' text; the cache settings do not: the attaching
            # process (a daemon) reads through its own cache.
            assert attached.files == index.files
            assert attached.cache_limit is None and attached.cache_dir is None
            assert remote_reads(attached) is not None
            assert attached.remote_chunks(np.arange(len(index))) == chunks
            assert bytes(attached.read(np.array([0]))[0]) == bytes(index.read(np.array([0]))[0])
            attached.close()
            del attached
        finally:
            segment.close()
