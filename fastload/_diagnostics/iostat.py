"""`fastload iostat`: where each running loader's time goes, with a verdict and one advice line.

Every INTERVAL seconds it reads the statistics block of every live loader of this user (no
configuration: they are found in /dev/shm by name), subtracts the previous reading, adds the
machine's figures (the dataset's block device from /proc/diskstats, CPU from /proc/stat, page
cache, /dev/shm, GPU utilisation when there is one) and classifies each loader:
storage-bound, decode-bound, augment-bound, transport-bound, host-to-device-bound, or not the
bottleneck. When a loader is tuned (issue 32) a "tuner" column shows what its tuner runs and its
last change ("w3 f12 +w 4s decode-bound": 3 workers, 12 batches in flight, a worker added 4 s
ago, decode-bound), and a line under the loader says it in words.

The room's other modules: `loader_rates` (a loader's rates over an interval) and `verdict` (the
classification and its advice), which the Prometheus exporter's verdict shares.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from types import FrameType
from typing import Any, TextIO

from fastload._batch_counters import column_name, declared
from fastload._diagnostics import sysinfo
from fastload._diagnostics.loader_rates import LoaderRates, MachineRates, loader_rates
from fastload._diagnostics.verdict import classify
from fastload._loading.running.stats import LoaderStats, find_loaders
from fastload._machine import usable_cores
from fastload._sizes import format_size


class Sampler:
    """Keeps the previous readings so each report covers one interval."""

    def __init__(self) -> None:
        self._loaders: dict[str, LoaderStats] = {}
        self._disk: dict[str, sysinfo.DiskCounters] | None = None
        self._cpu: sysinfo.CpuCounters | None = None
        self._time = time.monotonic()

    def sample(self) -> tuple[list[LoaderRates], MachineRates]:
        now = time.monotonic()
        seconds = max(now - self._time, 1e-9)
        first = self._cpu is None
        loaders = find_loaders()
        cpu = sysinfo.read_cpu()
        disks = sysinfo.read_diskstats()
        rates = [
            loader_rates(n, None if first else self._loaders.get(n), s, seconds) for n, s in loaders.items()
        ]
        device = (
            sysinfo.device_for_path(rates[0].dataset) if rates and os.path.exists(rates[0].dataset) else None
        )
        disk = None
        if device is not None and device.device and not first and self._disk and device.device in self._disk:
            disk = asdict(sysinfo.disk_rates(self._disk[device.device], disks[device.device], seconds))
        memory = sysinfo.memory()
        used, total = sysinfo.shm_usage()
        machine = MachineRates(
            cpu=asdict(sysinfo.cpu_percent(self._cpu, cpu)) if self._cpu else {},
            disk=disk,
            device=device.describe() if device else "unknown",
            device_kind=device.kind if device else "unknown",
            page_cache_bytes=memory.page_cache_bytes,
            shm_used_bytes=used,
            shm_total_bytes=total,
            gpu_percent=sysinfo.gpu_utilization(),
        )
        cores = usable_cores()
        classified = []
        for r in rates:
            verdict, advice = classify(r, machine, cores)
            if r.skipped:  # whatever bounds the loader: a dataset with broken samples is worth a line
                advice.append(
                    f"{r.skipped} broken sample(s) replaced by stand-ins so far (on_error='skip'): list them "
                    "with `fastload verify PATH -o LIST` and load with exclude=LIST"
                )
            classified.append(replace(r, verdict=verdict, advice=advice))
        self._loaders, self._disk, self._cpu, self._time = loaders, disks, cpu, now
        return classified, machine


def display_name(r: LoaderRates) -> str:
    """A loader as its user knows it: "pid 4242 train" (its dataset's last path part)."""
    dataset = os.path.basename(r.dataset.rstrip("/")) or r.dataset
    return f"pid {r.pid} {dataset}" if dataset else f"pid {r.pid}"


def format_report(
    loaders: list[LoaderRates], machine: MachineRates, extended: bool, now: float | None = None
) -> str:
    """The report of one interval; `now` (unix time, by default the clock's) dates the tuners'
    last changes."""
    now = time.time() if now is None else now
    lines = [time.strftime("%H:%M:%S")]
    c = machine.cpu
    cpu = f"cpu user {c['user']:.0f}% sys {c['system']:.0f}% iowait {c['iowait']:.0f}%" if c else "cpu -"
    disk = machine.disk
    io = (
        (
            f"r/s {disk['reads_per_s']:.0f} rMB/s {disk['read_mb_per_s']:.1f} "
            f"await {disk['await_ms']:.1f} ms %util {disk['util_percent']:.0f}"
        )
        if disk
        else "disk -"
    )
    gpu = f" gpu {', '.join(f'{g:.0f}%' for g in machine.gpu_percent)}" if machine.gpu_percent else ""
    lines.append(
        f"{cpu} | {machine.device}: {io} | page cache {format_size(machine.page_cache_bytes)} | "
        f"shm {format_size(machine.shm_used_bytes)} of {format_size(machine.shm_total_bytes)}{gpu}"
    )
    if not loaders:
        lines.append("no running fastload loaders of this user")
        return "\n".join(lines) + "\n"
    head = f"{'pid':>7} {'mode':<6} {'samples/s':>10} {'rMB/s':>7} {'busy%':>6} {'queue':>5} {'wait%':>6}"
    remote = any(r.net_mb_per_s or r.cache_hit_percent is not None for r in loaders)
    if remote:  # object storage: what was fetched, and how often the node cache answered
        head += f" {'netMB/s':>8} {'hit%':>5}"
    if extended:
        head += f" {'read':>7} {'net':>7} {'decode':>7} {'augment':>7} {'slot':>7} {'h2d':>7}"
        head += "".join(f" {heading:>9}" for heading, _ in _own_columns()) + "  (ms/sample)"
    tuned = any(r.tuner is not None for r in loaders)
    if tuned:  # only then: an untuned loader's table is as it was
        head += f"  {'tuner':<{TUNER_WIDTH}}"
    lines.append(head + "  verdict")
    for r in loaders:
        row = (
            f"{r.pid:>7} {r.mode:<6} {r.samples_per_s:>10.0f} {r.read_mb_per_s:>7.1f} "
            f"{r.worker_busy_percent:>6.0f} {r.ready_batches:>5} {r.trainer_wait_percent:>6.0f}"
        )
        if remote:
            hit = "-" if r.cache_hit_percent is None else f"{r.cache_hit_percent:.0f}"
            row += f" {r.net_mb_per_s:>8.1f} {hit:>5}"
        if extended:
            ms = r.ms_per_sample
            row += f" {ms['read']:>7.3f} {ms['net_wait']:>7.3f} {ms['decode']:>7.3f} {ms['augment']:>7.3f}"
            row += f" {ms['slot_wait']:>7.3f} {ms['h2d']:>7.3f}"
            row += "".join(f" {value(r):>9.3f}" for _, value in _own_columns())
        if tuned:
            row += f"  {tuner_cell(r, now):<{TUNER_WIDTH}}"
        lines.append(f"{row}  {r.verdict}")
        if r.tuner is not None:
            lines.append(f"{'':>9}- {tuner_line(r, now)}")
        lines.extend(f"{'':>9}- {a}" for a in r.advice)
    return "\n".join(lines) + "\n"


TUNER_WIDTH = 28  # "w12 f32 +w 59s decode-bound"; a longer cell pushes the verdict right


def tuner_cell(r: LoaderRates, now: float) -> str:
    """The tuner column: "w3 f12 +w 4s decode-bound" (workers, batches in flight, the last change,
    its age and reason), "w3 f12" before any change, "-" for a loader not tuned."""
    t = r.tuner
    if t is None:
        return "-"
    cell = f"w{t.workers} f{t.in_flight}"
    if t.last_change is None:
        return cell
    return f"{cell} {t.change} {_age(now - t.last_change)} {t.reason}"


def tuner_line(r: LoaderRates, now: float) -> str:
    """A tuned loader's line under its row: its tuner's state, and its last change in words."""
    t = r.tuner
    if t is None:
        return ""
    moved = (("workers", t.tunes_workers), ("batches in flight", t.tunes_in_flight))
    moves = " and ".join(what for what, tuned in moved if tuned)
    state = (
        f"tuner ({moves or 'nothing'} tuned): {t.workers} workers, {t.in_flight} batches in flight, "
        f"a ring of {r.ring_slots} slots"
    )
    if t.last_change is None:
        return f"{state}; no change yet"
    return (
        f"{state}; {t.changes} change{'s' if t.changes != 1 else ''}, the last {_age(now - t.last_change)} "
        f"ago: {t.reason_words}"
    )


def _age(seconds: float) -> str:
    """An age in its largest whole unit: 4s, 12m, 3h, 2d."""
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


# The table's columns a per-batch counter may name as the one that shows it (`Counter.column`).
TABLE_COLUMNS = ("samples/s", "rMB/s", "netMB/s", "hit%", "read", "net", "decode", "augment", "verdict")


def _own_columns() -> list[tuple[str, Callable[[LoaderRates], float]]]:
    """A column of `-x` for each per-batch counter no column of the table shows (NOTE [adding a
    per-batch counter]): a time in ms/sample, any other per second."""
    return [
        (column_name(name, c), functools.partial(_per_sample_ms, name.removesuffix("_ns")))
        if c.unit == "ns"
        else (f"{column_name(name, c)}/s", functools.partial(_per_second, name))
        for name, c in declared()
        if column_name(name, c) not in TABLE_COLUMNS
    ]


def _per_sample_ms(key: str, r: LoaderRates) -> float:
    return r.ms_per_sample[key]


def _per_second(key: str, r: LoaderRates) -> float:
    return r.per_second[key]


class _Stopped(Exception):
    """A termination signal arrived while iostat was recording."""


@contextlib.contextmanager
def _stopped_like_ctrl_c() -> Iterator[None]:
    """NOTE [iostat stop signals]: `timeout`, `kill`, `docker stop` and schedulers end a program
    with SIGTERM, a closed terminal with SIGHUP; both end the recording as Ctrl-C does (the
    report loop raises `_Stopped`) so that --plot still draws it. Only while recording: the
    previous handlers are back for the drawing, so a second signal ends iostat at once. Signal
    handlers belong to the main thread; `run` called from another thread keeps them as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Stopped(signal.Signals(signum).name)

    chosen = [signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])]
    previous = {s: signal.signal(s, stop) for s in chosen}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run(
    interval: float | None,
    count: int | None,
    extended: bool,
    as_json: bool,
    plot: str | None,
    out: TextIO = sys.stdout,
) -> int:
    """The command: one report since start (no interval), or one per interval, `count` times."""
    if plot is not None:  # before recording: a run that cannot be drawn is said at once, not lost
        from fastload._diagnostics.plot import check_matplotlib

        check_matplotlib()
    sampler = Sampler()
    history: list[dict[str, Any]] = []
    started = time.monotonic()
    reports = 0
    with contextlib.suppress(KeyboardInterrupt, _Stopped), _stopped_like_ctrl_c():
        sampler.sample()  # prime: every report covers one interval (1 s when none is given)
        time.sleep(interval if interval is not None else 1.0)
        while True:
            loaders, machine = sampler.sample()
            record = {
                "time": time.monotonic() - started,
                "wall_time": round(time.time(), 3),  # seconds since the epoch, to line up with logs
                "loaders": [asdict(r) for r in loaders],
                "machine": asdict(machine),
            }
            # The plot names a loader by what its user knows it by: its pid and dataset.
            named = [{**asdict(r), "name": display_name(r)} for r in loaders]
            history.append({**record, "loaders": named, "cpu": machine.cpu})
            out.write(json.dumps(record) + "\n" if as_json else format_report(loaders, machine, extended))
            out.flush()
            reports += 1
            if interval is None or (count is not None and reports >= count):
                break
            time.sleep(interval)
    if plot is not None:
        from fastload._diagnostics.plot import plot_history

        plot_history(history, plot)
    return 0
