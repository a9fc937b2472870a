"""`fastload serve --workers auto` (NOTE [a pool that follows need] in `_daemon.pool_tuning`): the
pool is sized by its sessions' need — a worker retired while no trainer waits, added back while
one waits with a core idle, never past the cores it started with — and every session's batches
stay what they are with a fixed pool."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from daemon_helpers import DaemonPool, assert_same_batches, local_epoch
from helpers import wait_until

from fastload import FastLoader
from fastload import transforms as T
from fastload._batch_counters import BatchCounters
from fastload._daemon import pool_tuning
from fastload._daemon.control import load_config
from fastload._daemon.pool_tuning import PoolTuner
from fastload._loading.jobs.executor import Done
from fastload._loading.tuning.decisions import Reason
from fastload._loading.tuning.machine_load import MachineSample
from fastload._machine import usable_cores

HANG_S = 120.0


class _Engine:
    """The engine's handles the pool tuner turns, counted."""

    def __init__(self, workers: int) -> None:
        self.active_workers, self.in_flight = workers, 0

    @property
    def worker_pids(self) -> list[int]:
        return list(range(1000, 1000 + self.active_workers))

    def add_worker(self) -> int:
        self.active_workers += 1
        return self.active_workers - 1

    def retire_worker(self) -> int | None:
        if self.active_workers == 1:
            return None
        self.active_workers -= 1
        return self.active_workers


def _idle_machine_every_second() -> Callable[..., MachineSample]:
    """An idle 4-core machine whose clock advances a second per look (an interval per tick)."""
    clock = itertools.count()
    return lambda *_, **__: MachineSample(float(next(clock)), 4, 0.0, 0, 0.0, {})


def _session(wait: float) -> Any:
    """A session with tasks out whose trainer reported waiting `wait` of its time."""
    return SimpleNamespace(pending=[1], client_seq={1: 1}, need=(1.0 + 3.0 * wait, "trainer"))


def _interval(
    tuner: PoolTuner, engine: _Engine, sessions: list[Any], tasks: int, busy_s: float
) -> int | None:
    for _ in range(tasks):
        tuner.record(Done(0, BatchCounters(samples=8, decode_ns=int(busy_s / tasks * 1e9))))
    return tuner.tick(engine, sessions)  # type: ignore[arg-type]


def test_the_pool_shrinks_while_no_trainer_waits_and_grows_back_when_one_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_tuning, "sample_machine", _idle_machine_every_second())
    engine, tuner = _Engine(3), PoolTuner(3, interval_s=0.0)
    seen = [engine.active_workers]
    for _ in range(20):  # trainers that never wait; the pool busy a third of the time
        _interval(tuner, engine, [_session(0.0), _session(0.01)], tasks=40, busy_s=1.0)
        seen.append(engine.active_workers)
    assert engine.active_workers < 3 and tuner.last_reason is Reason.TRAINER_BOUND, seen
    low = engine.active_workers
    for _ in range(30):  # one trainer starves; the workers busy all the time; cores idle
        rate = 20 * engine.active_workers  # each worker more buys its share of tasks
        _interval(tuner, engine, [_session(0.0), _session(0.6)], tasks=rate, busy_s=engine.active_workers)
        seen.append(engine.active_workers)
    assert engine.active_workers > low and max(seen) <= 3, seen  # never past the start (the cores)
    assert tuner.changes >= 2


def test_nothing_is_decided_without_finished_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_tuning, "sample_machine", _idle_machine_every_second())
    engine, tuner = _Engine(2), PoolTuner(2, interval_s=0.0)
    for _ in range(40):  # no sessions: an idle daemon keeps its pool
        assert _interval(tuner, engine, [], tasks=0, busy_s=0.0) is None
    assert engine.active_workers == 2 and tuner.changes == 0


def test_workers_auto_in_the_config_and_on_the_command_line(tmp_path: Path) -> None:
    config, _ = load_config(None, {"workers": "auto"})
    assert (config.workers, config.tune_workers) == (usable_cores(), True)
    config, _ = load_config(None, {"workers": 3})
    assert (config.workers, config.tune_workers) == (3, False)
    toml = tmp_path / "fastload.toml"
    toml.write_text('[daemon]\nworkers = "auto"\n')
    config, _ = load_config(str(toml), {})
    assert config.tune_workers


AUGMENT = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]
KWARGS: dict[str, Any] = {"batch_size": 4, "shuffle": True, "transform": AUGMENT, "device": "cpu"}


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[DaemonPool]:
    daemons = DaemonPool(tmp_path)
    yield daemons
    assert not daemons.close()


@pytest.mark.skipif(usable_cores() < 2, reason="a pool sized by need moves between 1 and the cores: needs 2")
def test_a_daemon_retires_workers_its_trainer_bound_session_does_not_need(
    pool: DaemonPool, image_folder: Path
) -> None:
    cores = usable_cores()
    daemon = pool.start(workers=cores, extra=["--workers", "auto"])
    weights = torch.randn(160, 160)
    first: list[Any] = []
    with FastLoader(image_folder, seed=5, prefetch=4, daemon=daemon.address, **KWARGS) as loader:
        deadline = time.monotonic() + HANG_S

        def shrunk() -> bool:
            return int(daemon.status(timeout_s=5.0)["workers"]) < cores

        for epoch in itertools.count():
            for batch in loader:
                if epoch == 0:
                    first.append([t.clone() for t in batch])
                for _ in range(40):  # a training step far longer than a batch's decode
                    weights.matmul(weights)
            if epoch > 0 and shrunk():
                break
            assert time.monotonic() < deadline, f"the pool kept {cores} workers:\n{daemon.log()}"
    # Retired as not needed, or as the trainer's step queued for a CPU beside the workers.
    assert wait_until(lambda: "retired a worker ->" in daemon.log(), HANG_S), daemon.log()
    assert "it cannot be reached" not in daemon.log()  # a stopped worker is told nothing more
    assert_same_batches(first, local_epoch(image_folder, seed=5, **KWARGS))
