"""The daemon's lifecycle under faults: trainers that die, a daemon that dies or is told to stop.

Protects: a trainer killed with SIGKILL has its session and ring reclaimed (its connection
closing says so at once) while another trainer carries on unaware; a trainer restarted from its
last state_dict() continues exactly where it stopped; a daemon killed with SIGKILL makes its
trainers raise DaemonError instead of hanging, and the next daemon on the same socket directory
takes over its stale socket and pid file and reaps its segments; SIGTERM finishes the batches in
flight, exits 0, leaves nothing in /dev/shm, and the trainer then gets a clear DaemonError.

The tests wait for events (a line from a trainer, a session gone, a process exited), never for a
time: their bounds are hang guards, so a machine busy with other work only makes them slower.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from daemon_helpers import RESIZE, Batches, DaemonPool, assert_same_batches, local_epoch, take
from daemon_trainer import make_loader
from helpers import pid_alive, wait_until

from fastload import DaemonError, FastLoader

pytestmark = pytest.mark.timeout(300)  # a regression here tends to be a hang
HANG_S = 60.0  # how long a test waits for something that comes in a few seconds at most
# A trainer subprocess imports torch before its first line: seconds, more on a busy machine.
TRAINER_HANG_S = 120.0

TRAINER = str(Path(__file__).with_name("daemon_trainer.py"))


class Trainer:
    """tests/daemon_trainer.py in a subprocess, its output read line by line (by a thread)."""

    def __init__(self, address: str, data: Path, out: Path, *args: str) -> None:
        out.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, TRAINER, address, str(data), str(out), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, line: str, timeout_s: float = TRAINER_HANG_S) -> None:
        deadline = time.monotonic() + timeout_s
        while line not in self.lines:
            try:
                text = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                text = None
            if text is None:
                self.kill()
                output = "\n".join(self.lines)
                raise AssertionError(f"the trainer never printed {line!r}; its output:\n{output}")
            self.lines.append(text)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)  # reaped at once, as a launcher would: a zombie still looks alive
        self._reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def trainers() -> Any:
    started: list[Trainer] = []

    def start(*args: Any) -> Trainer:
        trainer = Trainer(*args)
        started.append(trainer)
        return trainer

    yield start
    for trainer in started:
        trainer.kill()


def uninterrupted(folder: Path, epochs: int) -> list[Batches]:
    with make_loader(str(folder), None) as loader:
        return [take(loader) for _ in range(epochs)]


# ---------------------------------------------------------------------------------------------
# A trainer dies


def test_killed_trainer_is_reclaimed_and_another_does_not_notice(
    daemon_pool: DaemonPool, image_folder: Path, tmp_path: Path, trainers: Any
) -> None:
    daemon = daemon_pool.start()
    kwargs: dict[str, Any] = {
        "batch_size": 2, "shuffle": True, "seed": 3, "transform": RESIZE, "device": "cpu",
    }
    expected = local_epoch(image_folder, **kwargs)
    with FastLoader(image_folder, num_workers=1, prefetch=4, daemon=daemon.address, **kwargs) as survivor:
        it = iter(survivor)
        got = [[t.clone() for t in next(it)] for _ in range(3)]
        before = daemon.segments()
        victim = trainers(daemon.address, image_folder, tmp_path / "victim", "--pause-after", "2")
        victim.wait_for("paused")  # mid-epoch, with batches in flight
        (session,) = [s for s in daemon.sessions() if s["pid"] == victim.proc.pid]
        ring = daemon.segments() - before
        assert len(ring) == 5, ring  # prefetch 3 + 2 slots
        got += [[t.clone() for t in next(it)] for _ in range(3)]

        victim.kill()
        assert wait_until(lambda: victim.proc.pid not in {s["pid"] for s in daemon.sessions()}, HANG_S), (
            daemon.sessions()
        )
        assert not ring & daemon.segments(), "the dead trainer's ring is still in /dev/shm"
        # Its connection closing says it first; its pid vanishing would, within a second.
        why = rf"its connection closed|trainer pid {victim.proc.pid} is gone"
        assert re.search(rf"session {session['session']} ended \(({why})\)", daemon.log())
        got += [[t.clone() for t in batch] for batch in it]
    assert_same_batches(got, expected)
    # The survivor's bye (or its connection closing) reaches the daemon's loop after close()
    # returns, and a status request may come first: wait for the session to end.
    assert wait_until(lambda: daemon.status()["sessions"] == [], HANG_S), daemon.status()
    assert 0 < daemon.status()["used_bytes"] < 1 << 20  # the dataset's index only


def test_restarted_trainer_resumes_exactly_where_it_stopped(
    daemon_pool: DaemonPool, image_folder: Path, tmp_path: Path, trainers: Any
) -> None:
    daemon = daemon_pool.start()
    out = tmp_path / "run"
    first = trainers(daemon.address, image_folder, out, "--pause-after", "8")  # 6 batches an epoch
    first.wait_for("paused")
    first.kill()
    state = torch.load(out / "state.pt")
    assert (state["epoch"], state["batches_yielded"]) == (1, 2)

    second = trainers(daemon.address, image_folder, out, "--resume")
    second.wait_for("finished")
    assert second.lines[0] == "started 1 2", second.lines
    assert second.proc.wait(HANG_S) == 0
    expected = uninterrupted(image_folder, 2)
    for epoch, batches in enumerate(expected):
        got = [torch.load(out / f"e{epoch}_b{b}.pt") for b in range(len(batches))]
        assert_same_batches(got, batches)
    assert len(list(out.glob("e*_b*.pt"))) == 12


# ---------------------------------------------------------------------------------------------
# The daemon dies


def test_killed_daemon_gives_daemon_error_and_the_next_one_takes_over(
    daemon_pool: DaemonPool, image_folder: Path
) -> None:
    daemon = daemon_pool.start()
    loader = FastLoader(
        image_folder, batch_size=2, transform=RESIZE, device="cpu", num_workers=1, prefetch=4,
        daemon=daemon.address,
    )
    try:
        it = iter(loader)
        next(it)
        ring = daemon.segments()
        assert ring
        daemon.kill()
        # No `timeout`: a trainer that did not notice would wait for ever (the module's timeout).
        with pytest.raises(DaemonError, match=rf"daemon \(pid {daemon.pid}\) is gone.*fastload serve"):
            for _ in it:
                pass
    finally:
        loader.close()
    assert daemon.workers_gone(), "the dead daemon's workers outlived it"
    assert daemon.sock_path.exists() and daemon.pid_path.exists()  # stale: nobody cleaned up
    # Its segments stay until some fastload process of this user reaps them (any may: a
    # benchmark running beside the tests too), at the latest the next daemon.
    assert daemon.segments() <= ring

    successor = daemon_pool.start(daemon.socket_dir)
    assert successor.pid_path.read_text().strip() == str(successor.pid)
    assert not daemon.segments(), "the new daemon did not reap the dead one's segments"
    with FastLoader(
        image_folder, batch_size=2, transform=RESIZE, device="cpu", num_workers=1, daemon=successor.address
    ) as fresh:
        assert len(take(fresh)) == 12


def test_sigterm_finishes_the_batches_in_flight_then_exits_clean(
    daemon_pool: DaemonPool, image_folder: Path
) -> None:
    daemon = daemon_pool.start()
    kwargs: dict[str, Any] = {
        "batch_size": 2, "shuffle": True, "seed": 9, "transform": RESIZE, "device": "cpu",
    }
    expected = local_epoch(image_folder, **kwargs)
    got: Batches = []
    outcome: dict[str, BaseException | None] = {}

    def train(loader: FastLoader) -> None:
        try:
            got.extend(take(loader))  # the epoch the daemon is asked to stop in
            outcome["epoch"] = None
            take(loader)  # the next one: no daemon any more
        except BaseException as e:
            outcome["error"] = e

    with FastLoader(image_folder, num_workers=1, prefetch=12, daemon=daemon.address, **kwargs) as loader:
        thread = threading.Thread(target=train, args=(loader,), daemon=True)
        daemon.signal_workers(signal.SIGSTOP)  # so that the whole epoch is in flight
        try:
            thread.start()
            assert wait_until(lambda: [s["queued"] for s in daemon.sessions()] == [8], HANG_S)
            daemon.proc.send_signal(signal.SIGTERM)
            assert wait_until(lambda: daemon.status()["draining"], HANG_S)
            with pytest.raises(DaemonError, match="shutting down"):
                FastLoader(image_folder, batch_size=2, transform=RESIZE, device="cpu", daemon=daemon.address)
        finally:
            daemon.signal_workers(signal.SIGCONT)
        assert daemon.proc.wait(HANG_S) == 0, daemon.log()
        thread.join(HANG_S)
        assert not thread.is_alive(), "the trainer hangs after the daemon left"
    assert "finishing 4 tasks in flight" in daemon.log()
    assert "epoch" in outcome, f"the batches in flight were not all delivered: {outcome}"
    assert_same_batches(got, expected)
    assert isinstance(outcome.get("error"), DaemonError), outcome
    assert "fastload serve" in str(outcome["error"])
    assert not daemon.segments()
    assert daemon.workers_gone()
    assert not daemon.sock_path.exists() and not daemon.pid_path.exists()
    assert not pid_alive(daemon.pid)
    assert os.listdir(daemon.socket_dir) == []
