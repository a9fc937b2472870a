"""NOTE [the tuner's policy] (`tuning.controller`) on simulated intervals: it converges, damps,
never leaves its limits, follows a CPU burner coming and going, backs off a change that buys
nothing; and `from_stats` turns two real statistics-block snapshots into an interval."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from fastload import ConfigError
from fastload._loading.running.stats import StatsWriter
from fastload._loading.tuning import controller as policy
from fastload._loading.tuning.controller import Controller, Limits
from fastload._loading.tuning.decisions import Decision, Reason
from fastload._loading.tuning.machine_load import MachineSample
from fastload._loading.tuning.observation import Observation, from_stats


@dataclass
class Machine:
    """A loader on a machine, in one line of arithmetic per quantity: the rate is the least of the
    workers' decoding (each a fair share of the cores), the storage, the window and the trainer;
    noise from a seeded RNG."""

    cores: int = 4
    per_worker: float = 40.0  # batches/s one worker decodes on a whole core
    trainer_rate: float = 10_000.0  # batches/s the trainer could take (a huge one: it only consumes)
    trainer_cpu: float = 0.1  # cores the trainer's process uses at its full rate
    storage_rate: float = float("inf")  # batches/s the storage delivers, whatever the workers
    window_rate: float = float("inf")  # batches/s one batch in flight allows (latency-bound)
    burner: float = 0.0  # cores another process wants
    # Batches split across the workers (a Dataset's, a source's): two in flight keep them all
    # busy, one leaves them idle half the time; else one batch per worker (an iterable stream).
    split: bool = True
    noise: float = 0.03
    seed: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def _jitter(self, x: float) -> float:
        return max(x * (1 + self.rng.gauss(0, self.noise)), 0.0)

    def interval(self, workers: int, in_flight: int, seconds: float = 1.0) -> Observation:
        want = workers + self.trainer_cpu + self.burner
        share = min(1.0, self.cores / want)
        fed = min(1.0, in_flight / policy.FED_WINDOW) * workers if self.split else min(workers, in_flight)
        decode = fed * self.per_worker * share
        supply = min(decode, self.storage_rate)
        steady = min(supply, in_flight * self.window_rate, self.trainer_rate)
        rate = self._jitter(steady)
        busy = workers * seconds * min(rate / supply, 1.0)  # blocked on storage counts as busy
        workers_cores = rate / self.per_worker
        trainer_cores = self.trainer_cpu
        runnable = steady / (self.per_worker * share) + trainer_cores + self.burner  # noise-free
        wait = max(0.0, 1 - steady / self.trainer_rate) + abs(self.rng.gauss(0, 0.005))
        decoding = min(in_flight, policy.FED_WINDOW) if self.split else min(workers, in_flight)
        window_bound = in_flight * self.window_rate <= min(supply, self.trainer_rate)
        trainer_bound = self.trainer_rate <= min(supply, in_flight * self.window_rate)
        ready = in_flight - decoding if (trainer_bound or window_bound) else 0
        return Observation(
            seconds=seconds,
            batches=int(rate * seconds),
            trainer_wait_s=min(wait, 1.0) * seconds,
            workers_busy_s=self._jitter(busy),
            slot_wait_s=0.0,
            ready_batches=ready,
            decoding_batches=decoding,
            in_flight_limit=in_flight,
            workers=workers,
            usable_cores=self.cores,
            machine_busy_cores=min(self._jitter(workers_cores + trainer_cores + self.burner), self.cores),
            trainer_cores=trainer_cores,
            workers_cores=workers_cores,
            pressure=min(1.0, max(0.0, runnable - self.cores)),
        )


def run(machine: Machine, ctl: Controller, intervals: int) -> Iterator[tuple[Observation, Decision | None]]:
    """Feed `intervals` intervals; each decision is applied before the next (as the tuner does)."""
    for _ in range(intervals):
        obs = machine.interval(ctl.workers, ctl.in_flight)
        yield obs, ctl.observe(obs)


def limits(cores: int = 4, **kw: object) -> Limits:
    return Limits(**{"min_workers": 1, "max_workers": cores, "min_in_flight": 1, "max_in_flight": 32, **kw})  # type: ignore[arg-type]


def test_decode_bound_reaches_the_cores_and_stays() -> None:
    ctl = Controller(limits(), workers=1, in_flight=3)
    history = [(ctl.workers, d) for _, d in run(Machine(seed=1), ctl, 200)]
    first_at_4 = next(i for i, (w, _) in enumerate(history) if w == 4)
    assert first_at_4 <= 8  # three steps of settle + verify
    assert all(w == 4 for w, _ in history[first_at_4:])
    reasons = [d.reason for _, d in history if d is not None]
    # Each new worker comes with a batch more in flight; once no more can be added, the window
    # the busy workers do not need is given back (split batches: two feed them all).
    assert reasons == [Reason.DECODE_BOUND] * 3 + [Reason.WINDOW_DEEP]  # straight to the floor
    assert ctl.in_flight == policy.FED_WINDOW


def test_a_verdict_is_read_off_enough_batches() -> None:
    # 40 batches a second, 20 once the window is too small (an iterable stream's): the interval
    # after the shrink settles has 20 batches, so the verdict waits for two more (60 >= 48).
    ctl = Controller(limits(), workers=4, in_flight=8)
    machine = Machine(split=False, per_worker=10.0, noise=0.0)
    decisions = [(i, d.reason) for i, (_, d) in enumerate(run(machine, ctl, 10)) if d is not None]
    (shrunk, deep), (undone, no_gain) = decisions[:2]
    assert (deep, no_gain) == (Reason.WINDOW_DEEP, Reason.NO_GAIN)
    assert undone - shrunk == policy.SETTLE_INTERVALS + 3


def test_an_iterable_streams_window_stays_at_a_batch_per_worker() -> None:
    # Batches not split: fewer in flight than workers idles one; each trial below is undone, and
    # tried ever more rarely.
    ctl = Controller(limits(), workers=4, in_flight=8)
    history = [(ctl.in_flight, d) for _, d in run(Machine(split=False, seed=3), ctl, 200)]
    assert ctl.workers == 4 and ctl.in_flight == 4
    assert sum(window < 4 for window, _ in history) <= 20
    undone = [i for i, (_, d) in enumerate(history) if d is not None and d.reason is Reason.NO_GAIN]
    gaps = [b - a for a, b in itertools.pairwise(undone)]
    # The floor tried once, then the step below a batch per worker, held off longer each time.
    assert 2 <= len(undone) <= 8 and gaps[1:] == sorted(gaps[1:])


def test_trainer_bound_retires_to_the_fewest_that_keep_the_rate() -> None:
    # The trainer takes 60 batches/s; each worker decodes 40: two workers keep up, one does not.
    machine = Machine(trainer_rate=60.0, seed=2)
    ctl = Controller(limits(), workers=4, in_flight=16)
    decisions = [d for _, d in run(machine, ctl, 200) if d is not None]
    assert ctl.workers == 2
    assert Reason.TRAINER_BOUND in {d.reason for d in decisions}
    assert ctl.in_flight == 2 + policy.WINDOW_MARGIN  # the unused window given back too
    assert Reason.WINDOW_UNUSED in {d.reason for d in decisions}
    assert len(decisions) <= 8  # each step taken once: no retire-add-retire cycles


@pytest.mark.parametrize("seed", range(5))
def test_noisy_stats_do_not_make_it_oscillate(seed: int) -> None:
    machine = Machine(noise=0.08, trainer_rate=100.0, seed=seed)  # best: 3 workers, near the edge
    ctl = Controller(limits(), workers=1, in_flight=4)
    counts = [ctl.workers for _ in run(machine, ctl, 200)]
    changes = sum(a != b for a, b in itertools.pairwise(counts))
    assert changes <= 12
    assert counts[-50:].count(counts[-1]) >= 45  # settled, not wandering


@pytest.mark.parametrize("seed", range(20))
def test_it_never_leaves_its_limits(seed: int) -> None:
    rng = random.Random(seed)
    cores = rng.choice([1, 2, 4, 8, 16])
    lim = Limits(
        min_workers=1,
        max_workers=rng.randint(1, 24),
        min_in_flight=rng.randint(1, 4),
        max_in_flight=rng.randint(4, 40),
    )
    machine = Machine(
        cores=cores,
        per_worker=rng.uniform(5, 80),
        trainer_rate=rng.uniform(5, 500),
        storage_rate=rng.choice([float("inf"), rng.uniform(10, 300)]),
        window_rate=rng.choice([float("inf"), rng.uniform(2, 50)]),
        noise=0.1,
        seed=seed,
    )
    ctl = Controller(lim, workers=1, in_flight=lim.min_in_flight)
    previous: Decision | None = None
    for i, (_, decision) in enumerate(run(machine, ctl, 300)):
        if i % 50 == 25:
            machine.burner = rng.uniform(0, cores)
        assert lim.min_workers <= ctl.workers <= max(min(lim.max_workers, cores), lim.min_workers)
        assert lim.min_in_flight <= ctl.in_flight <= lim.max_in_flight
        assert not (decision is not None and previous is not None)  # a measured interval between
        previous = decision


def test_a_cpu_burner_coming_and_going_is_followed() -> None:
    machine = Machine(seed=3)
    ctl = Controller(limits(), workers=1, in_flight=3)
    list(run(machine, ctl, 20))
    assert ctl.workers == 4
    machine.burner = 2.0  # a process wanting two of the four cores
    during = [(ctl.workers, d) for _, d in run(machine, ctl, 40)]
    first_calm = next(i for i, (w, _) in enumerate(during) if w == 2)
    assert first_calm <= 6
    assert all(w == 2 for w, _ in during[first_calm:])  # no run-queue storm, no re-adding into it
    assert Reason.OVERSUBSCRIBED in {d.reason for _, d in during if d is not None}
    machine.burner = 0.0
    after = [ctl.workers for _ in run(machine, ctl, 40)]
    assert after.index(4) <= 8
    assert after[after.index(4) :].count(4) == len(after) - after.index(4)


def test_a_queue_of_its_own_is_not_retired_for() -> None:
    # As many workers as cores and the trainer's process beside them: PSI reads a queue, but no
    # other process makes it; a worker less would cost a quarter of the rate.
    machine = Machine(trainer_cpu=0.4, seed=5)
    ctl = Controller(limits(), workers=4, in_flight=6)
    seen = list(run(machine, ctl, 60))
    assert all(obs.pressure is not None and obs.pressure >= policy.PRESSURE_HIGH for obs, _ in seen)
    assert ctl.workers == 4
    assert Reason.OVERSUBSCRIBED not in {d.reason for _, d in seen if d is not None}


def test_more_workers_than_usable_cores_are_retired() -> None:
    machine = Machine(cores=2, seed=14)  # e.g. a cpuset shrunk under a running job
    ctl = Controller(limits(cores=8), workers=4, in_flight=6)
    reasons = [d.reason for _, d in run(machine, ctl, 12) if d is not None]
    assert ctl.workers == 2 and reasons[:2] == [Reason.OVERSUBSCRIBED] * 2


def test_the_trainers_own_cores_are_left_to_it() -> None:
    machine = Machine(trainer_cpu=2.0, seed=9)  # the trainer's threads use two of the four cores
    ctl = Controller(limits(), workers=1, in_flight=3)
    assert max(ctl.workers for _ in run(machine, ctl, 100)) == 2


def test_without_pressure_figures_it_still_adds_only_onto_an_idle_core() -> None:
    machine = Machine(burner=3.0, seed=10)  # three of four cores taken; this kernel has no PSI
    ctl = Controller(limits(), workers=1, in_flight=3)
    for _ in range(60):
        ctl.observe(replace(machine.interval(ctl.workers, ctl.in_flight), pressure=None))
        assert ctl.workers == 1
    machine.burner = 0.0  # the cores free again: it grows
    for _ in range(20):
        ctl.observe(replace(machine.interval(ctl.workers, ctl.in_flight), pressure=None))
    assert ctl.workers == 4


def test_the_same_intervals_give_the_same_decisions() -> None:
    def decisions() -> list[Decision | None]:
        ctl = Controller(limits(), workers=1, in_flight=3)
        machine = Machine(noise=0.1, trainer_rate=100.0, seed=11)
        return [d for _, d in run(machine, ctl, 150)]

    assert decisions() == decisions()


def test_a_worker_that_buys_nothing_is_undone_and_tried_ever_more_rarely() -> None:
    machine = Machine(storage_rate=60.0, seed=4)  # storage-bound: 60 batches/s, whatever the workers
    ctl = Controller(limits(), workers=2, in_flight=8)
    decisions = [(i, d) for i, (_, d) in enumerate(run(machine, ctl, 200)) if d is not None]
    tries = [i for i, d in decisions if d.reason is Reason.DECODE_BOUND]
    undos = [i for i, d in decisions if d.reason is Reason.NO_GAIN]
    assert len(undos) <= len(tries) <= len(undos) + 1  # every try undone (the last may be under way)
    assert 3 <= len(tries) <= 7  # 4, 8, 16, 32, 64 intervals apart
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps == sorted(gaps) and gaps[-1] > 2 * gaps[0]
    assert all(d.workers == 2 for d in (d for _, d in decisions if d.reason is Reason.NO_GAIN))


def test_a_larger_window_when_workers_idle_and_the_trainer_waits() -> None:
    machine = Machine(cores=2, per_worker=40.0, window_rate=8.0, seed=5)  # each batch in flight: 8 batches/s
    ctl = Controller(limits(cores=2, max_in_flight=24), workers=2, in_flight=4)
    decisions = [d for _, d in run(machine, ctl, 100) if d is not None]
    assert Reason.BURSTY in {d.reason for d in decisions}
    assert 8 <= ctl.in_flight <= 24  # 2 x 40 batches/s needs 10 in flight (9: workers 90% busy)
    assert max(d.in_flight for d in decisions) <= 24


def test_what_is_not_tuned_is_never_moved() -> None:
    ctl = Controller(limits(tune_workers=False), workers=1, in_flight=3)
    list(run(Machine(seed=6), ctl, 50))
    assert ctl.workers == 1
    ctl = Controller(limits(tune_in_flight=False), workers=4, in_flight=16)
    list(run(Machine(trainer_rate=60.0, seed=7), ctl, 100))
    assert ctl.in_flight == 16 and ctl.workers == 2


def test_short_intervals_are_merged_and_long_pauses_dropped() -> None:
    machine = Machine(per_worker=40.0, seed=8)
    ctl = Controller(limits(), workers=1, in_flight=3)
    tenths = [replace(machine.interval(1, 3, seconds=0.1), batches=4) for _ in range(8)]
    decisions = [ctl.observe(obs) for obs in tenths]
    # Settle on the first 16 batches, judge the next 16: the first decision comes with the 8th.
    assert [i for i, d in enumerate(decisions) if d is not None] == [7]
    ctl = Controller(limits(), workers=1, in_flight=3)
    paused = replace(machine.interval(1, 3), batches=0, seconds=policy.MAX_MERGE_S)
    assert ctl.observe(paused) is None and ctl._merging is None


def test_a_change_the_pipeline_could_not_take_is_no_trial() -> None:
    machine = Machine(cores=2, per_worker=40.0, window_rate=8.0, seed=12)  # wants a larger window
    ctl = Controller(limits(cores=2), workers=2, in_flight=4)
    refused = 0
    for _ in range(60):
        decision = ctl.observe(machine.interval(ctl.workers, ctl.in_flight))
        if decision is not None and decision.reason is Reason.BURSTY:
            refused += 1
            ctl.settled(workers=2, in_flight=4)  # the ring cannot hold more: nothing taken
        assert ctl.in_flight == 4
    assert 2 <= refused <= 4  # asked again ever more rarely (held off 4, 8, 16, ... intervals)
    ctl.settled(workers=2, in_flight=5)  # a clamp that took part of it: that is the setting now
    assert (ctl.workers, ctl.in_flight) == (2, 5)


def test_a_slow_spawn_is_waited_for_before_the_verdict() -> None:
    machine = Machine(seed=13)
    ctl = Controller(limits(), workers=1, in_flight=3)
    decision = None
    while decision is None:
        decision = ctl.observe(machine.interval(ctl.workers, ctl.in_flight))
    assert decision.workers == 2
    for _ in range(3):  # the second worker still starting: the first one alone delivers
        assert ctl.observe(machine.interval(1, ctl.in_flight)) is None
    verdict = ctl.observe(machine.interval(2, ctl.in_flight))  # running now: this interval judges it
    assert verdict is not None and verdict.reason is Reason.DECODE_BOUND  # kept, and on to a third
    assert verdict.workers == 3
    # A worker that never comes: after `MAX_SETTLE_INTERVALS` it is judged, and undone.
    for _ in range(policy.MAX_SETTLE_INTERVALS):
        assert ctl.observe(machine.interval(2, ctl.in_flight)) is None
    undo = ctl.observe(machine.interval(2, ctl.in_flight))
    assert undo is not None and undo.reason is Reason.NO_GAIN and undo.workers == 2


def test_limits_must_be_ranges() -> None:
    with pytest.raises(ConfigError, match="min_workers <= max_workers"):
        Limits(min_workers=3, max_workers=2, min_in_flight=1, max_in_flight=4)
    with pytest.raises(ConfigError, match="min_in_flight <= max_in_flight"):
        Limits(min_workers=1, max_workers=2, min_in_flight=0, max_in_flight=4)


def test_from_stats_turns_two_snapshots_into_an_interval() -> None:
    writer = StatsWriter("/data/x", "local", "cpu", num_workers=2, batch_size=8)
    try:
        before = writer.snapshot()
        for _ in range(20):
            writer.add("batches", 1)
            writer.add("read_ns", 10_000_000)
            writer.add("decode_ns", 30_000_000)
            writer.add("augment_ns", 5_000_000)
        writer.add("trainer_wait_ns", 400_000_000)
        writer.add("epoch_start_wait_ns", 100_000_000)
        writer.add("starved_ns", 300_000_000)  # of trainer_wait: the rest is handing batches over
        writer.add("slot_wait_ns", 20_000_000)
        writer.set("ready_batches", 3)
        writer.set("in_flight", 2)
        after = writer.snapshot()
    finally:
        writer.close()
    # Two seconds: 5 CPU-seconds busy, 0.2 s of pressure; worker 12 retired, 13 started.
    m0 = MachineSample(10.0, 4, 100.0, 0, own_cpu_s=1.0, workers_cpu_s={11: 5.0, 12: 5.0})
    m1 = MachineSample(12.0, 4, 105.0, 200_000, own_cpu_s=1.5, workers_cpu_s={11: 6.0, 13: 1.0})
    obs = from_stats(before, after, m0, m1, workers=2, in_flight_limit=6)
    assert obs.seconds == pytest.approx(2.0)
    assert obs.batches == 20 and obs.rate == pytest.approx(10.0)
    assert obs.workers_busy_s == pytest.approx(20 * 0.045)  # read + decode + augment
    assert obs.trainer_wait_s == pytest.approx(0.3)  # starved: not handing over, not an epoch's first
    assert obs.slot_wait_s == pytest.approx(0.02)
    assert (obs.ready_batches, obs.decoding_batches, obs.in_flight_limit) == (3, 2, 6)
    assert obs.machine_busy_cores == pytest.approx(2.5)
    assert obs.trainer_cores == pytest.approx(0.25)
    assert obs.workers_cores == pytest.approx(1.0)  # 11's second and 13's whole second
    assert obs.pressure == pytest.approx(0.1)
    assert obs.busy_fraction == pytest.approx(0.9 / 4)
