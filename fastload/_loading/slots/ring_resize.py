"""Resizing a live ring: the one path by which a ring changes size after it is made (the slot
`grow_if_starved` adds, a tuner's `set_in_flight`), its delivery told of every slot that comes
(`on_new_slot`: a CUDA delivery pins it) or goes (`on_slot_removed`: it is unpinned first).

A ring grows a pre-flighted slot at a time (`Ring.grow`: /dev/shm room and file descriptors),
never past `ring_ceiling_slots`; it shrinks by free slots only (`Ring.shrink`), so a slot in
flight, ready or held by the user is never unlinked: those go when asked again once free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fastload._errors import SharedMemoryError
from fastload._loading.slots.ring import Ring
from fastload._loading.slots.ring_plan import ring_ceiling_slots
from fastload._shm import Segment


class SlotWatcher(Protocol):
    """What a delivery hears of the slots a live ring gains and loses."""

    def on_new_slot(self, segment: Segment) -> None: ...

    def on_slot_removed(self, segment: Segment) -> None: ...


@dataclass(frozen=True)
class RingResized:
    """What `resize_ring` did: the slots the ring has now, the names of the segments it unlinked
    (for workers to unmap), and why it has not the slots asked for ("" when it has)."""

    slots: int
    removed: tuple[str, ...] = ()
    refused: str = ""


def add_slot(ring: Ring, delivery: SlotWatcher) -> int:
    """Grow the ring by one slot (pre-flighted: SharedMemoryError when /dev/shm or file
    descriptors lack room), the delivery told; its id."""
    slot = ring.grow()
    delivery.on_new_slot(ring.segments[slot])
    return slot


def resize_ring(ring: Ring, delivery: SlotWatcher, wanted: int) -> RingResized:
    """Grow `ring` towards `wanted` slots (up to `ring_ceiling_slots`, while /dev/shm has room)
    or shrink it by its free slots; what it has now, and why not `wanted`."""
    held = len(ring)
    if wanted > held:
        ceiling = ring_ceiling_slots(ring.slot_bytes, held)
        target, refused = min(wanted, ceiling), ""
        if target < wanted:
            refused = (
                f"{wanted} ring slots of {ring.slot_bytes} bytes are past the ceiling of {ceiling} "
                "(what /dev/shm has room for, the most batches in flight, twice the default budget)"
            )
        while len(ring) < target:
            try:
                add_slot(ring, delivery)
            except SharedMemoryError as e:
                refused = f"the ring stopped at {len(ring)} slots: {e}"
                break
        return RingResized(len(ring), (), refused)
    removed: list[str] = []

    def unlinked(segment: Segment) -> None:
        delivery.on_slot_removed(segment)
        removed.append(segment.name)

    ring.shrink(held - wanted, unlinked)
    busy = len(ring) - wanted
    refused = (
        f"{busy} of the slots to let go are in flight, ready or held by the user: ask again once "
        "they are free"
        if busy > 0
        else ""
    )
    return RingResized(len(ring), tuple(removed), refused)
