"""The ring plan (`_loading.slots.ring_plan`): one sizing and one /dev/shm pre-flight for every ring.

A local loader (before it forks), its pipeline (once a batch's layout is known) and the daemon
(for each session) size rings with `plan_ring`; these tests pin what it says and that the rings
actually made are the ones it planned.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from torch.utils.data import Dataset

import fastload._shm as _shm
from fastload import FastLoader, SharedMemoryError
from fastload._loading.slots.ring_plan import (
    EXTRA_SLOTS,
    MAX_IN_FLIGHT,
    TUNED_RING_BUDGET_BYTES,
    RingPlan,
    default_in_flight,
    in_flight_without_ring,
    plan_ring,
    ring_ceiling_slots,
)

pytestmark = pytest.mark.timeout(120)


def _fake_shm(monkeypatch: pytest.MonkeyPatch, free_mib: int, total_mib: int) -> None:
    blocks = SimpleNamespace(f_bavail=free_mib * 256, f_frsize=4096, f_blocks=total_mib * 256)
    monkeypatch.setattr(_shm.os, "statvfs", lambda path: blocks)
    monkeypatch.setattr(_shm, "_in_container", lambda: True)


def test_what_was_asked_wins_and_the_default_fills_in() -> None:
    assert plan_ring(1 << 20, workers=4, asked=3) == RingPlan(1 << 20, 3)
    for not_asked in (None, 0):  # 0: a hello that left it to the daemon
        assert plan_ring(1 << 20, 4, not_asked).in_flight == default_in_flight(4, 1 << 20)


def test_a_plan_holds_its_batches_in_flight_and_the_extra_slots() -> None:
    plan = RingPlan(slot_bytes=4096, in_flight=5)
    assert plan.slots == 5 + EXTRA_SLOTS
    assert plan.total_bytes == 4096 * (5 + EXTRA_SLOTS)


def test_without_a_ring_dataloaders_two_per_worker_unless_asked() -> None:
    assert in_flight_without_ring(workers=3, asked=None) == 6
    assert in_flight_without_ring(workers=0, asked=None) == 2
    assert in_flight_without_ring(workers=3, asked=5) == 5


def test_the_default_never_passes_the_most_in_flight() -> None:
    assert all(default_in_flight(w, 64) <= MAX_IN_FLIGHT for w in (1, 31, 32, 33, 64, 500))


def test_preflight_names_the_whole_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_shm(monkeypatch, free_mib=40, total_mib=64)
    plan = RingPlan(slot_bytes=10 << 20, in_flight=8)  # 10 slots: 100 MiB
    with pytest.raises(SharedMemoryError, match="needs 100 MiB") as info:
        plan.preflight()
    assert "--shm-size" in str(info.value) and "prefetch" in str(info.value)
    with pytest.raises(SharedMemoryError, match="needs 100 MiB"):
        plan.check()
    RingPlan(slot_bytes=1 << 20, in_flight=8).check()  # 10 MiB fits


def test_a_tuners_ceiling_is_the_least_of_shm_room_most_in_flight_and_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_shm(monkeypatch, free_mib=4096, total_mib=8192)  # 64 MiB head-room: 4032 MiB of room
    assert ring_ceiling_slots(1 << 10) == MAX_IN_FLIGHT + EXTRA_SLOTS
    assert ring_ceiling_slots(32 << 20) == TUNED_RING_BUDGET_BYTES // (32 << 20) == 32  # 1 GiB
    _fake_shm(monkeypatch, free_mib=1024, total_mib=2048)  # 960 MiB of room
    assert ring_ceiling_slots(100 << 20) == 9
    assert ring_ceiling_slots(100 << 20, held=1) == 10  # what it holds is counted as used
    assert ring_ceiling_slots(600 << 20, held=3) == 3  # never below what it holds: it stops growth
    _fake_shm(monkeypatch, free_mib=10, total_mib=2048)  # within the head-room: no room
    assert ring_ceiling_slots(1 << 20, held=5) == 5


class Rows(Dataset[np.ndarray]):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(1000, i, np.float32)


def test_a_datasets_ring_is_the_plan_of_its_probed_layout() -> None:
    with FastLoader(Rows(), batch_size=4, num_workers=2) as loader:
        assert len(list(loader)) == 6
        pipeline = loader._runs.pipeline
        assert pipeline is not None and pipeline.ring is not None and pipeline.layout is not None
        plan = plan_ring(pipeline.layout.slot_bytes, 2, None)
        assert len(pipeline.ring) == plan.slots
        assert pipeline.ring.slot_bytes == plan.slot_bytes

