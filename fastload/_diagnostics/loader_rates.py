"""A loader's rates over an interval: what `fastload iostat` and the exporters' verdict read.

`loader_rates` subtracts two snapshots of a statistics block (`LoaderStats`) and divides by the
interval: samples and bytes per second, each stage's milliseconds per sample (every per-batch time
counter `_batch_counters` declares, and the trainer's slot_wait and h2d), the workers' and the
trainer's shares of the time. `MachineRates` is the machine's side of the same interval.
`TunerState` is a tuned loader's tuner as its block says it now, its last change's reason worded
(`tuning.decisions`: the block holds the code).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastload._batch_counters import declared, stats_field
from fastload._loading.running.stats import TUNES_IN_FLIGHT, TUNES_WORKERS, LoaderStats
from fastload._loading.tuning.decisions import REASON_CHANGES, REASON_WORDS, Reason, reason_tag


@dataclass(frozen=True)
class TunerState:
    """A tuned loader's tuner now (`fastload iostat`'s tuner column and its `--json`)."""

    workers: int  # active workers now
    in_flight: int  # the in-flight window's limit now
    tunes_workers: bool  # whether it moves the workers (not an IterableDataset's streams)
    tunes_in_flight: bool
    changes: int  # since the loader started
    last_change: float | None  # unix time of the last change; None: none yet
    change: str  # what the last change moved: "+w", "-w", "+f", "-f", "undo" ("": none yet)
    reason: str  # its reason in a word or two ("decode-bound"), as the metrics' label says it
    reason_words: str  # ...and in words


def tuner_state(s: LoaderStats) -> TunerState | None:
    """The tuner of a loader's snapshot (None: nothing of it is tuned), its last reason worded."""
    if not s.is_tuned:
        return None
    try:
        reason = Reason(s.tuner_reason)
        tag, words, change = reason_tag(reason), REASON_WORDS[reason], REASON_CHANGES[reason]
    except (ValueError, KeyError):  # a code this version does not know (a newer tuner's)
        tag, words, change = f"reason-{s.tuner_reason}", f"reason code {s.tuner_reason}", "?"
    return TunerState(
        workers=s.tuner_workers,
        in_flight=s.tuner_in_flight,
        tunes_workers=bool(s.tuned & TUNES_WORKERS),
        tunes_in_flight=bool(s.tuned & TUNES_IN_FLIGHT),
        changes=s.tuner_changes,
        last_change=s.tuner_changed if s.tuner_changes else None,
        change=change if s.tuner_changes else "",
        reason=tag,
        reason_words=words,
    )


@dataclass(frozen=True)
class LoaderRates:
    """One loader over one interval."""

    name: str
    pid: int
    dataset: str
    mode: str
    device: str
    workers: int  # now: a tuned loader's tuner's count, else the count it started with
    batch_size: int
    samples_per_s: float
    read_mb_per_s: float
    # Each per-batch time counter (`_batch_counters`, "read_ns" as "read": read, of which read_cpu,
    # read_runq and net_wait; decode; augment), and the trainer's slot_wait and h2d.
    ms_per_sample: dict[str, float]
    worker_busy_percent: float
    trainer_wait_percent: float
    epoch_start_wait_percent: float  # of the interval, waiting for epochs' first batches
    epochs: int  # epochs started in the interval
    ready_batches: int
    in_flight: int
    skipped: int = 0  # broken samples replaced by stand-ins since the loader started (on_error="skip")
    epochs_so_far: int = 0  # iterations that yielded a batch since the loader started
    net_mb_per_s: float = 0.0  # fetched from object storage (workers and read-ahead)
    cache_hit_percent: float | None = None  # of chunk reads of remote objects; None: no remote reads
    verdict: str = ""
    advice: list[str] = field(default_factory=list)
    per_second: dict[str, float] = field(default_factory=dict)  # each per-batch counter not a time
    ring_slots: int = 0  # the ring's slots now (0: none yet)
    tuner: TunerState | None = None  # None: nothing of the loader is tuned


@dataclass(frozen=True)
class MachineRates:
    cpu: dict[str, float]
    disk: dict[str, float] | None  # r/s, rMB/s, await ms, %util of the first loader's device
    device: str  # what the first loader's data is on
    device_kind: str
    page_cache_bytes: int
    shm_used_bytes: int
    shm_total_bytes: int
    gpu_percent: list[float] | None


def loader_rates(name: str, before: LoaderStats | None, after: LoaderStats, seconds: float) -> LoaderRates:
    """Rates between two snapshots (or since the loader started when `before` is None)."""
    if before is None:
        seconds = max(after.updated - after.created, 1e-9)

    def delta(attr: str) -> float:
        return float(getattr(after, attr) - (getattr(before, attr) if before is not None else 0))

    samples = delta("samples")
    per_sample = 1000.0 / samples if samples else 0.0
    batches = delta("batches")
    sample_per_batch = samples / batches if batches else 0.0
    worker_time = delta("read_s") + delta("decode_s") + delta("augment_s")
    hits, misses = delta("cache_hits"), delta("cache_misses")
    times = [name for name, c in declared() if c.unit == "ns"]
    workers = after.tuner_workers or after.num_workers  # a tuner's count now, or the fixed one
    return LoaderRates(
        name=name,
        pid=after.pid,
        dataset=after.dataset,
        mode=after.mode,
        device=after.device,
        workers=workers,
        batch_size=after.batch_size,
        samples_per_s=samples / seconds,
        read_mb_per_s=delta("bytes_read") / seconds / 1e6,
        ms_per_sample={
            **{name.removesuffix("_ns"): delta(stats_field(name)) * per_sample for name in times},
            "slot_wait": delta("slot_wait_s") * per_sample,
            "h2d": delta("h2d_s") / max(delta("h2d_batches"), 1) * 1000.0 / max(sample_per_batch, 1.0)
            if delta("h2d_batches")
            else 0.0,
        },
        worker_busy_percent=min(100.0, 100.0 * worker_time / (seconds * max(workers, 1))),
        trainer_wait_percent=min(100.0, 100.0 * delta("trainer_wait_s") / seconds),
        epoch_start_wait_percent=min(100.0, 100.0 * delta("epoch_start_wait_s") / seconds),
        epochs=int(delta("epochs")),
        ready_batches=after.ready_batches,
        in_flight=after.in_flight,
        skipped=after.skipped,
        epochs_so_far=after.epochs,
        net_mb_per_s=delta("net_bytes") / seconds / 1e6,
        cache_hit_percent=100.0 * hits / (hits + misses) if hits + misses else None,
        per_second={name: delta(name) / seconds for name, c in declared() if c.unit != "ns"},
        ring_slots=after.ring_slots,
        tuner=tuner_state(after),
    )
