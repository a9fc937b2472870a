"""The batch ring: fixed-size slots of shared memory, and who may write into which.

Each slot is its own segment, so the ring can grow by one slot when the user holds every batch
delivered so far (`list(loader)`), without moving the slots already handed out. A slot is
free, in flight (a worker is writing it), ready, or held (the user can see it); it returns to
free only through `release`, which the delivery side calls when nothing can see the slot any
more. `release` may be called from any thread (a garbage-collection finalizer), so it only
appends to a deque the ring drains on the engine's thread. A tuner grows it a slot at a time
(`grow`) and shrinks it by free slots only (`shrink`); a slot's id is never reused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from fastload._loading.slots.ring_plan import check_ring_room
from fastload._shm import Segment, ensure_fd_room, preflight


def _create_slot(slot_bytes: int) -> Segment:
    preflight(slot_bytes)
    return Segment.create(slot_bytes)


class Ring:
    """Slots of `slot_bytes` each, made up front (after the ring plan's /dev/shm capacity and
    file-descriptor checks: before Python 3.13 every mapped slot holds one fd, see fastload._shm)
    by `allocate`; `ring_plan` says how many.

    In local mode the trainer creates its slots; attached to a daemon, `allocate` asks the daemon
    for one more slot of the session's ring and attaches it.
    """

    def __init__(
        self,
        slot_bytes: int,
        num_slots: int,
        allocate: Callable[[int], Segment] = _create_slot,
        initial: list[Segment] | None = None,
    ) -> None:
        if initial is None:
            check_ring_room(slot_bytes, num_slots)
        self.slot_bytes = slot_bytes
        self.segments: dict[int, Segment] = {}
        self._by_name: dict[str, Segment] = {}
        self._free: deque[int] = deque()
        self._released: deque[int] = deque()
        self._allocate = allocate
        self._next_id = 0  # slot ids are never reused: a shrunk ring's ids have gaps
        try:
            for segment in (
                initial if initial is not None else (Segment.create(slot_bytes) for _ in range(num_slots))
            ):
                self._add(segment)
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.segments)

    def grow(self) -> int:
        """Add one free slot and return its id."""
        ensure_fd_room(1)
        return self._add(self._allocate(self.slot_bytes))

    def _add(self, segment: Segment) -> int:
        slot, self._next_id = self._next_id, self._next_id + 1
        self.segments[slot] = segment
        self._by_name[segment.name] = segment
        self._free.append(slot)
        return slot

    def shrink(self, count: int, on_removed: Callable[[Segment], None] | None = None) -> int:
        """Unlink up to `count` free slots (never one in flight, ready or held by the user), the
        newest first; `on_removed(segment)` hears each before it is unlinked (the delivery's
        `on_slot_removed`). Returns how many went."""
        self._drain()
        removed = 0
        for slot in sorted(self._free, reverse=True)[: max(0, count)]:
            self._free.remove(slot)
            segment = self.segments.pop(slot)
            del self._by_name[segment.name]
            if on_removed is not None:
                on_removed(segment)
            segment.close()
            removed += 1
        return removed

    def name(self, slot: int) -> str:
        return self.segments[slot].name

    def buffer(self, name: str) -> memoryview:
        return memoryview(self._by_name[name].buf)

    def acquire(self) -> int | None:
        """Take a free slot, or None when every slot is in flight, ready or held."""
        self._drain()
        return self._free.popleft() if self._free else None

    def release(self, slot: int) -> None:
        """Mark a slot free again; thread-safe (deque.append is atomic)."""
        self._released.append(slot)

    def _drain(self) -> None:
        while self._released:
            self._free.append(self._released.popleft())

    @property
    def free_count(self) -> int:
        self._drain()
        return len(self._free)

    def close(self) -> None:
        """Unlink every slot; mappings still seen by live tensors stay valid until they die."""
        for segment in self.segments.values():
            segment.close()
        self.segments.clear()
        self._by_name.clear()
        self._free.clear()
