"""The node cache in a shared `FASTLOAD_CACHE_DIR` (issue 29, item 2): another user's link is never
followed, a swap after the check redirects nothing, and a damaged chunk is fetched again, never
used (NOTE [private directory], NOTE [node cache], NOTE [chunk verification]).

The attacks run as a second uid (a forked child that drops to nobody) against a real HTTP store
of a real pack and tar shards, loaded by a `FastLoader`.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from daemon_helpers import DaemonPool
from helpers import build_folder, write_tar_shards
from remote_helpers import env_without_remote_state, range_http_server

from fastload import DaemonError, DatasetError, FastLoader
from fastload import transforms as T
from fastload.sources import Packed, TarShards, pack
from fastload.sources._storage import chunk_file as _chunk_file
from fastload.sources._storage import remote as _remote
from fastload.sources._storage.node_cache import CHUNK_BYTES, NodeCache, node_cache

pytest.importorskip("aiohttp", reason="http(s) URLs need fastload[remote] (aiohttp)")
pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="drops to a second uid")

NOBODY = 65534
KW: dict[str, Any] = {"batch_size": 4, "transform": [T.Resize(24), T.CenterCrop(24)], "device": "cpu"}


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight images, their pack (several data files) and two tar shards."""
    base = tmp_path_factory.mktemp("node-cache-data")
    folder = build_folder(base / "folder", classes=2, per_class=4)
    pack(str(folder), str(base / "pack"), shard_bytes=20_000)
    write_tar_shards(folder, base / "shards", per_shard=4)
    return base


@pytest.fixture(scope="module")
def store(local: Path) -> Iterator[str]:
    """The base URL of an HTTP server of `local`."""
    with range_http_server(local) as base:
        yield base


@pytest.fixture
def shared() -> Iterator[Path]:
    """A cache root every user may write (a team's scratch directory: mode 0777, not sticky),
    outside pytest's private temporary directory so that the second uid reaches it."""
    env_without_remote_state()
    root = Path(tempfile.mkdtemp(prefix="fastload-shared-cache-"))
    root.chmod(0o777)
    yield root
    env_without_remote_state()
    shutil.rmtree(root)


