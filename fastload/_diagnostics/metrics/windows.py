"""Rate windows: each loader's per-second figures and verdict over at least a second.

A scrape may come every few milliseconds; the figures it shows still cover `RATE_WINDOW_S` at
least, from a reading kept per loader, and the machine's CPU shares over the same window.
"""

from __future__ import annotations

import time
from typing import Any

from fastload._diagnostics import sysinfo
from fastload._diagnostics.loader_rates import LoaderRates, MachineRates, loader_rates
from fastload._diagnostics.verdict import classify
from fastload._loading.running.stats import LoaderStats
from fastload._machine import usable_cores

RATE_WINDOW_S = 1.0  # per-second figures and the verdict cover at least this much time


class RateWindows:
    """Each loader's rates and verdict over at least `RATE_WINDOW_S`: the reading a window
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
        elif now - start[0] >= RATE_WINDOW_S or key not in self._last:
            rates = loader_rates(key, start[1], stats, now - start[0])
            if now - start[0] >= RATE_WINDOW_S:
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
        if self._machine is None or self._cpu is None or now - self._cpu[0] >= RATE_WINDOW_S:
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
