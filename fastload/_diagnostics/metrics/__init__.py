"""Prometheus metrics: a daemon's sessions and a local loader's stages, read from the stats blocks.

Served by prometheus-client's own HTTP server (its thread, `pip install fastload[metrics]`) through
a custom collector that reads, at each scrape, only what the loop that produces batches has
already published: a local loader's statistics block (read from /dev/shm as `iostat` reads it),
a daemon's `status()` snapshot (replaced whole by its loop, never computed for the scrape) and
its sessions' trainers' blocks. A scrape takes no lock of the loop's and never waits for it.

Names, units and labels follow Prometheus' conventions: counters end in `_total`, times are
`_seconds_total`, sizes `_bytes`; per-loader series are labelled by `rank` and `loader` (a local
loader's number in its process) or `session` and `rank` (a daemon's), never by sample, so a
series set stays as small as the loaders are few. What a loader is (dataset, mode, device, pid)
is in `fastload_loader_info`; the iostat verdict (`_diagnostics.iostat.classify`, over the time
since the previous scrape at least 1 s back) is `fastload_verdict{verdict=...}`, 1 for the
current one and 0 for the others, so its set of series is fixed.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastload._diagnostics import sysinfo
from fastload._diagnostics.iostat import LoaderRates, MachineRates, classify, loader_rates
from fastload._errors import ConfigError
from fastload._labels import label
from fastload._loading.stats import LoaderStats, find_loaders, read_block
from fastload._machine import SHM_DIR, usable_cores

if TYPE_CHECKING:
    from prometheus_client.core import Metric

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
_RATE_WINDOW_S = 1.0  # per-second figures and the verdict cover at least this much time


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core  # the metric families a collector yields
    except ImportError:
        raise ConfigError(
            "metrics need prometheus-client: pip install fastload[metrics] (or prometheus-client)"
        ) from None
    return prometheus_client


# -- families --------------------------------------------------------------------------------


class Families:
    """The metric families of one scrape, filled series by series."""

    def __init__(self) -> None:
        self.core = _prometheus().core
        self._families: dict[str, Any] = {}

    def _family(self, kind: str, name: str, doc: str, labels: tuple[str, ...], unit: str = "") -> Any:
        if name not in self._families:
            cls = {"counter": self.core.CounterMetricFamily, "gauge": self.core.GaugeMetricFamily}[kind]
            self._families[name] = cls(name, doc, labels=list(labels), unit=unit)
        return self._families[name]

    def counter(self, name: str, doc: str, labels: Mapping[str, str], value: float) -> None:
        self._family("counter", name, doc, tuple(labels)).add_metric(list(labels.values()), value)

    def gauge(self, name: str, doc: str, labels: Mapping[str, str], value: float) -> None:
        self._family("gauge", name, doc, tuple(labels)).add_metric(list(labels.values()), value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


def add_loader(f: Families, labels: Mapping[str, str], s: LoaderStats, r: LoaderRates | None) -> None:
    """One loader's (or a session's trainer's) series: counters since it started, gauges now, and
    per-second figures and the verdict over the last window (`r`)."""
    f.counter("fastload_samples_total", "Samples delivered to the trainer.", labels, s.samples)
    f.counter("fastload_batches_total", "Batches delivered to the trainer.", labels, s.batches)
    f.counter("fastload_read_bytes_total", "Encoded bytes the workers read.", labels, s.bytes_read)
    for stage, seconds in _stage_seconds(s).items():
        f.counter(
            "fastload_stage_seconds_total",
            "Time spent in each stage (read, decode, augment: summed over workers; slot_wait, h2d: "
            "the trainer's).",
            {**labels, "stage": stage},
            seconds,
        )
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
    f.counter(
        "fastload_remote_bytes_total",
        "Bytes fetched from object storage (workers and the trainer's read-ahead).",
        labels,
        s.net_bytes,
    )
    f.counter(
        "fastload_remote_wait_seconds_total",
        "Of the read stage, time waiting for chunks not in the node cache.",
        labels,
        s.net_wait_s,
    )
    for outcome, count in (("hit", s.cache_hits), ("miss", s.cache_misses)):
        f.counter(
            "fastload_node_cache_reads_total",
            "Chunk reads of remote objects, answered by the node cache (hit) or waited for (miss).",
            {**labels, "outcome": outcome},
            count,
        )
    f.gauge(
        "fastload_ring_ready_batches", "Batches decoded and waiting for the trainer.", labels, s.ready_batches
    )
    f.gauge("fastload_ring_in_flight_batches", "Batches being decoded.", labels, s.in_flight)
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


def _stage_seconds(s: LoaderStats) -> dict[str, float]:
    return {
        "read": s.read_s,
        "decode": s.decode_s,
        "augment": s.augment_s,
        "slot_wait": s.slot_wait_s,
        "h2d": s.h2d_s,
    }


class RateWindows:
    """Each loader's rates and verdict over at least `_RATE_WINDOW_S`: the reading a window
    starts from is kept per loader, so every scrape (however frequent) covers a full window."""

    def __init__(self) -> None:
        self._start: dict[str, tuple[float, LoaderStats]] = {}
        self._last: dict[str, LoaderRates] = {}
        self._cpu: tuple[float, Any] | None = None
        self._machine: MachineRates | None = None
        self._cores = usable_cores()

    def rates(self, key: str, stats: LoaderStats) -> LoaderRates:
        now = time.monotonic()
        start = self._start.get(key)
        if start is None or start[1].pid != stats.pid or start[1].created != stats.created:
            self._start[key] = (now, stats)
            rates = loader_rates(key, None, stats, 0.0)  # since the loader started
        elif now - start[0] >= _RATE_WINDOW_S or key not in self._last:
            rates = loader_rates(key, start[1], stats, now - start[0])
            if now - start[0] >= _RATE_WINDOW_S:
                self._start[key] = (now, stats)
        else:
            return self._last[key]
        verdict, advice = classify(rates, self.machine(), self._cores)
        rates = LoaderRates(**{**rates.__dict__, "verdict": verdict, "advice": advice})
        self._last[key] = rates
        return rates

    def machine(self) -> MachineRates:
        """The CPU's share of iowait over the same window (what `classify` reads of the machine)."""
        now = time.monotonic()
        if self._machine is None or self._cpu is None or now - self._cpu[0] >= _RATE_WINDOW_S:
            cpu = sysinfo.read_cpu()
            shares = {} if self._cpu is None else sysinfo.cpu_percent(self._cpu[1], cpu).__dict__
            self._cpu = (now, cpu)
            self._machine = MachineRates(
                cpu=dict(shares),
                disk=None,
                device="unknown",
                device_kind="unknown",
                page_cache_bytes=0,
                shm_used_bytes=0,
                shm_total_bytes=0,
                gpu_percent=None,
            )
        return self._machine

    def forget(self, keep: set[str]) -> None:
        for key in set(self._start) - keep:
            self._start.pop(key, None)
            self._last.pop(key, None)


