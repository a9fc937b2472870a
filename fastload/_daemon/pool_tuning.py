"""The daemon's pool sized to the machine and to its sessions' need (`fastload serve --workers
auto`): the loader's tuner policy (`_loading.tuning.controller`, NOTE [the tuner's policy]) fed
from the daemon's side, its decisions applied through the engine's spawn/retire.

NOTE [a pool that follows need]: a daemon's "trainer wait" is its neediest session's (a trainer's
reported wait, else inferred from its slots: NOTE [shares by need]); its batches are the tasks its
workers finished, their read + decode + augment time the workers' busy time; the machine's load is
read as a loader's is. So the pool gains a worker while some trainer waits, the workers are busy
and a core is idle (other processes' and the trainers' use counted), loses one while no trainer
waits and the others can do its work, or while processes queue for a CPU; each change verified,
undone if it bought nothing. It starts at the cores the daemon may use and never exceeds them: the
welcome tells each trainer that many workers (how many parts it splits a batch into, how large a
ring it gets), which stay right for any smaller pool. Only the worker count is tuned here; a
session's window is its trainer's. With no task finished in an interval (no sessions, or paused
ones) nothing is decided.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from fastload._daemon.sessions import Session
from fastload._daemon.shares import NEED_GAIN
from fastload._loading.jobs.executor import Done
from fastload._loading.running.engine import Engine
from fastload._loading.tuning.controller import INTERVAL_S, Controller, Limits
from fastload._loading.tuning.decisions import REASON_WORDS, Reason
from fastload._loading.tuning.machine_load import MachineSample, load_between, sample_machine
from fastload._loading.tuning.observation import Observation

log = logging.getLogger("fastload.daemon")


class PoolTuner:
    """Sizes one daemon's `Engine` by its sessions' need (NOTE [a pool that follows need])."""

    def __init__(self, workers: int, interval_s: float | None = None) -> None:
        """`workers`: the pool's start and most (the cores the daemon may use)."""
        limits = Limits(
            min_workers=1, max_workers=workers, min_in_flight=1, max_in_flight=1, tune_in_flight=False
        )
        self._controller = Controller(limits, workers=workers, in_flight=1)
        self._interval_s = INTERVAL_S if interval_s is None else interval_s
        self._next_tick = 0.0
        self._machine: MachineSample | None = None
        self._tasks = 0
        self._busy_ns = 0
        self.changes = 0
        self.last_reason = Reason.NONE

    def record(self, event: Done) -> None:
        """A task finished: counted, with its workers' time."""
        self._tasks += 1
        c = event.counters
        self._busy_ns += c.read_ns + c.decode_ns + c.augment_ns

    def tick(self, engine: Engine, sessions: Iterable[Session]) -> int | None:
        """Once an interval: observe, decide, apply; the pool's new worker count, or None."""
        now = time.monotonic()
        if now < self._next_tick:
            return None
        self._next_tick = now + self._interval_s
        machine = sample_machine(engine.worker_pids)
        previous, self._machine = self._machine, machine
        tasks, busy_ns, self._tasks, self._busy_ns = self._tasks, self._busy_ns, 0, 0
        if previous is None:
            return None
        load = load_between(previous, machine)
        waiting = [s for s in sessions if s.pending or s.client_seq]
        neediest = max(((s.need[0] - 1.0) / NEED_GAIN for s in waiting), default=0.0)
        observed = Observation(
            seconds=load.seconds,
            batches=tasks,
            trainer_wait_s=neediest * load.seconds,
            workers_busy_s=busy_ns / 1e9,
            slot_wait_s=0.0,
            ready_batches=0,
            decoding_batches=engine.in_flight,
            in_flight_limit=1,
            workers=len(engine.worker_pids),
            usable_cores=machine.cores,
            machine_busy_cores=load.busy_cores,
            trainer_cores=load.own_cores,
            workers_cores=load.workers_cores,
            pressure=load.pressure,
        )
        decision = self._controller.observe(observed)
        if decision is None:
            return None
        while engine.active_workers < decision.workers:
            engine.add_worker()
        while engine.active_workers > decision.workers and engine.retire_worker() is not None:
            pass
        self._controller.settled(workers=engine.active_workers, in_flight=1)
        self.changes += 1
        self.last_reason = decision.reason
        log.info(
            "pool: %s -> %d workers (%s)",
            REASON_WORDS[decision.reason], engine.active_workers, decision.detail,
            extra={"event": "pool_resized", "fields": {
                "workers": engine.active_workers, "reason": decision.reason.name.lower(),
            }},
        )
        return engine.active_workers
