"""A daemon's Prometheus series: its totals, its health, and each session's counters and trainer.

Read from the daemon's published `status()` (NOTE [published status] in `_daemon.server`) and, for
a local session, from its trainer's statistics block (`collectors.session_trainers`): the figures
`fastload status --json` shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastload._diagnostics.metrics.families import Families
from fastload._diagnostics.metrics.loader_series import add_loader
from fastload._diagnostics.metrics.windows import RateWindows
from fastload._labels import label
from fastload._loading.running.stats import LoaderStats


def add_daemon(
    f: Families, status: Mapping[str, Any], trainers: Mapping[int, LoaderStats], windows: RateWindows
) -> None:
    """A daemon's series from its published `status()` (and its local sessions' trainers' blocks,
    `trainers`: session id -> block) — the figures `fastload status --json` shows."""
    none: dict[str, str] = {}
    totals = status["totals"]
    f.counter(
        "fastload_daemon_samples_total",
        "Samples the daemon's workers delivered, every session.",
        none,
        totals["samples"],
    )
    f.counter(
        "fastload_daemon_tasks_total",
        "Tasks (batches or parts of one: trainers split them) the workers finished, every session.",
        none,
        totals["tasks"],
    )
    f.counter(
        "fastload_daemon_read_bytes_total",
        "Encoded bytes the daemon's workers read.",
        none,
        totals["bytes_read"],
    )
    f.counter(
        "fastload_daemon_failures_total", "Tasks that failed, every session.", none, totals["failures"]
    )
    f.counter("fastload_daemon_sessions_started_total", "Sessions admitted.", none, totals["sessions"])
    f.counter(
        "fastload_daemon_refusals_total",
        "Sessions refused (budget, limits, draining, a source it may not open).",
        none,
        totals["refusals"],
    )
    for cause, count in status["worker_deaths"].items():
        f.counter(
            "fastload_daemon_worker_restarts_total",
            "Workers replaced, by cause (crash, hang, external: killed from outside).",
            {"cause": cause},
            count,
        )
    f.gauge("fastload_daemon_sessions", "Sessions attached now.", none, len(status["sessions"]))
    f.gauge("fastload_daemon_workers", "Decode worker processes.", none, status["workers"])
    f.gauge(
        "fastload_daemon_memory_budget_bytes",
        "Shared memory the daemon may use.",
        none,
        status["budget_bytes"],
    )
    f.gauge(
        "fastload_daemon_memory_used_bytes",
        "Shared memory in use (rings and dataset indexes).",
        none,
        status["used_bytes"],
    )
    f.gauge(
        "fastload_daemon_draining",
        "1 while the daemon finishes its last batches before exiting.",
        none,
        float(status["draining"]),
    )
    for row in status["sessions"]:
        labels = {"session": str(row["session"]), "rank": str(row["rank"])}
        f.gauge(
            "fastload_session_info",
            "A session: its trainer, rank and dataset (value 1).",
            {
                **labels,
                "pid": str(row["pid"]),
                "world_size": str(row["world_size"]),
                "dataset": label(row["dataset"]),  # a peer's text (NOTE [one record, one line])
            },
            1.0,
        )
        f.counter(
            "fastload_session_samples_total",
            "Samples the daemon delivered to this session.",
            labels,
            row["images"],
        )
        f.counter(
            "fastload_session_tasks_total",
            "Tasks (batches or parts of one) the workers finished for this session.",
            labels,
            row["tasks"],
        )
        f.counter(
            "fastload_session_read_bytes_total",
            "Encoded bytes read for this session.",
            labels,
            row["bytes_read"],
        )
        for stage in ("read", "decode", "augment"):
            f.counter(
                "fastload_session_stage_seconds_total",
                "Workers' time per stage for this session.",
                {**labels, "stage": stage},
                row[f"{stage}_s"],
            )
        f.counter(
            "fastload_session_failures_total", "This session's failed tasks.", labels, row["failures"]
        )
        f.gauge(
            "fastload_session_samples_per_second",
            "Samples per second since the session started.",
            labels,
            row["images_per_s"],
        )
        f.gauge("fastload_session_queued_tasks", "Tasks queued for the pool.", labels, row["queued"])
        f.gauge("fastload_session_memory_bytes", "The session's ring.", labels, row["memory_bytes"])
        # NOTE [shares by need] in `_daemon.shares`: the weight is priority x need; the share is
        # what the session had of the pool's work over the last interval (`fastload status`'s columns).
        f.gauge("fastload_session_priority", "The priority its trainer asked for.", labels, row["priority"])
        f.gauge(
            "fastload_session_need",
            "How much its trainer waits: 1 when never, more the more it waits (from its slots until "
            "the trainer reports).",
            labels,
            row["need"],
        )
        f.gauge(
            "fastload_session_pool_share",
            "Its share of the pool's work, last interval (0..1).",
            labels,
            row["share"],
        )
        trainer = trainers.get(row["session"])
        if trainer is not None:  # the trainer's view: its waits, copies, ring and verdict
            add_loader(f, labels, trainer, windows.rates(f"session {row['session']}", trainer))
    windows.forget({f"session {row['session']}" for row in status["sessions"]})