# -- the daemon ------------------------------------------------------------------------------


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
        trainer = trainers.get(row["session"])
        if trainer is not None:  # the trainer's view: its waits, copies, ring and verdict
            add_loader(f, labels, trainer, windows.rates(f"session {row['session']}", trainer))
    windows.forget({f"session {row['session']}" for row in status["sessions"]})


def session_trainers(sessions: list[Mapping[str, Any]]) -> dict[int, LoaderStats]:
    """Each local session's trainer's statistics block: the one block of that pid attached to a
    daemon for that dataset (a trainer with two such loaders on one dataset is left out: which is
    which cannot be told)."""
    by_owner: dict[tuple[int, str], list[LoaderStats]] = {}
    for stats in find_loaders().values():
        if stats.mode == "daemon":
            by_owner.setdefault((stats.pid, stats.dataset), []).append(stats)
    found = {}
    for row in sessions:
        blocks = by_owner.get((row["pid"], row["dataset"]), [])
        if len(blocks) == 1:
            found[row["session"]] = blocks[0]
    return found


class DaemonCollector:
    """Reads `published()`, a daemon's latest status snapshot (None before the first)."""

    def __init__(self, published: Callable[[], Mapping[str, Any] | None]) -> None:
        self._published = published
        self._windows = RateWindows()
        self._lock = threading.Lock()  # the collector's own state, between concurrent scrapes

    def collect(self) -> Iterator[Metric]:
        status = self._published()
        if status is None:
            return iter(())
        f = Families()
        with self._lock:
            add_daemon(f, status, session_trainers(status["sessions"]), self._windows)
        return iter(f)


