"""Per-loader counters and timings in a small fixed-layout shared-memory block, always on.

Every loader (local, or a daemon session's trainer side) owns one block: a 64-byte header and a
row of int64 counters, written only by the trainer's process (one writer: no locks; aligned
8-byte stores are atomic on the platforms we run on), read by `loader.stats()` and by
`fastload iostat` from other processes, which find blocks by name (`fastload_<pid>_stats_...`).

Layout (little-endian): magic "FLSTATS1" | version | pid | created (unix ns) | workers |
batch size | mode (0 local, 1 daemon) | device (0 cpu, 1 cuda) | counters[...] | dataset (256 B).

What the stages mean: `read` is getting a sample's bytes (file read, or a Dataset's
`__getitem__`), of which `read_cpu` is time on a CPU and `read_runq` time runnable but waiting for
a CPU (the rest is time blocked: storage, sleeps, locks); `decode` is decode + augment + the write
into the batch slot (one fused pass in the native backend, so it is not split further);
`net_wait` (of `read`) is time waiting for chunks of remote objects not in the node cache;
`slot_wait` is time the pipeline had a batch to start but no free slot; `h2d` is the
host-to-device copy (+ normalize) measured by CUDA events; `trainer_wait` is time the trainer
spent inside `next()`, of which `starved` is time waiting for a batch not loaded yet (the rest is
handing a batch over; an epoch's first batch is counted in `epoch_start_wait` instead): the
tuner's measure of a loader-bound trainer.

The tuner's state (issue 32, `_loading.tuning`) is in the block too: what it runs now
(`tuner_workers`: 0 when nothing is tuned; `tuner_in_flight`; `tuned`: what it moves), the ring's
slots (every loader's, tuned or not), and its last change (`tuner_reason`: a
`tuning.decisions.Reason` code, which this room stores and does not word: the readers above
it, iostat and the exporters, do; `tuner_changes`; `tuner_changed_ns`).
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._batch_counters import BatchCounters, counter_names, stats_field
from fastload._machine import pid_alive
from fastload._shm import STATS_TAG, Segment, own_segments

MAGIC = b"FLSTATS1"
# 2: read_runq_ns; 3: epochs, epoch_start_wait_ns; 4: augment_ns; 5: skipped; 6: net_*, cache_*;
# 7: the tuner's state and the ring's slots (VERSION_7)
VERSION = 7
_HEAD = struct.Struct("<8sqqqqqqq")
# NOTE [the block's counters]: the per-batch counters (`_batch_counters.BatchCounters`: samples,
# bytes_read, read_ns, decode_ns, read_cpu_ns, read_runq_ns, augment_ns, net_*, cache_*) and the
# trainer's own, in version 6's order, then version 7's tuner gauges and counters; a per-batch
# counter declared since goes after them. The
# layout is what other processes (iostat, the exporters, another version's) read: a change is a
# new VERSION, which `tests/test_batch_counters.py` holds to the layout it records.
VERSION_6 = (
    "batches",
    "samples",
    "bytes_read",
    "read_ns",
    "decode_ns",
    "read_cpu_ns",
    "read_runq_ns",
    "slot_wait_ns",
    "h2d_ns",
    "h2d_batches",
    "trainer_wait_ns",
    "next_calls",
    "ready_batches",  # gauge: batches decoded and waiting for the trainer
    "in_flight",  # gauge: batches being decoded
    "failures",
    "updated_ns",  # monotonic-free wall clock (time.time_ns) of the last update
    "epochs",  # iterations that yielded a batch
    "epoch_start_wait_ns",  # of trainer_wait_ns, the waits for each epoch's first batch
    "augment_ns",
    "skipped",  # broken samples replaced by stand-ins (on_error="skip": NOTE [bad samples])
    "net_bytes",  # + what the trainer's read-ahead fetched
    "net_wait_ns",
    "cache_hits",
    "cache_misses",
)
VERSION_7 = (
    *VERSION_6,
    "tuner_workers",  # gauge: the workers a tuner runs now; 0: nothing of the loader is tuned
    "tuner_in_flight",  # gauge: the in-flight window's limit a tuner set
    "tuned",  # gauge: what a tuner moves (TUNES_WORKERS | TUNES_IN_FLIGHT); 0: not tuned
    "ring_slots",  # gauge: the ring's slots now (tuned or not; 0 before the ring exists)
    "tuner_reason",  # gauge: the `tuning.decisions.Reason` code of the last change (0: none yet)
    "tuner_changes",  # changes the tuner made
    "tuner_changed_ns",  # wall clock (time.time_ns) of the last change; 0: none yet
    "starved_ns",  # of trainer_wait_ns, waiting for a batch not yet loaded (not an epoch's first)
)
COUNTERS = VERSION_7 + tuple(name for name in counter_names() if name not in VERSION_7)
TUNES_WORKERS, TUNES_IN_FLIGHT = 1, 2  # the bits of `tuned`
# Each counter's `LoaderStats` field: a time (ns) in seconds (`stats_field`), a wall clock in unix
# seconds under its own name, the others as they are.
_WALL_CLOCKS = {"updated_ns": "updated", "tuner_changed_ns": "tuner_changed"}
_FIELDS = {name: _WALL_CLOCKS.get(name) or stats_field(name) for name in COUNTERS}
_INDEX = {name: i for i, name in enumerate(COUNTERS)}
_PATH_BYTES = 256
BLOCK_BYTES = _HEAD.size + 8 * len(COUNTERS) + _PATH_BYTES


@dataclass(frozen=True)
class LoaderStats:
    """A snapshot of one loader's counters (cumulative since it started; gauges are current).

    Times are seconds summed over batches (worker time for read/decode, so they can exceed wall
    time with several workers). One field per counter of the block (NOTE [the block's counters]),
    what each per-batch one means in `_batch_counters`.
    """

    pid: int
    dataset: str
    mode: str  # "local" | "daemon"
    device: str  # "cpu" | "cuda"
    num_workers: int
    batch_size: int
    created: float  # unix time
    batches: int
    samples: int
    bytes_read: int
    read_s: float
    decode_s: float
    read_cpu_s: float
    read_runq_s: float  # reading threads runnable but waiting for a CPU (0 where not reported)
    slot_wait_s: float
    h2d_s: float
    h2d_batches: int
    trainer_wait_s: float
    next_calls: int
    ready_batches: int
    in_flight: int
    failures: int
    updated: float  # unix time of the last update
    epochs: int = 0  # iterations that yielded a batch
    epoch_start_wait_s: float = 0.0  # of trainer_wait_s, the waits for each epoch's first batch
    augment_s: float = 0.0  # workers' time in the pixel stage (colour, policies)
    skipped: int = 0  # broken samples replaced by stand-ins (on_error="skip"), every time met
    net_bytes: int = 0  # fetched from object storage (workers and read-ahead)
    net_wait_s: float = 0.0  # of read_s, waiting for chunks not in the node cache
    cache_hits: int = 0  # chunk reads of remote objects answered by the node cache
    cache_misses: int = 0  # ...and those that waited for a download
    # The tuner (issue 32): what it runs now, what it moves, and its last change.
    tuner_workers: int = 0  # active workers now; 0: nothing of this loader is tuned
    tuner_in_flight: int = 0  # the in-flight window's limit now (0: not tuned)
    tuned: int = 0  # TUNES_WORKERS | TUNES_IN_FLIGHT: what the tuner moves
    ring_slots: int = 0  # the ring's slots now, tuned or not (0: no ring yet, or none: DALI)
    tuner_reason: int = 0  # the last change's `tuning.decisions.Reason` code (0: none yet)
    tuner_changes: int = 0
    tuner_changed: float = 0.0  # unix time of the last change (0: none yet)
    starved_s: float = 0.0  # of trainer_wait_s, waiting for a batch not yet loaded (epochs' first excepted)

    @property
    def is_tuned(self) -> bool:
        """Whether a tuner moves this loader's workers or batches in flight."""
        return self.tuner_workers > 0


class StatsWriter:
    """The trainer-side owner of a block; `add` and `set` are a few numpy stores each."""

    def __init__(self, dataset: str, mode: str, device: str, num_workers: int, batch_size: int) -> None:
        self.segment = Segment.create(BLOCK_BYTES, tag=STATS_TAG)
        _HEAD.pack_into(
            self.segment.buf,
            0,
            MAGIC,
            VERSION,
            os.getpid(),
            time.time_ns(),
            num_workers,
            batch_size,
            1 if mode == "daemon" else 0,
            1 if device == "cuda" else 0,
        )
        encoded = dataset.encode("utf-8", "replace")[:_PATH_BYTES]
        start = _HEAD.size + 8 * len(COUNTERS)
        self.segment.buf[start : start + len(encoded)] = encoded
        self._c = np.ndarray((len(COUNTERS),), np.int64, buffer=self.segment.buf, offset=_HEAD.size)
        self.last_change = ""  # the words of the tuner's last change (`tuner_changed`), for the summary

    def add(self, name: str, value: int) -> None:
        self._c[_INDEX[name]] += value
        self._c[_INDEX["updated_ns"]] = time.time_ns()

    def count_batch(self, counters: BatchCounters) -> None:
        """One more batch delivered, and what it cost (its per-batch counters)."""
        self.add("batches", 1)
        for name, value in counters.items():
            self.add(name, value)

    def set(self, name: str, value: int) -> None:
        self._c[_INDEX[name]] = value

    def tuning(
        self, workers: int, in_flight: int, ring_slots: int, *, tunes_workers: bool = True,
        tunes_in_flight: bool = True,
    ) -> None:
        """What a tuner runs now: its active workers (at least 1: a tuned loader's `tuner_workers`
        is never 0), the in-flight window's limit and the ring's slots; and what it moves. Called
        at its start and after each change."""
        self.set("tuner_workers", max(workers, 1))
        self.set("tuner_in_flight", in_flight)
        self.set("tuned", TUNES_WORKERS * tunes_workers | TUNES_IN_FLIGHT * tunes_in_flight)
        self.ring_sized(ring_slots)

    def tuner_changed(self, reason_code: int, words: str = "") -> None:
        """A tuner changed something, for the reason whose code (`tuning.decisions.Reason`) is
        `reason_code`; `words` (its `REASON_WORDS`) are kept here for this process's summary
        (`last_change`): the block holds the code, which other processes word themselves."""
        self.set("tuner_reason", int(reason_code))
        self.add("tuner_changes", 1)
        self.set("tuner_changed_ns", time.time_ns())
        self.last_change = words

    def ring_sized(self, slots: int) -> None:
        """The ring has `slots` slots now (made, grown or shrunk; every loader's)."""
        self.set("ring_slots", slots)

    def copied(self, seconds: float) -> None:
        """One host-to-device copy completed, taking `seconds` (timed by CUDA events)."""
        self.add("h2d_ns", int(seconds * 1e9))
        self.add("h2d_batches", 1)

    def snapshot(self) -> LoaderStats:
        return _parse(self.segment.buf)

    def close(self) -> None:
        del self._c
        self.segment.close()


def _parse(buf: memoryview | bytes | bytearray | object) -> LoaderStats:
    raw = bytes(buf[:BLOCK_BYTES])  # type: ignore[index]
    if len(raw) < BLOCK_BYTES:  # made, not yet sized: a loader starting as we look
        raise ValueError("not a whole fastload statistics block")
    magic, version, pid, created, workers, batch, mode, device = _HEAD.unpack_from(raw, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a fastload statistics block")
    c = np.frombuffer(raw, np.int64, count=len(COUNTERS), offset=_HEAD.size)
    dataset = raw[_HEAD.size + 8 * len(COUNTERS) :].rstrip(b"\0").decode("utf-8", "replace")
    fields: dict[str, Any] = {
        _FIELDS[name]: int(value) / 1e9 if name.endswith("_ns") else int(value)
        for name, value in zip(COUNTERS, c, strict=True)
    }
    return LoaderStats(
        pid=pid,
        dataset=dataset,
        mode="daemon" if mode else "local",
        device="cuda" if device else "cpu",
        num_workers=workers,
        batch_size=batch,
        created=created / 1e9,
        **fields,
    )


def find_loaders() -> dict[str, LoaderStats]:
    """Every live loader of this user: statistics block name -> snapshot."""
    found: dict[str, LoaderStats] = {}
    for entry, owner in own_segments():
        if f"_{STATS_TAG}" not in entry.name or not pid_alive(owner):
            continue  # not a statistics block, or its owner died (the next loader start reaps it)
        stats = read_block(entry.path)
        if stats is not None:
            found[entry.name] = stats
    return found


def read_block(path: str) -> LoaderStats | None:
    """A block read from its file, never mapped (its owner may close it meanwhile): None when it is
    gone, or not (yet) a valid block."""
    try:
        with open(path, "rb") as f:
            return _parse(f.read(BLOCK_BYTES))
    except (OSError, ValueError):
        return None


def format_summary(stats: LoaderStats, last_change: str = "") -> str:
    """A profiler-style table of a loader's stages: total time, average per batch, count; and a
    tuned loader's line on its tuner (`last_change`: the words of its last change's reason, as
    `StatsWriter.last_change` keeps them; this room cannot word a reason's code)."""
    batches = max(stats.batches, 1)
    rows = [
        ("read (storage / __getitem__)", stats.read_s, stats.batches),
        ("decode + augment + collate", stats.decode_s, stats.batches),
        ("waiting for a free slot", stats.slot_wait_s, stats.batches),
        ("host-to-device copy", stats.h2d_s, stats.h2d_batches),
        ("trainer waiting in next()", stats.trainer_wait_s, stats.next_calls),
    ]
    lines = [
        f"fastload summary: {stats.dataset} — {stats.samples} samples in {stats.batches} batches, "
        f"{stats.num_workers} workers ({stats.mode}, {stats.device})",
        f"{'stage':<32}{'total s':>10}{'avg ms':>10}{'count':>9}",
    ]
    for name, total, count in rows:
        avg = 1000 * total / max(count, 1) if count else 0.0
        lines.append(f"{name:<32}{total:>10.3f}{avg:>10.2f}{count:>9}")
    lines.append(
        f"(read and decode are summed over workers; per batch of {stats.batch_size}: "
        f"{1000 * (stats.read_s + stats.decode_s) / batches:.1f} ms of worker time)"
    )
    if stats.is_tuned:
        lines.append(_tuner_line(stats, last_change))
    return "\n".join(lines) + "\n"


def _tuner_line(stats: LoaderStats, last_change: str) -> str:
    """What the tuner ended at, from where, and its last change."""
    ended = (
        f"tuner: ended at {stats.tuner_workers} workers (started at {stats.num_workers}) and "
        f"{stats.tuner_in_flight} batches in flight, a ring of {stats.ring_slots} slots"
    )
    if not stats.tuner_changes:
        return f"{ended}; no change made"
    why = last_change or f"reason {stats.tuner_reason}"
    before_end = max(stats.updated - stats.tuner_changed, 0.0)
    changes = f"{stats.tuner_changes} change{'s' if stats.tuner_changes != 1 else ''}"
    return f"{ended}; {changes}, the last {before_end:.0f} s before the end: {why}"
