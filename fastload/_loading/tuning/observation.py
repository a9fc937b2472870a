"""One interval of a loader and of its machine, as the tuner's policy reads it (`Observation`), and
the one place counters become one (`from_stats`: two snapshots of a loader's statistics block and
of the machine). `controller` decides on them; the daemon's pool tuner makes its own from the
daemon's counters."""

from __future__ import annotations

from dataclasses import dataclass, replace

from fastload._loading.running.stats import LoaderStats
from fastload._loading.tuning.machine_load import MachineSample, load_between


@dataclass(frozen=True)
class Observation:
    """One interval of a loader and of its machine (`from_stats` makes one from counters)."""

    seconds: float  # wall time of the interval
    batches: int  # batches delivered to the trainer
    trainer_wait_s: float  # the trainer's time inside next(), less each epoch's first batch
    workers_busy_s: float  # workers' read + decode + augment time of the batches delivered
    slot_wait_s: float  # time the pipeline had a batch to start but no free slot
    ready_batches: int  # gauge at the end: decoded, waiting for the trainer
    decoding_batches: int  # gauge at the end: submitted, being decoded
    in_flight_limit: int  # the window: batches kept submitted and not yet delivered
    workers: int  # workers running (a spawned one once it takes tasks; a retiring one until it exits)
    usable_cores: int  # cores this process may use
    machine_busy_cores: float  # every process's busy cores, on the usable CPUs
    trainer_cores: float  # the trainer's process (its own threads and the loader's)
    workers_cores: float  # the workers' processes
    pressure: float | None  # PSI "some" fraction 0..1, None where the kernel has none

    @property
    def rate(self) -> float:
        """Batches delivered per second."""
        return self.batches / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_fraction(self) -> float:
        return self.trainer_wait_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def busy_fraction(self) -> float:
        """Of the workers' wall time, the share spent on batches (1.0: never between tasks)."""
        return self.workers_busy_s / (max(self.workers, 1) * self.seconds) if self.seconds > 0 else 0.0

    @property
    def idle_cores(self) -> float:
        return self.usable_cores - self.machine_busy_cores

    @property
    def others_cores(self) -> float:
        """Cores other processes used: the machine's busy cores less the trainer's and the workers'."""
        return max(self.machine_busy_cores - self.trainer_cores - self.workers_cores, 0.0)

    def merged(self, later: Observation) -> Observation:
        """This interval and the next as one: counts summed, rates weighted by time, the gauges
        and the setting the later one's."""
        total = self.seconds + later.seconds

        def mean(a: float, b: float) -> float:
            return (a * self.seconds + b * later.seconds) / total if total > 0 else b

        pressure = None
        if self.pressure is not None and later.pressure is not None:
            pressure = mean(self.pressure, later.pressure)
        return replace(
            later,
            seconds=total,
            batches=self.batches + later.batches,
            trainer_wait_s=self.trainer_wait_s + later.trainer_wait_s,
            workers_busy_s=self.workers_busy_s + later.workers_busy_s,
            slot_wait_s=self.slot_wait_s + later.slot_wait_s,
            machine_busy_cores=mean(self.machine_busy_cores, later.machine_busy_cores),
            trainer_cores=mean(self.trainer_cores, later.trainer_cores),
            workers_cores=mean(self.workers_cores, later.workers_cores),
            pressure=pressure,
        )


def from_stats(
    prev: LoaderStats,
    now: LoaderStats,
    machine_prev: MachineSample,
    machine_now: MachineSample,
    *,
    workers: int,
    in_flight_limit: int,
) -> Observation:
    """The one place counters become an interval: two snapshots of a loader's statistics block
    and of the machine (the wall time is the machine samples' monotonic clock), with the setting
    that ran between them. The trainer's wait is its `starved` time: waiting for a batch not yet
    loaded, leaving out handing batches over (the loader's own work in `next()`, which no setting
    removes) and each epoch's wait for its first batch (the pipeline filling)."""
    load = load_between(machine_prev, machine_now)

    def grew(field: str) -> float:
        return max(float(getattr(now, field)) - float(getattr(prev, field)), 0.0)

    busy = grew("read_s") + grew("decode_s") + grew("augment_s")  # augment is timed apart from decode
    return Observation(
        seconds=load.seconds,
        batches=int(grew("batches")),
        trainer_wait_s=grew("starved_s"),
        workers_busy_s=busy,
        slot_wait_s=grew("slot_wait_s"),
        ready_batches=now.ready_batches,
        decoding_batches=now.in_flight,
        in_flight_limit=in_flight_limit,
        workers=workers,
        usable_cores=machine_now.cores,
        machine_busy_cores=load.busy_cores,
        trainer_cores=load.own_cores,
        workers_cores=load.workers_cores,
        pressure=load.pressure,
    )
