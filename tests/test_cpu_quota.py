"""`_cpu_quota` (NOTE [a container's CPU quota]): the tightest quota on the cgroup path found in
v1 and v2 trees (a container's namespace, no limit, nested limits), its counters read, the cores
it allows rounded down; the tuner's machine sample counting within it (throttled periods as
pressure); and, where this host lets root make a v1 cgroup, a real quota of a fifth of a core seen
(as one) by a process in it while two burners there are throttled."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fastload
from fastload._cpu_quota import CpuLimit, find_cpu_limit, quota_cores
from fastload._loading.tuning.machine_load import MachineSample, load_between, sample_machine

V1_CPU = Path("/sys/fs/cgroup/cpu")
WAIT_S = 60.0  # a hang guard for waits on events, never a target


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_v2_takes_the_tightest_limit_on_the_path_and_reads_its_counters(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _tree(root, {
        "cgroup.controllers": "cpu memory\n",
        "cpu.max": "max 100000\n",
        "pod/cpu.max": "250000 100000\n",  # the pod's 2.5 cores bind its container's 3.5
        "pod/cpu.stat": "usage_usec 7500000\nuser_usec 1\nnr_periods 40\nnr_throttled 10\n",
        "pod/box/cpu.max": "350000 100000\n",
        "pod/box/cpu.stat": "usage_usec 1\n",
    })  # fmt: skip
    (tmp_path / "cgroup").write_text("0::/pod/box\n")
    limit = find_cpu_limit(str(root), str(tmp_path / "cgroup"))
    assert limit is not None and limit.version == 2
    assert limit.cores == 2.5 and limit.directory == str(root / "pod")
    assert limit.usage_s() == 7.5 and limit.throttling() == (40, 10)
    assert quota_cores(limit) == 2


def test_v2_without_a_limit_and_a_namespace_path_not_there(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _tree(root, {"cgroup.controllers": "cpu\n", "cpu.max": "max 100000\n"})
    (tmp_path / "cgroup").write_text("0::/\n")
    assert find_cpu_limit(str(root), str(tmp_path / "cgroup")) is None
    # Inside a cgroup namespace's container /proc may show the host's path; the mount is its own.
    (root / "cpu.max").write_text("150000 100000\n")
    (tmp_path / "cgroup").write_text("0::/kubepods/burstable/pod1/abc\n")
    limit = find_cpu_limit(str(root), str(tmp_path / "cgroup"))
    assert limit is not None and limit.cores == 1.5 and limit.directory == str(root)
    assert quota_cores(limit) == 1  # rounded down
    assert limit.usage_s() is None and limit.throttling() is None  # no cpu.stat: unreadable, None


def test_v1_quota_with_cpuacct_beside_it(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    _tree(root, {
        "cpu/cpu.cfs_quota_us": "-1\n",
        "cpu/cpu.cfs_period_us": "100000\n",
        "cpu/docker/x/cpu.cfs_quota_us": "50000\n",
        "cpu/docker/x/cpu.cfs_period_us": "100000\n",
        "cpu/docker/x/cpu.stat": "nr_periods 8\nnr_throttled 2\nthrottled_time 5\n",
        "cpuacct/docker/x/cpuacct.usage": "3000000000\n",
        "unified/cgroup.controllers": "\n",
    })  # fmt: skip
    (tmp_path / "cgroup").write_text("4:memory:/docker/x\n2:cpuacct:/docker/x\n1:cpu:/docker/x\n0::/x\n")
    limit = find_cpu_limit(str(root), str(tmp_path / "cgroup"))
    assert limit is not None and limit.version == 1 and limit.cores == 0.5
    assert limit.usage_s() == 3.0 and limit.throttling() == (8, 2)
    assert quota_cores(limit) == 1  # at least one
    (root / "cpu/docker/x/cpu.cfs_quota_us").write_text("-1\n")
    assert find_cpu_limit(str(root), str(tmp_path / "cgroup")) is None
    assert quota_cores(None) is None


def test_no_cgroup_file_means_no_limit(tmp_path: Path) -> None:
    assert find_cpu_limit(str(tmp_path), str(tmp_path / "missing")) is None


def test_the_tuners_sample_counts_within_a_quota(tmp_path: Path) -> None:
    stat = tmp_path / "cpu.stat"
    stat.write_text("usage_usec 1000000\nnr_periods 100\nnr_throttled 0\n")
    limit = CpuLimit(cores=1.5, directory=str(tmp_path), usage_file=str(stat), version=2)
    before = sample_machine(limit=limit)
    assert before.cores == 1 and before.busy_cpu_s == 1.0 and before.throttling == (100, 0)
    stat.write_text("usage_usec 3000000\nnr_periods 110\nnr_throttled 9\n")
    after = sample_machine(limit=limit)
    load = load_between(before, after)
    assert load.busy_cores == pytest.approx(min(2.0 / load.seconds, 1.0))  # within its one core
    assert load.pressure is not None and load.pressure >= 0.9  # 9 of 10 periods throttled
    unlimited = sample_machine(limit=None)
    assert unlimited.throttling is None and unlimited.cores == len(os.sched_getaffinity(0))
    # Its use unreadable (v1's cpuacct mounted apart, without this cgroup): cores and busy stay
    # the CPUs' (one view for both), throttling is still read.
    blind = CpuLimit(cores=1.5, directory=str(tmp_path), usage_file=str(tmp_path / "gone"), version=2)
    seen = sample_machine(limit=blind)
    assert seen.cores == len(os.sched_getaffinity(0)) and seen.throttling == (110, 9)


def test_throttling_counts_as_pressure_beside_psi() -> None:
    def at(t: float, psi_us: int, throttled: tuple[int, int] | None) -> MachineSample:
        return MachineSample(t, 4, 0.0, psi_us, 0.0, {}, throttled)

    assert load_between(at(0, 0, (10, 0)), at(1, 200_000, (20, 5))).pressure == 0.5
    assert load_between(at(0, 0, (10, 0)), at(1, 700_000, (20, 5))).pressure == 0.7
    assert load_between(at(0, 0, (10, 0)), at(1, 100_000, (10, 0))).pressure == 0.1  # no period ran
    assert load_between(at(0, 0, None), at(1, 100_000, (10, 0))).pressure == 0.1


_IN_QUOTA = """
import json, subprocess, sys, time
from fastload._cpu_quota import own_cpu_limit
from fastload._loading.tuning.machine_load import load_between, sample_machine
from fastload._machine import usable_cores
burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL) for _ in range(2)]  # not holding our pipes
limit = own_cpu_limit()
before = sample_machine()
deadline = time.monotonic() + float(sys.argv[1])
while limit is not None and (limit.throttling() or (0, 0))[1] - before.throttling[1] < 5:
    assert time.monotonic() < deadline, "no period throttled"
    time.sleep(0.05)  # polling for the event (periods throttled), not a timed wait