# -- a local loader --------------------------------------------------------------------------


@dataclass
class _Exported:
    loader: weakref.ref[Any]
    number: int
    rank: int


class LoaderCollector:
    """The loaders of this process that export on one address."""

    def __init__(self) -> None:
        self._loaders: list[_Exported] = []
        self._windows = RateWindows()
        self._lock = threading.Lock()
        self._numbers = 0

    def add(self, loader: Any, rank: int) -> _Exported:
        with self._lock:
            entry = _Exported(weakref.ref(loader), self._numbers, rank)
            self._numbers += 1
            self._loaders.append(entry)
            return entry

    def remove(self, entry: _Exported) -> bool:
        """Forget a loader; True when none is left."""
        with self._lock:
            self._loaders = [e for e in self._loaders if e is not entry and e.loader() is not None]
            return not self._loaders

    def collect(self) -> Iterator[Metric]:
        f = Families()
        with self._lock:
            for entry in self._loaders:
                stats = _loader_stats(entry.loader())
                if stats is None:
                    continue
                labels = {"rank": str(entry.rank), "loader": str(entry.number)}
                f.gauge(
                    "fastload_loader_info",
                    "A loader: its dataset, mode and device (value 1).",
                    {
                        **labels,
                        "dataset": label(stats.dataset),
                        "mode": stats.mode,
                        "device": stats.device,
                        "pid": str(stats.pid),
                        "workers": str(stats.num_workers),
                    },
                    1.0,
                )
                add_loader(f, labels, stats, self._windows.rates(f"loader {entry.number}", stats))
        return iter(f)


def _loader_stats(loader: Any) -> LoaderStats | None:
    """A loader's counters, read from its block's file (its pipeline may close meanwhile: then the
    last snapshot it kept), never from its mapping."""
    if loader is None:
        return None
    pipeline = loader._pipeline
    if pipeline is not None and not pipeline.closed:
        stats = read_block(os.path.join(SHM_DIR, pipeline.stats.segment.name))
        if stats is not None:
            return stats
    last: LoaderStats | None = loader._last_stats
    return last


# -- servers ---------------------------------------------------------------------------------


class MetricsServer:
    """prometheus-client's HTTP server on (host, port), serving one collector."""

    def __init__(self, host: str, port: int, collector: Any) -> None:
        prometheus = _prometheus()
        registry = prometheus.CollectorRegistry(auto_describe=False)
        registry.register(collector)
        try:
            self._server, self._thread = prometheus.start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise ConfigError(f"cannot serve metrics on {_join(host, port)}: {e.strerror or e}") from None
        self.host, self.port = host, int(self._server.server_port)
        self.collector = collector

    @property
    def url(self) -> str:
        return f"http://{_join(self.host, self.port)}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_servers: dict[tuple[str, int], MetricsServer] = {}  # this process's loader exporters, by address asked
_servers_lock = threading.Lock()


@dataclass
class LoaderExport:
    """A loader's registration with its process's exporter; `close` when the loader closes."""

    key: tuple[str, int]
    entry: _Exported
    server: MetricsServer
    closed: bool = False

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        """Forget the loader; the server stops with the last loader exporting on it."""
        with _servers_lock:
            if self.closed:
                return
            self.closed = True
            if self.server.collector.remove(self.entry):
                _servers.pop(self.key, None)
                self.server.close()


def export_loader(loader: Any, address: tuple[str, int] | None, rank: int) -> LoaderExport | None:
    """Serve `loader`'s metrics on `address` (None: not at all), sharing the server of any other
    loader of this process that asked for the same address."""
    if address is None:
        return None
    with _servers_lock:
        server = _servers.get(address) if address[1] else None
        if server is None:
            server = MetricsServer(address[0], address[1], LoaderCollector())
            _servers[address if address[1] else (address[0], server.port)] = server
        key = next(k for k, s in _servers.items() if s is server)
        return LoaderExport(key, server.collector.add(loader, rank), server)


def servers() -> list[str]:
    """The URLs this process's loaders serve metrics on."""
    with _servers_lock:
        return [s.url for s in _servers.values()]
