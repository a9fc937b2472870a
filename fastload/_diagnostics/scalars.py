"""`ScalarLogger`: a loader's per-epoch figures as scalars beside the loss curves (TensorBoard's
`SummaryWriter`, or any Lightning logger).

Each `log(step)` reads the loader's statistics block (the counters `iostat` reads), takes the
difference from the previous call, and writes: images per second, each stage's share of the
loader's time per sample (read, decode, augment, slot wait, host-to-device), the share of the
time the trainer waited in `next()`, the batches that failed and the samples skipped, and
iostat's verdict as its index in `metrics.VERDICTS` (a scalar plot cannot hold a word). A tuned
loader adds its tuner's: `tuner/workers`, `tuner/in_flight` and `tuner/ring_slots` now,
`tuner/changes` since the previous call, and `tuner/reason`, its last change's
`tuning.decisions.Reason` code.
"""

from __future__ import annotations

import time
from typing import Any

from fastload._diagnostics.loader_rates import MachineRates, loader_rates
from fastload._diagnostics.metrics import STAGES, VERDICTS
from fastload._diagnostics.verdict import classify
from fastload._loading.running.stats import LoaderStats
from fastload._machine import usable_cores

_NO_MACHINE = MachineRates(
    cpu={}, disk=None, device="unknown", device_kind="unknown", page_cache_bytes=0, shm_used_bytes=0,
    shm_total_bytes=0, gpu_percent=None,
)


class ScalarLogger:
    """Write `loader`'s figures since the previous `log` to `logger` under `prefix`.

        writer = SummaryWriter("runs/resnet")        # or a Lightning logger: trainer.logger
        scalars = fastload.ScalarLogger(loader, writer)
        for epoch in range(epochs):
            for images, labels in loader: ...
            scalars.log(epoch)                       # fastload/img_per_s, fastload/share/read, ...

    `logger` is anything with `add_scalar(tag, value, step)` (SummaryWriter) or
    `log_metrics(dict, step)` (Lightning's loggers). `log` returns what it wrote, and writes
    nothing before the loader's first batch.
    """

    def __init__(self, loader: Any, logger: Any, prefix: str = "fastload/") -> None:
        if not (hasattr(logger, "add_scalar") or hasattr(logger, "log_metrics")):
            raise TypeError(
                f"{type(logger).__name__} has neither add_scalar (SummaryWriter) nor log_metrics (Lightning)"
            )
        self.loader, self.logger, self.prefix = loader, logger, prefix
        self._previous: tuple[float, LoaderStats] | None = None

    def scalars(self) -> dict[str, float]:
        """The figures since the previous call (since the loader started, the first time)."""
        stats = self.loader.stats()
        if stats is None:
            return {}
        now = time.monotonic()
        before = self._previous
        if before is not None and (before[1].pid, before[1].created) != (stats.pid, stats.created):
            before = None  # a new pipeline (the loader was closed and iterated again): start over
        rates = loader_rates("", before[1] if before else None, stats, now - before[0] if before else 0.0)
        self._previous = (now, stats)
        ms = rates.ms_per_sample
        total = sum(ms[stage] for stage in STAGES)
        verdict, _ = classify(rates, _NO_MACHINE, usable_cores())
        figures = {
            "img_per_s": rates.samples_per_s,
            **{f"share/{stage}": ms[stage] / total if total else 0.0 for stage in STAGES},
            **{f"ms_per_sample/{stage}": ms[stage] for stage in STAGES},
            "trainer_wait_share": rates.trainer_wait_percent / 100.0,
            "failures": float(stats.failures - (before[1].failures if before else 0)),
            "skipped": float(stats.skipped - (before[1].skipped if before else 0)),
            "verdict": float(VERDICTS.index(verdict)),
        }
        if stats.is_tuned:
            figures |= {
                "tuner/workers": stats.tuner_workers,
                "tuner/in_flight": stats.tuner_in_flight,
                "tuner/ring_slots": stats.ring_slots,
                "tuner/changes": stats.tuner_changes - (before[1].tuner_changes if before else 0),
                "tuner/reason": stats.tuner_reason,
            }
        return {self.prefix + name: float(value) for name, value in figures.items()}

    def log(self, step: int) -> dict[str, float]:
        """Write the figures since the previous call at `step` (an epoch, or a global step)."""
        figures = self.scalars()
        if not figures:
            return figures
        if hasattr(self.logger, "add_scalar"):
            for tag, value in figures.items():
                self.logger.add_scalar(tag, value, step)
        else:
            self.logger.log_metrics(figures, step=step)
        return figures
