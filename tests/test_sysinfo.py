"""_diagnostics/sysinfo.py: figures from fixture /proc snapshots and a fake /sys tree, then here."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from fastload._diagnostics.sysinfo import (
    BlockDevice,
    CpuCounters,
    CpuPercent,
    DiskCounters,
    DiskRates,
    Memory,
    cpu_percent,
    device_for_path,
    disk_rates,
    fs_kind,
    gpu_utilization,
    memory,
    read_cpu,
    read_diskstats,
    read_mounts,
    shm_usage,
)
from fastload._errors import ConfigError
from fastload._machine import run_delay_since, thread_run_delay_ns

FIXTURES = Path(__file__).parent / "fixtures" / "proc"
T0, T1 = str(FIXTURES / "t0"), str(FIXTURES / "t1")
KINDS = {"nvme", "ssd", "hdd", "network", "memory", "virtual", "unknown"}

NVME = "devices/pci0000:00/0000:00:1d.0/nvme/nvme0/nvme0n1"
SDA = "devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/sda"
VDA = "devices/pci0000:00/0000:00:02.0/virtio1/block/vda"


def _disk(sys_root: Path, device_dir: str, majmin: str, rotational: str) -> None:
    """A whole disk: its device directory, /sys/block/<disk> and /sys/dev/block/<maj:min> links."""
    name = os.path.basename(device_dir)
    (sys_root / device_dir / "queue").mkdir(parents=True)
    (sys_root / device_dir / "queue" / "rotational").write_text(rotational + "\n")
    (sys_root / "block" / name).symlink_to(Path("..") / device_dir)
    (sys_root / "dev" / "block" / majmin).symlink_to(Path("../..") / device_dir)
    (sys_root / "class" / "block" / name).symlink_to(Path("../..") / device_dir)


def _partition(sys_root: Path, disk_dir: str, name: str, majmin: str, number: int) -> None:
    part_dir = f"{disk_dir}/{name}"
    (sys_root / part_dir).mkdir()
    (sys_root / part_dir / "partition").write_text(f"{number}\n")
    (sys_root / "dev" / "block" / majmin).symlink_to(Path("../..") / part_dir)
    (sys_root / "class" / "block" / name).symlink_to(Path("../..") / part_dir)


@pytest.fixture
def sys_root(tmp_path: Path) -> str:
    """A fake /sys: nvme0n1 (+p2, SSD), sda (+sda1, rotational), vda (virtio, not rotational)."""
    root = tmp_path / "sys"
    for d in ("block", "dev/block", "class/block"):
        (root / d).mkdir(parents=True)
    _disk(root, NVME, "259:0", "0")
    _partition(root, NVME, "nvme0n1p2", "259:2", 2)
    _disk(root, SDA, "8:0", "1")
    _partition(root, SDA, "sda1", "8:1", 1)
    _disk(root, VDA, "254:0", "0")
    return str(root)


def _device(path: str, sys_root: str, major: int, minor: int) -> BlockDevice:
    return device_for_path(path, T0, sys_root, st_dev=os.makedev(major, minor))


# Mounts and devices


def test_mounts_are_parsed_with_escapes() -> None:
    mounts = read_mounts(T0)
    assert [m.mount_point for m in mounts][:5] == ["/", "/proc", "/sys", "/dev/shm", "/data"]
    assert "/mnt/my data" in [m.mount_point for m in mounts]
    nfs = next(m for m in mounts if m.mount_point == "/mnt/nfs")
    assert (nfs.source, nfs.fs_type) == ("fileserver:/export/datasets", "nfs4")
    assert "vers=4.2" in nfs.options


def test_nvme_partition_resolves_to_its_disk(sys_root: str) -> None:
    dev = _device("/", sys_root, 259, 2)
    assert dev == BlockDevice("/", "/", "ext4", "nvme0n1p2", "nvme0n1", "nvme")
    assert dev.describe() == "NVMe SSD nvme0n1 (ext4 on /)"


def test_rotational_partition_is_hdd(sys_root: str) -> None:
    dev = _device("/data/imagenet/train", sys_root, 8, 1)
    assert (dev.mount_point, dev.device, dev.disk, dev.kind) == ("/data", "sda1", "sda", "hdd")
    assert dev.describe() == "HDD sda (ext4 on /data)"


def test_virtio_whole_disk_is_ssd_and_says_virtio(sys_root: str) -> None:
    dev = _device("/mnt/vm/images", sys_root, 254, 0)
    assert (dev.device, dev.disk, dev.kind) == ("vda", "vda", "ssd")
    assert dev.describe() == "virtio SSD vda (ext4 on /mnt/vm)"


def test_mount_point_with_a_space(sys_root: str) -> None:
    dev = _device("/mnt/my data/x.jpg", sys_root, 8, 1)
    assert (dev.mount_point, dev.disk, dev.kind) == ("/mnt/my data", "sda", "hdd")


def test_longest_prefix_respects_path_components(sys_root: str) -> None:
    # /mnt/nfsother is not under /mnt/nfs: it is on the root filesystem.
    dev = _device("/mnt/nfsother/x", sys_root, 259, 2)
    assert (dev.mount_point, dev.kind) == ("/", "nvme")


@pytest.mark.parametrize(
    ("path", "mount_point", "fs_type", "kind", "text"),
    [
        ("/mnt/nfs/imagenet", "/mnt/nfs", "nfs4", "network", "network filesystem nfs4 on /mnt/nfs"),
        (
            *("/mnt/remote/a/b", "/mnt/remote", "fuse.sshfs", "network"),
            "network filesystem fuse.sshfs on /mnt/remote",
        ),
        ("/dev/shm/x", "/dev/shm", "tmpfs", "memory", "in-memory filesystem tmpfs on /dev/shm"),
        ("/proc/cpuinfo", "/proc", "proc", "virtual", "virtual filesystem proc on /proc"),
    ],
)
def test_filesystems_without_a_disk(
    sys_root: str, path: str, mount_point: str, fs_type: str, kind: str, text: str
) -> None:
    dev = _device(path, sys_root, 0, 50)  # st_dev of such filesystems has major 0
    assert dev == BlockDevice(path, mount_point, fs_type, None, None, kind)
    assert dev.describe() == text


def test_anonymous_st_dev_falls_back_to_the_mount_source(sys_root: str) -> None:
    # btrfs and friends report major 0; the mount's /dev/nvme0n1p2 source still names the disk.
    dev = _device("/fastload-no-such-dir/home", sys_root, 0, 45)
    assert (dev.device, dev.disk, dev.kind) == ("nvme0n1p2", "nvme0n1", "nvme")


def test_overlay_takes_the_kind_of_its_upper_dir(sys_root: str) -> None:
    dev = _device("/mnt/overlay/train", sys_root, 0, 77)
    assert dev == BlockDevice("/mnt/overlay/train", "/mnt/overlay", "overlay", "sda1", "sda", "hdd")
    hidden = _device("/mnt/hidden/train", sys_root, 0, 78)
    assert (hidden.kind, hidden.disk) == ("virtual", None)
    assert hidden.describe() == "virtual filesystem overlay on /mnt/hidden"


def test_odd_systems_give_unknown_not_errors(tmp_path: Path, sys_root: str) -> None:
    empty = str(tmp_path / "nothing")
    assert device_for_path("/x", empty, empty, st_dev=os.makedev(259, 2)).kind == "unknown"
    # A known mount whose device /sys does not list (and whose source is not under /dev).
    dev = device_for_path("/x", T0, empty, st_dev=os.makedev(9, 9))
    assert (dev.mount_point, dev.device, dev.disk, dev.kind) == ("/", None, None, "unknown")
    assert dev.describe() == "unknown storage (ext4 on /)"
    # A disk whose queue has no rotational flag.
    os.remove(Path(sys_root) / SDA / "queue" / "rotational")
    assert _device("/data", sys_root, 8, 1).kind == "unknown"


def test_fs_kind() -> None:
    assert fs_kind("nfs") == fs_kind("cifs") == fs_kind("fuse.gcsfuse") == fs_kind("lustre") == "network"
    assert fs_kind("ramfs") == "memory"
    assert fs_kind("ext4") is None and fs_kind("xfs") is None and fs_kind("fuseblk") is None


# Disk counters


def test_diskstats_parse() -> None:
    stats = read_diskstats(T0)
    assert set(stats) == {"nvme0n1", "nvme0n1p2", "sda", "sda1", "vda", "loop0"}
    assert stats["nvme0n1"] == DiskCounters(reads=100000, read_sectors=8000000, read_ms=40000, io_ms=30000)
    assert stats["sda"] == DiskCounters(20000, 1600000, 150000, 60000)  # the old 14-field format
    assert stats["vda"] == DiskCounters(1561805, 127174378, 2467281, 129112)


def test_disk_rates_iostat_semantics() -> None:
    before, after = read_diskstats(T0), read_diskstats(T1)
    nvme = disk_rates(before["nvme0n1"], after["nvme0n1"], 2.0)
    assert nvme == DiskRates(reads_per_s=10000.0, read_mb_per_s=100.0, await_ms=0.5, util_percent=75.0)
    sda = disk_rates(before["sda"], after["sda"], 2.0)
    assert sda == DiskRates(reads_per_s=200.0, read_mb_per_s=5.0, await_ms=8.0, util_percent=100.0)  # capped
    idle = disk_rates(before["vda"], after["vda"], 2.0)
    assert idle == DiskRates(0.0, 0.0, 0.0, 0.0)


def test_disk_rates_counter_reset_and_bad_interval() -> None:
    big, small = DiskCounters(100, 1000, 50, 40), DiskCounters(10, 100, 5, 4)
    assert disk_rates(big, small, 1.0) == DiskRates(0.0, 0.0, 0.0, 0.0)
    with pytest.raises(ConfigError, match="positive interval"):
        disk_rates(small, big, 0.0)


def test_missing_diskstats_is_empty(tmp_path: Path) -> None:
    assert read_diskstats(str(tmp_path)) == {}


# CPU and memory


def test_cpu_counters_and_percent() -> None:
    before, after = read_cpu(T0), read_cpu(T1)
    assert before == CpuCounters(10000, 500, 3000, 80000, 1000, 100, 400, 0)
    assert cpu_percent(before, after) == CpuPercent(user=35.0, system=10.0, iowait=5.0, idle=47.5, steal=2.5)
    assert cpu_percent(after, after) == CpuPercent(0.0, 0.0, 0.0, 0.0, 0.0)


def test_cpu_short_line_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  10 2 3 40 5\ncpu0 10 2 3 40 5\n")
    assert read_cpu(str(tmp_path)) == CpuCounters(10, 2, 3, 40, 5, 0, 0, 0)
    assert read_cpu(str(tmp_path / "none")) == CpuCounters(0, 0, 0, 0, 0, 0, 0, 0)


def test_run_queue_delay_is_the_second_schedstat_field(tmp_path: Path) -> None:
    (tmp_path / "schedstat").write_text("540786614 236458 70\n")
    assert thread_run_delay_ns(str(tmp_path / "schedstat")) == 236458
    (tmp_path / "odd").write_text("540786614\n")
    assert thread_run_delay_ns(str(tmp_path / "odd")) is None
    assert thread_run_delay_ns(str(tmp_path / "none")) is None
    assert run_delay_since(None) == 0  # not reported when the stage began: unknown, counted as 0


SHARED_CORE = """
import os, sys, time
from fastload._machine import thread_run_delay_ns
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
rival = os.fork()  # spins on the same core until killed
if rival == 0:
    while True:
        pass
