"""Machine figures read from /proc and /sys: which device holds a path, disk, CPU and memory counters.

Every reader takes `proc_root` and `sys_root` so that tests can point it at a fixture tree. The
readers never raise on an odd system (a container without /proc/diskstats, a filesystem with no
block device): they fall back to empty or zero figures and `kind="unknown"`, because a monitoring
command should show what it can rather than stop. Byte rates are in iostat's MB (2**20 bytes).
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastload._errors import ConfigError

MB = 1 << 20
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's sector size

# Filesystem types with no local disk under them (fuse.* counts as network too: sshfs, s3fs, gcsfuse).
NETWORK_FS = frozenset(
    (
        *("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "virtiofs"),
        *("lustre", "ceph", "glusterfs", "beegfs", "gpfs"),  # cluster filesystems
    )
)
MEMORY_FS = frozenset(("tmpfs", "ramfs"))
VIRTUAL_FS = frozenset(("proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs"))
_KIND_WORDS = {"nvme": "NVMe SSD", "ssd": "SSD", "hdd": "HDD", "virtual": "virtual block device"}


# Which device holds a path


@dataclass(frozen=True)
class BlockDevice:
    """Where a path's data lives: its mount, filesystem and (for local disks) block device."""

    path: str
    mount_point: str
    fs_type: str
    device: str | None  # the /proc/diskstats name, e.g. "nvme0n1p2" or "sda1"
    disk: str | None  # the whole disk, e.g. "nvme0n1"
    kind: str  # "nvme" | "ssd" | "hdd" | "network" | "memory" | "virtual" | "unknown"

    def describe(self) -> str:
        """One phrase for people, e.g. "NVMe SSD nvme0n1 (ext4 on /)"."""
        where = f"{self.fs_type or 'unknown filesystem'} on {self.mount_point or self.path}"
        if self.kind == "network":
            return f"network filesystem {where}"
        if self.kind == "memory":
            return f"in-memory filesystem {where}"
        if self.disk is None:
            return f"virtual filesystem {where}" if self.kind == "virtual" else f"unknown storage ({where})"
        word = _KIND_WORDS.get(self.kind, "disk of unknown type")
        if self.disk.startswith("vd") and self.kind in ("ssd", "hdd"):
            word = f"virtio {word}"
        return f"{word} {self.disk} ({where})"


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mounts."""

    source: str
    mount_point: str
    fs_type: str
    options: tuple[str, ...]


def read_mounts(proc_root: str = "/proc") -> list[Mount]:
    """The mount table in kernel order (a later mount on the same point hides an earlier one)."""
    text = _read_text(os.path.join(proc_root, "self", "mounts"))
    mounts = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) >= 4:
            source, point, fs_type = (_unescape_mount(f) for f in fields[:3])
            mounts.append(Mount(source, point, fs_type, tuple(fields[3].split(","))))
    return mounts


def mount_for_path(path: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount whose point is the longest prefix of the absolute, resolved `path`."""
    best: Mount | None = None
    for mount in mounts:
        if _under(path, mount.mount_point) and (
            best is None or len(mount.mount_point) >= len(best.mount_point)
        ):
            best = mount
    return best


def device_for_path(
    path: str, proc_root: str = "/proc", sys_root: str = "/sys", st_dev: int | None = None
) -> BlockDevice:
    """Describe the storage holding `path`; `st_dev` overrides os.stat(path).st_dev (for tests)."""
    real = os.path.realpath(path)
    mounts = read_mounts(proc_root)
    mount = mount_for_path(real, mounts)
    if mount is None:
        return BlockDevice(real, "", "", None, None, "unknown")
    kind = fs_kind(mount.fs_type)
    if kind is not None:
        return BlockDevice(real, mount.mount_point, mount.fs_type, None, None, kind)
    if mount.fs_type == "overlay":
        return _overlay_device(real, mount, mounts, sys_root)
    dev = st_dev if st_dev is not None else _stat_dev(real, mount.mount_point)
    device, disk = _block_names(dev, mount.source, sys_root)
    return BlockDevice(real, mount.mount_point, mount.fs_type, device, disk, disk_kind(disk, sys_root))


def fs_kind(fs_type: str) -> str | None:
    """"network", "memory" or "virtual" for filesystems with no local disk; None for the others."""
    if fs_type in NETWORK_FS or fs_type.startswith("fuse."):
        return "network"
    if fs_type in MEMORY_FS:
        return "memory"
    if fs_type in VIRTUAL_FS:
        return "virtual"
    return None


