"""The tuner of one loader: every interval, its counters and the machine's load become an
`Observation`, the `controller` decides, and the decision is applied through the pipeline's
handles (`Pipeline.set_workers`, `Pipeline.set_in_flight`: the engine's spawn/retire, the
in-flight window, the ring), counted in the statistics block and logged at debug level.

It runs on the trainer's thread, from the epoch loop's `next()` (`Pipeline.tuner`), and costs a
clock read per call and, once an interval, a snapshot of the block and a few /proc reads. It holds
no reference to the pipeline (it is handed one per tick: NOTE [no reference back] in `pipeline`).
The loader's assembly keeps one across its pipelines: a new pipeline (a Dataset's epoch without
persistent workers) starts at the setting learned so far (`next_spec`).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from fastload._loading.running.pipeline import Pipeline
from fastload._loading.running.stats import LoaderStats
from fastload._loading.settings.spec import LoaderSpec
from fastload._loading.slots.ring_plan import EXTRA_SLOTS, ring_ceiling_slots
from fastload._loading.tuning.controller import INTERVAL_S, Controller, Limits
from fastload._loading.tuning.decisions import REASON_WORDS, Decision
from fastload._loading.tuning.machine_load import MachineSample, sample_machine
from fastload._loading.tuning.observation import from_stats
from fastload._machine import usable_cores

log = logging.getLogger("fastload")


class Tuner:
    """Feeds one loader's `Controller` and applies what it decides (see the module docstring)."""

    def __init__(self, spec: LoaderSpec, interval_s: float | None = None) -> None:
        self._spec = spec
        self._interval_s = INTERVAL_S if interval_s is None else interval_s
        self._controller: Controller | None = None  # made once the pipeline's ring exists
        self._next_tick = 0.0
        self._stats: LoaderStats | None = None
        self._machine: MachineSample | None = None

    def next_spec(self, spec: LoaderSpec) -> LoaderSpec:
        """The spec a new pipeline of this loader starts with: at the setting tuned so far (a
        Dataset's next epoch without persistent_workers starts fresh workers, at the count the
        last epoch ended with, not at the default again); its first interval is not judged."""
        self._stats = self._machine = None
        self._next_tick = 0.0
        if self._controller is None:
            return spec
        self._controller.restarted()
        return dataclasses.replace(
            spec, num_workers=self._controller.workers, prefetch=self._controller.in_flight
        )

    def tick(self, pipeline: Pipeline) -> None:
        """Called after each `next()`: once an interval has passed, observe, decide and apply."""
        now = time.monotonic()
        if now < self._next_tick or pipeline.ring is None or pipeline.closed:
            return
        self._next_tick = now + self._interval_s
        if self._controller is None:
            self._controller = self._start(pipeline)
        stats, machine = pipeline.stats.snapshot(), sample_machine(pipeline.worker_pids)
        if self._stats is not None and self._machine is not None:
            observed = from_stats(
                self._stats, stats, self._machine, machine,
                workers=len(pipeline.worker_pids), in_flight_limit=pipeline.window.limit,
            )
            decision = self._controller.observe(observed)
            if decision is not None:
                self._apply(pipeline, decision)
        self._stats, self._machine = stats, machine
        self._trim_ring(pipeline)
        self._publish(pipeline)

    @staticmethod
    def _trim_ring(pipeline: Pipeline) -> None:
        """A smaller window lets go of the ring's free slots only; those that were in flight or
        held then are let go of here, on a later interval, once they are free again."""
        ring = pipeline.ring
        if ring is not None and len(ring) > pipeline.window.limit + EXTRA_SLOTS and ring.free_count:
            pipeline.set_in_flight(pipeline.window.limit)

    def _start(self, pipeline: Pipeline) -> Controller:
        """The controller for this pipeline, within its bounds: workers 1..the cores this process
        may use (or fixed), batches in flight 1..what /dev/shm lets the ring grow to (or fixed)."""
        spec, ring = self._spec, pipeline.ring
        assert ring is not None
        workers = pipeline.workers
        max_workers = max(workers, usable_cores()) if spec.tune_workers else workers
        in_flight = pipeline.window.limit
        ceiling = max(in_flight, ring_ceiling_slots(ring.slot_bytes, held=len(ring)) - EXTRA_SLOTS)
        limits = Limits(
            min_workers=1 if spec.tune_workers else workers,
            max_workers=max_workers,
            min_in_flight=1 if spec.tune_in_flight else in_flight,
            max_in_flight=ceiling if spec.tune_in_flight else in_flight,
            tune_workers=spec.tune_workers,
            tune_in_flight=spec.tune_in_flight,
        )
        log.debug("fastload tuner: starting at %d workers, %d in flight (%s)", workers, in_flight, limits)
        return Controller(limits, workers=workers, in_flight=in_flight)

    def _apply(self, pipeline: Pipeline, decision: Decision) -> None:
        """Turn the handles to `decision`; the controller is told what was taken (a bound may
        have clamped it)."""
        assert self._controller is not None
        workers, in_flight = pipeline.workers, pipeline.window.limit
        if decision.workers != workers:
            workers = pipeline.set_workers(decision.workers)
        if decision.in_flight != in_flight:
            resized = pipeline.set_in_flight(decision.in_flight)
            in_flight = resized.limit
            if resized.refused:
                log.debug("fastload tuner: %s", resized.refused)
        self._controller.settled(workers=workers, in_flight=in_flight)
        pipeline.stats.tuner_changed(int(decision.reason), REASON_WORDS[decision.reason])
        log.debug(
            "fastload tuner: %s -> %d workers, %d in flight (%s)",
            REASON_WORDS[decision.reason], workers, in_flight, decision.detail,
            extra={"event": "tuner_change", "fields": {
                "reason": decision.reason.name.lower(), "workers": workers, "in_flight": in_flight,
            }},
        )

    def _publish(self, pipeline: Pipeline) -> None:
        ring, spec = pipeline.ring, self._spec
        pipeline.stats.tuning(
            pipeline.workers, pipeline.window.limit, len(ring) if ring is not None else 0,
            tunes_workers=spec.tune_workers, tunes_in_flight=spec.tune_in_flight,
        )
