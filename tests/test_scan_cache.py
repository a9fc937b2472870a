"""The tar scan cache cannot be poisoned, redirected or left to grow (NOTE [scan cache trust])."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import write_tar_shards

from fastload import sources
from fastload.sources._storage import scan_cache as _scan_cache
from fastload.sources._storage.scan_cache import ScanCache, entry_dir_name

pytestmark = pytest.mark.hostile

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chowns to a second uid")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(root))
    return root / entry_dir_name()


def test_entries_live_in_a_private_directory_as_private_files(
    image_folder: Path, tmp_path: Path, cache: Path
) -> None:
    (shard,) = write_tar_shards(image_folder, tmp_path / "s", per_shard=24)
    sources.TarShards(str(shard)).open()
    assert cache.stat().st_mode & 0o777 == 0o700
    (entry,) = cache.iterdir()
    assert entry.stat().st_mode & 0o777 == 0o600 and entry.name.endswith(".scan")


@needs_root
def test_a_cache_directory_of_another_user_is_not_trusted(
    image_folder: Path, tmp_path: Path, cache: Path
) -> None:
    # Another user made the directory first and planted an entry saying every label is 7.
    (shard,) = write_tar_shards(image_folder, tmp_path / "s", per_shard=24)
    truth = sources.TarShards(str(shard)).open().labels.copy()
    (entry,) = cache.iterdir()
    scan = ScanCache.open()
    assert scan is not None
    planted = _scan_cache._decode(entry.read_bytes(), _identity(shard))
    assert planted is not None
    planted["labels"] = np.full_like(planted["labels"], 7)
    entry.write_bytes(_scan_cache._encode(planted, _identity(shard)))
    scan.close()
    os.chown(cache, 65534, 65534)
    os.chown(entry, 65534, 65534)
    with pytest.warns(RuntimeWarning, match="not private"):
        labels = sources.TarShards(str(shard)).open().labels
    assert np.array_equal(labels, truth)
    os.chown(cache, 0, 0)
    cache.chmod(0o777)  # ours, but others may write: not trusted either
    with pytest.warns(RuntimeWarning, match="not private"):
        sources.TarShards(str(shard)).open()


def _identity(shard: Path) -> tuple[int, int, int, int, int]:
    from fastload.sources._storage.bounds import identity

    return identity(os.stat(shard))


def test_planted_links_and_fifos_are_neither_followed_nor_waited_on(
    image_folder: Path, tmp_path: Path, cache: Path
) -> None:
    (shard,) = write_tar_shards(image_folder, tmp_path / "s", per_shard=24)
    truth = sources.TarShards(str(shard)).open().labels.copy()
    (entry,) = cache.iterdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    entry.unlink()
    entry.symlink_to(victim)  # read: not followed; written: replaced by rename, victim untouched
    assert np.array_equal(sources.TarShards(str(shard)).open().labels, truth)
    assert victim.read_text() == "precious\n"
    assert not entry.is_symlink()
    entry.unlink()
    os.mkfifo(entry)
    started = time.monotonic()
    assert np.array_equal(sources.TarShards(str(shard)).open().labels, truth)
    assert time.monotonic() - started < 5


def test_a_damaged_or_oversized_entry_is_a_miss(image_folder: Path, tmp_path: Path, cache: Path) -> None:
    (shard,) = write_tar_shards(image_folder, tmp_path / "s", per_shard=24)
    truth = sources.TarShards(str(shard)).open()
    (entry,) = cache.iterdir()
    data = bytearray(entry.read_bytes())
    data[16:24] = (1 << 40).to_bytes(8, "little")  # a key blob declared 1 TiB
    entry.write_bytes(bytes(data))
    assert np.array_equal(sources.TarShards(str(shard)).open().labels, truth.labels)
    with open(entry, "wb") as f:
        f.truncate(_scan_cache.MAX_ENTRY_BYTES + 1)
    assert np.array_equal(sources.TarShards(str(shard)).open().offsets, truth.offsets)


def test_the_cache_is_pruned_least_recently_used_first(
    image_folder: Path, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_scan_cache, "MAX_ENTRIES", 2)
    shards = write_tar_shards(image_folder, tmp_path / "s", per_shard=8)
    assert len(shards) == 3
    sources.TarShards([str(p) for p in shards]).open()
    assert len(list(cache.iterdir())) == 2
    for entry in cache.iterdir():
        entry.unlink()
    (cache / ".leftover.tmp").write_bytes(b"x")  # a killed writer's, an hour old
    os.utime(cache / ".leftover.tmp", (0, 0))
    sources.TarShards(str(shards[0])).open()  # a miss, written: prunes
    names = [p.name for p in cache.iterdir()]
    assert len(names) == 1 and names[0].endswith(".scan")
