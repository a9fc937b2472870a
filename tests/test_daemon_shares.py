"""A daemon that shares its pool by need (NOTE [shares by need] in `_daemon.shares`, NOTE [need
reports] in `daemon_link`).

Protects: each queued session gets the pool in proportion to priority x need, never less than its
floor, deterministically and without starvation (the policy, and the scheduler feeding a pool);
a trainer reports how much it waits only to a daemon that reads it, and a report with values no
trainer sends is refused with an `error` while its session lives on; `priority` is validated in
the hello; through a real daemon, a starving session's need outweighs a trainer-bound one's, a
priority=0.25 session gets about a quarter of a starving session's samples, and every session's
batches stay those of the same loader alone, bit for bit; `fastload status` shows the shares.

Tests wait for events (a report, a count), never for a time; counts, not timings, are asserted.
"""

from __future__ import annotations

import io
import itertools
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from daemon_helpers import (
    AUGMENT,
    Batches,
    DaemonPool,
    DaemonProcess,
    RawClient,
    answer,
    assert_same_batches,
    hello_fields,
    local_epoch,
)
from helpers import wait_until

from fastload import ConfigError, FastLoader
from fastload._daemon import control
from fastload._daemon.scheduler import Scheduler
from fastload._daemon.sessions import Session, check_hello, check_need
from fastload._daemon.shares import (
    FLOOR_PER_SESSION,
    NEED_GAIN,
    PoolMeter,
    Served,
    StrideShares,
    floored_shares,
    need_of,
    policy_from_environment,
    reserves,
)
from fastload._loading.link import daemon_link as wire
from fastload._loading.link.need_report import NeedReport

pytestmark = pytest.mark.timeout(180)
HANG_S = 60.0


# ---------------------------------------------------------------------------------------------
# The policy


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_picks(weights: dict[int, float], picks: int, samples: int = 4) -> list[int]:
    shares = StrideShares()
    order = []
    for _ in range(picks):
        chosen, share = shares.pick(weights)
        shares.charge(chosen, samples, share)
        order.append(chosen)
    return order


def test_shares_are_in_proportion_to_weights() -> None:
    assert floored_shares({1: 1.0, 2: 0.25}) == pytest.approx({1: 0.8, 2: 0.2})
    order = run_picks({1: 1.0, 2: 0.25}, 1000)
    assert abs(order.count(1) - 800) <= 1 and abs(order.count(2) - 200) <= 1
    order = run_picks({1: 3.0, 2: 2.0, 3: 1.0}, 600)
    assert [order.count(k) for k in (1, 2, 3)] == pytest.approx([300, 200, 100], abs=1)


def test_each_session_gets_at_least_its_floor() -> None:
    shares = floored_shares({1: 100.0, 2: 0.01, 3: 0.01})
    floor = FLOOR_PER_SESSION / 3
    assert shares[2] == shares[3] == pytest.approx(floor)
    assert sum(shares.values()) == pytest.approx(1.0)
    order = run_picks({1: 100.0, 2: 0.01, 3: 0.01}, 1200)
    assert order.count(2) >= 1200 * floor - 1 and order.count(3) >= 1200 * floor - 1


def test_no_session_starves_over_a_long_run() -> None:
    weights = {1: 100.0, 2: 1.0, 3: 0.01, 4: 4.0}
    order = run_picks(weights, 20_000)
    for k in weights:
        at = [i for i, chosen in enumerate(order) if chosen == k]
        gaps = np.diff([-1, *at, len(order)])
        # its floor is 1/16 of the pool: a pick at least every 16 (one more for rounding)
        assert gaps.max() <= 17, (k, gaps.max())


def test_the_policy_is_deterministic() -> None:
    weights = {3: 1.0, 1: 2.5, 2: 0.7}
    assert run_picks(weights, 500) == run_picks(dict(reversed(weights.items())), 500)