def disk_kind(disk: str | None, sys_root: str = "/sys") -> str:
    """The kind of a whole disk, from its name and its queue's rotational flag."""
    if disk is None:
        return "unknown"
    if disk.startswith("nvme"):
        return "nvme"
    if disk.startswith(("zram", "ram")):
        return "memory"
    if disk.startswith("loop"):
        return "virtual"
    flag = _read_text(os.path.join(sys_root, "block", disk.replace("/", "!"), "queue", "rotational"))
    if flag is None:
        return "unknown"
    return {"1": "hdd", "0": "ssd"}.get(flag.strip(), "unknown")


def _overlay_device(real: str, mount: Mount, mounts: Sequence[Mount], sys_root: str) -> BlockDevice:
    """An overlay takes the kind of the filesystem under its upper dir, or "virtual" when hidden."""
    upper = _option(mount.options, "upperdir")
    under = mount_for_path(upper, mounts) if upper else None
    if upper is None or under is None or under.fs_type == "overlay":
        return BlockDevice(real, mount.mount_point, "overlay", None, None, "virtual")
    kind = fs_kind(under.fs_type)
    if kind is not None:
        return BlockDevice(real, mount.mount_point, "overlay", None, None, kind)
    device, disk = _block_names(_stat_dev(upper, under.mount_point), under.source, sys_root)
    if disk is None:
        return BlockDevice(real, mount.mount_point, "overlay", None, None, "virtual")
    return BlockDevice(real, mount.mount_point, "overlay", device, disk, disk_kind(disk, sys_root))


def _block_names(dev: int | None, source: str, sys_root: str) -> tuple[str | None, str | None]:
    """(device, disk) diskstats names from st_dev, else from the mount's /dev source."""
    links = []
    if dev is not None and os.major(dev) != 0:
        links.append(os.path.join(sys_root, "dev", "block", f"{os.major(dev)}:{os.minor(dev)}"))
    if source.startswith("/dev/"):
        name = os.path.basename(os.path.realpath(source))
        links.append(os.path.join(sys_root, "class", "block", name))
    for link in links:
        names = _names_from_sys_link(link, sys_root)
        if names is not None:
            return names
    return None, None


def _names_from_sys_link(link: str, sys_root: str) -> tuple[str, str] | None:
    """A sysfs block link points into devices/...; a partition's directory sits in its disk's."""
    try:
        target = os.readlink(link).rstrip("/")
    except OSError:
        return None
    name = os.path.basename(target)
    parent = os.path.basename(os.path.dirname(target))
    is_partition = os.path.exists(os.path.join(link, "partition")) or (
        parent not in ("", "block") and os.path.isdir(os.path.join(sys_root, "block", parent))
    )
    disk = parent if is_partition else name
    return name.replace("!", "/"), disk.replace("!", "/")


def _stat_dev(path: str, mount_point: str) -> int | None:
    """st_dev of `path` or of its nearest existing ancestor inside `mount_point`; None if none."""
    while _under(path, mount_point):
        try:
            return os.stat(path).st_dev
        except OSError:
            parent = os.path.dirname(path)
            if parent == path:
                return None
            path = parent
    return None


