"""One loader's running machinery: executor + ring + delivery, reused across its epochs.

`Pipeline` owns the pieces that live across epochs (workers, the ring, the delivery); `submit`
gives each batch a ticket (its seq) and every finished batch's outcome is queued under its ticket
for `take_outcomes`. The epoch iterator (`epoch`) drives it; the flow is one-way: the iterator
calls the pipeline, never the reverse, and an epoch that ends early `cancel`s its tickets. Every
wait is bounded and re-checks worker liveness. What runs the tasks is `executors`' choice; a
batch's parts are cut and joined by `split_batches`; the ring is sized by `slots.ring_plan`, and
how many batches are in flight is the `in_flight` window's to say.
"""

from __future__ import annotations

import gc
import itertools
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from fastload._augment.program import TrainerStages
from fastload._bad_samples import SkipAccount, SkippedSample, stand_ins
from fastload._batch_counters import BatchCounters
from fastload._errors import LoaderTimeout
from fastload._loading.jobs.contract import Job
from fastload._loading.jobs.executor import (
    Done,
    Event,
    Executor,
    Failure,
    Opaque,
    Probed,
    RemoteExecutor,
    Task,
    raise_failure,
)
from fastload._loading.order.sampling import RepeatCopies
from fastload._loading.running.engine import Engine
from fastload._loading.running.executors import RingSlots, make_executor
from fastload._loading.running.in_flight import InFlightWindow, Resized
from fastload._loading.running.split_batches import SplitBatches, part_count
from fastload._loading.running.stats import StatsWriter
from fastload._loading.settings.spec import LoaderSpec
from fastload._loading.slots.delivery import CpuDelivery, CudaDelivery, make_delivery
from fastload._loading.slots.identity import SampleIds
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring import Ring
from fastload._loading.slots.ring_plan import (
    EXTRA_SLOTS,
    RingPlan,
    in_flight_without_ring,
    plan_ring,
    ring_ceiling_slots,
)
from fastload._loading.slots.ring_resize import add_slot, resize_ring
from fastload._machine import usable_cores
from fastload._paths import reap_engine_dirs
from fastload._shm import install_signal_cleanup, reap_orphans

_POLL_S = 0.05


# (slot, count, samples replaced in it: NOTE [bad samples]) | failure | opaque batch
Outcome = tuple[int, int, tuple[SkippedSample, ...]] | Failure | Opaque


class Steers(Protocol):
    """What turns a pipeline's handles after each `next()` (`tuning.tuner.Tuner`): no reference kept."""

    def tick(self, pipeline: Pipeline) -> None: ...