def test_shares_are_counted_in_samples_not_tasks() -> None:
    shares = StrideShares()
    got = {1: 0, 2: 0}
    size = {1: 2, 2: 8}  # session 1's tasks are a quarter of session 2's
    for _ in range(1000):
        chosen, share = shares.pick({1: 1.0, 2: 1.0})
        shares.charge(chosen, size[chosen], share)
        got[chosen] += size[chosen]
    assert got[1] == pytest.approx(got[2], abs=8)


def test_an_idle_session_banks_no_credit() -> None:
    shares = StrideShares()
    for _ in range(100):  # session 2 has nothing queued: session 1 runs alone
        chosen, share = shares.pick({1: 1.0})
        shares.charge(chosen, 4, share)
    order = []
    for _ in range(10):
        chosen, share = shares.pick({1: 1.0, 2: 1.0})
        shares.charge(chosen, 4, share)
        order.append(chosen)
    assert order.count(2) == 5, order  # equal weights: it alternates, rather than taking 10 in a row


def test_a_satisfied_session_keeps_what_it_was_served_up_to_an_equal_share() -> None:
    kept = reserves({1: False, 2: True}, {1: 0.8, 2: 0.2})
    assert kept == pytest.approx({2: 0.25})  # HEADROOM x what it was served; a starving one keeps none
    assert floored_shares({1: 4.0, 2: 1.0}, kept) == pytest.approx({1: 0.75, 2: 0.25})  # weights: 0.2
    assert reserves({1: True, 2: True}, {1: 0.9, 2: 0.1}) == pytest.approx({1: 0.5, 2: 0.125})
    shares = floored_shares({1: 1.0, 2: 1.0, 3: 1.0, 4: 9.0}, {1: 0.5, 2: 0.5, 3: 0.5})
    assert sum(shares.values()) == pytest.approx(1.0) and shares[4] >= FLOOR_PER_SESSION / 4
    assert shares[1] == shares[2] == shares[3] > shares[4]  # reserves scaled down to fit


def test_what_a_session_was_served_is_forgotten_over_time() -> None:
    clock = Clock()
    served = Served(clock, half_life_s=1.0)
    served.add(1, 300)
    served.add(2, 100)
    assert served.fractions() == pytest.approx({1: 0.75, 2: 0.25})
    clock.now = 2.0  # two half-lives: 75 and 25 left
    served.add(2, 50)
    assert served.fractions() == pytest.approx({1: 0.5, 2: 0.5})
    served.forget(1)
    assert served.fractions() == {2: 1.0}


def test_a_starving_session_needs_more_and_a_report_wins_over_the_slots() -> None:
    assert need_of(1.0, 0, 8) == (1.0 + NEED_GAIN, "trainer")
    assert need_of(0.0, 8, 8) == (1.0, "trainer")  # slots all in flight, but the trainer does not wait
    assert need_of(None, 8, 8) == (1.0 + NEED_GAIN, "slots")  # every slot in flight: starving
    assert need_of(None, 1, 8)[0] < need_of(None, 7, 8)[0]  # most done and unclaimed: satisfied


def test_the_policy_is_need_unless_the_benchmark_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTLOAD_DAEMON_SHARES", raising=False)
    assert policy_from_environment() == "need"
    monkeypatch.setenv("FASTLOAD_DAEMON_SHARES", "round-robin")
    assert policy_from_environment() == "round-robin"
    monkeypatch.setenv("FASTLOAD_DAEMON_SHARES", "fifo")
    with pytest.raises(ConfigError, match="FASTLOAD_DAEMON_SHARES='fifo': use one of need, round-robin"):
        policy_from_environment()


def test_the_pool_meter_gives_each_session_its_fraction_of_the_work() -> None:
    meter = PoolMeter(interval_s=5.0)
    assert meter.fractions({1: 0, 2: 0}, now=0.0) == {1: 0.0, 2: 0.0}
    assert meter.fractions({1: 300, 2: 100}, now=1.0) == {1: 0.75, 2: 0.25}  # the interval under way
    meter.fractions({1: 600, 2: 200}, now=1e9)  # a whole interval passed: it is what is shown
    assert meter.fractions({1: 600, 2: 1200}, now=1e9 + 1) == {1: 0.75, 2: 0.25}


