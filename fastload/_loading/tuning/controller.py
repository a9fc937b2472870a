"""The tuner's policy, pure: one interval's observations in (`observation.Observation`, made
from two snapshots of a loader's counters and of the machine by `observation.from_stats`), a
damped decision out (`Controller.observe` -> `decisions.Decision` or None). No clock, no I/O: the
same observations give the same decisions, so it is tested on recorded and simulated intervals.

NOTE [the tuner's policy]: each judged interval (one with at least `MIN_BATCHES` batches; a shorter
one is merged with the next) is read as follows, and at most one change is made:
- CPU pressure high (PSI "some" >= `PRESSURE_HIGH`), the machine saturated (under
  `SATURATED_IDLE` cores idle) and other processes part of it (at least `OTHERS_MIN` cores
  besides the trainer's and the workers'): -1 worker (OVERSUBSCRIBED), even while the trainer
  waits: a worker more only adds run-queue delay to everyone's; adding is then held off for
  `PRESSURE_HOLD`. A queue of the loader's own (as many workers as cores, and the trainer beside
  them: the default's start) is not retired for: a fixed setting has it too, and on a small
  machine a worker less costs a share of the rate (the trainer-bound rule below gives its cores
  back when the trainer needs them).
- The trainer waits (>= `WAIT_CLEAR` of the interval) and
  - the workers are busy (>= `BUSY_HIGH`) and a core is idle (usable cores less every process's
    busy cores, the trainer's own included, >= `IDLE_CORE_MIN`) with no CPU pressure: +1 worker
    (DECODE_BOUND), and the window raised to workers + `WINDOW_MARGIN` if it is smaller;
  - the workers idle between tasks (busy < `BUSY_LOW`) while the window is full (the pipeline
    waited for a slot, or every batch of the window is submitted): a larger window (BURSTY);
  - the workers are busy and none can be added, with no batch ready and no slot waited for: the
    workers are the bottleneck, and a window deeper than keeps them fed holds ring memory for
    nothing: down to `FED_WINDOW` on trial (WINDOW_DEEP), once since the window last grew; then
    half the excess at a time.
- The trainer has not waited (< `WAIT_QUIET`) for `QUIET_INTERVALS` intervals and
  - the other workers could do this one's work (busy / (workers - 1) < `RETIRE_BUSY_MAX`): -1
    worker (TRAINER_BOUND), its core back to the trainer's threads;
  - else, batches sit ready (at least half the window) and the window is wider than workers +
    `WINDOW_MARGIN`: half the excess off the window (WINDOW_UNUSED), its slots' memory back.
Every change is verified: the interval after it is discarded (`SETTLE_INTERVALS`: it straddles
the change), and those until the workers observed are those asked for (a new one spawning, up to
`MAX_SETTLE_INTERVALS`); the next is compared with the rate before (the mean of up to
`BASELINE_INTERVALS` judged intervals at the old setting). A +worker that did not buy
`MIN_GAIN`, nor a quarter of what one worker more could (1/workers), a larger window that bought
less than `MIN_GAIN`, a retired worker or a smaller window that added more than `LOSS_TOLERANCE`
of the interval to the trainer's wait, or, where the trainer waited before (its wait then near
whole, a loss shows in the rate only), cost more of the rate than `LOSS_TOLERANCE` or twice the
noise of the intervals before (their relative standard deviation; at most `MAX_LOSS_TOLERANCE`),
is undone (NO_GAIN), and that direction is held off for
`BASE_HOLD` judged intervals, doubling on each failure up to `MAX_HOLD` (a verified gain resets it). Hence
never two changes without a measured interval between them. Workers stay within
`Limits.min_workers`..min(`Limits.max_workers`, usable cores), the window within
`Limits.min_in_flight`..`Limits.max_in_flight`; what `Limits` does not tune is never moved.
What it cannot see: without PSI (None) it never retires for pressure (it still adds only onto an
idle core); a user's sampler or collate in the trainer's process is only time the trainer waits.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from fastload._errors import ConfigError
from fastload._loading.tuning.decisions import Decision, Reason
from fastload._loading.tuning.observation import Observation

# The cadence the tuner is meant to call `observe` at: tens of batches at the rates we see (so
# one batch more or less is a few per cent), /proc's 10 ms tick 1% of it, and short enough that
# 1 -> 4 workers (two intervals a step) converges in under 10 s of the 30 s target.
INTERVAL_S = 1.0
# Fewer batches than this and the interval is merged with the next: one batch more or less is then
# at most ~6% of the rate, under the gain a worker is asked to buy on a small machine.
MIN_BATCHES = 16
# The interval a change is judged on is merged up to this many batches (or `VERDICT_MAX_S`, for
# large batches on a small machine): one batch more or less is then ~2% of the rate, under the
# loss a shrink may cost (a verdict read off 16 batches undid shrinks that cost nothing).
VERDICT_BATCHES = 48
VERDICT_MAX_S = 5 * INTERVAL_S
# Merged intervals longer than this (no batches: an evaluation, a checkpoint, a stalled store)
# are dropped, not judged: a paused trainer says nothing about the setting.
MAX_MERGE_S = 10 * INTERVAL_S
# Intervals discarded after a change: the one straddling it (a new worker starting, a window
# filling) measures neither setting.
SETTLE_INTERVALS = 1
# ...and more while the observed workers are not yet those asked for (`Observation.workers`: the
# workers running), up to this many: a spawn on a loaded machine takes a second or two.
MAX_SETTLE_INTERVALS = 4
# Judged intervals at one setting averaged for the rate before a change: fewer is noisier, more
# remembers a machine that has since changed (a burner come or gone).
BASELINE_INTERVALS = 4
# The trainer waits "clearly" past 10% of the interval (loader-bound); "not at all" under 2%
# (next()'s own bookkeeping and an odd late batch stay under it).
WAIT_CLEAR = 0.10
WAIT_QUIET = 0.02
# Intervals of quiet before retiring or shrinking: one quiet interval may be a lucky one.
QUIET_INTERVALS = 3
# Workers' busy fraction (read + decode + augment time of the batches delivered, per worker-second):
# past 80% they are the bottleneck; under 60% they idle between tasks.
BUSY_HIGH = 0.80
BUSY_LOW = 0.60
# A worker is added only onto this much idle core: most of a core, so a trainer using a tenth of
# one does not strand the last core, yet the new worker is not born into a queue.
IDLE_CORE_MIN = 0.7
# PSI "some" fractions: under 10% calm (a busy machine's background), past 30% tasks queue for a
# CPU a third of the time (a run-queue storm in the making).
PRESSURE_CALM = 0.10
PRESSURE_HIGH = 0.30
# The machine is saturated with under half a core idle.
SATURATED_IDLE = 0.5
# Other processes' share of a storm, in cores, before the loader gives way: half a core (the
# /proc readings' noise is a hundredth; the loader's own start-up, a few tenths, stays under).
OTHERS_MIN = 0.5
# A worker is retired only when the rest would be under 85% busy doing its share: headroom for
# bursts, below the 100% at which the trainer would start to wait.
RETIRE_BUSY_MAX = 0.85
# A change must buy at least 3% (above the noise of a judged interval), a +worker at least a quarter
# of the 1/workers one more worker could (a core spent for less is better left to the trainer); a
# retire or a shrink may add at most 3% of the interval to the trainer's wait (while the trainer
# does not wait, the rate is the trainer's own: its noise is not the change's cost).
MIN_GAIN = 0.03
ADD_GAIN_SHARE = 0.25
LOSS_TOLERANCE = 0.03
# A loader-bound shrink is judged on its rate against the noise of the intervals before it (one
# interval against their mean: twice their deviation leaves a few per cent of false verdicts),
# never excusing more than this; and tried only once that noise is known (`DEEP_BASELINE`
# intervals at the setting): memory back is not urgent, an undo costs an interval.
MAX_LOSS_TOLERANCE = 0.08
DEEP_BASELINE = 3
# Judged intervals a direction is held off after a change in it failed: 4, doubling up to 64
# (a minute at `INTERVAL_S`: a storage-bound loader tries a worker more about once a minute).
BASE_HOLD = 4
MAX_HOLD = 64
# After retiring for pressure, intervals before a worker may be added again (not doubled: a
# burner that goes should be answered within a few intervals).
PRESSURE_HOLD = 3
# Batches in flight beyond one per worker: the one being delivered and one to cover a late one.
WINDOW_MARGIN = 2
# The window that keeps busy workers fed: a batch is split into one part per worker (NOTE [split
# batches] in `split_batches`), so each worker holds a part of every batch in flight, and two
# keep it busy (one decoding, the next queued while the first's reply travels). Only a floor for
# trials: a shrink that costs rate is undone (an iterable stream, whose batches are not split,
# needs about one per worker, and keeps it so).
FED_WINDOW = 2

_ADD, _RETIRE, _GROW, _SHRINK = "add a worker", "retire a worker", "grow the window", "shrink the window"


@dataclass(frozen=True)
class Limits:
    """What the tuner may move, and within which bounds."""

    min_workers: int
    max_workers: int
    min_in_flight: int
    max_in_flight: int
    tune_workers: bool = True
    tune_in_flight: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ConfigError(
                f"tuning limits: workers {self.min_workers}..{self.max_workers} is not a range of at "
                "least one worker: pass 1 <= min_workers <= max_workers"
            )
        if not 1 <= self.min_in_flight <= self.max_in_flight:
            raise ConfigError(
                f"tuning limits: batches in flight {self.min_in_flight}..{self.max_in_flight} is not a "
                "range of at least one batch: pass 1 <= min_in_flight <= max_in_flight"
            )


@dataclass(frozen=True)
class _Trial:
    """A change awaiting its verdict: which way, and the rate before it."""

    direction: str
    rate_before: float
    rate_noise: float  # the intervals' rates before: their standard deviation / their mean
    wait_before: float  # the trainer's wait fraction before
    workers_before: int
    in_flight_before: int


class Controller:
    """The damped policy (NOTE [the tuner's policy]): `observe` one interval, get the setting to
    move to (a `Decision`) or None. A decision it returns is applied before the next interval is
    observed; what was taken of it, if a bound outside `Limits` clamped it, is told by `settled`."""

    def __init__(self, limits: Limits, workers: int, in_flight: int) -> None:
        self.limits = limits
        self.workers = workers
        self.in_flight = in_flight
        self._merging: Observation | None = None
        self._settling = SETTLE_INTERVALS  # the first interval holds the workers' start
        self._settled_for = 0  # intervals discarded since the last change
        self._trial: _Trial | None = None
        self._baseline: deque[Observation] = deque(maxlen=BASELINE_INTERVALS)
        self._quiet = 0
        self._hold = {d: 0 for d in (_ADD, _RETIRE, _GROW, _SHRINK)}
        self._next_hold = {d: BASE_HOLD for d in self._hold}
        self._floor_tried = False  # a WINDOW_DEEP trial went to `FED_WINDOW` since the window grew

    def observe(self, obs: Observation) -> Decision | None:
        """One interval; a decision (the new workers and in-flight window, and why) or None."""
        if self._merging is not None:
            obs = self._merging.merged(obs)
        if obs.batches < MIN_BATCHES:  # too few to judge: merged with the next, unless paused
            self._merging = obs if obs.seconds < MAX_MERGE_S else None
            return None
        starting = obs.workers != self.workers and self._settled_for < MAX_SETTLE_INTERVALS
        verdict_due = self._trial is not None and not (self._settling or starting)
        if verdict_due and obs.batches < VERDICT_BATCHES and obs.seconds < VERDICT_MAX_S:
            self._merging = obs  # a verdict is read off more batches than a decision
            return None
        self._merging = None
        for direction in self._hold:
            self._hold[direction] = max(self._hold[direction] - 1, 0)
        if self._settling or starting:
            # The interval straddling a change, then any until the workers asked for run (a
            # spawning one is not decoding yet; a retiring one finishes its task), for at most
            # `MAX_SETTLE_INTERVALS`: a worker that never comes is judged by the rate it did not buy.
            self._settling = max(self._settling - 1, 0)
            self._settled_for += 1
            return None
        if self._trial is not None:
            undo = self._verdict(self._trial, obs)
            self._trial = None
            if undo is not None:
                return undo
        self._baseline.append(obs)
        self._quiet = self._quiet + 1 if obs.wait_fraction < WAIT_QUIET else 0
        return self._decide(obs)

    def settled(self, workers: int, in_flight: int) -> None:
        """What the tuner could apply of the last decision: a bound beyond `Limits` (the ring's
        slots, the engine's) may have clamped it. A change not taken at all is no trial: that
        direction is held off as if it had failed."""
        trial = self._trial
        if trial is not None and (workers, in_flight) == (trial.workers_before, trial.in_flight_before):
            self._trial = None
            self._hold_off(trial.direction)
        self.workers, self.in_flight = workers, in_flight

    def restarted(self) -> None:
        """The loader's workers were started afresh at the current setting (a new pipeline: a
        Dataset's epoch without persistent_workers): the interval holding their start is not
        judged, nor merged with one before it; a change under trial is judged after it."""
        self._merging = None
        self._settling = max(self._settling, SETTLE_INTERVALS)

    # -- the rules -------------------------------------------------------------------------

    def _decide(self, obs: Observation) -> Decision | None:
        lim = self.limits
        max_workers = min(lim.max_workers, max(obs.usable_cores, lim.min_workers))
        calm = obs.pressure is None or obs.pressure < PRESSURE_CALM
        if lim.tune_workers and self.workers > lim.min_workers:
            storm = obs.pressure is not None and obs.pressure >= PRESSURE_HIGH
            crowded = obs.idle_cores < SATURATED_IDLE and obs.others_cores >= OTHERS_MIN
            if self.workers > max_workers or (storm and crowded):
                self._hold[_ADD] = max(self._hold[_ADD], PRESSURE_HOLD)
                return self._change(obs, _RETIRE, self.workers - 1, self.in_flight, Reason.OVERSUBSCRIBED)
        if obs.wait_fraction >= WAIT_CLEAR:
            if (
                lim.tune_workers
                and self.workers < max_workers
                and not self._hold[_ADD]
                and obs.busy_fraction >= BUSY_HIGH
                and obs.idle_cores >= IDLE_CORE_MIN
                and calm
            ):
                window = self.in_flight
                if lim.tune_in_flight:
                    window = max(window, min(self.workers + 1 + WINDOW_MARGIN, lim.max_in_flight))
                return self._change(obs, _ADD, self.workers + 1, window, Reason.DECODE_BOUND)
            # The gauges are set as a batch is handed over, before its place is refilled: a full
            # window reads one short.
            in_window = obs.ready_batches + obs.decoding_batches + 1
            full = obs.slot_wait_s > 0 or in_window >= obs.in_flight_limit
            if (
                lim.tune_in_flight
                and self.in_flight < lim.max_in_flight
                and not self._hold[_GROW]
                and obs.busy_fraction < BUSY_LOW
                and full
            ):
                window = min(self.in_flight + max(1, self.in_flight // 2), lim.max_in_flight)
                return self._change(obs, _GROW, self.workers, window, Reason.BURSTY)
            fed = max(lim.min_in_flight, FED_WINDOW)
            if (
                lim.tune_in_flight
                and self.in_flight > fed
                and not self._hold[_SHRINK]
                and obs.busy_fraction >= BUSY_HIGH
                and obs.ready_batches == 0
                and obs.slot_wait_s == 0
                and len(self._baseline) >= DEEP_BASELINE
            ):
                # Straight to the floor once (split batches are fed by it) since the window last
                # grew; after that, half the excess at a time.
                window = self._halfway_to(fed)
                if not self._floor_tried:
                    window, self._floor_tried = fed, True
                return self._change(obs, _SHRINK, self.workers, window, Reason.WINDOW_DEEP)
        if self._quiet >= QUIET_INTERVALS:
            if (
                lim.tune_workers
                and self.workers > lim.min_workers
                and not self._hold[_RETIRE]
                and obs.workers_busy_s / ((self.workers - 1) * obs.seconds) < RETIRE_BUSY_MAX
            ):
                return self._change(obs, _RETIRE, self.workers - 1, self.in_flight, Reason.TRAINER_BOUND)
            target = max(lim.min_in_flight, min(self.workers + WINDOW_MARGIN, lim.max_in_flight))
            if (
                lim.tune_in_flight
                and self.in_flight > target
                and not self._hold[_SHRINK]
                and 2 * obs.ready_batches >= self.in_flight
            ):
                window = self._halfway_to(target)
                return self._change(obs, _SHRINK, self.workers, window, Reason.WINDOW_UNUSED)
        return None

    def _halfway_to(self, floor: int) -> int:
        """The window with half its excess over `floor` taken off (at least one batch)."""
        return self.in_flight - max(1, (self.in_flight - floor) // 2)

    def _change(
        self, obs: Observation, direction: str, workers: int, window: int, reason: Reason
    ) -> Decision:
        """Move to a new setting; verified after it settles, unless it was forced by pressure."""
        verified = reason is not Reason.OVERSUBSCRIBED
        seconds = sum(o.seconds for o in self._baseline)
        rate = sum(o.batches for o in self._baseline) / seconds
        wait = sum(o.trainer_wait_s for o in self._baseline) / seconds
        rates = [o.rate for o in self._baseline]
        noise = statistics.pstdev(rates) / rate if len(rates) > 1 and rate > 0 else 0.0
        if verified:
            self._trial = _Trial(direction, rate, noise, wait, self.workers, self.in_flight)
        return self._apply(workers, window, reason, obs, f"{direction}: {_figures(obs)}")

    def _verdict(self, trial: _Trial, obs: Observation) -> Decision | None:
        """The change under trial judged on this interval: None if kept, else the undo."""
        change = obs.rate / trial.rate_before - 1 if trial.rate_before > 0 else 0.0
        if trial.direction == _ADD:
            needed = max(MIN_GAIN, ADD_GAIN_SHARE / trial.workers_before)
            failed = change < needed
        elif trial.direction == _GROW:
            needed = MIN_GAIN
            failed = change < needed
        else:  # a retire or a shrink costs what it makes the trainer wait (its rate is its own)
            needed = -LOSS_TOLERANCE
            failed = trial.wait_before - obs.wait_fraction < needed
            if trial.wait_before >= WAIT_CLEAR:  # loader-bound: the wait saturates, the rate shows it
                needed = -min(max(LOSS_TOLERANCE, 2 * trial.rate_noise), MAX_LOSS_TOLERANCE)
                failed = failed or change < needed
        if not failed:
            self._next_hold[trial.direction] = BASE_HOLD
            return None
        self._hold_off(trial.direction)
        detail = (
            f"{trial.direction}: rate {trial.rate_before:.2f} -> {obs.rate:.2f} batches/s ({change:+.1%}), "
            f"trainer waits {trial.wait_before:.0%} -> {obs.wait_fraction:.0%} (needed {needed:+.1%}); "
            f"held off {self._hold[trial.direction]} intervals"
        )
        return self._apply(trial.workers_before, trial.in_flight_before, Reason.NO_GAIN, obs, detail)

    def _hold_off(self, direction: str) -> None:
        """A change in `direction` failed: none for a while, twice as long as the last time."""
        self._hold[direction] = self._next_hold[direction]
        self._next_hold[direction] = min(2 * self._next_hold[direction], MAX_HOLD)

    def _apply(self, workers: int, window: int, reason: Reason, obs: Observation, detail: str) -> Decision:
        if window > self.in_flight and reason is not Reason.NO_GAIN:
            self._floor_tried = False  # a grown window may be given back straight to the floor
        self.workers, self.in_flight = workers, window
        self._settling, self._settled_for = SETTLE_INTERVALS, 0
        self._baseline.clear()
        self._quiet = 0
        return Decision(workers=workers, in_flight=window, reason=reason, detail=detail)


def _figures(obs: Observation) -> str:
    pressure = "n/a" if obs.pressure is None else f"{obs.pressure:.0%}"
    return (
        f"{obs.rate:.2f} batches/s, trainer waits {obs.wait_fraction:.0%}, workers busy "
        f"{obs.busy_fraction:.0%}, {obs.idle_cores:.1f} of {obs.usable_cores} cores idle, "
        f"pressure {pressure}, {obs.ready_batches} ready of {obs.in_flight_limit} in flight"
    )
