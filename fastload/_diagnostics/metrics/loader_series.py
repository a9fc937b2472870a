"""A loader's Prometheus series: its counters since it started, its gauges, its rates and verdict.

Names, units and labels follow Prometheus' conventions: counters end in `_total`, times are
`_seconds_total`, sizes `_bytes`; per-loader series are labelled by `rank` and `loader` (a local
loader's number in its process) or `session` and `rank` (a daemon's), never by sample, so a
series set stays as small as the loaders are few. The iostat verdict (`_diagnostics.verdict.classify`,
over the time since the previous scrape at least 1 s back) is `fastload_verdict{verdict=...}`,
1 for the current one and 0 for the others, so its set of series is fixed.

The per-batch counters' series are the declaration's (`_batch_counters`: each counter's family,
help and label): a counter declared there is exported with no edit here.

A tuned loader's tuner (issue 32) is `fastload_tuner_workers`, `fastload_tuner_in_flight`,
`fastload_tuner_changes_total`, `fastload_tuner_last_change_timestamp_seconds` and the reason of
its last change as `fastload_tuner_reason{reason=...}`, 1 for it and 0 for the others: a state
set, like the verdict, so a dashboard or an alert names the reason (`{reason="oversubscribed"}
== 1`) without a table of codes, and the set of series is fixed (`tuning.decisions.Reason`). A
loader not tuned has none of these; every loader has `fastload_ring_slots`.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastload._batch_counters import STAGE_HELP, STAGE_SECONDS, declared, series_name, stats_field
from fastload._diagnostics.loader_rates import LoaderRates
from fastload._diagnostics.metrics.families import Families
from fastload._loading.running.stats import LoaderStats
from fastload._loading.tuning.decisions import Reason, reason_tag

VERDICTS = (
    "idle",
    "not the bottleneck",
    "storage-bound",
    "decode-bound",
    "augment-bound",
    "transport-bound",
    "host-to-device-bound",
    "epoch-start-bound",
)
STAGES = ("read", "decode", "augment", "slot_wait", "h2d")


def add_loader(f: Families, labels: Mapping[str, str], s: LoaderStats, r: LoaderRates | None) -> None:
    """One loader's (or a session's trainer's) series: counters since it started, gauges now, and
    per-second figures and the verdict over the last window (`r`)."""
    for name, c in declared():  # the per-batch counters, each under the series it declares
        series_labels = {**labels, **dict([c.series_label] if c.series_label else [])}
        f.counter(series_name(name, c), c.help, series_labels, getattr(s, stats_field(name)))
    f.counter("fastload_batches_total", "Batches delivered to the trainer.", labels, s.batches)
    for stage, seconds in (("slot_wait", s.slot_wait_s), ("h2d", s.h2d_s)):  # the trainer's stages
        f.counter(STAGE_SECONDS, STAGE_HELP, {**labels, "stage": stage}, seconds)
    f.counter(
        "fastload_trainer_wait_seconds_total",
        "Time the trainer spent inside next().",
        labels,
        s.trainer_wait_s,
    )
    f.counter(
        "fastload_failures_total", "Batches that failed (SampleError, WorkerError).", labels, s.failures
    )
    f.counter(
        "fastload_skipped_samples_total",
        "Broken samples replaced by stand-ins (on_error='skip').",
        labels,
        s.skipped,
    )
    f.counter("fastload_epochs_total", "Iterations that yielded a batch.", labels, s.epochs)
    f.gauge(
        "fastload_ring_ready_batches", "Batches decoded and waiting for the trainer.", labels, s.ready_batches
    )
    f.gauge("fastload_ring_in_flight_batches", "Batches being decoded.", labels, s.in_flight)
    f.gauge("fastload_ring_slots", "Slots of the loader's shared-memory ring now.", labels, s.ring_slots)
    if s.is_tuned:
        add_tuner(f, labels, s)
    if r is None:
        return
    f.gauge(
        "fastload_samples_per_second", "Samples per second over the last window.", labels, r.samples_per_s
    )
    f.gauge(
        "fastload_batches_per_second",
        "Batches per second over the last window.",
        labels,
        r.samples_per_s / s.batch_size if s.batch_size else 0.0,
    )
    for stage in STAGES:
        f.gauge(
            "fastload_stage_seconds_per_sample",
            "Each stage's time per sample over the last window.",
            {**labels, "stage": stage},
            r.ms_per_sample[stage] / 1000.0,
        )
    f.gauge(
        "fastload_trainer_wait_ratio",
        "Share of the last window the trainer waited in next().",
        labels,
        r.trainer_wait_percent / 100.0,
    )
    f.gauge(
        "fastload_worker_busy_ratio",
        "Share of the last window the workers worked.",
        labels,
        r.worker_busy_percent / 100.0,
    )
    for verdict in VERDICTS:
        f.gauge(
            "fastload_verdict",
            "fastload iostat's verdict: 1 for the current one.",
            {**labels, "verdict": verdict},
            float(r.verdict == verdict),
        )



def add_tuner(f: Families, labels: Mapping[str, str], s: LoaderStats) -> None:
    """A tuned loader's tuner: what it runs now, its changes, and the reason of the last one."""
    f.gauge("fastload_tuner_workers", "Workers the tuner runs now.", labels, s.tuner_workers)
    f.gauge(
        "fastload_tuner_in_flight", "Batches in flight the tuner allows now (the window's limit).",
        labels, s.tuner_in_flight,
    )
    f.counter("fastload_tuner_changes_total", "Changes the tuner made.", labels, s.tuner_changes)
    f.gauge(
        "fastload_tuner_last_change_timestamp_seconds",
        "Unix time of the tuner's last change (0: none yet).",
        labels,
        s.tuner_changed,
    )
    for reason in Reason:
        f.gauge(
            "fastload_tuner_reason",
            "The reason of the tuner's last change: 1 for it (none: no change yet).",
            {**labels, "reason": reason_tag(reason)},
            float(s.tuner_reason == reason),
        )
