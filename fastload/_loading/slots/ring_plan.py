"""The ring plan: how many slots of how many bytes a ring gets, and whether /dev/shm can hold it.

Sized once, by `plan_ring`, wherever a ring is about to be made: the local loader before it
forks workers, the pipeline once a batch's layout is known, and the daemon for each session.

NOTE [what "prefetch" names]: four numbers were once all called prefetch; each has its own name
now, and is derived in one place:
- `prefetch_factor` (DataLoader's argument): batches in flight *per worker*, as asked;
  `build_spec` folds it into `prefetch` (factor x workers), and nothing else reads it.
- `prefetch` (fastload's argument, `LoaderSpec.prefetch`, the daemon hello's field): batches in
  flight, as asked; None (0 in a hello) when the user left it to fastload.
- batches in flight (`RingPlan.in_flight`, then `InFlightWindow.limit` in `running.in_flight`,
  its one owner): derived here only: `plan_ring` (`prefetch`, else `default_in_flight` from the
  workers and the slot's bytes), or before a ring is planned (a Dataset's sample not probed yet,
  batches pickled rather than written into slots) `in_flight_without_ring`.
- `MAX_TASKS_PER_WORKER` (`running.dispatch`): tasks one worker holds, the rest waiting in the
  engine; it is `MAX_IN_FLIGHT` (why: there).
- `AHEAD_BATCHES` (`order.read_ahead`): how many batches past the last one delivered a remote
  source's chunks are fetched into the node cache; it holds no slot, so no window bounds it
  (why 32: there).
A ring holds the batches in flight plus `EXTRA_SLOTS`; the window never exceeds what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastload._shm import ensure_fd_room, preflight, shm_room

# Ring slots beyond the batches in flight: the batch the user holds while asking for the next,
# and one spare.
EXTRA_SLOTS = 2
# The most batches one loader keeps in flight, and the most a daemon session may ask for: past
# "every worker busy" more slots buy nothing but shared memory.
MAX_IN_FLIGHT = 64
# DataLoader's default prefetch_factor: batches in flight per worker when nothing else decides.
PER_WORKER_DEFAULT = 2
# What a loader's ring may take by default. More only buys batches in flight beyond "every
# worker busy".
DEFAULT_RING_BUDGET_BYTES = 512 << 20


def default_in_flight(workers: int, slot_bytes: int, budget_bytes: int = DEFAULT_RING_BUDGET_BYTES) -> int:
    """Batches in flight when the user does not say: two per worker (DataLoader's
    prefetch_factor=2) as far as `budget_bytes` of ring allow, but never so few that a worker
    waits for a slot (workers + 1), and never more than MAX_IN_FLIGHT.

    E.g. 16 workers, batches of 256 images of 224x224 (37 MiB): 11 fit in 512 MiB, 17 keep every
    worker busy, so 17 (19 slots, 700 MiB), where two per worker would take 34 slots (1.25 GiB).
    """
    workers = max(1, workers)
    affordable = budget_bytes // max(1, slot_bytes) - EXTRA_SLOTS
    return int(min(MAX_IN_FLIGHT, max(workers + 1, min(PER_WORKER_DEFAULT * workers, affordable))))


# The most ring a tuner may grow one loader's ring to (`ring_ceiling_slots`): twice the default
# budget. The default plan keeps every worker busy within the budget; a tuner grows the window
# past that only to absorb bursty batch times, and doubling is room for that (a window twice the
# default's) without one loader taking the /dev/shm its trainer's other loaders and processes use.
TUNED_RING_BUDGET_BYTES = 2 * DEFAULT_RING_BUDGET_BYTES


def ring_ceiling_slots(slot_bytes: int, held: int = 0) -> int:
    """The most slots a tuner may grow a ring of `slot_bytes` slots to, when it `held` slots
    already (which /dev/shm counts as used): what the pre-flight allows now (`shm_room`), never
    more than MAX_IN_FLIGHT + EXTRA_SLOTS nor `TUNED_RING_BUDGET_BYTES`, and never fewer than it
    holds (a ceiling only stops growth)."""
    slot_bytes = max(1, slot_bytes)
    room = held + shm_room() // slot_bytes
    budget = TUNED_RING_BUDGET_BYTES // slot_bytes
    return max(held, min(MAX_IN_FLIGHT + EXTRA_SLOTS, budget, room))


def in_flight_without_ring(workers: int, asked: int | None) -> int:
    """Batches in flight before (or without) a ring plan: `asked` (the user's `prefetch`), else
    DataLoader's two per worker."""
    return asked or PER_WORKER_DEFAULT * max(1, workers)


def check_ring_room(slot_bytes: int, slots: int) -> None:
    """The pre-flight of a ring about to be made: SharedMemoryError, saying how big /dev/shm must
    be (or how many file descriptors are missing) and what to lower, if `slots` slots of
    `slot_bytes` cannot be made; the soft RLIMIT_NOFILE is raised where that makes room."""
    preflight(slot_bytes * slots)
    ensure_fd_room(slots)


@dataclass(frozen=True)
class RingPlan:
    """A ring's size before it is made: room for `in_flight` batches of `slot_bytes`, plus
    `EXTRA_SLOTS`."""

    slot_bytes: int
    in_flight: int

    @property
    def slots(self) -> int:
        return self.in_flight + EXTRA_SLOTS

    @property
    def total_bytes(self) -> int:
        return self.slot_bytes * self.slots

    def preflight(self) -> None:
        """SharedMemoryError (how big /dev/shm must be, what to lower) if /dev/shm cannot hold the
        ring: called before any worker is forked, so a ring that cannot fit leaves nothing behind."""
        preflight(self.total_bytes)

    def check(self) -> None:
        """The whole pre-flight of a ring made now: /dev/shm room and file descriptors
        (`check_ring_room`)."""
        check_ring_room(self.slot_bytes, self.slots)


def plan_ring(slot_bytes: int, workers: int, asked: int | None) -> RingPlan:
    """The ring for batches of `slot_bytes` fed by `workers` workers: `asked` batches in flight
    (the user's `prefetch`), or when not asked (None or 0) `default_in_flight`."""
    return RingPlan(slot_bytes, asked or default_in_flight(workers, slot_bytes))
