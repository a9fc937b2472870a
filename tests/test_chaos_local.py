"""Fault injection on a local loader: workers killed and stopped from outside, at a rate.

Protects the supervision contract of issue 8: whatever happens to worker processes from outside
(SIGKILL as the OOM killer or an operator sends it, SIGSTOP), the epoch stays exactly-once, no
batch is failed for deaths it did not cause (no false WorkerError), no raw ZeroMQ error reaches
the trainer, a stopped worker is taken as hung and replaced even with `timeout=0`, and a sample
that really crashes its worker is still failed after three tries. The blame policy itself
(`_loading.running.supervision.classify`) is checked on its own, including the OOM-killer case.

Kills come at random times but never faster than the loader makes progress (a batch between two
kills), or exactly when a worker has reached a given sample; no test bounds how long an epoch
takes (a hang is the module's timeout), so a machine busy with other work only makes them slower.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from helpers import Killer, segfault_at
from torch.utils.data import Dataset

from fastload import FastLoader, WorkerError
from fastload._loading.jobs.dataset_job import DatasetJob
from fastload._loading.jobs.executor import Task
from fastload._loading.running.engine import Engine
from fastload._loading.running.supervision import Cause, HangBound, classify

pytestmark = pytest.mark.timeout(120)


class SlowIndexDataset(Dataset[tuple[np.int64, np.ndarray]]):
    """Sample i is (i, [i, i]); each takes `sleep_s`, and `hook(i)` may crash the process."""

    def __init__(self, n: int, sleep_s: float, hook: Callable[[int], None] | None = None) -> None:
        self.n = n
        self.sleep_s = sleep_s
        self.hook = hook

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.int64, np.ndarray]:
        time.sleep(self.sleep_s)
        if self.hook is not None:
            self.hook(i)
        return np.int64(i), np.full(2, i, np.float32)


def _epoch_indices(loader: FastLoader, batches: list[int] | None = None) -> list[int]:
    """One epoch's sample indices; `batches[0]` counts the batches received (a Killer's pace)."""
    seen: list[int] = []
    for index, payload in loader:
        assert torch.equal(payload[:, 0], index.float()), "a batch's rows do not belong together"
        seen += index.tolist()
        if batches is not None:
            batches[0] += 1
    return seen


@pytest.mark.parametrize("workers", [2, 3])
def test_random_sigkills_across_an_epoch_keep_it_exactly_once(workers: int) -> None:
    n = 600
    dataset = SlowIndexDataset(n, sleep_s=0.002)
    received = [0]
    with FastLoader(dataset, batch_size=4, shuffle=True, num_workers=workers, seed=5) as loader:
        killer = Killer(os.getpid(), every_s=0.05, seed=workers, progress=lambda: received[0])
        killer.start()
        epochs: list[list[int]] = []
        try:
            # As many epochs as it takes for 15 kills, however fast this machine loads them.
            while len(killer.sent) < 15 and len(epochs) < 30:
                loader.set_epoch(len(epochs))
                epochs.append(_epoch_indices(loader, received))
        finally:
            killer.stop()
        second = _epoch_indices(loader)  # the replacements serve the next epoch
    assert len(killer.sent) >= 15, f"the killer only sent {len(killer.sent)} signals in {len(epochs)} epochs"
    for seen in epochs:
        assert sorted(seen) == list(range(n)), "a sample was lost or delivered twice"
    assert sorted(second) == list(range(n))


class _Tries:
    """Sample `target` blocks (until killed) the first `kills` times a worker loads it, after
    telling the test which worker: a file per try, named by try and pid."""

    def __init__(self, target: int, kills: int, folder: Path) -> None:
        self.target, self.kills, self.folder = target, kills, folder

    def __call__(self, i: int) -> None:
        if i != self.target:
            return
        try_number = len(list(self.folder.iterdir()))
        (self.folder / f"{try_number}-{os.getpid()}").touch()
        if try_number < self.kills:
            time.sleep(120)  # the test kills this worker long before (a hang guard)

    def wait_for_try(self, number: int, training: Callable[[], bool]) -> int | None:
        """The pid of the worker making try `number` once it has started it; None if training
        stopped first."""
        deadline = time.monotonic() + 60  # a hang guard
        while time.monotonic() < deadline and training():
            for entry in self.folder.iterdir():
                k, pid = entry.name.split("-")
                if int(k) == number:
                    return int(pid)
            time.sleep(0.005)
        assert not training(), f"no worker started try {number} of sample {self.target}"
        return None


def test_sigkilled_workers_do_not_fail_a_batch_that_runs_alone(tmp_path: Path) -> None:
    # The worker loading batch 1 is killed from outside (SIGKILL, no OOM) every time it gets to
    # sample 9, more times than a sample that crashes its worker is tried: each time the batch is
    # re-run, and in the end delivered, never failed with a WorkerError.
    n, kills = 48, 5
    tries = _Tries(target=9, kills=kills, folder=tmp_path)
    dataset = SlowIndexDataset(n, sleep_s=0.001, hook=tries)
    seen: list[int] = []
    errors: list[BaseException] = []

    def train(loader: FastLoader) -> None:  # in a thread: next() is what notices deaths
        try:
            seen.extend(_epoch_indices(loader))
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    with FastLoader(dataset, batch_size=8, num_workers=2, seed=1) as loader:
        trainer = threading.Thread(target=train, args=(loader,), daemon=True)
        trainer.start()
        killed = []
        for number in range(kills):
            pid = tries.wait_for_try(number, trainer.is_alive)
            assert pid is not None, f"the epoch ended after {number} kills: {errors}"
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        trainer.join(60)  # a hang guard
        assert not trainer.is_alive(), "the epoch did not end"
        assert not errors, errors
        assert not set(killed) & set(loader.worker_pids)
    assert sorted(seen) == list(range(n))
    assert len({p.name for p in tmp_path.iterdir()}) == kills + 1  # and the try that succeeded


@pytest.mark.parametrize("timeout", [0, 30])
def test_a_stopped_worker_is_taken_as_hung_and_replaced(timeout: float) -> None:
    n = 80
    dataset = SlowIndexDataset(n, sleep_s=0.005)
    with FastLoader(dataset, batch_size=4, num_workers=2, timeout=timeout, hang_timeout=1.0) as loader:
        it = iter(loader)
        seen = next(it)[0].tolist()
        victim = loader.worker_pids[0]
        os.kill(victim, signal.SIGSTOP)
        # Without the hang bound, next() would wait on the stopped worker for ever (timeout=0:
        # the module's timeout) or raise LoaderTimeout after 30 s.
        for index, _ in it:
            seen += index.tolist()
        assert victim not in loader.worker_pids, "the stopped worker was not replaced"
        assert len(loader.worker_pids) == 2
    assert sorted(seen) == list(range(n))




def test_a_sample_that_crashes_is_still_failed_under_outside_kills() -> None:
    dataset = SlowIndexDataset(200, sleep_s=0.002, hook=segfault_at(9))
    got: list[int] = []
    errors: list[WorkerError] = []
    killer = Killer(os.getpid(), every_s=0.2, seed=3, progress=lambda: len(got) + len(errors))
    with FastLoader(dataset, batch_size=4, num_workers=2) as loader:
        it = iter(loader)
        killer.start()
        try:
            while True:
                try:
                    got += next(it)[0].tolist()
                except StopIteration:
                    break
                except WorkerError as e:
                    errors.append(e)
        finally:
            killer.stop()
    assert killer.sent, "no worker was killed from outside"
    assert len(errors) == 1 and "[8, 9, 10, 11]" in str(errors[0]) and "SIGSEGV" in str(errors[0])
    assert sorted(got) == [i for i in range(200) if not 8 <= i < 12]


def test_sending_to_a_worker_that_just_died_does_not_raise() -> None:
    # ROUTER_MANDATORY makes a send to a vanished peer fail with EHOSTUNREACH; the engine must
    # treat that worker as dead (re-running what it held) instead of raising into the trainer.
    job = DatasetJob(SlowIndexDataset(64, sleep_s=0.0), None, seed=0, batch_size=4)
    engine = Engine({0: job}, num_workers=2, mp_context=None, worker_init_fn=None)
    try:
        probe = Task(0, 0, 0, np.asarray([0], np.int64), "", probe=True)
        engine.submit(probe)
        events: list[object] = []
        deadline = time.monotonic() + 60  # a hang guard, as the ones below
        while not events and time.monotonic() < deadline:
            events += engine.poll(0.1)
        assert events, "no worker became ready"
        while not all(w.ready for w in engine._workers.values()):  # both have said READY
            engine.poll(0.05)
        victim = engine.worker_pids[0]
        os.kill(victim, signal.SIGKILL)
        assert wait_zombie(victim, 60), "the killed worker did not die"
        time.sleep(0.2)  # the ROUTER has seen the connection close: a send would now fail
        tasks = [Task(k + 1, 0, k, np.asarray([k], np.int64), "", probe=True) for k in range(8)]
        for task in tasks:
            engine.submit(task)  # must not raise zmq.ZMQError
        done: set[int] = set()
        deadline = time.monotonic() + 60
        while len(done) < len(tasks) and time.monotonic() < deadline:
            done |= {e.seq for e in engine.poll(0.1) if hasattr(e, "seq")}  # type: ignore[attr-defined]
        assert done == {t.seq for t in tasks}
        assert victim not in engine.worker_pids
        assert engine.deaths[Cause.EXTERNAL] == 1
    finally:
        engine.close()


def wait_zombie(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False


# ---------------------------------------------------------------------------------------------
# The blame policy on its own


@pytest.mark.parametrize(
    ("exitcode", "hung", "oom", "cause"),
    [
        (-signal.SIGSEGV, False, (5, 5), Cause.CRASH),
        (-signal.SIGBUS, False, (5, 5), Cause.CRASH),
        (-signal.SIGABRT, False, (5, 5), Cause.CRASH),
        (3, False, (5, 5), Cause.CRASH),  # os._exit(3) in a Dataset or a native library
        (-signal.SIGKILL, False, (5, 5), Cause.EXTERNAL),  # kill -9 from outside
        (-signal.SIGKILL, False, (5, 6), Cause.CRASH),  # the OOM killer struck meanwhile
        (-signal.SIGKILL, False, (-1, -1), Cause.EXTERNAL),  # no /proc/vmstat: cannot tell
        (-signal.SIGTERM, False, (5, 5), Cause.EXTERNAL),
        (-signal.SIGKILL, True, (5, 5), Cause.HANG),  # the engine killed it for hanging
    ],
)
def test_death_causes(exitcode: int, hung: bool, oom: tuple[int, int], cause: Cause) -> None:
    assert classify(exitcode, hung=hung, oom_kills_before=oom[0], oom_kills_now=oom[1]) is cause


def test_hang_bound_grows_with_measured_sample_times_and_earlier_hangs() -> None:
    bound = HangBound(2.0)
    assert bound.limit_s(64, 0) == 2.0  # nothing measured yet: the floor
    bound.record(6.4, 64)  # 0.1 s per sample
    assert bound.limit_s(64, 0) == pytest.approx(20 * 0.1 * 64)
    assert bound.limit_s(64, 1) == pytest.approx(2 * 20 * 0.1 * 64)
    assert not HangBound(0).enabled
    assert HangBound(None).floor_s == 120.0
