"""One measurement of tools/bench/bench_autotune.py, alone in its own process (so that one loader's
workers never overlap another's): one FastLoader, read for a fixed time, sampled as it runs.

    python tools/bench/autotune_run.py '{"mode": "run", "folder": ..., ...}'

prints one JSON line on stdout. Modes:
  run        a FastLoader over `folder` (RandomResizedCrop + flip, CPU batches, shuffled, epochs in a
             row) for `seconds`, with `workers` / `prefetch` (a number, or "auto": the argument left
             out) and `autotune` (left out when None); after each batch the trainer runs its `step`
             ("none", "cpu": `step_work` 1-thread matmuls, "sleep": `step_s` seconds, a GPU step's
             stand-in), and between `burner_on` and `burner_off` seconds one busy process per core
             runs beside it. Every `interval` seconds a thread samples: images delivered, live
             workers, the tuner's statistics (None before the tuner exists), the workers' CPU
             seconds (/proc/PID/stat utime + stime, the last value seen of each worker, so a
             retired worker's time up to its last sample counts) and the trainer's, the bytes of
             the loader's ring segments in /dev/shm and the CPU pressure ("some" total, in µs).
  calibrate  how many 1-thread matmuls take `step_s` seconds on an idle core (the "cpu" step's work).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

TUNER_FIELDS = ("tuner_workers", "tuner_in_flight", "ring_slots", "tuner_changes", "tuner_reason")
MATMUL_SIDE = 256
_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of process `pid` in seconds (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # fields 14 and 15 of proc(5)


def ring_bytes(pid: int) -> int:
    """Bytes of the /dev/shm segments process `pid` made (fastload_PID_*), its statistics block aside."""
    prefix, total = f"fastload_{pid}_", 0
    with os.scandir("/dev/shm") as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and not entry.name.startswith(prefix + "stats_"):
                with contextlib.suppress(OSError):  # freed meanwhile
                    total += entry.stat().st_size
    return total


def cpu_pressure_us() -> int | None:
    """/proc/pressure/cpu's "some" total: microseconds during which a runnable task waited for a CPU."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return None


class Sampler(threading.Thread):
    """Samples a running loader every `interval` seconds, and starts and stops the burner on time."""

    def __init__(self, loader: Any, spec: dict[str, Any], t0: float) -> None:
        super().__init__(daemon=True)
        self.loader, self.spec, self.t0 = loader, spec, t0
        self.images = 0  # written by the trainer's loop
        self.samples: list[dict[str, Any]] = []
        self.worker_cpu: dict[int, float] = {}
        self.burners: list[subprocess.Popen[bytes]] = []
        self.done = threading.Event()
        self._pids: list[int] = []

    def run(self) -> None:
        while not self.done.wait(self.spec["interval"]):
            self.sample()

    def live_workers(self) -> list[int]:
        with contextlib.suppress(RuntimeError):  # the table changed while read: keep the last one
            self._pids = list(self.loader.worker_pids)
        return self._pids

    def sample(self) -> None:
        now = time.perf_counter() - self.t0
        self.burner(now)
        pids = self.live_workers()
        for pid in pids:
            cpu = proc_cpu_s(pid)
            if cpu is not None:
                self.worker_cpu[pid] = cpu
        stats = self.loader.stats()
        row: dict[str, Any] = {
            "t": now,
            "images": self.images,
            "workers": len(pids),
            "worker_cpu_s": sum(self.worker_cpu.values()),
            "trainer_cpu_s": proc_cpu_s(os.getpid()),
            "ring_bytes": ring_bytes(os.getpid()),
            "psi_us": cpu_pressure_us(),
            "burner": bool(self.burners),
        }
        for name in TUNER_FIELDS:
            row[name] = getattr(stats, name, None)
        row["in_flight"] = getattr(stats, "in_flight", None)
        self.samples.append(row)

    def burner(self, now: float) -> None:
        on, off = self.spec.get("burner_on"), self.spec.get("burner_off")
        if on is None or off is None:
            return
        if on <= now < off and not self.burners:
            busy = [sys.executable, "-S", "-c", "while True: pass"]
            self.burners = [subprocess.Popen(busy) for _ in range(self.spec["cores"])]
        elif now >= off:
            self.stop_burner()

    def stop_burner(self) -> None:
        for burner in self.burners:
            burner.kill()
            burner.wait()
        self.burners = []


def matmuls(count: int) -> None:
    """`count` products of two 256 x 256 float32 matrices on this thread (torch, 1 thread)."""
    import torch

    a = torch.ones(MATMUL_SIDE, MATMUL_SIDE)
    for _ in range(count):
        torch.mm(a, a)


def calibrate(step_s: float) -> int:
    """Matmuls that take `step_s` seconds on an idle core (the fastest of a few timings)."""
    import torch

    torch.set_num_threads(1)
    matmuls(20)
    best = min(_timed(lambda: matmuls(50)) for _ in range(7)) / 50
    return max(1, round(step_s / best))


def _timed(work: Callable[[], None]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def trainer_step(spec: dict[str, Any]) -> Callable[[], None]:
    kind = spec.get("step", "none")
    if kind == "cpu":
        import torch

        torch.set_num_threads(1)
        work = spec["step_work"]
        return lambda: matmuls(work)
    if kind == "sleep":
        seconds = spec["step_s"]
        return lambda: time.sleep(seconds)
    return lambda: None


def epochs(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from fastload import FastLoader
    from fastload import transforms as T

    chain = [T.RandomResizedCrop(spec["size"]), T.RandomHorizontalFlip()]
    chosen = {k: spec[k] for k in ("workers", "prefetch") if spec.get(k) not in (None, "auto")}
    kwargs: dict[str, Any] = {"num_workers": chosen.get("workers"), "prefetch": chosen.get("prefetch")}
    if spec.get("autotune") is not None:
        kwargs["autotune"] = spec["autotune"]
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    step = trainer_step(spec)
    t0 = time.perf_counter()
    loader = FastLoader(
        spec["folder"], batch_size=spec["batch_size"], shuffle=True, seed=spec.get("seed", 0),
        device="cpu", transform=chain, **kwargs,
    )  # fmt: skip
    sampler = Sampler(loader, spec, t0)
    sampler.start()
    batches = 0
    try:
        for images, _ in epochs(loader):
            sampler.images += images.shape[0]
            batches += 1
            step()
            if time.perf_counter() - t0 >= spec["seconds"]:
                break
        sampler.done.set()
        sampler.join()
        sampler.sample()  # the end, exactly
    finally:
        sampler.done.set()
        sampler.join()
        sampler.stop_burner()
        loader.close()
    return {"samples": sampler.samples, "batches": batches, "workers_started": loader.num_workers}


def main() -> int:
    spec = json.loads(sys.argv[1])
    if spec["mode"] == "calibrate":
        print(json.dumps({"step_work": calibrate(spec["step_s"])}))
    else:
        print(json.dumps(run(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
