"""Faults: what happens when workers die, files are bad, samples raise, or nothing arrives.

Protects the supervision and error-reporting contract: a killed worker is replaced and its
batches re-run, so the epoch stays exactly-once; a bad file or a raising sample becomes a
SampleError that names the file or index and carries the worker's traceback, and the next
batches still come (as with DataLoader); worker_init_fn failures and crash loops become a
WorkerError instead of a hang; `timeout` raises LoaderTimeout; close() always leaves no
worker process and no shared memory behind.

No test bounds how long something takes: "at once, not a hang" is what the module's timeout
checks (a regression here tends to be a hang), so a machine busy with other work only makes
them slower. Where a test needs a sample to hang, it waits for the test to let it go.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import epoch_outcomes, fastload_segments, pid_alive, segfault_at, split_outcomes, wait_until
from torch.utils.data import Dataset

from fastload import FastLoader, LoaderTimeout, SampleError, WorkerError
from fastload import transforms as T
from fastload._loading.running import engine as _engine

pytestmark = pytest.mark.timeout(120)  # a regression here tends to be a hang

TRANSFORM = [T.Resize((24, 24))]


class ToyDataset(Dataset[tuple[np.int64, np.ndarray]]):
    """Sample i is (i, [i, i]); `hook(i)` runs first and may sleep, raise or crash."""

    def __init__(self, n: int, hook: Callable[[int], None] | None = None) -> None:
        self.n = n
        self.hook = hook

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.int64, np.ndarray]:
        if self.hook is not None:
            self.hook(i)
        return np.int64(i), np.full(2, i, np.float32)


def _collect(loader: FastLoader) -> tuple[list[list[torch.Tensor]], list[SampleError]]:
    """Iterate one epoch like a tolerant training loop: keep going past SampleErrors."""
    return split_outcomes(epoch_outcomes(loader))


def _sleep_ms(ms: float) -> Callable[[int], None]:
    def hook(i: int) -> None:
        time.sleep(ms / 1000)

    return hook


# ---------------------------------------------------------------------------------------------
# (a) a worker killed mid-epoch


@pytest.mark.parametrize("victims", ["one", "all"])
def test_killed_worker_is_replaced_and_epoch_stays_exactly_once(victims: str) -> None:
    n = 96
    with FastLoader(ToyDataset(n, _sleep_ms(3)), batch_size=4, shuffle=True, num_workers=2, seed=1) as loader:
        seen: list[int] = []
        killed: list[int] = []
        for k, (index, payload) in enumerate(loader):
            assert torch.equal(payload[:, 0], index.float())
            seen += index.tolist()
            if k == 0:
                pids = loader.worker_pids
                assert len(pids) == 2
                killed = pids[:1] if victims == "one" else pids
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
        assert sorted(seen) == list(range(n))
        survivors = loader.worker_pids
        assert len(survivors) == 2
        assert not set(killed) & set(survivors), "a dead worker was not replaced"
        assert all(pid_alive(pid) for pid in survivors)
        # The replacements serve the next epoch too.
        assert sorted(torch.cat([b[0] for b in loader]).tolist()) == list(range(n))


def test_killed_folder_worker_is_replaced(image_folder: Path) -> None:
    with FastLoader(image_folder, batch_size=2, num_workers=2, transform=TRANSFORM) as loader:
        labels = []
        for k, (_, y) in enumerate(loader):
            labels += y.tolist()
            if k == 0:
                os.kill(loader.worker_pids[0], signal.SIGKILL)
    assert labels == [i // 8 for i in range(24)]


# ---------------------------------------------------------------------------------------------
# (b, c) bad files


@pytest.mark.parametrize(("num_workers", "backend"), [(0, "native"), (2, "native"), (2, "pil")])
def test_corrupt_and_truncated_jpegs_raise_sample_errors_and_iteration_goes_on(
    make_folder: Callable[..., Path], num_workers: int, backend: str
) -> None:
    root = make_folder(classes=2, per_class=6)
    truncated = root / "n00" / "img_002.jpg"
    truncated.write_bytes(truncated.read_bytes()[: len(truncated.read_bytes()) // 2])
    corrupt = root / "n01" / "img_004.jpg"
    corrupt.write_bytes(b"this is not a JPEG at all" * 20)
    with FastLoader(
        root, batch_size=3, num_workers=num_workers, transform=TRANSFORM, backend=backend
    ) as loader:
        batches, errors = _collect(loader)
    # 12 images in 4 batches: batch 0 holds the truncated file, batch 3 the corrupt one.
    assert len(errors) == 2 and len(batches) == 2
    assert [b[1].tolist() for b in batches] == [[0, 0, 0], [1, 1, 1]]
    for error, path, index in ((errors[0], truncated, 2), (errors[1], corrupt, 10)):
        assert error.path == str(path)
        assert str(path) in str(error)
        assert error.index == index
        assert error.worker_traceback.strip()
        assert "Traceback" in error.worker_traceback
        assert error.exc_type and f"{error.exc_type}: " in str(error)
    if backend == "pil":  # the decoder's own words
        assert errors[0].exc_type == "OSError" and "truncated" in str(errors[0])
        assert errors[1].exc_type == "UnidentifiedImageError"


@pytest.mark.parametrize("num_workers", [0, 1])
def test_file_deleted_after_indexing(make_folder: Callable[..., Path], num_workers: int) -> None:
    root = make_folder(classes=1, per_class=4)
    victim = root / "n00" / "img_001.jpg"
    with FastLoader(root, batch_size=2, num_workers=num_workers, transform=TRANSFORM) as loader:
        victim.unlink()
        batches, errors = _collect(loader)
    assert len(batches) == 1 and len(errors) == 1
    assert errors[0].path == str(victim) and str(victim) in str(errors[0])
    assert errors[0].exc_type == "FileNotFoundError"


# ---------------------------------------------------------------------------------------------
# (d) a Dataset that raises


def _raise_at(*bad: int) -> Callable[[int], None]:
    def hook(i: int) -> None:
        if i in bad:
            raise KeyError(f"no sample {i}")

    return hook


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("bad", [6, 0])  # 0: the very first sample, which the layout probe loads
def test_dataset_exception_becomes_sample_error(num_workers: int, bad: int) -> None:
    with FastLoader(ToyDataset(12, _raise_at(bad)), batch_size=4, num_workers=num_workers) as loader:
        batches, errors = _collect(loader)
    assert len(errors) == 1
    error = errors[0]
    assert error.index == bad and error.exc_type == "KeyError"
    assert f"index {bad}" in str(error) and "KeyError" in str(error)
    assert f"no sample {bad}" in error.worker_traceback
    assert error.path == ""
    # The other batches arrive, in order.
    good = [b for b in range(3) if b != bad // 4]
    assert [b[0].tolist() for b in batches] == [list(range(4 * b, 4 * b + 4)) for b in good]


def test_sample_error_is_raised_in_order() -> None:
    # Batches before the failing one are delivered first, even if the failure arrives early.
    slow_then_bad = _raise_at(9)

    def hook(i: int) -> None:
        if i < 4:
            time.sleep(0.05)
        slow_then_bad(i)

    with FastLoader(ToyDataset(12, hook), batch_size=4, num_workers=2) as loader:
        it = iter(loader)
        assert next(it)[0].tolist() == [0, 1, 2, 3]
        assert next(it)[0].tolist() == [4, 5, 6, 7]
        with pytest.raises(SampleError):
            next(it)
        with pytest.raises(StopIteration):
            next(it)


# ---------------------------------------------------------------------------------------------
# (e) worker_init_fn


def _failing_init(worker_id: int) -> None:
    raise RuntimeError(f"cannot initialise worker {worker_id}")


def test_worker_init_fn_error_is_a_worker_error() -> None:
    # No `timeout`: without the WorkerError, next() would wait for ever (the module's timeout).
    with (
        FastLoader(ToyDataset(8), batch_size=2, num_workers=2, worker_init_fn=_failing_init) as loader,
        pytest.raises(WorkerError, match="cannot initialise worker") as info,
    ):
        next(iter(loader))
    assert "RuntimeError" in str(info.value)


def test_worker_init_fn_error_is_a_worker_error_for_folders_too(image_folder: Path) -> None:
    # A folder has no probe: the failure (task -1) was once taken for the probe's reply, and lost.
    with FastLoader(
        image_folder, batch_size=4, num_workers=2, worker_init_fn=_failing_init, device="cpu",
        transform=[T.Resize((8, 8))],
    ) as loader, pytest.raises(WorkerError, match="cannot initialise worker"):
        next(iter(loader))


def test_worker_init_fn_runs_in_each_worker(tmp_path: Path) -> None:
    def init(worker_id: int) -> None:  # written whole, then named: never seen half-written
        (tmp_path / f".worker{worker_id}").write_text(str(os.getpid()))
        os.replace(tmp_path / f".worker{worker_id}", tmp_path / f"worker{worker_id}")

    with FastLoader(ToyDataset(8), batch_size=2, num_workers=2, worker_init_fn=init) as loader:
        assert len(list(loader)) == 4
        # Every worker runs it when it starts, whether or not it got work this epoch.
        assert wait_until(lambda: len(list(tmp_path.glob("worker*"))) == 2, 60)  # a hang guard
        pids = set(loader.worker_pids)
    assert {p.name for p in tmp_path.iterdir()} == {"worker0", "worker1"}
    assert {int(p.read_text()) for p in tmp_path.glob("worker*")} == pids


# ---------------------------------------------------------------------------------------------
# (f) timeout


def _stuck_at(bad: int, gate: Path) -> Callable[[int], None]:
    """Sample `bad` hangs until the test creates `gate` (for 2 minutes at most: a hang guard)."""

    def hook(i: int) -> None:
        if i == bad:
            deadline = time.monotonic() + 120
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.01)

    return hook


def test_timeout_raises_loader_timeout_and_close_still_works(tmp_path: Path) -> None:
    # Sample 5 hangs until let go, so batch 1 cannot come: only the timeout can end next().
    # The first batch must come within the 2 s timeout: it takes milliseconds, so that
    # holds on a busy machine too.
    gate = tmp_path / "let-go"
    loader = FastLoader(ToyDataset(12, _stuck_at(5, gate)), batch_size=4, num_workers=2, timeout=2.0)
    try:
        it = iter(loader)
        assert next(it)[0].tolist() == [0, 1, 2, 3]
        start = time.monotonic()
        with pytest.raises(LoaderTimeout, match=r"timeout of 2 s") as info:
            next(it)
        assert time.monotonic() - start >= 2.0  # not before the timeout (a slow machine only adds)
        assert isinstance(info.value, TimeoutError)
        pids = loader.worker_pids
    finally:
        gate.touch()
        loader.close()
    assert not any(pid_alive(pid) for pid in pids)


def test_no_timeout_when_batches_are_merely_slow() -> None:
    # 80 ms batches, a 5 s timeout: generous enough for a machine busy with other work too.
    with FastLoader(ToyDataset(8, _sleep_ms(40)), batch_size=2, num_workers=1, timeout=5.0) as loader:
        assert len(list(loader)) == 4


# ---------------------------------------------------------------------------------------------
# (g) a sample that crashes every worker that loads it




@pytest.mark.parametrize("num_workers", [1, 2])
def test_crashing_sample_gives_worker_error_naming_it_not_a_hang(num_workers: int) -> None:
    with FastLoader(ToyDataset(40, segfault_at(5)), batch_size=4, num_workers=num_workers) as loader:
        it = iter(loader)
        assert next(it)[0].tolist() == [0, 1, 2, 3]
        with pytest.raises(WorkerError) as info:  # (no `timeout`: a hang would be the module's)
            next(it)
    message = str(info.value)
    assert "batch 1 " in message and "[4, 5, 6, 7]" in message, message
    assert "SIGSEGV" in message


# ---------------------------------------------------------------------------------------------
# (h) close


@pytest.mark.parametrize("when", ["fresh", "mid_epoch", "after_epoch", "after_error"])
def test_close_leaves_no_workers_and_no_segments(when: str) -> None:
    loader = FastLoader(ToyDataset(40, _raise_at(13)), batch_size=4, num_workers=2)
    pids: list[int] = []
    try:
        if when != "fresh":
            it = iter(loader)
            next(it)
            if when == "after_epoch":
                with pytest.raises(SampleError):
                    list(it)
                list(it)
            elif when == "after_error":
                next(it)
                next(it)
                with pytest.raises(SampleError):
                    next(it)
            pids = loader.worker_pids
            assert len(pids) == 2 and all(pid_alive(p) for p in pids)
            assert fastload_segments(os.getpid())
    finally:
        loader.close()
    assert not any(pid_alive(p) for p in pids)  # close() joined them
    assert not fastload_segments(os.getpid())
    assert loader.worker_pids == []
    loader.close()  # twice is fine


@pytest.mark.filterwarnings("ignore:batch_size=.*gives no batches")  # the empty epoch is the point
def test_close_right_after_start_is_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    # An epoch with no batch starts workers that are never asked for anything: close() must stop
    # them, not wait for them to time out. With that wait made an hour, waiting would be a hang
    # (the module's timeout), however busy the machine.
    monkeypatch.setattr(_engine, "_JOIN_TIMEOUT_S", 3600.0)
    loader = FastLoader(ToyDataset(3), batch_size=5, drop_last=True, num_workers=2)
    try:
        assert list(loader) == []
        pids = loader.worker_pids
    finally:
        loader.close()
    assert len(pids) == 2 and not any(pid_alive(p) for p in pids)
