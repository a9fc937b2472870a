"""A tuned loader (`num_workers="auto"`): the tuner (`_loading.tuning.tuner`) changes the worker
count and the batches in flight as the loader runs, and the batches stay those of a fixed
setting, bit for bit, every sample once per epoch, in the same order.

The real controller is driven here by the loader's own counters under an injected cost; the
machine's load is pinned to an idle one (`sample_machine` replaced), so the decisions depend on
the loader alone and hold beside CPU burners. Waits are for the tuner's events (its counters),
bounded by a deadline, never a fixed time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fastload import FastLoader
from fastload import transforms as T
from fastload._loading.tuning import tuner as tuner_module
from fastload._loading.tuning.decisions import Decision, Reason
from fastload._loading.tuning.machine_load import MachineSample
from fastload._machine import usable_cores

DEADLINE_S = 180.0


class _SlowSamples(torch.utils.data.Dataset[dict[str, Any]]):
    """Samples that take `cost_s` to load (a sleep: storage latency, which more workers hide) and
    draw from the global random state (seeded per sample by the loader)."""

    def __init__(self, n: int, cost_s: float) -> None:
        self.n, self.cost_s = n, cost_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        time.sleep(self.cost_s)
        return {"x": np.full(4, i, np.int64), "noise": torch.rand(2), "draw": np.random.randint(1 << 30)}


def _idle_machine(worker_pids: Any = (), **_: Any) -> MachineSample:
    """A machine with every core idle and no CPU pressure (the decisions then follow the loader)."""
    return MachineSample(time.monotonic(), 4, 0.0, 0, 0.0, {})


def _burn(seconds: float) -> None:
    """A training step's CPU work (the trainer is the bottleneck while it lasts)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _fixed_epoch(dataset: Any, epoch: int, **kw: Any) -> list[Any]:
    with FastLoader(dataset, num_workers=2, autotune=False, **kw) as fixed:
        fixed.set_epoch(epoch)
        return [_copy(batch) for batch in fixed]


def _copy(batch: Any) -> Any:
    """A batch's tensors copied out of its slot (so the slot goes back to the ring)."""
    if isinstance(batch, dict):
        return {k: _copy(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [_copy(v) for v in batch]
    return batch.clone()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(torch.equal(a, b))


@pytest.mark.skipif(usable_cores() < 2, reason="the tuner moves workers between 1 and the cores: needs 2")
def test_the_tuner_retires_and_adds_workers_and_every_batch_stays_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tuner_module, "sample_machine", _idle_machine)
    dataset = _SlowSamples(256, cost_s=0.002)
    kw: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 7, "persistent_workers": True}
    seen: list[tuple[int, list[Any]]] = []  # (epoch, its batches) as the tuned loader gave them
    counts: list[int] = []
    with FastLoader(dataset, num_workers="auto", **kw) as loader:
        start = len(loader.worker_pids) or 2

        def epochs(step_s: float) -> Iterator[tuple[int, Any]]:
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline:
                epoch, batches = len(seen), []
                seen.append((epoch, batches))
                for batch in loader:
                    batches.append(_copy(batch))  # its slot goes back to the ring
                    del batch
                    _burn(step_s)
                    stats = loader.stats()
                    assert stats is not None
                    counts.append(stats.tuner_workers)
                    yield epoch, stats
            raise AssertionError(f"the tuner did not act in {DEADLINE_S:.0f} s; workers seen: {counts[-20:]}")

        # The trainer is the bottleneck (its step 30 ms, a batch 16 ms of one worker's time): a
        # worker is retired.
        for _, stats in epochs(0.030):
            if stats.tuner_workers == 1 and stats.tuner_reason == Reason.TRAINER_BOUND:
                break
        # The trainer only consumes: decode-bound (the workers sleep on "storage"), a core idle: a
        # worker is added (or the retire, if not yet verified, is undone: it made the trainer wait).
        for _, stats in epochs(0.0):
            if stats.tuner_workers == 2 and stats.tuner_reason in (Reason.DECODE_BOUND, Reason.NO_GAIN):
                break
        for _ in loader:  # the epoch under way to its end (same batches, fewer or more workers)
            pass
        assert stats.tuner_changes >= 2
    assert start == 2 and 1 in counts
    for epoch, batches in seen[:-1]:  # every whole epoch the tuned loader yielded
        if len(batches) == len(loader):
            assert _same(batches, _fixed_epoch(dataset, epoch, **kw)), f"epoch {epoch} differs"
    whole = [(e, b) for e, b in seen if len(b) == len(loader)]
    assert whole, "no whole epoch was compared"
    for epoch, batches in whole:
        drawn = torch.cat([b["x"][:, 0] for b in batches])
        assert sorted(drawn.tolist()) == list(range(len(dataset))), f"epoch {epoch}: not every sample once"


class _Scripted:
    """A controller that moves the setting on every interval, through a fixed script: workers and
    batches in flight up and down, whatever the counters say."""

    script = ((1, 2), (2, 6), (1, 3), (2, 1), (1, 8), (2, 4))

    def __init__(self, limits: Any, workers: int, in_flight: int) -> None:
        self.limits, self.workers, self.in_flight, self.step = limits, workers, in_flight, 0

    def observe(self, obs: Any) -> Decision:
        workers, in_flight = self.script[self.step % len(self.script)]
        self.step += 1
        return Decision(workers, in_flight, Reason.BURSTY, "scripted")

    def settled(self, workers: int, in_flight: int) -> None:
        self.workers, self.in_flight = workers, in_flight


def test_an_image_source_keeps_its_batches_while_workers_and_window_move(
    image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tuner_module, "Controller", _Scripted)
    monkeypatch.setattr(tuner_module, "INTERVAL_S", 0.0)
    kw: dict[str, Any] = {
        "batch_size": 3, "shuffle": True, "seed": 3, "device": "cpu",
        "transform": [T.RandomResizedCrop(24), T.RandomHorizontalFlip()],
    }
    with FastLoader(image_folder, **kw) as loader:
        for epoch in range(3):
            tuned = [_copy(batch) for batch in loader]
            stats = loader.stats()
            assert stats is not None and stats.tuner_changes >= 1
            assert _same(tuned, _fixed_epoch(image_folder, epoch, **kw)), f"epoch {epoch} differs"
        assert stats.tuner_changes >= 2 * len(loader)  # it moved on (nearly) every batch