class Pipeline:
    """Workers, ring and delivery of one loader, reused across its epochs."""

    def __init__(
        self,
        job: Job | None,
        spec: LoaderSpec,
        session: RemoteExecutor | None = None,
        name_of: Callable[[int], str] | None = None,
        skips: SkipAccount | None = None,
        copies: RepeatCopies | None = None,
        source_of: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        """Run `job` on local workers (or inline), or, given a daemon `session`, on the daemon's pool;
        `name_of` names a sample and `source_of` says a Mix's child of each, for `SampleIds` (with
        `spec.sample_ids`); `skips` takes the samples on_error="skip" replaced (the loader's, kept
        across pipelines); `copies` keys the trainer's random draws of repeated samples (NOTE
        [augmentation of repeats] in `order.sampling`)."""
        self.spec = spec
        self._copies = copies
        self._name_of = name_of
        self._source_of = source_of
        self._skips = skips
        self.layout: BatchLayout | None = job.layout if job is not None else None
        self.ring: Ring | None = None
        self.delivery: CpuDelivery | CudaDelivery | None = None
        self._seqs = itertools.count()
        self._slot_of: dict[int, int] = {}  # seq -> slot, for tasks whose slot is not yet ready
        self._wanted: set[int] = set()  # tickets submitted, not yet taken nor cancelled
        self._outcomes: deque[tuple[int, Outcome]] = deque()  # (ticket, outcome), for take_outcomes
        self._probed: Probed | Failure | None = None  # the reply to the layout probe
        self._probe_seq: int | None = None  # the layout probe's task, once sent (Datasets only)
        self._collect_at = 0  # ring size at which a starved ring next runs the garbage collector
        self._split = SplitBatches()  # the parts of batches split across workers
        self._slots = RingSlots()  # how tasks run on this thread (inline) find a slot's memory
        self.workers = spec.num_workers if session is None else session.workers
        # The ring, sized from the batch's bytes once they are known (a Dataset's, once a sample is
        # probed); a daemon session's ring is the daemon's.
        self._ring_plan: RingPlan | None = None
        if self.layout is not None:
            self._ring_plan = plan_ring(self.layout.slot_bytes, self.workers, spec.prefetch)
        install_signal_cleanup()
        reap_orphans()
        reap_engine_dirs()
        if self._ring_plan is not None and session is None and not spec.decodes_in_trainer:
            # Before any worker is forked: a ring that cannot fit fails here, leaving nothing behind.
            self._ring_plan.preflight()
        self.executor: Executor = make_executor(job, spec, session, self._slots.buffer)
        # Tasks run in poll, on this thread (the DALI executor's run on threads of its own).
        self.inline = session is None and spec.num_workers == 0 and not spec.decodes_in_trainer
        # The DALI executor's batches are finished where they go: no ring.
        self.opaque = session is None and spec.decodes_in_trainer
        # Batches in flight (NOTE [what "prefetch" names]): the ring plan's, or until there is one,
        # DataLoader's two per worker; fitted to the ring once it exists (`_build_ring`).
        plan = self._ring_plan
        start = plan.in_flight if plan is not None else in_flight_without_ring(self.workers, spec.prefetch)
        self.window = InFlightWindow(start, workers=self.workers, engine=isinstance(self.executor, Engine))
        self.stats = StatsWriter(
            spec.label, "daemon" if session is not None else "local", spec.device.type,
            self.workers, spec.slot_batch_size,
        )
        self._slot_wait_since: float | None = None
        self._owns_ring = session is None  # a daemon session's ring is the daemon's to size
        self.tuner: Steers | None = None  # set by the assembly for a tuned loader (NOTE [what is tuned])
        # Closed in reverse order of creation: delivery, ring, then the executor's workers.
        # NOTE [no reference back]: nothing in this list may refer to the pipeline itself (no
        # bound methods of it), or the finalizer would keep it alive and a loader dropped without
        # close() would keep its workers and segments until the interpreter exits.
        self._resources: list[Any] = [self.executor, self.stats]
        self._finalizer = weakref.finalize(self, _close_all, self._resources, os.getpid())
        if session is not None:  # the daemon fixed the layout and made the ring, of its size
            self.layout = session.layout
            self._build_ring_or_close(session.attach_ring)

    def next_seq(self) -> int:
        return next(self._seqs)

    def ensure_layout(self, epoch: int, batch_index: int, indices: np.ndarray) -> Failure | None:
        """Learn the batch layout (probing one sample of the batch `indices` for a Dataset) and
        build ring + delivery.

        Returns the Failure when the probed sample could not be loaded: that batch fails, and the
        next batch probes again.
        """
        if self.ring is not None or self.opaque:
            return None
        if self.layout is None:
            self._probe_seq = seq = self.next_seq()
            # A map-style sample is its index; an iterable stream's is its batch's (stream, k).
            probed = indices if self.spec.iterable else indices[:1]
            self.executor.submit(
                Task(seq, epoch, batch_index, probed, "", probe=True, worker=self._worker_of(indices))
            )
            deadline = deadline_after(self.spec.timeout_s)
            while self._probed is None or self._probed.seq != seq:
                self.poll_once(deadline)
            if isinstance(self._probed, Failure):
                return self._probed
            self.layout = self._probed.layout
            if self.layout is None:
                self.opaque = True
                return None
            self.executor.set_layout(self.layout)
            self._ring_plan = plan_ring(self.layout.slot_bytes, self.workers, self.spec.prefetch)
        plan = self._ring_plan
        assert plan is not None
        self._build_ring_or_close(lambda: Ring(plan.slot_bytes, plan.slots))
        return None

    @property
    def runs_ahead(self) -> bool:
        """Whether the next epoch's first batches may be submitted ahead (NOTE [no drain] in
        `epoch`): once the ring exists, or with the DALI executor (which needs none)."""
        return self.ring is not None or self.spec.decodes_in_trainer

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def _build_ring_or_close(self, make_ring: Callable[[], Ring]) -> None:
        """Build ring and delivery; if that fails (too little /dev/shm), close the whole pipeline
        (workers, statistics block) before the error reaches the user, rather than at exit."""
        try:
            self._build_ring(make_ring())
        except BaseException:
            self.close()
            raise

    def _build_ring(self, ring: Ring) -> None:
        assert self.layout is not None
        self.ring = ring
        self._resources.append(ring)
        self.window.fit_ring(len(ring))
        self.stats.ring_sized(len(ring))
        self._slots.ring = ring
        plan, spec = self.spec.transforms, self.spec
        stages = (  # one per view (NOTE [views] in transforms), each drawing from its seed
            [
                TrainerStages(view, seed, not spec.pixels_in_workers, not spec.normalize_in_workers)
                for view, seed in plan.view_plans(spec.seed)
            ]
            if plan is not None
            else None
        )
        self.delivery = make_delivery(
            ring, self.layout, spec.images, spec.device, spec.pin_memory,
            on_copied=self.stats.copied, stages=stages,
        )
        self._resources.append(self.delivery)

    def submit(self, epoch: int, batch_index: int, indices: np.ndarray) -> int | None:
        """Queue one batch; its ticket (the seq its outcome is queued under), or None when no slot is free."""
        slot_name = ""
        seq = self.next_seq()
        if not self.opaque:
            assert self.ring is not None
            slot = self.ring.acquire()
            if slot is None:
                if self._slot_wait_since is None:
                    self._slot_wait_since = time.perf_counter()
                return None
            if self._slot_wait_since is not None:
                self.stats.add("slot_wait_ns", int((time.perf_counter() - self._slot_wait_since) * 1e9))
                self._slot_wait_since = None
            self._slot_of[seq] = slot
            slot_name = self.ring.name(slot)
        self._wanted.add(seq)
        # One task per worker (NOTE [split batches] in `split_batches`); an iterable stream's
        # batch runs whole on its stream's worker.
        parts = 1 if self.spec.iterable or self.opaque else part_count(len(indices), self.workers)
        if parts == 1:
            worker = self._worker_of(indices)
            self.executor.submit(Task(seq, epoch, batch_index, indices, slot_name, worker=worker))
            return seq
        for part, row, rows in self._split.split(seq, indices, parts, self.next_seq):
            self.executor.submit(Task(part, epoch, batch_index, rows, slot_name, row=row))
        return seq

    def _worker_of(self, indices: np.ndarray) -> int | None:
        """The worker an iterable stream's batch must run on (its stream's: NOTE [iterable
        streams]); any worker for other batches, and on this thread (inline) there is one."""
        if not self.spec.iterable or self.inline:
            return None
        return int(indices[0])

    def poll_once(self, deadline: float | None, wait_s: float = _POLL_S) -> None:
        """Wait up to `wait_s` for events and queue each batch's outcome under its ticket; LoaderTimeout
        past `deadline`."""
        if self.delivery is not None:
            self.delivery.poll()
        events = self.executor.poll(wait_s)
        for event in events:
            self._route(event)
        if not events and deadline is not None and time.monotonic() > deadline:
            raise LoaderTimeout(
                f"no batch within the loader's timeout of {self.spec.timeout_s:g} s while its "
                f"{self.workers} workers were alive: a sample may be very slow to load "
                "(a network filesystem?) — raise `timeout`, or check the dataset"
            )

    def _route(self, event: Event) -> None:
        if isinstance(event, Probed) or (isinstance(event, Failure) and event.seq == self._probe_seq):
            self._probed = event
            return
        if isinstance(event, Failure) and event.seq < 0:
            raise_failure(event)
        if isinstance(event, (Done, Failure)) and self._split.holds(event.seq):
            joined = self._split.join(event)
            if joined is None:
                return
            event = joined
        if isinstance(event, Done):
            self.stats.count_batch(event.counters)
        elif isinstance(event, Opaque):  # made whole elsewhere: its time counts as the work's
            self.stats.count_batch(BatchCounters(samples=event.count, decode_ns=event.load_ns))
        elif isinstance(event, Failure):
            self.stats.add("failures", 1)
        slot = self._slot_of.pop(event.seq, None)
        outcome: Outcome
        if isinstance(event, Done):
            assert slot is not None
            outcome = (slot, event.count, event.skipped)
        else:
            if slot is not None and self.ring is not None:
                self.ring.release(slot)
            outcome = event
        if event.seq in self._wanted:
            self._outcomes.append((event.seq, outcome))
        else:
            self.discard(outcome)  # its epoch ended early and cancelled it

    def take_outcomes(self) -> list[tuple[int, Outcome]]:
        """(ticket, outcome) of every batch finished since the last call, in completion order."""
        taken = list(self._outcomes)
        self._outcomes.clear()
        self._wanted.difference_update(seq for seq, _ in taken)
        return taken

    def cancel(self, tickets: list[int]) -> None:
        """Nobody will take these batches (their epoch ended early): their slots come back."""
        cancelled = set(tickets)
        self._wanted -= cancelled
        kept: deque[tuple[int, Outcome]] = deque()
        for seq, outcome in self._outcomes:
            if seq in cancelled:
                self.discard(outcome)
            else:
                kept.append((seq, outcome))
        self._outcomes = kept

    def discard(self, outcome: Outcome) -> None:
        """Return the slot of an outcome no epoch will deliver."""
        if isinstance(outcome, tuple) and self.ring is not None:
            self.ring.release(outcome[0])

    def deliver(self, outcome: Outcome, epoch: int, indices: np.ndarray | None, batch_index: int = 0) -> Any:
        """The user's batch from an outcome (`indices`: its samples, which key the random draws of
        the transforms that run in this process, with `batch_index` under repeats), or the batch's
        error raised."""
        if isinstance(outcome, Failure):
            raise_failure(outcome)
        skipped = outcome.skipped if isinstance(outcome, Opaque) else outcome[2]
        if skipped:  # counted as delivered (not as decoded ahead): NOTE [bad samples]
            self.stats.add("skipped", len(skipped))
            if self._skips is not None:
                self._skips.record(skipped)  # DatasetError past max_skipped
            if indices is not None:
                indices = stand_ins(indices, skipped)  # the samples the batch holds
        if isinstance(outcome, Opaque):
            batch = outcome.batch
        else:
            assert self.delivery is not None
            slot, count, _ = outcome
            keys = indices
            if keys is not None and self._copies is not None:  # NOTE [augmentation of repeats]
                keys = self._copies.keys(batch_index, 0, keys)
            batch = self.delivery.deliver(slot, count, (epoch, keys) if keys is not None else None)
        if self.spec.sample_ids and indices is not None:
            ids = SampleIds(indices, self._name_of, self._source_of)
            if isinstance(batch, dict):  # declared fields by name: beside them, under "sample_ids"
                return {**batch, "sample_ids": ids}
            return [*batch, ids]
        return batch

    def grow_if_starved(self, ready_count: int) -> bool:
        """Add a slot when every slot is held by the user (e.g. `list(loader)`), never otherwise.

        Returns True when it freed or added a slot (nothing was in flight: waiting would not help).
        """
        if self.opaque or self.ring is None or self.executor.in_flight or ready_count:
            return False
        if isinstance(self.delivery, CudaDelivery) and self.delivery.pending:
            return False  # slots come back when their copies complete
        if self.ring.free_count > 0:
            return False
        if len(self.ring) >= self._collect_at:
            # A batch in a reference cycle holds its slot until collected; but a full collection is
            # slow, so run it again only once the ring has doubled (list(loader) grows it per batch).
            gc.collect()
            self._collect_at = 2 * len(self.ring)
        if self.ring.free_count == 0:
            add_slot(self.ring, self.delivery)  # type: ignore[arg-type]
            self.stats.ring_sized(len(self.ring))
        return True

    def set_workers(self, n: int) -> int:
        """Add or retire local workers until `n` take tasks (1 .. `max_workers`); the count now.
        Batches are split for it from the next submission (any split gives the same bytes); the
        window's bound follows. Not for inline, DALI, a daemon's pool or iterable streams."""
        engine = self.executor
        if not isinstance(engine, Engine) or self.spec.iterable:
            return self.workers
        n = max(1, min(int(n), self.max_workers))
        while engine.active_workers < n:
            engine.add_worker()
        while engine.active_workers > n and engine.retire_worker() is not None:
            pass
        self.workers = engine.active_workers
        self.window.set_workers(self.workers)
        return self.workers

    @property
    def max_workers(self) -> int:
        """The most workers `set_workers` starts: twice the usable cores, or the count asked for."""
        return max(self.spec.num_workers, 2 * usable_cores())

    def set_in_flight(self, n: int) -> Resized:
        """Keep `n` batches in flight: a local ring grows to `n + EXTRA_SLOTS` slots (pre-flighted,
        a slot at a time, within `ring_ceiling_slots`) or lets go of its free slots (workers unmap
        them), then the window is resized; what was taken and why not more. A ring not made yet
        is planned for `n`; a daemon's ring is the daemon's: only the window moves within it."""
        slots, why = self.window.slots_for(n), ""
        if self.ring is not None and self.delivery is not None and self._owns_ring:
            resized = resize_ring(self.ring, self.delivery, slots)
            if isinstance(self.executor, Engine):
                for name in resized.removed:
                    self.executor.forget_slot(name)
            self.window.set_ring(resized.slots)
            why = resized.refused
        elif self.ring is None and self._ring_plan is not None:
            plan = self._ring_plan
            slots = min(slots, ring_ceiling_slots(plan.slot_bytes))
            self._ring_plan = RingPlan(plan.slot_bytes, max(1, slots - EXTRA_SLOTS))
        taken = self.window.resize(n)
        return Resized(taken.limit, taken.refused or why)

    @property
    def worker_pids(self) -> list[int]:
        return list(self.executor.worker_pids)

    def close(self) -> None:
        """Stop the workers and unlink the ring; safe to call twice; also runs at exit or GC."""
        self._finalizer()


def _close_all(resources: list[Any], owner_pid: int) -> None:
    if os.getpid() != owner_pid:
        # A forked child (another loader's worker) collecting a copy of a dropped pipeline: the
        # workers, sockets and segments are its parent's to stop and unlink, not its own.
        resources.clear()
        return
    # Workers first so none writes into a slot being unlinked, then delivery, then ring.
    executor, rest = resources[0], resources[1:]
    try:
        executor.close()
    finally:
        for resource in reversed(rest):
            resource.close()
        resources.clear()


def deadline_after(timeout_s: float) -> float | None:
    """The monotonic time `timeout_s` from now, or None (no limit) for 0."""
    return time.monotonic() + timeout_s if timeout_s > 0 else None