def _under(path: str, mount_point: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def _option(options: Sequence[str], key: str) -> str | None:
    prefix = key + "="
    for option in options:
        if option.startswith(prefix):
            return _unescape_mount(option[len(prefix) :])
    return None


def _unescape_mount(field: str) -> str:
    r"""Undo the kernel's octal escapes in mount fields (\040 space, \011 tab, \012 newline, \134)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        chunk = field[i + 1 : i + 4]
        if field[i] == "\\" and len(chunk) == 3 and all(c in "01234567" for c in chunk):
            out.append(chr(int(chunk, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


# Disk counters


@dataclass(frozen=True)
class DiskCounters:
    """A disk's cumulative read counters from /proc/diskstats."""

    reads: int  # reads completed
    read_sectors: int  # 512-byte sectors read
    read_ms: int  # time spent on reads (summed over requests)
    io_ms: int  # time the device had any I/O in flight


@dataclass(frozen=True)
class DiskRates:
    """Read rates between two snapshots, as `iostat -x` computes them."""

    reads_per_s: float
    read_mb_per_s: float
    await_ms: float  # mean time per read, queueing included
    util_percent: float  # share of the interval the device was busy, at most 100


def read_diskstats(proc_root: str = "/proc") -> dict[str, DiskCounters]:
    """Counters of every device in /proc/diskstats, by name; {} when the file cannot be read."""
    counters = {}
    for line in (_read_text(os.path.join(proc_root, "diskstats")) or "").splitlines():
        fields = line.split()
        if len(fields) < 14:
            continue
        try:
            counters[fields[2]] = DiskCounters(
                int(fields[3]), int(fields[5]), int(fields[6]), int(fields[12])
            )
        except ValueError:
            continue
    return counters


def disk_rates(before: DiskCounters, after: DiskCounters, seconds: float) -> DiskRates:
    """Rates over `seconds` between two snapshots (a counter that went backwards counts as 0)."""
    if seconds <= 0:
        raise ConfigError(f"disk_rates needs a positive interval, got {seconds} s: take snapshots apart")
    reads = max(0, after.reads - before.reads)
    sectors = max(0, after.read_sectors - before.read_sectors)
    read_ms = max(0, after.read_ms - before.read_ms)
    io_ms = max(0, after.io_ms - before.io_ms)
    return DiskRates(
        reads_per_s=reads / seconds,
        read_mb_per_s=sectors * SECTOR_BYTES / MB / seconds,
        await_ms=read_ms / reads if reads else 0.0,
        util_percent=min(100.0, io_ms / (seconds * 1000.0) * 100.0),
    )


# CPU counters


@dataclass(frozen=True)
class CpuCounters:
    """Cumulative CPU time (clock ticks, all CPUs) from the first "cpu" line of /proc/stat."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int


@dataclass(frozen=True)
class CpuPercent:
    """Share of all CPUs' time between two snapshots, in percent."""

    user: float  # user + nice
    system: float  # system + irq + softirq
    iowait: float
    idle: float
    steal: float = 0.0  # taken by the hypervisor for other guests


def read_cpu(proc_root: str = "/proc") -> CpuCounters:
    """The machine-wide CPU counters; all zeros when /proc/stat cannot be read."""
    for line in (_read_text(os.path.join(proc_root, "stat")) or "").splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            try:
                values = [int(v) for v in fields[1:9]]
            except ValueError:
                break
            return CpuCounters(*(values + [0] * (8 - len(values))))
    return CpuCounters(0, 0, 0, 0, 0, 0, 0, 0)


def thread_run_delay_ns(path: str = "/proc/thread-self/schedstat") -> int | None:
    """Nanoseconds the calling thread has spent runnable but waiting for a CPU, so far.

    The second field of the kernel's per-task schedstat ("time spent waiting on a runqueue"):
    on a machine with more runnable tasks than cores it grows as fast as the wall clock while
    the task waits its turn. None where the kernel does not report it (no CONFIG_SCHED_INFO).
    Cheap enough to read twice per batch (one open, one read of a few bytes).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fields = os.read(fd, 128).split()
        return int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def run_delay_since(before: int | None) -> int:
    """The calling thread's run-queue delay since `before` (a `thread_run_delay_ns()`); 0 unknown."""
    after = thread_run_delay_ns() if before is not None else None
    return max(0, after - before) if after is not None and before is not None else 0


def cpu_percent(before: CpuCounters, after: CpuCounters) -> CpuPercent:
    """CPU shares between two snapshots; all zeros when no time passed between them."""
    d = {name: max(0, getattr(after, name) - getattr(before, name)) for name in CpuCounters.__annotations__}
    total = sum(d.values())
    if total == 0:
        return CpuPercent(0.0, 0.0, 0.0, 0.0, 0.0)
    scale = 100.0 / total
    return CpuPercent(
        user=(d["user"] + d["nice"]) * scale,
        system=(d["system"] + d["irq"] + d["softirq"]) * scale,
        iowait=d["iowait"] * scale,
        idle=d["idle"] * scale,
        steal=d["steal"] * scale,
    )


# Memory


@dataclass(frozen=True)
class Memory:
    """Machine memory from /proc/meminfo, in bytes."""

    total_bytes: int
    available_bytes: int  # what new work can have without swapping (page cache it may drop included)
    page_cache_bytes: int  # "Cached": file pages kept in memory


def memory(proc_root: str = "/proc") -> Memory:
    """Total, available and page-cache bytes; zeros when /proc/meminfo cannot be read."""
    kib: dict[str, int] = {}
    for line in (_read_text(os.path.join(proc_root, "meminfo")) or "").splitlines():
        key, _, rest = line.partition(":")
        value = rest.split()
        if value and value[0].isdigit():
            kib[key.strip()] = int(value[0])
    cached = kib.get("Cached", 0)
    available = kib.get("MemAvailable", kib.get("MemFree", 0) + kib.get("Buffers", 0) + cached)
    return Memory(kib.get("MemTotal", 0) * 1024, available * 1024, cached * 1024)


def shm_usage(shm_dir: str = "/dev/shm") -> tuple[int, int]:
    """(used, total) bytes of the shared-memory filesystem; (0, 0) when it cannot be read."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return 0, 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize


# GPUs


def gpu_utilization() -> list[float] | None:
    """Per-GPU utilisation in percent through nvidia-ml-py; None without it or without a GPU."""
    try:
        nvml: Any = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # no driver, no GPU, a broken install: no figures, not an error
        return None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        rates = [
            float(nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(i)).gpu)
            for i in range(count)
        ]
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return rates or None


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None
