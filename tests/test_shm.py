"""Shared memory: private segments, a capacity check that says what to do, and no leaks.

Protects the /dev/shm contract: segments are 0600 files with unguessable names; a process that
dies without cleaning up (SIGKILL) has its segments reaped by the next loader, while segments of
live processes and other users are left alone; SIGTERM cleans up on the way out; and a /dev/shm
too small for the ring is a SharedMemoryError naming the size needed and how to get it.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import select
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import SHM_DIR, fastload_segments, live_children, pid_alive, unlink_segments, wait_until
from torch.utils.data import Dataset

import fastload._shm as _shm
from fastload import FastLoader, SharedMemoryError
from fastload import transforms as T
from fastload._paths import reap_engine_dirs

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
    # The advice works: a mount of that size, with what others use now (24 MiB), takes the ring.
    size = int(match.group(1))
    _fake_shm(monkeypatch, free_mib=size - 24, total_mib=size, container=True)
    _shm.preflight(100 << 20)
    # And the other way out is sized: a ring that fits in the named MiB passes as things are.
    fits = re.search(r"until the ring fits in (\d+) MiB", message)
    assert fits is not None, message
    _fake_shm(monkeypatch, free_mib=40, total_mib=64, container=True)
    _shm.preflight(int(fits.group(1)) << 20)


def test_dockers_default_shm_takes_a_small_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    """64 MiB, Docker's default: the head-room is an eighth of it, not all of it."""
    _fake_shm(monkeypatch, free_mib=64, total_mib=64, container=True)
    _shm.preflight(2 << 20)
    _shm.preflight(56 << 20)
    with pytest.raises(SharedMemoryError, match="plus 8 MiB head-room"):
        _shm.preflight(57 << 20)


def test_a_full_shm_does_not_advise_a_smaller_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_shm(monkeypatch, free_mib=4, total_mib=64, container=False)
    with pytest.raises(SharedMemoryError) as info:
        _shm.preflight(2 << 20)
    assert "nearly full: 60 MiB in use" in str(info.value) and "batch_size" not in str(info.value)


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
        it = iter(loader)
        workers = loader.worker_pids
        with pytest.raises(SharedMemoryError, match="--shm-size"):
            next(it)
        # Its workers and statistics block are gone at once, not at close() or a gc.collect().
        assert not fastload_segments(os.getpid())
        assert not any(pid_alive(p) for p in workers)  # joined when the pipeline closed itself
        assert loader.worker_pids == []


def test_folder_loader_with_too_little_shm_fails_before_forking(
    monkeypatch: pytest.MonkeyPatch, image_folder: Path
) -> None:
    _fake_shm(monkeypatch, free_mib=8, total_mib=64, container=False)
    before = set(live_children())
    with pytest.raises(SharedMemoryError, match="remount"):
        FastLoader(
            image_folder, batch_size=512, transform=[T.Resize((224, 224))], num_workers=2, device="cpu"
        )
    assert set(live_children()) == before, "workers were forked for a ring that cannot exist"
    assert not fastload_segments(os.getpid())


