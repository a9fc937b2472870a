"""The per-batch counters are declared once (`fastload._batch_counters`), and every reader follows.

Each test runs over every field of `BatchCounters`, read from the declaration: a counter declared
there is checked on both links, in the statistics block and `LoaderStats`, in the Prometheus
series and in iostat's table with no edit here. The block's layout is fixed at import (other
processes read it): a new counter changes it, and `test_the_block_layout_is_its_versions` asks
for the new VERSION.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from helpers import loader_series

from fastload._batch_counters import (
    BatchCounters,
    column_name,
    counter_names,
    declared,
    series_name,
    stats_field,
    wire_name,
)
from fastload._diagnostics.iostat import format_report
from fastload._diagnostics.loader_rates import MachineRates, loader_rates
from fastload._loading.jobs.executor import Done
from fastload._loading.link import daemon_link
from fastload._loading.running import stats, worker_link
from fastload._loading.running.stats import LoaderStats, StatsWriter

# Every layout the statistics block has had since counters were declared: VERSION -> counters.
LAYOUTS = {
    6: stats.VERSION_6,
    7: (  # the tuner's state and the ring's slots (issue 32)
        *stats.VERSION_6, "tuner_workers", "tuner_in_flight", "tuned", "ring_slots", "tuner_reason",
        "tuner_changes", "tuner_changed_ns", "starved_ns",
    ),
}
# The `done` counters a daemon link of version 1 requires: a counter required later would be
# refused by every older trainer (NOTE [counters on the link]).
REQUIRED_ON_THE_LINK = {"count", "read_ns", "decode_ns", "bytes", "read_cpu_ns"}
IDLE = MachineRates(
    cpu={"user": 1.0, "system": 1.0, "iowait": 0.0}, disk=None, device="tmpfs", device_kind="memory",
    page_cache_bytes=0, shm_used_bytes=0, shm_total_bytes=1, gpu_percent=None,
)


def distinct_counters() -> BatchCounters:
    """Every counter a value of its own (times in whole seconds, so they read back exactly)."""
    names = counter_names()
    return BatchCounters(*((k + 1) * (10**9 if name.endswith("_ns") else 1) for k, name in enumerate(names)))


@pytest.fixture
def snapshot() -> Iterator[LoaderStats]:
    """A statistics block that counted one batch of `distinct_counters`, read back."""
    writer = StatsWriter("/data/train", "local", "cpu", num_workers=2, batch_size=8)
    try:
        writer.count_batch(distinct_counters())
        yield writer.snapshot()
    finally:
        writer.close()


def test_each_counter_declares_what_its_readers_need() -> None:
    assert declared(), "no counter declared"
    for name, c in declared():
        assert c.help.strip(), f"{name} has no help text"
        assert (c.unit == "ns") == name.endswith("_ns"), f"{name}: a time is named *_ns, and only a time"
        assert series_name(name, c).endswith("_total"), f"{name}: a Prometheus counter ends in _total"


@pytest.mark.parametrize(("name", "position"), [(n, k) for k, n in enumerate(counter_names())])
def test_counters_sum_field_by_field(name: str, position: int) -> None:
    a, b = distinct_counters(), BatchCounters(*(7 for _ in counter_names()))
    assert getattr(a + b, name) == getattr(a, name) + 7
    assert (a + BatchCounters()).values()[position] == a.values()[position]


def test_every_counter_crosses_the_worker_link() -> None:
    done = Done(3, distinct_counters())
    assert worker_link.decode_event(worker_link.encode_event(done)) == done


def test_a_done_of_another_layout_is_refused() -> None:
    kind, head = worker_link.encode_event(Done(3, distinct_counters()))
    with pytest.raises(ValueError, match="DONE of"):
        worker_link.decode_event([kind, head[:-8]])


def test_every_counter_crosses_the_daemon_link() -> None:
    done = Done(3, distinct_counters())
    op, fields = daemon_link.event_message(done, 3)
    assert {wire_name(n, c) for n, c in declared()} <= set(fields)
    assert daemon_link.event_from_message(*daemon_link.decode(daemon_link.encode(op, **fields))) == done


def test_the_daemon_link_requires_only_its_first_versions_counters() -> None:
    required = {wire_name(n, c) for n, c in declared() if c.required}
    assert required == REQUIRED_ON_THE_LINK
    op, fields = daemon_link.event_message(Done(4, BatchCounters(samples=2)), 4)
    assert set(fields) == {"seq", *required}  # the others, zero, are left out for older peers
    assert daemon_link.event_from_message(*daemon_link.decode(daemon_link.encode(op, **fields))) == Done(
        4, BatchCounters(samples=2)
    )


def test_the_block_layout_is_its_versions() -> None:
    assert stats.VERSION in LAYOUTS, f"record statistics block version {stats.VERSION}'s layout in LAYOUTS"
    assert LAYOUTS[stats.VERSION] == stats.COUNTERS, (
        "the statistics block's counters changed: bump stats.VERSION (other processes read the "
        "block) and record its layout in LAYOUTS"
    )


def test_every_counter_is_in_the_block_and_loader_stats(snapshot: LoaderStats) -> None:
    fields = {f.name for f in dataclasses.fields(LoaderStats)}
    for name, value in distinct_counters().items():
        assert name in stats.COUNTERS
        assert stats_field(name) in fields, f"give LoaderStats a field {stats_field(name)} for {name}"
        expected = value / 1e9 if name.endswith("_ns") else value
        assert getattr(snapshot, stats_field(name)) == expected, name
    assert snapshot.batches == 1


def test_every_counter_is_a_prometheus_series(snapshot: LoaderStats) -> None:
    series = loader_series(snapshot)
    for name, c in declared():
        labels = {"rank": "0", "loader": "0", **dict([c.series_label] if c.series_label else [])}
        key = (series_name(name, c), tuple(sorted(labels.items())))
        assert key in series, f"{name} is not exported as {key}"
        assert series[key] == pytest.approx(getattr(snapshot, stats_field(name))), name


def test_every_counter_has_a_column_in_iostats_table(snapshot: LoaderStats) -> None:
    rates = loader_rates("block", None, snapshot, 1.0)
    for name, c in declared():
        if c.unit == "ns":
            assert name.removesuffix("_ns") in rates.ms_per_sample, name
        else:
            assert name in rates.per_second, name
    heading = format_report([rates], IDLE, extended=True).splitlines()[2]
    for name, c in declared():
        column = column_name(name, c)
        assert column in heading, f"{name}'s column {column!r} is not in {heading!r}"
