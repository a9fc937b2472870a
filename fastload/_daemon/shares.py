"""How the daemon divides its pool among sessions: each session's need and weight, the weighted
fair share (stride scheduling, in samples) that picks whose queued task runs next, and the share
of the pool each session got over the last interval (what `fastload status` shows).

NOTE [shares by need]: a session's weight is `priority x need`. Its need runs from 1 (its trainer
never waits for a batch) to 1 + NEED_GAIN (it waits all the time), from the fraction of time its
trainer spent waiting for this daemon's batches, as the trainer reports it (`need` messages,
`daemon_link`); until a report comes (the first half second, or a trainer of a version that sends
none), from the session's slots: the fraction of its ring's samples that are queued or running
here (every slot in flight: starving; most done and waiting to be taken: satisfied). A report,
once one has come, wins: it is what the trainer measured, where the slots are a guess (a trainer
that takes batches slower than they come keeps few slots in flight, and so reads as satisfied,
which it is; but one whose window is small reads the same while it starves). The latest report
holds until the next (a trainer reports when its figures change).

Among the sessions with queued tasks, each is owed `weight / total weight` of the pool, but never
less than FLOOR_PER_SESSION / sessions of it (none stalls), and a satisfied session (its trainer
waits less than SATISFIED_WAIT of the time) never less than HEADROOM x what it was served lately,
up to an equal share: a session that does not wait gives way only what it does not use. A
trainer's ring bounds what it asks for (NOTE [tasks bounded by slots]): a satisfied trainer asks
at the rate it takes batches, so what it keeps costs the others nothing it would not use, and it
does not start to wait because a starving one weighs more (weights alone gave it 1/5 of the pool
beside a starving session, less than the 1/4 a step of 2x its batch's decode takes). What the
weights divide is the rest: between starving sessions, and what a satisfied one leaves.

Stride scheduling: each session's pass advances by the samples of each task it runs divided by
its share; the next task is the queued session's with the lowest pass (ties: the lower session
id), so while the shares hold, the samples each runs stay within about one task of its share,
deterministically, in O(sessions) per pick. A session that had nothing queued rejoins at the
current virtual time: an idle session banks no credit to flood the pool later.

Only the order of tasks across sessions changes: each session's batches are the same, bit for bit.
`FASTLOAD_DAEMON_SHARES=round-robin` in the environment of `fastload serve` feeds the pool
round-robin as before shares existed: a benchmarking aid (tools/bench/bench_daemon_shares.py),
not a setting.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from fastload._errors import ConfigError

NEED_GAIN = 3.0  # a trainer that always waits weighs 4x one that never does (at equal priority)
FLOOR_PER_SESSION = 0.25  # each queued session gets at least 1/(4 x sessions) of the pool
SATISFIED_WAIT = 0.1  # a trainer waiting less than this fraction of the time is satisfied
HEADROOM = 1.25  # ...and keeps this much more than it was served lately (`reserves`)
SERVED_HALF_LIFE_S = 2.0  # how soon what a session was served is forgotten
SHARE_INTERVAL_S = 5.0  # `status`' share: the pool's work over the last interval this long
POLICY_VARIABLE = "FASTLOAD_DAEMON_SHARES"
POLICIES = ("need", "round-robin")


def policy_from_environment() -> str:
    """The feeding policy `fastload serve` runs (NOTE [shares by need]; round-robin for benchmarks)."""
    policy = os.environ.get(POLICY_VARIABLE, "need") or "need"
    if policy not in POLICIES:
        raise ConfigError(f"{POLICY_VARIABLE}={policy!r}: use one of {', '.join(POLICIES)} (unset: need)")
    return policy


def need_of(reported_wait: float | None, samples_out: int, capacity: int) -> tuple[float, str]:
    """(need, where it came from: "trainer" or "slots"): NOTE [shares by need]."""
    if reported_wait is not None:
        return 1.0 + NEED_GAIN * reported_wait, "trainer"
    inferred = min(1.0, samples_out / capacity) if capacity > 0 else 0.0
    return 1.0 + NEED_GAIN * inferred, "slots"


def floored_shares(
    weights: Mapping[int, float], reserved: Mapping[int, float] | None = None
) -> dict[int, float]:
    """Each session's share of the pool: in proportion to its weight, but at least its minimum,
    FLOOR_PER_SESSION / len(weights) or what is `reserved` for it (`reserves`) if more (reserves
    scaled down to fit, when together they would not); the shares sum to 1."""
    if not weights:
        return {}
    floor = FLOOR_PER_SESSION / len(weights)
    above = {k: max(0.0, (reserved or {}).get(k, 0.0) - floor) for k in weights}
    room = 1.0 - floor * len(weights)
    scale = min(1.0, room / sum(above.values())) if sum(above.values()) > 0 else 0.0
    least = {k: floor + scale * above[k] for k in weights}
    fixed: set[int] = set()
    while True:  # at most len(weights) rounds: each fixes one more session at its minimum, or ends
        free = {k: w for k, w in weights.items() if k not in fixed}
        mass = 1.0 - sum(least[k] for k in fixed)
        total = sum(free.values())
        shares = {k: mass * w / total for k, w in free.items()} if total > 0 else {}
        low = {k for k, share in shares.items() if share < least[k]}
        if not low:
            return {**shares, **{k: least[k] for k in fixed}}
        fixed |= low


def reserves(satisfied: Mapping[int, bool], served: Mapping[int, float]) -> dict[int, float]:
    """NOTE [shares by need]: what a satisfied session keeps of the pool, of the sessions with
    queued tasks (id -> whether its trainer is satisfied): HEADROOM x the fraction of the pool's
    samples it was served lately (`Served`), never more than an equal share."""
    equal = 1.0 / max(1, len(satisfied))
    return {k: min(equal, HEADROOM * served.get(k, 0.0)) for k, ok in satisfied.items() if ok}


class Served:
    """The samples sent to the pool for each session lately (halved every SERVED_HALF_LIFE_S)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, half_life_s: float = SERVED_HALF_LIFE_S
    ) -> None:
        self._clock = clock
        self._half_life_s = half_life_s
        self._samples: dict[int, float] = {}
        self._at = clock()

    def _decay(self) -> None:
        now = self._clock()
        factor = 0.5 ** ((now - self._at) / self._half_life_s)
        self._at = now
        for k in self._samples:
            self._samples[k] *= factor

    def add(self, session: int, samples: int) -> None:
        self._decay()
        self._samples[session] = self._samples.get(session, 0.0) + samples

    def fractions(self) -> dict[int, float]:
        self._decay()
        total = sum(self._samples.values())
        return {k: v / total for k, v in self._samples.items()} if total > 0 else {}

    def forget(self, session: int) -> None:
        self._samples.pop(session, None)