def test_engine_socket_dirs_of_dead_processes_are_reaped(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_pid = int(dead.stdout)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = xdg if xdg and os.path.isdir(xdg) else tempfile.gettempdir()
    orphan = Path(tempfile.mkdtemp(prefix=f"fastload-engine-{dead_pid}-", dir=base))
    (orphan / "engine.sock").touch()
    mine = Path(tempfile.mkdtemp(prefix=f"fastload-engine-{os.getpid()}-", dir=base))
    try:
        reaped = reap_engine_dirs()
        assert str(orphan) in reaped and not orphan.exists()
        assert mine.exists(), "a live process's engine directory was removed"
    finally:
        mine.rmdir()


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
    # Its workers notice the trainer is gone (they check every second) and exit: waiting longer
    # than that is a hang guard, for a machine busy with other work.
    assert wait_until(lambda: not any(pid_alive(p) for p in workers), 60)


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
    assert wait_until(lambda: not any(pid_alive(p) for p in workers), 60)  # they check every second


# ---------------------------------------------------------------------------------------------
# File descriptors: before Python 3.13 every mapped slot keeps one fd open (mmap's dup), so a big
# prefetch meets RLIMIT_NOFILE; that must be "too many open files", never "is /dev/shm full?".

FD_SCRIPT = """
import os, resource, sys
from fastload import SharedMemoryError
import fastload._shm as _shm
from fastload._loading.slots.ring import Ring

mode, slots = sys.argv[1], int(sys.argv[2])
if mode == "no-precheck":  # meet the limit in os.open / mmap itself, mid-ring
    _shm.ensure_fd_room = lambda count: None
    import fastload._loading.slots.ring_plan
    fastload._loading.slots.ring_plan.ensure_fd_room = _shm.ensure_fd_room
low = len(os.listdir("/proc/self/fd")) + 24
hard = low if mode in ("hard", "no-precheck") else resource.RLIM_INFINITY
if hard == resource.RLIM_INFINITY:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
try:
    ring = Ring(4096, slots)
except SharedMemoryError as e:
    print("ERROR", str(e).replace("\\n", " "))
else:
    print("OK", len(ring), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    ring.close()
left = [n for n in os.listdir("/dev/shm") if n.startswith(f"fastload_{os.getpid()}_")]
for n in left:
    os.unlink(os.path.join("/dev/shm", n))
print("LEFT", len(left))
"""


def _fd_script(mode: str, slots: int) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", FD_SCRIPT, mode, str(slots)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[1].startswith("LEFT "), done.stdout + done.stderr
    return lines


def _assert_fd_advice(message: str) -> None:
    assert "too many open files" in message, message
    assert "prefetch" in message and "ulimit -n" in message, message
    assert "RLIMIT_NOFILE soft" in message and "hard" in message, message
    assert "/dev/shm full" not in message, message


def test_a_ring_beyond_the_hard_fd_limit_says_open_files_and_leaves_nothing() -> None:
    result, left = _fd_script("hard", 200)
    assert left == "LEFT 0"
    if sys.version_info >= (3, 13):  # trackfd=False: a slot holds no fd, so the ring fits
        assert result.startswith("OK 200"), result
        return
    assert result.startswith("ERROR "), result
    _assert_fd_advice(result)
    assert "needs 200 more file descriptors" in result, result
    assert "one per shared-memory slot" in result, result


def test_running_out_of_fds_mid_ring_says_open_files_and_leaves_nothing() -> None:
    # No pre-check: the limit is met in os.open / mmap after some slots exist; Ring cleans up.
    result, left = _fd_script("no-precheck", 200)
    assert left == "LEFT 0"
    if sys.version_info >= (3, 13):
        assert result.startswith("OK 200"), result
        return
    assert result.startswith("ERROR "), result
    _assert_fd_advice(result)
    assert "one file descriptor open" in result, result


@pytest.mark.skipif(
    sys.version_info >= (3, 13), reason="Python >= 3.13 maps with trackfd=False: slots hold no fd"
)
def test_a_low_soft_fd_limit_is_raised_for_the_ring() -> None:
    import resource

    slots = 500
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < slots + 200:
        pytest.skip(f"the hard RLIMIT_NOFILE ({hard}) is too low to raise the soft one for {slots} slots")
    result, left = _fd_script("soft", slots)
    assert left == "LEFT 0"
    assert result.startswith(f"OK {slots} "), result
    assert int(result.split()[2]) >= slots + _shm.FD_MARGIN, result


def test_ensure_fd_room_raises_the_soft_limit_or_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = [100, 1000]
    set_to: list[tuple[int, int]] = []

    def fake_setrlimit(which: int, new: tuple[int, int]) -> None:
        assert which == _shm.resource.RLIMIT_NOFILE
        set_to.append(new)

    monkeypatch.setattr(_shm, "FDS_PER_SEGMENT", 1)  # what Python < 3.13 keeps per slot
    monkeypatch.setattr(_shm, "_open_fd_count", lambda: 30)
    monkeypatch.setattr(_shm.resource, "getrlimit", lambda which: (limits[0], limits[1]))
    monkeypatch.setattr(_shm.resource, "setrlimit", fake_setrlimit)

    _shm.ensure_fd_room(6)  # 30 + 6 + margin fits under 100: nothing to do
    assert set_to == []
    _shm.ensure_fd_room(300)  # 30 + 300 + 64 = 394: soft raised, within the hard limit
    assert len(set_to) == 1 and 394 <= set_to[0][0] <= 1000 and set_to[0][1] == 1000
    with pytest.raises(SharedMemoryError) as info:
        _shm.ensure_fd_room(2000)  # 30 + 2000 + 64 > hard 1000
    message = str(info.value)
    _assert_fd_advice(message)
    assert "needs 2000 more file descriptors" in message and "30 are open" in message
    assert "soft 100, hard 1000" in message and "ulimit -n 2094" in message
    assert len(set_to) == 1

    monkeypatch.setattr(_shm, "FDS_PER_SEGMENT", 0)  # Python >= 3.13: slots hold no fd
    _shm.ensure_fd_room(2000)


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE])
@pytest.mark.parametrize("action", ["create", "attach"])
def test_fd_exhaustion_in_open_is_too_many_open_files(
    monkeypatch: pytest.MonkeyPatch, code: int, action: str
) -> None:
    existing = _shm.Segment.create(4096) if action == "attach" else None
    real_open = os.open
    calls: list[str] = []

    def fake_open(path: str, *args: int) -> int:
        if os.path.basename(path).startswith("fastload_"):
            calls.append(path)
            raise OSError(code, os.strerror(code), path)
        return real_open(path, *args)

    monkeypatch.setattr(_shm.os, "open", fake_open)
    monkeypatch.setattr(_shm, "_raise_soft_limit", lambda want: True)  # EMFILE: one retry
    try:
        with pytest.raises(SharedMemoryError) as info:
            if existing is None:
                _shm.Segment.create(4096)
            else:
                _shm.Segment.attach(existing.name)
    finally:
        monkeypatch.undo()
        if existing is not None:
            existing.close()
    _assert_fd_advice(str(info.value))
    assert ("process's limit" if code == errno.EMFILE else "system's limit") in str(info.value)
    assert len(calls) == (2 if code == errno.EMFILE else 1)
    assert not fastload_segments(os.getpid())


