"""What the machine is doing, read cheaply from /proc: the cores busy, the CPU pressure, and the CPU
this process and the loader's workers use, as a sample now and as rates between two samples.

A sample is a handful of small /proc reads (no psutil): `/proc/stat`'s per-CPU lines for the CPUs
this process may run on, `/proc/pressure/cpu` (PSI; absent on older kernels and in containers
without it: None then), this process's CPU clock (all threads), and `/proc/<pid>/stat` of each
worker (a pid gone meanwhile is skipped). Under a cgroup's CPU quota (NOTE [a container's CPU
quota] in `_cpu_quota`) the cores are the quota's and busy is the limiting cgroup's own use (its
CPUs' idle time is not this process's to take; where that use cannot be read, both stay the
CPUs'), and the share of its periods throttled counts as pressure beside PSI's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from fastload._cpu_quota import CpuLimit, own_cpu_limit, quota_cores
from fastload._machine import usable_cores

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# /proc/stat's columns after the name: user nice system idle iowait irq softirq steal guest
# guest_nice. Busy is user..system, irq, softirq and steal (guest time is already in user/nice);
# idle and iowait are a CPU with nothing to run.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class MachineSample:
    """One look at the machine; cumulative counters, to be differenced (`load_between`)."""

    time: float  # time.monotonic()
    cores: int  # the CPUs counted in `busy_cpu_s` (this process's usable cores by default)
    busy_cpu_s: float  # CPU-seconds the usable CPUs spent busy, every process's, since boot
    pressure_some_us: int | None  # PSI "some" total: µs some runnable task waited for a CPU
    own_cpu_s: float  # this process's CPU-seconds, all threads (the trainer's, with the loader's)
    workers_cpu_s: Mapping[int, float]  # pid -> its CPU-seconds, for the pids given that were alive
    throttling: tuple[int, int] | None = None  # a CPU quota's (periods, throttled periods) so far

    @property
    def workers_total_s(self) -> float:
        """The workers' CPU-seconds, summed."""
        return sum(self.workers_cpu_s.values())


@dataclass(frozen=True)
class MachineLoad:
    """What the machine did between two samples, per second of wall time."""

    seconds: float
    busy_cores: float  # cores busy on average, every process's (0..the sample's cores)
    pressure: float | None  # fraction of the time some runnable task waited for a CPU (0..1)
    own_cores: float  # cores this process used (the trainer's own threads and the loader's)
    workers_cores: float  # cores the workers used


def sample_machine(
    worker_pids: Iterable[int] = (),
    *,
    cpus: Iterable[int] | None = None,
    limit: CpuLimit | Literal["own"] | None = "own",
) -> MachineSample:
    """The machine now; `worker_pids`: the loader's workers (those gone are skipped); `cpus`: the
    CPUs to count (default: those this process may run on); `limit`: a CPU quota to count within
    (default: this process's, if any; None: none)."""
    counted = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    quota = own_cpu_limit() if limit == "own" else limit
    cores = len(counted) or usable_cores()
    busy_s = None if quota is None else quota.usage_s()
    if quota is not None and busy_s is not None:  # the quota's cores, and its cgroup's use of them
        cores = min(cores, quota_cores(quota) or cores)
    else:  # the CPUs' cores and their busy time, every process's (the tuner's limits cap workers)
        busy_s = busy_cpu_seconds(counted)
    return MachineSample(
        time=time.monotonic(),
        cores=cores,
        busy_cpu_s=busy_s,
        pressure_some_us=cpu_pressure_some_us(),
        own_cpu_s=time.process_time(),
        workers_cpu_s={pid: s for pid in worker_pids if (s := process_cpu_seconds(pid)) is not None},
        throttling=None if quota is None else quota.throttling(),
    )


def load_between(before: MachineSample, after: MachineSample) -> MachineLoad:
    """The per-second rates between two samples. A worker in both counts its difference, one new
    since `before` all its time (it started within the interval), one gone since is not counted
    (its last moments are lost, never negative)."""
    seconds = max(after.time - before.time, 1e-9)
    workers = sum(s - before.workers_cpu_s.get(pid, 0.0) for pid, s in after.workers_cpu_s.items())
    pressure = None
    if before.pressure_some_us is not None and after.pressure_some_us is not None:
        waited_s = (after.pressure_some_us - before.pressure_some_us) / 1e6
        pressure = min(max(waited_s / seconds, 0.0), 1.0)
    if before.throttling is not None and after.throttling is not None:
        periods = after.throttling[0] - before.throttling[0]
        if periods > 0:  # a quota's throttled periods: its tasks waited for the next period
            throttled = min(max((after.throttling[1] - before.throttling[1]) / periods, 0.0), 1.0)
            pressure = throttled if pressure is None else max(pressure, throttled)
    return MachineLoad(
        seconds=seconds,
        busy_cores=min(max((after.busy_cpu_s - before.busy_cpu_s) / seconds, 0.0), float(after.cores)),
        pressure=pressure,
        own_cores=max((after.own_cpu_s - before.own_cpu_s) / seconds, 0.0),
        workers_cores=max(workers / seconds, 0.0),
    )


def busy_cpu_seconds(cpus: Iterable[int] | None = None, path: str = "/proc/stat") -> float:
    """CPU-seconds the given CPUs (default: this process's usable ones) spent busy since boot;
    0.0 where /proc/stat cannot be read."""
    wanted = {f"cpu{n}" for n in (os.sched_getaffinity(0) if cpus is None else cpus)}
    ticks = 0
    try:
        with open(path, "rb") as f:
            for line in f:
                if not line.startswith(b"cpu"):
                    break  # the cpu lines come first
                fields = line.split()
                if fields[0].decode() in wanted:
                    ticks += sum(int(fields[1 + i]) for i in _BUSY_COLUMNS if 1 + i < len(fields))
    except OSError:
        return 0.0
    return ticks / _TICKS_PER_S


def cpu_pressure_some_us(path: str = "/proc/pressure/cpu") -> int | None:
    """PSI's "some" total for the CPU (µs any runnable task waited for one), or None where the
    kernel does not report pressure."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"some"):
                    return int(line.rsplit(b"total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None
    return None


def process_cpu_seconds(pid: int) -> float | None:
    """A process's CPU-seconds, all its threads (user + system), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The name (field 2) is in parentheses and may hold spaces or parentheses: split after the last.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime (fields 14, 15)
    except (IndexError, ValueError):
        return None