# ---------------------------------------------------------------------------------------------
# The scheduler feeding a pool


class CountingEngine:
    """The engine's `submit` and `in_flight`, recording whose tasks were submitted, in order."""

    def __init__(self) -> None:
        self.submitted: list[int] = []
        self.in_flight = 0

    def submit(self, task: Any) -> None:
        self.submitted.append(task.job_id)


def make_session(sid: int, slots: int = 64, batch_size: int = 4) -> Session:
    return Session(
        id=sid, identity=b"", sock=None, local=True, pid=1, rank=0, world_size=1, dataset="/d",
        num_samples=1000, segments=dict.fromkeys(f"s{sid}_{k}" for k in range(slots)),  # type: ignore[misc]
        slot_bytes=1, batch_size=batch_size, connection=0, peer="p", index_key="/d",
    )


def queue(scheduler: Scheduler, session: Session, tasks: int) -> None:
    seqs = itertools.count(len(session.client_seq) + 1000 * session.id)
    for k, slot in zip(range(tasks), itertools.cycle(session.segments), strict=False):
        fields = {"slot": slot, "epoch": 0, "batch_index": k, "row": 0, "seq": next(seqs)}
        scheduler.accept(session, fields, [np.arange(session.batch_size, dtype="<i8").tobytes()])


def fed(policy: str, waits: dict[int, float | None], tasks: int = 40) -> list[int]:
    engine = CountingEngine()
    scheduler = Scheduler(engine, workers=1, policy=policy)  # type: ignore[arg-type]
    sessions = [make_session(sid) for sid in waits]
    for session in sessions:
        session.reported_wait = waits[session.id]
        queue(scheduler, session, tasks)
    scheduler.feed(sessions)  # the pool never fills here: it takes every queued task, in order
    return engine.submitted


def test_the_scheduler_runs_a_starving_sessions_tasks_ahead_of_a_satisfied_ones() -> None:
    order = fed("need", {1: 1.0, 2: 0.0})
    first = order[:20]
    assert first.count(1) == 16 and first.count(2) == 4, first  # weights 4 : 1
    assert sorted(order) == [1] * 40 + [2] * 40  # every task runs, once
    assert fed("round-robin", {1: 1.0, 2: 0.0})[:20].count(1) == 10  # the old policy, for benchmarks


def test_the_scheduler_weighs_priority_and_infers_need_from_the_slots() -> None:
    engine = CountingEngine()
    scheduler = Scheduler(engine, workers=1, policy="need")  # type: ignore[arg-type]
    a, b = make_session(1, slots=10), make_session(2, slots=10)
    b.priority = 0.25
    queue(scheduler, a, 10)
    queue(scheduler, b, 10)
    assert a.need == b.need == (1.0 + NEED_GAIN, "slots")  # every slot in flight, no report yet
    scheduler.feed([a, b])
    assert engine.submitted[:10].count(2) == 2, engine.submitted  # 0.8 : 0.2
    assert a.scheduled == b.scheduled == 40


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize("priority", [0, 0.001, 1000, math.nan, math.inf])
def test_a_hello_priority_out_of_range_is_refused(image_folder: Path, priority: float) -> None:
    with pytest.raises(ConfigError, match=r"priority must be a number 0.01..100"):
        check_hello(hello_fields(image_folder, priority=priority), 1 << 30)


def test_a_need_report_of_values_no_trainer_sends_is_refused() -> None:
    session = make_session(1, slots=4)
    for bad in ({"wait": -0.1, "ready": 0}, {"wait": 1.5, "ready": 0}, {"wait": math.nan, "ready": 0},
                {"wait": 0.5, "ready": 5}, {"wait": 0.5, "ready": -1}):
        with pytest.raises(wire.WireError, match="need"):
            check_need(session, bad)
    assert session.reported_wait is None  # nothing of a refused report is kept
    check_need(session, {"wait": 0.25, "ready": 3})
    assert (session.reported_wait, session.reported_ready) == (0.25, 3)
    for fields in ({"wait": "0.5", "ready": 0}, {"wait": True, "ready": 0}, {"wait": 0.5}):
        with pytest.raises(wire.WireError):
            wire.decode(wire.encode("need", **fields))


