"""Shared memory: private segments, a capacity check that says what to do, and no leaks.

Protects the /dev/shm contract: segments are 0600 files with unguessable names; a process that
dies without cleaning up (SIGKILL) has its segments reaped by the next loader, while segments of
live processes and other users are left alone; SIGTERM cleans up on the way out; and a /dev/shm
too small for the ring is a SharedMemoryError naming the size needed and how to get it.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import SHM_DIR, fastload_segments, pid_alive, unlink_segments, wait_until
from torch.utils.data import Dataset

from fastload import FastLoader, SharedMemoryError, _shm

REPO = Path(__file__).resolve().parents[1]


class Vectors(Dataset[np.ndarray]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(256, i, np.float32)


def _mode(name: str) -> int:
    return stat.S_IMODE(os.stat(os.path.join(SHM_DIR, name)).st_mode)


# ---------------------------------------------------------------------------------------------
# Names and modes


def test_segments_are_private_with_unguessable_names() -> None:
    old_umask = os.umask(0)  # a permissive umask must not widen the mode
    try:
        a, b = _shm.Segment.create(4096), _shm.Segment.create(4096)
    finally:
        os.umask(old_umask)
    try:
        pattern = re.compile(rf"^fastload_{os.getpid()}_[0-9a-f]{{32}}$")
        assert pattern.match(a.name) and pattern.match(b.name)
        assert a.name != b.name
        assert _mode(a.name) == _mode(b.name) == 0o600
        assert os.stat(os.path.join(SHM_DIR, a.name)).st_uid == os.getuid()
        assert _shm.is_private(a.name)
    finally:
        a.close()
        b.close()
    assert not os.path.exists(os.path.join(SHM_DIR, a.name))
    assert not os.path.exists(os.path.join(SHM_DIR, b.name))


def test_a_loaders_ring_is_private() -> None:
    with FastLoader(Vectors(), batch_size=4, num_workers=2) as loader:
        next(iter(loader))
        names = fastload_segments(os.getpid())
        assert len(names) >= 2
        assert all(_mode(n) == 0o600 for n in names)
    assert not fastload_segments(os.getpid())


def test_attach_refuses_names_that_are_not_segments() -> None:
    for name in ("../../etc/passwd", "fastload_1_short", "other_1_" + "0" * 32):
        with pytest.raises(SharedMemoryError):
            _shm.Segment.attach(name)


# ---------------------------------------------------------------------------------------------
# Reaping


def _dead_pid() -> int:
    with subprocess.Popen([sys.executable, "-c", "pass"]) as proc:
        proc.wait()
    assert not pid_alive(proc.pid)
    return proc.pid


@pytest.fixture
def planted() -> Iterator[list[str]]:
    """Segment files a test plants by hand; removed afterwards whatever happens."""
    names: list[str] = []
    yield names
    unlink_segments(names)


def _plant(names: list[str], name: str) -> str:
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.close(fd)
    names.append(name)
    return name


def test_reap_orphans_removes_dead_owners_segments_only(planted: list[str]) -> None:
    dead = _dead_pid()
    orphan = _plant(planted, f"fastload_{dead}_{secrets.token_hex(16)}")
    mine = _plant(planted, f"fastload_{os.getpid()}_{secrets.token_hex(16)}")
    odd = _plant(planted, f"fastload_{dead}_not-a-segment")
    reaped = _shm.reap_orphans()
    assert orphan in reaped
    assert mine not in reaped and odd not in reaped
    assert not os.path.exists(os.path.join(SHM_DIR, orphan))
    assert os.path.exists(os.path.join(SHM_DIR, mine))
    assert os.path.exists(os.path.join(SHM_DIR, odd))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_reap_orphans_leaves_other_users_segments(planted: list[str]) -> None:
    theirs = _plant(planted, f"fastload_{_dead_pid()}_{secrets.token_hex(16)}")
    os.chown(os.path.join(SHM_DIR, theirs), 54321, 54321)
    assert theirs not in _shm.reap_orphans()
    assert os.path.exists(os.path.join(SHM_DIR, theirs))


def test_a_new_loader_reaps_orphans(planted: list[str]) -> None:
    orphan = _plant(planted, f"fastload_{_dead_pid()}_{secrets.token_hex(16)}")
    with FastLoader(Vectors(), batch_size=4, num_workers=0) as loader:
        next(iter(loader))
    assert not os.path.exists(os.path.join(SHM_DIR, orphan))


# ---------------------------------------------------------------------------------------------
# Pre-flight


def _fake_shm(monkeypatch: pytest.MonkeyPatch, free_mib: int, total_mib: int, container: bool) -> None:
    blocks = SimpleNamespace(f_bavail=free_mib * 256, f_frsize=4096, f_blocks=total_mib * 256)
    monkeypatch.setattr(_shm.os, "statvfs", lambda path: blocks)
    monkeypatch.setattr(_shm, "_in_container", lambda: container)


def test_preflight_in_a_container_names_the_size_and_shm_size(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_shm(monkeypatch, free_mib=40, total_mib=64, container=True)
    with pytest.raises(SharedMemoryError) as info:
        _shm.preflight(100 << 20)
    message = str(info.value)
    assert "needs 100 MiB" in message and "40 MiB free of 64 MiB" in message
    match = re.search(r"--shm-size=(\d+)m", message)
    assert match is not None, message
    assert int(match.group(1)) >= 100 + 64  # the ring and the head-room
    assert "batch_size" in message


def test_preflight_outside_a_container_says_how_to_grow_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_shm(monkeypatch, free_mib=40, total_mib=64, container=False)
    with pytest.raises(SharedMemoryError, match="needs 100 MiB") as info:
        _shm.preflight(100 << 20)
    assert "remount" in str(info.value) and "--shm-size" not in str(info.value)


def test_preflight_passes_when_there_is_room(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_shm(monkeypatch, free_mib=1024, total_mib=2048, container=True)
    _shm.preflight(100 << 20)


def test_loader_with_too_little_shm_fails_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_shm(monkeypatch, free_mib=8, total_mib=64, container=True)
    with FastLoader(Vectors(), batch_size=4, num_workers=2) as loader:
        with pytest.raises(SharedMemoryError, match="--shm-size"):
            next(iter(loader))
        # No ring slot was left behind (the loader's statistics block lives until close()).
        assert not {s for s in fastload_segments(os.getpid()) if "_stats_" not in s}


# ---------------------------------------------------------------------------------------------
# A trainer process that dies


CHILD = """
import sys, time
import numpy as np, torch
from fastload import FastLoader

