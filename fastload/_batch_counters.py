"""The per-batch counters, declared once: what a worker measures while it makes a batch.

`BatchCounters` is the one declaration. Each of its fields is an int64 with a `Counter` beside it
(its unit, its kind, its help text, the name the daemon link gives it, the Prometheus series it
is exported as and the `fastload iostat` column that shows it). Everything that carries or shows
these counters takes its fields from here, in the declared order:
    `_loading.jobs.executor.Done`          a finished task's counters (`Done.counters`)
    `_loading.running.worker_link`            the DONE struct, one int64 per field after the seq
    `_loading.link.daemon_link`            the `done` reply's fields and their schema
    `_loading.running.pipeline`               a split batch's parts summed (`+`), then counted
    `_loading.running.stats`                  the statistics block's counters and `LoaderStats` fields
    `_diagnostics.metrics.loader_series`  a loader's Prometheus series
    `_diagnostics.loader_rates`       the rates iostat's table shows (`_diagnostics.iostat`)
    `_daemon.sessions`                what a daemon session has cost so far

NOTE [adding a per-batch counter]: add a field here, at the end (the worker link and the
statistics block keep the declared order), with its `counter(...)`; measure it where the work is
(a job's `Done`); give `LoaderStats` its field (`_loading.running.stats`, a typed public API) and bump
the block's VERSION (`tests/test_batch_counters.py` says both when they are missing). The links,
the block's layout, the sums, the Prometheus series and iostat's table follow from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

Unit = Literal["samples", "bytes", "ns", "reads"]


@dataclass(frozen=True)
class Counter:
    """What one counter means and what its readers call it."""

    unit: Unit  # "ns" counters are shown in seconds (`LoaderStats`' `<name>_s`, Prometheus)
    help: str  # the Prometheus HELP text, and what the counter is, for a person
    # "counter": summed over batches, only ever grows. (The trainer's gauges, such as the batches
    # ready, are the statistics block's own: no worker measures them per batch.)
    kind: Literal["counter"] = "counter"
    # The daemon link's `done` field ("": the counter's own name). `required`: in `done` since
    # the link's first version, always sent; the others arrived later: sent when not zero, absent
    # read as zero (an older peer neither sends nor accepts them).
    wire: str = ""
    required: bool = False
    # The Prometheus family it is exported as ("": fastload_<name>_total, ns as _seconds_total),
    # and a (label, value) its series carries where several counters share a family.
    series: str = ""
    series_label: tuple[str, str] | None = None
    # The column of `fastload iostat`'s table that shows it ("": a column of its own, `-x`).
    column: str = ""


def counter(unit: Unit, help: str, **names: Any) -> Any:
    """A `BatchCounters` field: an int defaulting to 0, with its `Counter`."""
    return dataclasses.field(default=0, metadata={"counter": Counter(unit, help, **names)})


STAGE_SECONDS = "fastload_stage_seconds_total"
STAGE_HELP = (
    "Time spent in each stage (read, decode, augment: summed over workers; slot_wait, h2d: the trainer's)."
)
NODE_CACHE_READS = "fastload_node_cache_reads_total"
NODE_CACHE_HELP = "Chunk reads of remote objects, answered by the node cache (hit) or waited for (miss)."


@dataclass(frozen=True)
class BatchCounters:
    """A batch's (or a part of one's) counters, as a worker measured them; `+` sums two."""

    samples: int = counter(
        "samples", "Samples delivered to the trainer.", wire="count", required=True,
        series="fastload_samples_total", column="samples/s",
    )
    read_ns: int = counter(
        "ns", STAGE_HELP, required=True, series=STAGE_SECONDS, series_label=("stage", "read"), column="read",
    )
    decode_ns: int = counter(
        "ns", STAGE_HELP, required=True, series=STAGE_SECONDS, series_label=("stage", "decode"),
        column="decode",
    )
    bytes_read: int = counter(
        "bytes", "Encoded bytes the workers read.", wire="bytes", required=True,
        series="fastload_read_bytes_total", column="rMB/s",
    )
    # CPU time of the read stage: near read_ns when reading computes (a Dataset decoding in
    # __getitem__), far below it when the worker waits, for storage or for a CPU.
    read_cpu_ns: int = counter(
        "ns", "Of the read stage, the workers' time on a CPU.", required=True,
        series="fastload_read_cpu_seconds_total", column="verdict",
    )
    # Time the reading thread was runnable but waiting for a CPU (the kernel's run-queue delay;
    # 0 where it is not reported): what separates the two waits on an oversubscribed machine.
    read_runq_ns: int = counter(
        "ns", "Of the read stage, the workers' time runnable but waiting for a CPU.",
        series="fastload_read_runq_seconds_total", column="verdict",
    )
    # The pixel stage's time (colour, policies: NOTE [transform stages]), apart from decode_ns.
    augment_ns: int = counter(
        "ns", STAGE_HELP, series=STAGE_SECONDS, series_label=("stage", "augment"), column="augment",
    )
    # Reads of remote objects (NOTE [node cache]): bytes fetched from the store, time waited for
    # chunks not in the node cache, chunks found there and chunks waited for.
    net_bytes: int = counter(
        "bytes", "Bytes fetched from object storage (workers and the trainer's read-ahead).",
        series="fastload_remote_bytes_total", column="netMB/s",
    )
    net_wait_ns: int = counter(
        "ns", "Of the read stage, time waiting for chunks not in the node cache.",
        series="fastload_remote_wait_seconds_total", column="net",
    )
    cache_hits: int = counter(
        "reads", NODE_CACHE_HELP, series=NODE_CACHE_READS, series_label=("outcome", "hit"), column="hit%",
    )
    cache_misses: int = counter(
        "reads", NODE_CACHE_HELP, series=NODE_CACHE_READS, series_label=("outcome", "miss"), column="hit%",
    )

    def __add__(self, other: BatchCounters) -> BatchCounters:
        return type(self)(*(a + b for a, b in zip(self.values(), other.values(), strict=True)))

    def values(self) -> tuple[int, ...]:
        """Every counter, in the declared order (the worker link's DONE struct)."""
        return tuple(getattr(self, name) for name in counter_names(type(self)))

    def items(self) -> Iterator[tuple[str, int]]:
        """(name, value) of every counter, in the declared order."""
        return zip(counter_names(type(self)), self.values(), strict=True)


def declared(cls: type[BatchCounters] = BatchCounters) -> tuple[tuple[str, Counter], ...]:
    """(name, Counter) of every field of the declaration, in its order."""
    return tuple((f.name, f.metadata["counter"]) for f in dataclasses.fields(cls))


def counter_names(cls: type[BatchCounters] = BatchCounters) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def stats_field(name: str) -> str:
    """The `LoaderStats` field that shows counter `name`: a time (`_ns`, its unit "ns") in seconds,
    `read_ns` as `read_s`; any other under its own name."""
    return name.removesuffix("_ns") + "_s" if name.endswith("_ns") else name


def wire_name(name: str, c: Counter) -> str:
    return c.wire or name


def series_name(name: str, c: Counter) -> str:
    """Its Prometheus family: the declared one, or fastload_<name>_total (ns: _seconds_total)."""
    if c.series:
        return c.series
    if c.unit == "ns":
        return f"fastload_{name.removesuffix('_ns')}_seconds_total"
    return f"fastload_{name}_total"


def column_name(name: str, c: Counter) -> str:
    return c.column or name.removesuffix("_ns")
