"""The in-flight window (`_loading.running.in_flight`): the one owner of how many batches a loader
keeps in flight, and the handle a tuner turns.

Its bounds and the reasons it gives for a value it did not take; and turned in the middle of an
epoch, it changes how many batches are in flight while the epoch still yields every batch once,
in order, the same as a loader nobody turned.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from fastload import ConfigError, FastLoader
from fastload._loading.running.dispatch import MAX_TASKS_PER_WORKER
from fastload._loading.running.in_flight import InFlightWindow, Resized
from fastload._loading.slots.ring_plan import EXTRA_SLOTS

pytestmark = pytest.mark.timeout(120)


def test_a_window_takes_what_its_bounds_allow() -> None:
    window = InFlightWindow(4, workers=2, engine=True)
    assert window.limit == 4 and window.ceiling == 2 * MAX_TASKS_PER_WORKER
    assert window.resize(9) == Resized(9)
    assert window.fit_ring(6 + EXTRA_SLOTS) == Resized(6)  # the ring it got: opened to it
    assert window.limit == 6 and window.ceiling == 6
    assert window.resize(3) == Resized(3) and window.limit == 3


def test_a_window_says_why_it_refused_a_value() -> None:
    window = InFlightWindow(4, workers=2, engine=True)
    window.fit_ring(4 + EXTRA_SLOTS)
    more = window.resize(10)
    assert more.limit == 4 and "need 12 ring slots; the ring has 6" in more.refused
    none = window.resize(0)
    assert none.limit == 1 and "at least 1" in none.refused
    assert window.limit == 1
    with pytest.raises(ConfigError, match="whole number"):
        window.resize(2.5)  # type: ignore[arg-type]


def test_the_engines_per_worker_cap_bounds_a_window_without_a_ring() -> None:
    window = InFlightWindow(2, workers=1, engine=True)
    capped = window.resize(MAX_TASKS_PER_WORKER + 1)
    assert capped.limit == MAX_TASKS_PER_WORKER and f"{MAX_TASKS_PER_WORKER} each" in capped.refused
    unbounded = InFlightWindow(2, workers=0, engine=False)  # inline: no engine, no ring yet
    assert unbounded.ceiling is None and unbounded.resize(500) == Resized(500)


def test_the_bounds_follow_the_workers_and_the_ring_and_clamp_without_opening() -> None:
    window = InFlightWindow(2, workers=2, engine=True)
    window.fit_ring(20 + EXTRA_SLOTS)
    assert window.resize(20).limit == 20
    assert window.set_workers(1) == Resized(20)  # 1 x MAX_TASKS_PER_WORKER still holds 20
    assert window.ceiling == min(20, MAX_TASKS_PER_WORKER)
    assert window.set_ring(8 + EXTRA_SLOTS).limit == 8  # shrunk: clamped
    assert window.set_ring(30 + EXTRA_SLOTS).limit == 8  # grown: not opened
    assert window.slots_for(12) == 12 + EXTRA_SLOTS and window.slots_for(0) == 1 + EXTRA_SLOTS
    assert window.slots_for(10**6) == MAX_TASKS_PER_WORKER + EXTRA_SLOTS  # the engine's bound
    with pytest.raises(ConfigError, match="whole number"):
        window.slots_for(True)


class Numbers(Dataset[int]):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> int:
        return i


KWARGS: dict[str, Any] = {"batch_size": 2, "shuffle": True, "seed": 5, "num_workers": 2, "prefetch": 6}


def test_turning_the_window_mid_epoch_changes_batches_in_flight_and_loses_none() -> None:
    with FastLoader(Numbers(), **KWARGS) as loader:
        expected = [batch.clone() for batch in loader]
    got: list[torch.Tensor] = []
    in_flight: list[int] = []
    with FastLoader(Numbers(), **KWARGS) as loader:
        it = iter(loader)
        for k in range(len(expected)):
            if k == 4:
                assert loader._runs.pipeline is not None
                assert loader._runs.pipeline.window.resize(1) == Resized(1)
            if k == 24:
                assert loader._runs.pipeline is not None
                assert loader._runs.pipeline.window.resize(6) == Resized(6)
            got.append(next(it).clone())
            in_flight.append(it._in_window())  # type: ignore[attr-defined]
        with pytest.raises(StopIteration):
            next(it)
    assert len(got) == len(expected) == 48
    same = all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert same, "a batch lost, doubled or moved"
    assert max(in_flight[:4]) == 6  # the window it started with, filled
    assert max(in_flight[12:24]) <= 1  # shrunk: drained down to one batch in flight
    assert max(in_flight[24:40]) == 6  # opened again