class Vectors(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return np.full(256, i, np.float32)

loader = FastLoader(Vectors(), batch_size=4, num_workers=2)
batch = next(iter(loader))
print(" ".join(map(str, loader.worker_pids)), flush=True)
time.sleep(120)
"""


@pytest.fixture
def trainer() -> Iterator[tuple[subprocess.Popen[str], list[int]]]:
    """A process that holds a running loader (mid-epoch); yields it and its worker pids."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    ) as proc:
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, "the trainer process did not start its loader"
            workers = [int(p) for p in proc.stdout.readline().split()]
            assert len(workers) == 2
            yield proc, workers
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
    # Its workers notice the trainer is gone (they check every second) and exit.
    assert wait_until(lambda: not any(pid_alive(p) for p in workers), 10)


def test_sigterm_cleans_up(trainer: tuple[subprocess.Popen[str], list[int]]) -> None:
    proc, _ = trainer
    owned = fastload_segments(proc.pid)
    assert owned, "the trainer should hold a ring"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM
    assert not fastload_segments(proc.pid)


def test_sigkill_leftovers_are_reaped_by_the_next_loader(
    trainer: tuple[subprocess.Popen[str], list[int]],
) -> None:
    proc, _ = trainer
    proc.kill()
    proc.wait(30)
    left = fastload_segments(proc.pid)
    assert left, "SIGKILL cannot clean up: the segments stay until reaped"
    with FastLoader(Vectors(), batch_size=4, num_workers=0) as loader:
        next(iter(loader))
    assert not fastload_segments(proc.pid)


def test_sigterm_handler_chains_to_the_programs_own(tmp_path: Path) -> None:
    # A trainer with its own SIGTERM handler (say, to save a checkpoint) still gets it called.
    marker = tmp_path / "saved"
    handler = (
        "import os, signal\n"
        "def save(signum, frame):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    os._exit(3)\n"
        "signal.signal(signal.SIGTERM, save)\n"
    )
    script = CHILD.replace("loader = FastLoader", handler + "loader = FastLoader")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        try:
            assert select.select([proc.stdout], [], [], 60)[0]
            workers = [int(p) for p in proc.stdout.readline().split()]
            assert fastload_segments(proc.pid)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 3
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    assert marker.exists()
    assert not fastload_segments(proc.pid)
    assert wait_until(lambda: not any(pid_alive(p) for p in workers), 10)