# ---------------------------------------------------------------------------------------------
# The trainer's reports


def test_a_trainer_reports_only_to_a_daemon_that_reads_it_and_only_what_changed() -> None:
    clock = Clock()
    report = NeedReport(clock, every_s=0.5)
    report.enable_if_read({"sessions": [{"session": 7}]}, 7)  # an older daemon's row: no `need`
    clock.now = 1.0
    assert report.due() is None
    report.enable_if_read({"sessions": [{"session": 3, "need": 1}, {"session": 7, "need": 1.0}]}, 7)
    report.sent(1, "a")
    report.sent(2, "b")
    report.waited(0.4)
    clock.now = 1.2
    assert report.due() is None  # too soon
    clock.now = 1.8
    report.finished(1)
    assert report.due() == {"wait": 0.5, "ready": 1}  # 0.4 s of the 0.8 since the last
    report.waited(0.3)
    clock.now = 2.4
    assert report.due() is None  # the same figures: nothing sent
    report.sent(3, "a")  # slot a is taken and sent into again
    clock.now = 3.0
    assert report.due() == {"wait": 0.0, "ready": 0}


# ---------------------------------------------------------------------------------------------
# Through a daemon


def test_a_bad_need_report_is_refused_and_the_session_lives_on(
    daemon_pool: DaemonPool, image_folder: Path
) -> None:
    daemon = daemon_pool.start(workers=1)
    with RawClient(daemon.address) as client:
        reply = client.call(wire.encode("need", wait=0.5, ready=0))
        assert reply is not None and reply[0] == "error" and "need before hello" in reply[1]["message"]
        reply = answer(client, wire.encode("hello", **hello_fields(image_folder, priority=0.5)))
        assert reply is not None and reply[0] == "welcome", reply
        (row,) = daemon.sessions()
        assert row["need_from"] == "slots" and row["priority"] == 0.5  # no report yet: the slots
        for bad in (b'{"v":1,"op":"need","wait":NaN,"ready":0}', wire.encode("need", wait=2, ready=0)):
            reply = client.call(bad)
            assert reply is not None and reply[0] == "error" and "need.wait" in reply[1]["message"]
        client.send(wire.encode("need", wait=0.75, ready=1))  # a good one: no reply
        assert wait_until(lambda: daemon.sessions()[0]["need_from"] == "trainer", HANG_S)
        (row,) = daemon.sessions()
        assert row["need"] == 1.0 + NEED_GAIN * 0.75 and row["weight"] == pytest.approx(0.5 * row["need"])
        assert row["ready"] == 1
        task = wire.encode("task", seq=1, epoch=0, batch_index=0, slot=reply_slot(client, daemon), row=0)
        reply = client.call(task, np.arange(4, dtype="<i8").tobytes())
        assert reply is not None and reply[0] == "done", reply  # the session serves on
        client.send(wire.encode("bye"))


def reply_slot(client: RawClient, daemon: DaemonProcess) -> str:
    reply = client.call(wire.encode("grow"))
    assert reply is not None and reply[0] == "slot", reply
    return str(reply[1]["name"])


class Trainer:
    """One loader consumed on a thread, epoch after epoch, until `stop`; `work` per batch stands
    for a training step. Keeps its first epoch's batches."""

    def __init__(self, loader: FastLoader, work: Callable[[], None] | None = None) -> None:
        self.loader, self.work = loader, work
        self.first: Batches = []
        self.batches = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for epoch in itertools.count():
                for batch in self.loader:
                    if epoch == 0:
                        self.first.append([t.clone() for t in batch])
                    if self.work is not None:
                        self.work()
                    self.batches += 1
                    if self.stop.is_set() and epoch > 0:
                        return
        except BaseException as e:  # reported by the test
            self.error = e

    def join(self) -> None:
        self.stop.set()
        self.thread.join(HANG_S)
        assert not self.thread.is_alive(), "a trainer hangs"
        assert self.error is None, self.error


