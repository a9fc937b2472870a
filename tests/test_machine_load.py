"""`tuning.machine_load`: plausible readings of this machine, a burning child's CPU seen as the
workers' cores, a gone pid skipped, and the /proc formats parsed (pressure absent: None)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastload._loading.tuning.machine_load import (
    MachineSample,
    busy_cpu_seconds,
    cpu_pressure_some_us,
    load_between,
    process_cpu_seconds,
    sample_machine,
)
from fastload._machine import usable_cores

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")


def test_this_machine_reads_plausibly() -> None:
    before = sample_machine()
    deadline = time.monotonic() + 30
    while time.process_time() - before.own_cpu_s < 0.05 and time.monotonic() < deadline:
        sum(range(10_000))  # spend a little CPU here, so the interval has something to measure
    after = sample_machine()
    rates = load_between(before, after)
    assert after.cores == usable_cores()
    assert 0.0 <= rates.busy_cores <= usable_cores()
    assert rates.pressure is None or 0.0 <= rates.pressure <= 1.0
    assert rates.own_cores > 0.0
    assert rates.workers_cores == 0.0  # no workers given


def test_a_burning_child_is_counted_as_a_worker_and_skipped_once_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        before = sample_machine([child.pid])
        assert child.pid in before.workers_cpu_s
        deadline = time.monotonic() + 60
        while (process_cpu_seconds(child.pid) or 0.0) - before.workers_cpu_s[child.pid] < 0.2:
            assert time.monotonic() < deadline, "the child burned no CPU in a minute"
            time.sleep(0.01)  # polling for the event (its CPU clock advanced), not a timed wait
        after = sample_machine([child.pid])
    finally:
        child.kill()
        child.wait()
    rates = load_between(before, after)
    assert rates.workers_cores > 0.0
    assert after.workers_total_s >= 0.2
    gone = sample_machine([child.pid])
    assert gone.workers_cpu_s == {}
    assert load_between(after, gone).workers_cores == 0.0  # a retired worker: never negative


def test_proc_formats(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  400 0 100 9000 50 0 0 0 0 0\n"
        "cpu0 100 0 50 4500 25 0 0 0 0 0\n"
        "cpu1 300 10 50 4500 25 5 5 0 0 0\n"
        "intr 12345\n"
    )
    ticks = busy_cpu_seconds([1], path=str(stat)) * 100  # USER_HZ is 100 on Linux
    assert ticks == pytest.approx(300 + 10 + 50 + 5 + 5)
    pressure = tmp_path / "cpu"
    pressure.write_text(
        "some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert cpu_pressure_some_us(str(pressure)) == 123456
    assert cpu_pressure_some_us(str(tmp_path / "absent")) is None


def test_rates_without_pressure_on_either_side() -> None:
    a = MachineSample(
        time=1.0, cores=2, busy_cpu_s=10.0, pressure_some_us=None, own_cpu_s=0.0, workers_cpu_s={}
    )
    b = MachineSample(time=3.0, cores=2, busy_cpu_s=13.0, pressure_some_us=5, own_cpu_s=1.0, workers_cpu_s={})
    rates = load_between(a, b)
    assert rates.pressure is None
    assert rates.busy_cores == pytest.approx(1.5)
    assert rates.own_cores == pytest.approx(0.5)