load = load_between(before, sample_machine())
for burner in burners:
    burner.kill()
    burner.wait()
print(json.dumps({"usable": usable_cores(), "quota": None if limit is None else limit.cores,
                  "pressure": load.pressure}))
"""


def _writable_v1_cpu() -> bool:
    return os.geteuid() == 0 and (V1_CPU / "cpu.cfs_quota_us").exists() and os.access(V1_CPU, os.W_OK)


@pytest.mark.skipif(not _writable_v1_cpu(), reason="needs root and a writable cgroup v1 cpu hierarchy")
def test_a_process_under_a_real_quota_sees_one_core_and_its_throttling() -> None:
    group = V1_CPU / f"fastload-test-{secrets.token_hex(4)}"
    try:
        group.mkdir()
    except OSError as e:  # a read-only or delegated hierarchy
        pytest.skip(f"cannot make a cgroup here: {e}")
    try:
        (group / "cpu.cfs_period_us").write_text("100000\n")
        # A fifth of a core, on any of the CPUs: two burners overrun it even where the machine's
        # load leaves them little (a quota they never reach throttles nothing).
        (group / "cpu.cfs_quota_us").write_text("20000\n")
        script = f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1" "$2"'
        env = {**os.environ, "PYTHONPATH": str(Path(fastload.__file__).parents[1])}  # this checkout's
        done = subprocess.run(
            ["sh", "-c", script, sys.executable, _IN_QUOTA, str(WAIT_S / 2)],
            capture_output=True, text=True, timeout=WAIT_S, check=False, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["usable"] == 1 and seen["quota"] == 0.2  # at least one core
        assert seen["pressure"] is not None and seen["pressure"] > 0.5  # throttled most periods
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            os.kill(int(pid), signal.SIGKILL)  # a failed assertion's burners
        deadline = time.monotonic() + WAIT_S
        while (group / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.01)  # waiting for the killed to leave (an event), not a timed wait
        group.rmdir()
