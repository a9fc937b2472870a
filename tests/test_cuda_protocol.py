"""The CUDA delivery protocol, checked on CPU with a stand-in for torch.cuda.

What a GPU run cannot show on this machine, this shows: every slot (also slots added later) is
registered once, copies are issued inside the side stream's context, the user's stream waits on
the copy's event, a slot is released only once its event reports completion, and close()
unregisters. The real-GPU behaviour is tested in tests/gpu/.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from fastload._loading.slots.delivery import CudaDelivery, ImageOutput
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring import Ring
from fastload._shm import SHM_DIR


class FakeEvent:
    def __init__(self, log: list[str], complete_after: int, enable_timing: bool) -> None:
        self.log, self.queries, self.complete_after = log, 0, complete_after
        self.recorded_on: Any = None
        self.enable_timing = enable_timing
        self.at_ms = 0.0

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.enable_timing and end.enable_timing, "timing needs enable_timing=True events"
        return end.at_ms - self.at_ms

    def record(self, stream: Any) -> None:
        self.recorded_on = stream
        self.at_ms = 2.5 * len([e for e in self.log if e.startswith("record")])
        self.log.append(f"record:{stream.name}")

    def query(self) -> bool:
        self.queries += 1
        return self.queries > self.complete_after


class FakeStream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log
        self.waited: list[FakeEvent] = []

    def wait_event(self, event: FakeEvent) -> None:
        self.waited.append(event)
        self.log.append(f"wait:{self.name}")

    def synchronize(self) -> None:
        self.log.append(f"sync:{self.name}")


class FakeCudart:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        assert ptr not in self.registered
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        del self.registered[ptr]
        return 0


class FakeCuda:
    """The names CudaDelivery uses from torch.cuda."""

    def __init__(self, complete_after: int = 2) -> None:
        self.log: list[str] = []
        self.user = FakeStream("user", self.log)
        self.current: FakeStream = self.user
        self.rt = FakeCudart()
        self.events: list[FakeEvent] = []
        self.complete_after = complete_after

    def Stream(self, device: Any = None) -> FakeStream:
        return FakeStream("side", self.log)

    def Event(self, enable_timing: bool = False) -> FakeEvent:
        event = FakeEvent(self.log, self.complete_after, enable_timing)
        self.events.append(event)
        return event

    def current_stream(self, device: Any = None) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        previous, self.current = self.current, s
        self.log.append(f"enter:{s.name}")
        try:
            yield
        finally:
            self.current = previous
            self.log.append(f"exit:{s.name}")

    def cudart(self) -> FakeCudart:
        return self.rt


def _setup(
    complete_after: int = 2, copied: list[float] | None = None
) -> tuple[Ring, BatchLayout, FakeCuda, CudaDelivery]:
    layout = BatchLayout.infer([np.zeros((4, 4, 3), np.uint8), 0], 2)
    assert layout is not None
    ring = Ring(layout.slot_bytes, 3)
    cuda = FakeCuda(complete_after)
    on_copied = copied.append if copied is not None else None
    delivery = CudaDelivery(ring, layout, ImageOutput(), torch.device("cpu"), cuda=cuda, on_copied=on_copied)
    return ring, layout, cuda, delivery


def test_every_slot_registered_once_and_unregistered_on_close() -> None:
    ring, _, cuda, delivery = _setup()
    try:
        assert len(cuda.rt.registered) == 3
        delivery.on_new_slot(ring.segments[ring.grow()])
        assert len(cuda.rt.registered) == 4
        assert sorted(cuda.rt.registered.values()) == [ring.slot_bytes] * 4
        delivery.close()
        assert cuda.rt.registered == {}
        assert "sync:side" in cuda.log
    finally:
        ring.close()


def test_a_slot_the_ring_lets_go_of_is_unregistered_first() -> None:
    ring, _, cuda, delivery = _setup()
    try:
        held = ring.acquire()  # a slot in use is never let go of
        removed: list[str] = []

        def unlinking(segment: Any) -> None:
            assert os.path.exists(os.path.join(SHM_DIR, segment.name))  # told before it is unlinked
            delivery.on_slot_removed(segment)
            removed.append(segment.name)

        assert ring.shrink(5, unlinking) == 2
        assert len(removed) == 2 and list(ring.segments) == [held]
        assert len(cuda.rt.registered) == 1
        delivery.close()
        assert cuda.rt.registered == {}
    finally:
        ring.close()


def test_copy_on_side_stream_user_waits_and_slot_released_after_event() -> None:
    copy_seconds: list[float] = []
    ring, layout, cuda, delivery = _setup(complete_after=2, copied=copy_seconds)
    try:
        slot = ring.acquire()
        assert slot is not None
        images, labels = layout.arrays(ring.segments[slot].buf)
        images[:] = 7
        labels[:] = [3, 4]
        x, y = delivery.deliver(slot, 2)
        assert cuda.log == ["enter:side", "record:side", "record:side", "exit:side", "wait:user"]
        started, event = cuda.events
        assert started.recorded_on.name == "side" and started.enable_timing
        assert event.recorded_on.name == "side" and cuda.user.waited == [event]
        assert x.shape == (2, 3, 4, 4) and int(x.sum()) == 7 * x.numel()
        assert y.tolist() == [3, 4]
        free_before = ring.free_count
        delivery.poll()  # event not complete yet: slot stays taken
        assert ring.free_count == free_before and delivery.pending == 1
        delivery.poll()
        assert ring.free_count == free_before
        assert copy_seconds == []
        delivery.poll()  # third query reports completion
        assert ring.free_count == free_before + 1 and delivery.pending == 0
        assert copy_seconds == [0.0025]  # the copy's event-timed duration, in seconds
    finally:
        delivery.close()
        ring.close()


def test_slots_released_in_copy_order() -> None:
    ring, _, _cuda, delivery = _setup(complete_after=0)
    try:
        taken = [ring.acquire(), ring.acquire()]
        for slot in taken:
            assert slot is not None
            delivery.deliver(slot, 1)
        assert delivery.pending == 2
        delivery.poll()
        assert delivery.pending == 0
        assert sorted([ring.acquire(), ring.acquire(), ring.acquire()]) == [0, 1, 2]  # type: ignore[type-var]
    finally:
        delivery.close()
        ring.close()