@pytest.fixture
def trainers() -> Iterator[list[Trainer]]:
    running: list[Trainer] = []
    yield running
    for trainer in running:
        trainer.stop.set()
    for trainer in running:
        trainer.thread.join(HANG_S)


KWARGS: dict[str, Any] = {"batch_size": 4, "shuffle": True, "transform": AUGMENT, "device": "cpu"}


def rows_by_pid_order(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return sorted(daemon.sessions(), key=lambda row: row["session"])


def test_a_starving_session_outweighs_a_trainer_bound_one_with_the_same_batches(
    daemon_pool: DaemonPool, image_folder: Path, trainers: list[Trainer]
) -> None:
    daemon = daemon_pool.start(workers=2)
    weights = torch.randn(192, 192)

    def step() -> None:  # a training step: CPU work, far longer than a batch's decode
        for _ in range(60):
            weights.matmul(weights)

    with (
        FastLoader(image_folder, seed=1, prefetch=4, daemon=daemon.address, **KWARGS) as starving,
        FastLoader(image_folder, seed=2, prefetch=4, daemon=daemon.address, **KWARGS) as bound,
    ):
        trainers += [Trainer(starving), Trainer(bound, step)]

        def reported() -> bool:
            rows = rows_by_pid_order(daemon)
            return all(r["need_from"] == "trainer" for r in rows) and rows[0]["need"] > rows[1]["need"] + 1
        assert wait_until(reported, HANG_S), daemon.sessions()
        rows = rows_by_pid_order(daemon)
        assert rows[0]["weight"] > rows[1]["weight"] and rows[0]["scheduled"] > rows[1]["scheduled"]
        out = io.StringIO()
        assert control.status(daemon.address, out=out) == 0
        assert "weight  need share" in out.getvalue()
        for trainer in trainers:
            trainer.join()
    assert_same_batches(trainers[0].first, local_epoch(image_folder, seed=1, **KWARGS))
    assert_same_batches(trainers[1].first, local_epoch(image_folder, seed=2, **KWARGS))


def test_a_priority_session_gets_its_weight_of_the_pool_with_the_same_batches(
    daemon_pool: DaemonPool, image_folder: Path, trainers: list[Trainer]
) -> None:
    """Two starving trainers, one at priority=0.25: over a stretch where both have tasks queued,
    the daemon runs about a quarter as many of its samples (round-robin ran as many)."""
    daemon = daemon_pool.start(workers=1)
    with (
        FastLoader(image_folder, seed=1, prefetch=6, daemon=daemon.address, **KWARGS) as training,
        FastLoader(image_folder, seed=2, prefetch=6, daemon=daemon.address, priority=0.25, **KWARGS) as val,
    ):
        trainers += [Trainer(training), Trainer(val)]
        assert wait_until(lambda: all(t.batches >= 3 for t in trainers), HANG_S)
        before = [r["scheduled"] for r in rows_by_pid_order(daemon)]
        assert wait_until(lambda: rows_by_pid_order(daemon)[0]["scheduled"] >= before[0] + 400, HANG_S)
        after = [r["scheduled"] for r in rows_by_pid_order(daemon)]
        ran = [a - b for a, b in zip(after, before, strict=True)]
        assert 0 < ran[1] < 0.6 * ran[0], ran  # 0.25 by the weights; the floor keeps it above 0
        assert [r["priority"] for r in rows_by_pid_order(daemon)] == [1.0, 0.25]
        for trainer in trainers:
            trainer.join()
    assert_same_batches(trainers[0].first, local_epoch(image_folder, seed=1, **KWARGS))
    assert_same_batches(trainers[1].first, local_epoch(image_folder, seed=2, **KWARGS))
