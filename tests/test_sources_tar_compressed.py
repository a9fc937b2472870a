"""Compressed tar shards (`.tar.gz`, `.tgz`, `.tar.xz`, `.tar.bz2`) read through their
decompressed copies (NOTE [decompressed shards] in `sources/_storage/decompressed.py`).

Protects: compressed shards give the batches of the same uncompressed shards bit for bit (0 and
2 workers, by brace pattern, glob and path, samples named after the compressed shard; through a
daemon, whose allowlist checks where the copies are kept); a shard is decompressed once, and
again when it changes (its earlier copy removed), a copy made meanwhile by another process kept;
a decompression bomb is refused before it fills the disk, a corrupt stream named; what stays
refused (zstd, caching off, a cache not private) says why. At a URL: the same batches.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from daemon_helpers import DaemonPool
from helpers import epoch_with_ids, write_tar_shards
from remote_helpers import range_http_server

from fastload import DaemonError, DatasetError, FastLoader, sources
from fastload import transforms as T
from fastload.sources._storage import decompressed

COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    ".tar.gz": gzip.compress, ".tgz": gzip.compress, ".tar.xz": lzma.compress, ".tar.bz2": bz2.compress,
}


@pytest.fixture(scope="module")
def shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The 24-image folder as uncompressed shards of 10, 10 and 4 samples, and beside each its
    copy under every compressed name."""
    plain = write_tar_shards(image_folder, tmp_path_factory.mktemp("shards"), per_shard=10)
    for shard in plain:
        for suffix, compress in COMPRESSORS.items():
            named = shard.with_name(shard.name.removesuffix(".tar") + suffix)
            named.write_bytes(compress(shard.read_bytes()))
    return plain


def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(cache))
    return cache


