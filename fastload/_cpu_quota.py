"""The CPU a cgroup allows this process: the quota, in cores, of the tightest CPU limit on the path
from its cgroup to the root (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`),
with that cgroup's CPU use and throttled periods as counters; None where no quota applies.

NOTE [a container's CPU quota]: `docker run --cpus 4` (Kubernetes' CPU limits, systemd's
CPUQuota) on a 64-CPU host leaves the process's affinity at 64 CPUs and caps it by time instead:
4 CPU-seconds per second, on any of them. Counting the affinity, a loader starts 64 workers, and
the quota throttles them all in turn: once a period's time is spent, every task of the cgroup
waits for the next period, a run-queue delay that neither /proc/stat's idle CPUs nor the host's
PSI shows. So the cores this process may use (`_machine.usable_cores`) are the quota's, rounded
down and at least 1, as Go's automaxprocs does; and the tuner (`tuning.machine_load`) reads the
limiting cgroup's own use as the busy cores and its throttled periods as pressure. The limiting
cgroup may be an ancestor (a pod's limit over its containers): its use counts its siblings too,
which is what the quota is shared with. Only what this process can read is seen: a limit in a
cgroup namespace's parent is invisible from inside (the namespace's root is the root here).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"

# Where a v1 hierarchy holding the `cpu` (and `cpuacct`) controller may be mounted under the root.
_V1_CPU_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")
_V1_ACCT_DIRS = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True)
class CpuLimit:
    """The tightest CPU quota over this process, and where to read its cgroup's counters."""

    cores: float  # quota / period: CPU-seconds a second the cgroup may use
    directory: str  # the limiting cgroup's directory (its cpu controller's)
    usage_file: str  # v2 cpu.stat (usage_usec) or v1 cpuacct.usage (ns) of that cgroup
    version: int  # 1 or 2

    def usage_s(self) -> float | None:
        """CPU-seconds the limiting cgroup (every process under it) has used, or None unreadable."""
        try:
            with open(self.usage_file, "rb") as f:
                raw = f.read()
        except OSError:
            return None
        if self.version == 1:
            return int(raw) / 1e9 if raw.strip().isdigit() else None
        usage = _stat_fields(raw).get("usage_usec")
        return None if usage is None else usage / 1e6

    def throttling(self) -> tuple[int, int] | None:
        """(periods, throttled periods) of the limiting cgroup so far, or None unreadable."""
        try:
            with open(os.path.join(self.directory, "cpu.stat"), "rb") as f:
                fields = _stat_fields(f.read())
        except OSError:
            return None
        if "nr_periods" not in fields or "nr_throttled" not in fields:
            return None
        return fields["nr_periods"], fields["nr_throttled"]


def _stat_fields(raw: bytes) -> dict[str, int]:
    """`key value` lines (cpu.stat) as a dict; lines that are not are skipped."""
    fields: dict[str, int] = {}
    for line in raw.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            fields[parts[0].decode()] = int(parts[1])
    return fields


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _own_cgroups(proc_cgroup: str) -> tuple[str | None, dict[str, str]]:
    """This process's cgroup v2 path (the `0::` line) and its v1 paths by controller."""
    unified: str | None = None
    v1: dict[str, str] = {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            unified = path
        for controller in controllers.split(","):
            v1[controller] = path
    return unified, v1


def _ancestors(mount: str, path: str) -> list[str]:
    """The cgroup directories from `path` (relative to its hierarchy's `mount`) up to the mount.
    A path that is not there (a container's cgroup namespace shows the host's path, its mount
    the container's own cgroup) is taken as the mount itself."""
    parts = [p for p in path.split("/") if p and p != ".."]
    deepest = os.path.join(mount, *parts)
    if not os.path.isdir(deepest):
        return [mount]
    return [os.path.join(mount, *parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_quota(directory: str) -> float | None:
    text = _read(os.path.join(directory, "cpu.max"))
    if text is None:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max" or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None
    return int(quota) / int(period)


def _v1_quota(directory: str) -> float | None:
    quota = _read(os.path.join(directory, "cpu.cfs_quota_us"))
    period = _read(os.path.join(directory, "cpu.cfs_period_us"))
    if quota is None or period is None or not quota.isdigit() or not period.isdigit() or int(period) == 0:
        return None  # -1 (no limit) is not digits
    return int(quota) / int(period)


def _first_dir(root: str, names: tuple[str, ...]) -> str | None:
    return next((os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))), None)


def _tightest(directories: list[str], quota_of: Callable[[str], float | None]) -> tuple[float, str] | None:
    """The smallest quota among `directories` and its directory (the deepest on a tie), or None."""
    quotas = [(cores, d) for d in directories if (cores := quota_of(d)) is not None]
    return min(quotas, key=lambda found: found[0], default=None)


def find_cpu_limit(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> CpuLimit | None:
    """The tightest CPU quota on this process's cgroup path (v1's cpu hierarchy when one is
    mounted: a hybrid host's cpu controller is there; else v2's), or None without one."""
    unified, v1 = _own_cgroups(proc_cgroup)
    cpu_mount = _first_dir(root, _V1_CPU_DIRS)
    if cpu_mount is not None and "cpu" in v1:
        found = _tightest(_ancestors(cpu_mount, v1["cpu"]), _v1_quota)
        if found is None:
            return None
        cores, directory = found
        acct_mount = _first_dir(root, _V1_ACCT_DIRS) or cpu_mount
        acct = os.path.normpath(os.path.join(acct_mount, os.path.relpath(directory, cpu_mount)))
        return CpuLimit(cores, directory, os.path.join(acct, "cpuacct.usage"), 1)
    if unified is None or not os.path.exists(os.path.join(root, "cgroup.controllers")):
        return None
    found = _tightest(_ancestors(root, unified), _v2_quota)
    if found is None:
        return None
    cores, directory = found
    return CpuLimit(cores, directory, os.path.join(directory, "cpu.stat"), 2)


@functools.lru_cache(maxsize=1)
def own_cpu_limit() -> CpuLimit | None:
    """This process's CPU quota (`find_cpu_limit`), read once: a quota is set when a container
    starts and kept while it runs."""
    return find_cpu_limit()


def quota_cores(limit: CpuLimit | None) -> int | None:
    """The whole cores a quota allows: rounded down, at least 1 (NOTE [a container's CPU quota])."""
    if limit is None:
        return None
    return max(1, int(limit.cores + 1e-9))