class StrideShares:
    """Weighted fair sharing of the pool by stride scheduling (NOTE [shares by need])."""

    def __init__(self) -> None:
        self._pass: dict[int, float] = {}  # session id -> its pass, in samples / share
        self._now = 0.0  # virtual time: the pass of the last session picked

    def pick(
        self, weights: Mapping[int, float], reserved: Mapping[int, float] | None = None
    ) -> tuple[int, float]:
        """Of the sessions with queued tasks (id -> weight > 0; `reserved`: `reserves`), (the one
        whose task runs next, its share of the pool now)."""
        shares = floored_shares(weights, reserved)
        for k in shares:  # an idle session rejoins now: no credit banked while it had nothing queued
            self._pass[k] = max(self._pass.get(k, self._now), self._now)
        chosen = min(shares, key=lambda k: (self._pass[k], k))
        self._now = self._pass[chosen]
        return chosen, shares[chosen]

    def charge(self, session: int, samples: int, share: float) -> None:
        """Session `session` ran a task of `samples` samples at `share` of the pool."""
        self._pass[session] = self._pass.get(session, self._now) + max(1, samples) / share

    def forget(self, session: int) -> None:
        self._pass.pop(session, None)


class PoolMeter:
    """Each session's fraction of the pool's work (its tasks' worker time) over the last
    SHARE_INTERVAL_S: `status` shows it beside the weight the policy gave."""

    def __init__(self, interval_s: float = SHARE_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._since = time.monotonic()
        self._base: dict[int, int] = {}  # session id -> its worker ns when the interval began
        self._last: dict[int, float] = {}  # the last whole interval's fractions

    def fractions(self, worker_ns: Mapping[int, int], now: float | None = None) -> dict[int, float]:
        """Session id -> fraction of the pool's work, from each session's cumulative worker time:
        over the last whole interval, or the one under way until one has passed."""
        now = time.monotonic() if now is None else now
        used = {k: v - self._base.get(k, 0) for k, v in worker_ns.items()}
        total = sum(used.values())
        current = {k: v / total if total > 0 else 0.0 for k, v in used.items()}
        if now - self._since >= self._interval_s:
            self._since, self._base, self._last = now, dict(worker_ns), current
        elif not self._last:
            return current
        return {k: self._last.get(k, 0.0) for k in worker_ns}