@pytest.mark.parametrize(
    ("code", "advice"),
    [(errno.EMFILE, "too many open files"), (errno.ENOSPC, "is /dev/shm full?"), (errno.ENOMEM, "/dev/shm")],
)
def test_create_reports_map_failures_by_cause(
    monkeypatch: pytest.MonkeyPatch, code: int, advice: str
) -> None:
    def failing_map(fd: int, size: int, flags: int) -> object:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(_shm, "_map", failing_map)
    monkeypatch.setattr(_shm, "_raise_soft_limit", lambda want: False)
    with pytest.raises(SharedMemoryError, match=re.escape(advice)) as info:
        _shm.Segment.create(4096)
    if code == errno.EMFILE:
        _assert_fd_advice(str(info.value))
    else:
        assert "too many open files" not in str(info.value)
    assert not fastload_segments(os.getpid())  # the half-made segment was unlinked


def test_a_mapped_segment_holds_a_file_descriptor_only_before_python_3_13() -> None:
    before = len(os.listdir("/proc/self/fd"))
    segments = [_shm.Segment.create(4096) for _ in range(20)]
    try:
        held = len(os.listdir("/proc/self/fd")) - before
    finally:
        for segment in segments:
            segment.close()
    assert held == 20 * _shm.FDS_PER_SEGMENT
