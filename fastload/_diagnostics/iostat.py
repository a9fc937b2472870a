"""`fastload iostat`: where each running loader's time goes, with a verdict and one advice line.

Every INTERVAL seconds it reads the statistics block of every live loader of this user (no
configuration: they are found in /dev/shm by name), subtracts the previous reading, adds the
machine's figures (the dataset's block device from /proc/diskstats, CPU from /proc/stat, page
cache, /dev/shm, GPU utilisation when there is one) and classifies each loader:
storage-bound, decode-bound, augment-bound, transport-bound, host-to-device-bound, or not the
bottleneck.
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
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any, TextIO

from fastload._batch_counters import column_name, declared, stats_field
from fastload._diagnostics import sysinfo
from fastload._loading import read_ahead
from fastload._loading.stats import LoaderStats, find_loaders
from fastload._machine import usable_cores
from fastload._sizes import format_size

# The trainer waiting less than this share of the time means the loader keeps up.
WAIT_BOUND_PERCENT = 10.0
BUSY_BOUND_PERCENT = 80.0
H2D_BOUND_PERCENT = 60.0
DISK_BOUND_UTIL = 80.0
IOWAIT_BOUND_PERCENT = 20.0
# Reads on a CPU or queued for one less than this share of their time are waiting on I/O
# (NOTE [storage wait or CPU wait] in `classify`).
READ_WAITING = 0.3
CPU_CONTENDED = 0.3  # reads queued for a CPU this share of their time: the cores are oversubscribed
REMOTE_WAITING = 0.5  # reads waiting for object storage this share of their time: storage-bound
EPOCH_START_SHARE = 0.3  # the trainer's wait is mostly at epoch starts: the pipeline drains there


@dataclass(frozen=True)
class LoaderRates:
    """One loader over one interval."""

    name: str
    pid: int
    dataset: str
    mode: str
    device: str
    workers: int
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
    return LoaderRates(
        name=name,
        pid=after.pid,
        dataset=after.dataset,
        mode=after.mode,
        device=after.device,
        workers=after.num_workers,
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
        worker_busy_percent=min(100.0, 100.0 * worker_time / (seconds * max(after.num_workers, 1))),
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
    )


def classify(r: LoaderRates, m: MachineRates, cores: int) -> tuple[str, list[str]]:
    """The loader's verdict and advice lines, from its rates and the machine's."""
    advice: list[str] = []
    if r.batch_size % 8 and r.device == "cuda":  # a GPU's matter: no advice for CPU batches
        advice.append(f"batch size {r.batch_size} is not a multiple of 8: tensor cores prefer multiples of 8")
    if r.samples_per_s == 0 and r.trainer_wait_percent < WAIT_BOUND_PERCENT:
        return "idle", advice
    if r.trainer_wait_percent < WAIT_BOUND_PERCENT:
        return "not the bottleneck", [
            f"the trainer waits only {r.trainer_wait_percent:.0f}% of the time in next(): the model "
            "step is slower than loading, so speed that up (AMP, channels_last, a larger batch); "
            "the loader has headroom",
            *advice,
        ]
    if r.epochs and r.epoch_start_wait_percent > EPOCH_START_SHARE * r.trainer_wait_percent:
        # A loader decodes its next epoch's first batches while the trainer eats this epoch's tail
        # (NOTE [no drain]), locally and with a daemon; these are the cases it cannot.
        advice.append(
            f"{r.epoch_start_wait_percent:.0f}% of the time goes to waiting for the first batch of "
            f"{r.epochs} epoch(s): those epochs started cold. A loader decodes the next epoch ahead "
            "only when it outlives the epoch (one loader per phase, made once, not per epoch), the "
            "epoch it runs next is the one after (set_epoch skips none), its order is fastload's "
            "own (not a sampler= or batch_sampler= of yours) and persistent_workers is not False"
        )
        if r.trainer_wait_percent - r.epoch_start_wait_percent < WAIT_BOUND_PERCENT:
            return "epoch-start-bound", advice  # between epoch starts the trainer hardly waits
    ms = r.ms_per_sample
    h2d_busy = ms["h2d"] * r.samples_per_s / 10.0  # percent of wall time spent copying
    if r.device == "cuda" and h2d_busy > H2D_BOUND_PERCENT:
        return "host-to-device-bound", [
            f"copies to the GPU take {h2d_busy:.0f}% of the time: ship uint8 and normalize on the GPU "
            "(normalize=..., dtype=torch.float16), and check the PCIe link width (nvidia-smi -q)",
            *advice,
        ]
    work = ms["read"] + ms["decode"] + ms["augment"]
    read_share = ms["read"] / work if work else 0.0
    # NOTE [storage wait or CPU wait]: a reading thread's wall time is time on a CPU (read_cpu)
    # + time runnable but waiting for a CPU (read_runq: the kernel's run-queue delay) + time
    # blocked (storage, sleeps, locks). Only the blocked part is waiting for storage. On an
    # oversubscribed machine (more runnable tasks than cores: other jobs, or more workers than
    # cores) a reader that only computes, such as a Dataset decoding in __getitem__, spends most
    # of its wall time in the run queue: judged by CPU / wall alone, 2 such workers beside 4 busy
    # processes on 2 cores read at 29% CPU and were called storage-bound. So reads wait on I/O
    # when they are neither on a CPU nor queued for one most of the time. Where the kernel does
    # not report run-queue delay, read_runq is 0 and this is CPU / wall, as before.
    runnable_share = (ms["read_cpu"] + ms["read_runq"]) / ms["read"] if ms["read"] else 1.0
    runq_share = ms["read_runq"] / ms["read"] if ms["read"] else 0.0
    if read_share > 0.5 and ms["net_wait"] > REMOTE_WAITING * ms["read"]:
        return "storage-bound", [_remote_advice(r), *advice]
    disk_busy = m.disk is not None and m.disk.get("util_percent", 0.0) > DISK_BOUND_UTIL
    waiting_on_reads = read_share > 0.5 and runnable_share < READ_WAITING
    if waiting_on_reads or disk_busy or m.cpu.get("iowait", 0.0) > IOWAIT_BOUND_PERCENT:
        where = m.device
        if m.device_kind == "network":
            tip = "copy the data to local NVMe or pack it into shards (large sequential reads)"
        elif m.device_kind == "hdd":
            tip = "move the data to an SSD/NVMe, or pack it into shards so reads are sequential"
        elif disk_busy:
            tip = "the disk is saturated: a faster disk, or data that fits the page cache"
        else:
            tip = f"more workers keep more reads in flight (now {r.workers})"
        return "storage-bound", [
            f"storage-bound on {where}: {ms['read']:.2f} ms/sample reading vs "
            f"{ms['decode']:.2f} decoding; {tip}",
            *advice,
        ]
    if r.worker_busy_percent > BUSY_BOUND_PERCENT and ms["augment"] > ms["decode"]:
        gpu = (
            "they run in the workers because batches stay on the CPU: with device='cuda' they run "
            "batched on the GPU after the copy"
            if r.device == "cpu"
            else "fewer or cheaper ones (a hue shift costs the most), or more workers"
        )
        return "augment-bound", [
            f"augment-bound: the pixel transforms (colour, policies) take {ms['augment']:.2f} ms/sample "
            f"against {ms['decode']:.2f} decoding, with {r.workers} workers {r.worker_busy_percent:.0f}% "
            f"busy; {gpu}",
            *advice,
        ]
    if r.worker_busy_percent > BUSY_BOUND_PERCENT:
        if runq_share > CPU_CONTENDED:
            tip = (
                f"they wait for a free core {100 * runq_share:.0f}% of the time they read: the cores "
                "are oversubscribed (other processes, or more workers than cores), so more workers "
                "will not help; give the loader cores of its own, or add cores"
            )
        elif r.workers < cores:
            tip = f"{cores - r.workers} core(s) are free: raise num_workers to {cores}"
        elif r.device == "cuda":
            tip = (
                "add cores, store smaller images (fastload pack --max-side 320), or decode on the "
                "GPU (backend='dali')"
            )
        else:
            tip = "add cores, or store smaller images (fastload pack --max-side 320)"
        return "decode-bound", [
            f"decode-bound: {r.workers} workers on {cores} cores are "
            f"{r.worker_busy_percent:.0f}% busy; {tip}",
            *advice,
        ]
    if ms["slot_wait"] > 0.5 * work:
        return "transport-bound", [
            "every slot is held while workers could work: release batches sooner (don't keep references), "
            "or raise prefetch",
            *advice,
        ]
    return "transport-bound", [
        f"the trainer waits {r.trainer_wait_percent:.0f}% of the time while workers are only "
        f"{r.worker_busy_percent:.0f}% busy: raise prefetch "
        f"(now {r.in_flight + r.ready_batches} batches ahead)",
        *advice,
    ]


def _remote_advice(r: LoaderRates) -> str:
    """Why reads of object storage hold the loader back, and what to change."""
    ms = r.ms_per_sample
    hit = r.cache_hit_percent
    said = (
        f"storage-bound on object storage: {ms['net_wait']:.2f} of {ms['read']:.2f} ms/sample reading "
        f"waits for chunks not in the node cache ({r.net_mb_per_s:.1f} MB/s fetched"
        f"{f', {hit:.0f}% of chunk reads from the cache' if hit is not None else ''})"
    )
    if hit is not None and hit < 50.0 and r.epochs_so_far > 1:  # past the first epoch: the cache's to answer
        return (
            f"{said}; later epochs fetch again: the node cache is smaller than the data, so raise "
            "cache_limit (or FASTLOAD_CACHE_LIMIT), or put the cache (FASTLOAD_CACHE_DIR) on a larger disk"
        )
    return (
        f"{said}; keep more requests in flight (FASTLOAD_REMOTE_REQUESTS, {read_ahead.DEFAULT_REQUESTS} by "
        "default), use a block shuffle (shuffle_block=) so that a window of batches shares chunks, or "
        "pack the data "
        "(`fastload pack SRC s3://...`: packs are read by byte ranges, tar shards whole)"
    )


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
            classified.append(LoaderRates(**{**asdict(r), "verdict": verdict, "advice": advice}))
        self._loaders, self._disk, self._cpu, self._time = loaders, disks, cpu, now
        return classified, machine


def display_name(r: LoaderRates) -> str:
    """A loader as its user knows it: "pid 4242 train" (its dataset's last path part)."""
    dataset = os.path.basename(r.dataset.rstrip("/")) or r.dataset
    return f"pid {r.pid} {dataset}" if dataset else f"pid {r.pid}"


def format_report(loaders: list[LoaderRates], machine: MachineRates, extended: bool) -> str:
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
        lines.append(f"{row}  {r.verdict}")
        lines.extend(f"{'':>9}- {a}" for a in r.advice)
    return "\n".join(lines) + "\n"


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