def _copies(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*") if p.is_file() and "tar-plain-" in str(p))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz"])
def test_compressed_shards_give_the_batches_of_the_plain_ones(
    shards: list[Path], suffix: str, num_workers: int
) -> None:
    directory = shards[0].parent
    pattern = str(directory / "train-{000000..000002}.tar")
    want = epoch_with_ids(sources.TarShards(pattern), 0, seed=7)
    got = epoch_with_ids(sources.TarShards(pattern.removesuffix(".tar") + suffix), num_workers, seed=7)
    assert len(got) == len(want) == 5
    for (images, labels, ids), (want_images, want_labels, want_ids) in zip(got, want, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert torch.equal(ids.indices, want_ids.indices)
        assert ids.names == tuple(name.replace(".tar:", f"{suffix}:") for name in want_ids.names)


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_every_compressed_name_loads_by_path_and_by_glob(shards: list[Path], suffix: str) -> None:
    directory = shards[0].parent
    plain = sources.TarShards(str(directory / "train-*.tar")).open()
    assert isinstance(sources.as_source(str(directory / f"train-000000{suffix}")), sources.TarShards)
    some = np.array([0, 13, 23])
    listed = tuple(str(s).removesuffix(".tar") + suffix for s in shards)
    for paths in (str(directory / f"train-*{suffix}"), listed):
        index = sources.TarShards(paths).open()
        assert index.labels.tolist() == plain.labels.tolist()
        assert [bytes(b) for b in index.read(some)] == [bytes(b) for b in plain.read(some)]
    last = str(directory / f"train-000002{suffix}")
    with FastLoader(last, batch_size=4, num_workers=0, device="cpu", transform=[T.Resize((8, 8))]) as loader:
        assert [labels.tolist() for _, labels in loader] == [plain.labels[20:].tolist()]


def test_a_shard_is_decompressed_once_and_again_when_it_changes(
    shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _own_cache(tmp_path, monkeypatch)
    shard = tmp_path / "one.tar.gz"
    shard.write_bytes(gzip.compress(shards[2].read_bytes()))
    first = sources.TarShards(str(shard)).open()
    (copy,) = _copies(cache)
    assert copy.name == "one.tar.gz" and (copy.stat().st_mode & 0o777) == 0o600
    assert all((d.stat().st_mode & 0o777) == 0o700 for d in (copy.parent, copy.parent.parent))
    made = copy.stat().st_mtime_ns
    again = sources.TarShards(str(shard)).open()
    assert _copies(cache) == [copy] and copy.stat().st_mtime_ns == made  # not decompressed again
    assert again.labels.tolist() == first.labels.tolist()
    shard.write_bytes(gzip.compress(shards[0].read_bytes()))  # replaced: other samples
    changed = sources.TarShards(str(shard)).open()
    (new_copy,) = _copies(cache)  # the earlier version's copy removed
    assert new_copy != copy and new_copy.parent.parent == copy.parent.parent
    assert len(changed) == 10 != len(first)
    assert list(copy.parent.parent.iterdir()) == [new_copy.parent]


def test_a_decompression_bomb_is_refused_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _own_cache(tmp_path, monkeypatch)
    monkeypatch.setattr(decompressed, "MIN_LIMIT_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(gzip.compress(bytes(8 << 20)))  # 8 MiB of zeros in ~8 KiB
    with pytest.raises(DatasetError, match="decompression bomb") as info:
        sources.TarShards(str(bomb)).open()
    assert str(bomb) in str(info.value) and "decompress it yourself" in str(info.value)
    assert _copies(cache) == []  # the temporary is gone
    assert decompressed.plain_limit(1 << 40) == decompressed.MAX_PLAIN_BYTES


@pytest.mark.parametrize("damage", ["truncated", "flipped", "not gzip"])
def test_a_corrupt_stream_is_named(
    shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    cache = _own_cache(tmp_path, monkeypatch)
    data = bytearray(gzip.compress(shards[2].read_bytes()))
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[len(data) // 2] ^= 0xFF
    else:
        data = bytearray(shards[2].read_bytes())  # a plain tar under a .tar.gz name
    shard = tmp_path / "bad.tar.gz"
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="not a readable compressed tar") as info:
        sources.TarShards(str(shard)).open()
    assert str(shard) in str(info.value) and "corrupt or truncated" in str(info.value)
    assert _copies(cache) == []


def test_what_stays_refused_says_why(
    shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = tmp_path / "t.tar.gz"
    shard.write_bytes(gzip.compress(shards[2].read_bytes()))
    for given in ("s3://bucket/t.tar.zst", str(tmp_path / "t.tar.zst")):
        with pytest.raises(DatasetError, match="is a zstd-compressed tar") as info:
            sources.TarShards(given).open()
        assert "`zstd -d`" in str(info.value) and "decompresses only shards named" in str(info.value)
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", "")
    with pytest.raises(DatasetError, match="FASTLOAD_CACHE_DIR is empty"):
        sources.TarShards(str(shard)).open()
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "shared"))
    os.makedirs(tmp_path / "shared" / f"tar-plain-{os.geteuid()}", mode=0o755)
    os.chmod(tmp_path / "shared" / f"tar-plain-{os.geteuid()}", 0o755)
    with pytest.raises(DatasetError, match="is not private"):
        sources.TarShards(str(shard)).open()


def _daemon_epoch(source: sources.TarShards, address: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with FastLoader(
        source, daemon=address, batch_size=5, shuffle=True, seed=7, transform=[T.RandomResizedCrop(32)],
        device="cpu",
    ) as loader:
        return [(images.clone(), labels.clone()) for images, labels in loader]


def test_a_daemon_serves_compressed_shards_only_with_its_cache_under_its_roots(
    shards: list[Path], tmp_path: Path, daemon_pool: DaemonPool
) -> None:
    """The allowlist checks the compressed shard, then where its copy is kept, which workers read
    beneath the roots: a confined daemon whose cache lies outside them refuses, before
    decompressing anything; one whose cache lies under a root serves the plain shards' batches."""
    directory = shards[0].parent
    plain = sources.TarShards(str(directory / "train-{000000..000002}.tar"))
    packed = sources.TarShards(str(directory / "train-{000000..000002}.tar.gz"))
    outside = tmp_path / "outside-cache"
    env = dict(os.environ, FASTLOAD_CACHE_DIR=str(outside))
    confined = daemon_pool.start(workers=1, extra=["--root", str(directory)], env=env)
    with pytest.raises(DaemonError, match="decompressed into") as info:
        _daemon_epoch(packed, confined.address)
    assert str(outside) not in str(info.value) and not outside.exists()
    confined.terminate()
    inside = directory / "daemon-cache"
    env = dict(os.environ, FASTLOAD_CACHE_DIR=str(inside))
    served = daemon_pool.start(tmp_path / "s-in", workers=2, extra=["--root", str(directory)], env=env)
    want = _daemon_epoch(plain, served.address)
    got = _daemon_epoch(packed, served.address)
    assert len(got) == len(want) == 5
    assert len(list(inside.rglob("train-00000?.tar.gz"))) == 3  # the daemon's copies, under the root
    for (images, labels), (want_images, want_labels) in zip(got, want, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_a_copy_made_meanwhile_is_kept_not_replaced(
    shards: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two loaders (ranks of one node) decompressing one shard at once: the copy the first made
    stays, so the index the first made still names the file workers find."""
    cache = _own_cache(tmp_path, monkeypatch)
    shard = tmp_path / "one.tar.gz"
    shard.write_bytes(gzip.compress(shards[2].read_bytes()))
    path, made = decompressed.decompressed_copy(str(shard), "gzip")
    monkeypatch.setattr(decompressed, "_kept", lambda name, dir_fd: None)
    with pytest.raises(DatasetError, match="left the cache"):  # it decompressed again, linked nothing
        decompressed.decompressed_copy(str(shard), "gzip")
    (copy,) = _copies(cache)
    assert str(copy) == path and os.stat(path).st_ino == made[1]
    assert [p.name for p in copy.parent.iterdir()] == ["one.tar.gz"]  # no temporary left


def test_compressed_shards_at_a_url_give_the_batches_of_the_plain_ones(shards: list[Path]) -> None:
    """Read whole through the node cache once, decompressed to a local copy that workers read."""
    directory = shards[0].parent
    want = epoch_with_ids(sources.TarShards(str(directory / "train-{000000..000002}.tar")), 0, seed=7)
    with range_http_server(directory) as base:
        remote = sources.TarShards(f"{base}/train-{{000000..000002}}.tar.xz")
        got = epoch_with_ids(remote, 2, seed=7)
        assert all(not f.startswith("http") for f in remote.open().files)  # the local copies
    assert len(got) == len(want) == 5
    for (images, labels, ids), (want_images, want_labels, want_ids) in zip(got, want, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert ids.names == tuple(name.replace(".tar:", ".tar.xz:") for name in want_ids.names)