def _as_another_user(action: Callable[[], None]) -> None:
    """Run `action` in a forked child as uid and gid `NOBODY`, without groups."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            action()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the second user's part failed (its traceback is above)"


def _epoch(source: Any, workers: int = 0, **kw: Any) -> list[list[torch.Tensor]]:
    with FastLoader(source, num_workers=workers, **KW, **kw) as loader:
        return [[t.clone() for t in batch] for batch in loader]


def _same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    pairs = zip(a, b, strict=False)
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in pairs for x, y in zip(p, q, strict=True))


@needs_root
def test_a_link_planted_as_the_users_cache_is_refused_and_nothing_where_it_leads_is_removed(
    local: Path, store: str, shared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The victim's home (0700, as the old check wanted), with a key older than any chunk: the
    # first file LRU eviction removes, if the cache's listing reaches it.
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    home.chmod(0o700)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    os.utime(key, (0, 0))
    mine = shared / f"remote-{os.geteuid()}"
    _as_another_user(lambda: os.symlink(home, mine))  # before the victim's first remote load
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(shared))
    source = Packed(f"{store}/pack", cache_limit=1000)  # every download evicts
    with pytest.raises(DatasetError, match=re.escape(f"{mine} is a symbolic link") + ".*not followed"):
        _epoch(source)
    assert key.read_text().startswith("-----BEGIN OPENSSH")
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == [".ssh", ".ssh/id_ed25519"]
    assert mine.is_symlink()


@needs_root
def test_a_cache_swapped_for_a_link_after_its_check_redirects_nothing(
    local: Path, store: str, shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(shared))
    expected = _epoch(str(local / "pack"))
    url = f"{store}/pack/data-00000.bin"
    size, version = _remote.size_of(url)
    truth = (local / "pack" / "data-00000.bin").read_bytes()
    cache = node_cache()  # the victim's process opens and checks its own cache: all is well
    mine = Path(cache.directory)
    assert mine == shared / f"remote-{os.geteuid()}" and not mine.is_symlink()
    theirs = shared / "theirs"
    name = NodeCache.chunk_name(url, version, 0, CHUNK_BYTES)
    planted = bytes(reversed(truth))  # the attacker's bytes where the victim's image should be

    def swap() -> None:  # then moves the victim's directory aside, and links its name to theirs
        theirs.mkdir(mode=0o755)
        fd = os.open(theirs, os.O_RDONLY | os.O_DIRECTORY)
        _chunk_file.write(fd, name, planted)  # well formed: its digests say it is whole
        os.close(fd)
        os.rename(mine, shared / "moved-aside")
        os.symlink(theirs, mine)

    _as_another_user(swap)
    assert cache.read(url, version, size, 0, size) == truth
    assert _same(_epoch(Packed(f"{store}/pack"), workers=1), expected)
    assert sorted(p.name for p in theirs.iterdir()) == [name]  # nothing written where the link leads
    assert (shared / "moved-aside" / name).is_file()  # the chunks went to the directory checked


def _damage(chunk: Path, how: str) -> None:
    data = bytearray(chunk.read_bytes())
    if how == "flip":
        data[len(data) // 3] ^= 0x01  # inside a sample: a decoder would take it without a word
    elif how == "cut":
        del data[len(data) // 2 :]
    chunk.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["flip", "cut"])
def test_a_damaged_chunk_is_dropped_and_fetched_again(
    local: Path, store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    env_without_remote_state()
    cache_dir = tmp_path / "node-cache"
    source = Packed(f"{store}/pack", cache_dir=str(cache_dir))
    expected = _epoch(str(local / "pack"))
    assert _same(_epoch(source), expected)
    chunks = sorted(p for p in cache_dir.iterdir() if p.is_file())
    assert chunks
    kept = chunks[0].read_bytes()
    _damage(chunks[0], how)
    env_without_remote_state()  # as a new process would
    assert _same(_epoch(source, workers=1), expected)
    assert chunks[0].read_bytes() == kept  # fetched again, as it was


def test_a_damaged_tar_shard_is_fetched_again_before_it_is_scanned(
    local: Path, store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_without_remote_state()
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", "")  # no scan cache: every open scans the shard
    cache_dir = tmp_path / "node-cache"
    source = TarShards(f"{store}/shards/train-{{000000..000001}}.tar", cache_dir=str(cache_dir))
    expected = _epoch(TarShards(str(local / "shards" / "train-{000000..000001}.tar")))
    truth = source.open().labels.copy()
    shard = sorted(p for p in cache_dir.iterdir() if p.is_file())[0]
    data = bytearray(shard.read_bytes())
    data[0:8] = b"planted/"  # the first member's name: its header no longer sums
    shard.write_bytes(bytes(data))
    env_without_remote_state()
    assert (source.open().labels == truth).all()
    assert _same(_epoch(source), expected)


def test_eviction_removes_only_chunks(local: Path, store: str, tmp_path: Path) -> None:
    env_without_remote_state()
    cache_dir = tmp_path / "mine"
    (cache_dir / "notes").mkdir(parents=True)
    cache_dir.chmod(0o700)
    notes = cache_dir / "notes" / "todo.txt"
    notes.write_text("keep\n")
    os.utime(notes, (0, 0))  # older than any chunk
    (cache_dir / "readme").write_text("keep\n")
    os.utime(cache_dir / "readme", (0, 0))
    source = Packed(f"{store}/pack", cache_dir=str(cache_dir), cache_limit=1000)  # every download evicts
    assert _same(_epoch(source), _epoch(str(local / "pack")))
    assert notes.read_text() == "keep\n" and (cache_dir / "readme").read_text() == "keep\n"


def test_a_daemons_peer_cannot_choose_its_cache(
    local: Path, store: str, tmp_path: Path, daemon_pool: DaemonPool
) -> None:
    """A peer's `cache_dir` had the daemon's index opener make and fill a directory of the peer's
    choosing with the daemon's rights (while its workers read through the daemon's own cache: the
    shared index carries no cache settings, issue 30); a peer's `cache_limit` sized it. Both are
    refused, nothing is made there, and the daemon serves the source through its own cache. (Over
    ipc: a TCP daemon's roots take no URLs yet; the check is the same for every peer.)"""
    daemon = daemon_pool.start(workers=1)
    chosen = tmp_path / "the-daemon-users-home" / ".config" / "autostart"
    url = f"{store}/shards/train-000000.tar"
    for fields in ({"cache_dir": str(chosen)}, {"cache_limit": 1 << 50}):
        with pytest.raises(
            DaemonError, match=r"refused: .*own node cache.*leave cache_(dir|limit) out"
        ):
            _epoch(TarShards(url, **fields), daemon=daemon.address)  # type: ignore[arg-type]
    assert not chosen.parent.parent.exists()
    assert _same(
        _epoch(TarShards(url), daemon=daemon.address), _epoch(str(local / "shards" / "train-000000.tar"))
    )