try:
    delay0, wall0, cpu0 = thread_run_delay_ns(), time.monotonic(), time.process_time()
    while time.process_time() - cpu0 < 0.2:
        pass
    delay = (thread_run_delay_ns() - delay0) / 1e9
    print(f"{delay:.3f} {time.monotonic() - wall0 - (time.process_time() - cpu0):.3f}")
finally:
    os.kill(rival, 9)
    os.waitpid(rival, 0)
"""


@pytest.mark.skipif(thread_run_delay_ns() is None, reason="this kernel does not report run-queue delay")
def test_run_queue_delay_grows_while_a_thread_waits_for_its_core() -> None:
    # 0.2 s of CPU on a core shared with a process that spins: about as long again waiting for
    # it, off the CPU but not blocked. That wait is what the delay counts (more if more share it).
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    done = subprocess.run(
        [sys.executable, "-c", SHARED_CORE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    delay, off_cpu = (float(v) for v in done.stdout.split())
    assert 0.1 < delay <= off_cpu + 0.02, done.stdout  # a part of the time off the CPU


def test_memory() -> None:
    assert memory(T0) == Memory(
        total_bytes=16384000 * 1024, available_bytes=12000000 * 1024, page_cache_bytes=8000000 * 1024
    )


def test_memory_without_memavailable(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text(
        "MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 20 kB\nCached: 300 kB\n"
    )
    assert memory(str(tmp_path)) == Memory(1000 * 1024, 420 * 1024, 300 * 1024)


# GPUs


def test_gpu_utilization_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    assert gpu_utilization() is None


def test_gpu_utilization_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    fake.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=[87, 12][h])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_utilization() == [87.0, 12.0]
    assert calls == ["init", "shutdown"]


def test_gpu_utilization_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pynvml")

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_utilization() is None


# This machine


def test_live_machine(tmp_path: Path) -> None:
    here = device_for_path(str(tmp_path))
    assert here.kind in KINDS and here.mount_point and here.fs_type
    assert str(tmp_path).startswith(here.mount_point) and here.describe()
    shm = device_for_path("/dev/shm")
    if any(m.mount_point == "/dev/shm" and m.fs_type == "tmpfs" for m in read_mounts()):
        assert shm.kind == "memory"
    for counters in read_diskstats().values():
        assert min(counters.reads, counters.read_sectors, counters.read_ms, counters.io_ms) >= 0
    cpu = read_cpu()
    assert min(cpu.user, cpu.system, cpu.idle) >= 0 and cpu.user + cpu.idle > 0
    mem = memory()
    assert mem.total_bytes > 0 and 0 <= mem.available_bytes <= mem.total_bytes and mem.page_cache_bytes >= 0
    used, total = shm_usage()
    assert 0 <= used <= total
    assert shm_usage(str(tmp_path / "missing")) == (0, 0)
