"""One loader's running machinery: executor + ring + delivery, reused across its epochs.

`Pipeline` owns the pieces that live across epochs (workers, the ring, the delivery); `submit`
gives each batch a ticket (its seq) and every finished batch's outcome is queued under its ticket
for `take_outcomes`. The epoch iterator (`epoch`) drives it; the flow is one-way: the iterator
calls the pipeline, never the reverse, and an epoch that ends early `cancel`s its tickets. Every
wait is bounded and re-checks worker liveness.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import os
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._augment.program import TrainerStages
from fastload._bad_samples import SkipAccount, SkippedSample, stand_ins
from fastload._batch_counters import BatchCounters
from fastload._errors import LoaderTimeout
from fastload._loading.delivery import CpuDelivery, CudaDelivery, make_delivery
from fastload._loading.engine import Engine, raise_failure
from fastload._loading.executor import Done, Event, Executor, Failure, Opaque, Probed, RemoteExecutor, Task
from fastload._loading.identity import SampleIds
from fastload._loading.inline import InlineExecutor
from fastload._loading.jobs import Job
from fastload._loading.layout import BatchLayout
from fastload._loading.ring import EXTRA_SLOTS, Ring
from fastload._loading.spec import LoaderSpec
from fastload._loading.stats import StatsWriter
from fastload._paths import reap_engine_dirs
from fastload._shm import install_signal_cleanup, preflight, reap_orphans

_POLL_S = 0.05
# A cold batch is split so that each part keeps at least this many rows.
_MIN_SPLIT_ROWS = 4


@dataclass
class _Parts:
    """The joined outcome of a batch split across workers (see NOTE [split batches])."""

    left: int
    counters: BatchCounters = dataclasses.field(default_factory=BatchCounters)
    skipped: tuple[SkippedSample, ...] = ()
    failure: Failure | None = None


class _RingSlots:
    """A slot's memory by name, once the ring exists (for the inline executor). It holds the
    ring, never the pipeline: see NOTE [no reference back]."""

    ring: Ring | None = None

    def buffer(self, name: str) -> Any:
        if self.ring is None:
            raise RuntimeError(f"slot {name} was named before the ring was made")
        return self.ring.buffer(name)


# (slot, count, samples replaced in it: NOTE [bad samples]) | failure | opaque batch
Outcome = tuple[int, int, tuple[SkippedSample, ...]] | Failure | Opaque


class Pipeline:
    """Workers, ring and delivery of one loader, reused across its epochs."""

    def __init__(
        self,
        job: Job | None,
        spec: LoaderSpec,
        session: RemoteExecutor | None = None,
        name_of: Callable[[int], str] | None = None,
        skips: SkipAccount | None = None,
    ) -> None:
        """Run `job` on local workers (or inline), or, given a daemon `session`, on the daemon's pool;
        `name_of` names a sample for `SampleIds` (with `spec.sample_ids`); `skips` takes the samples
        on_error="skip" replaced (the loader's, kept across pipelines)."""
        self.spec = spec
        self._name_of = name_of
        self._skips = skips
        self.layout: BatchLayout | None = job.layout if job is not None else None
        self.opaque = False
        self.ring: Ring | None = None
        self.delivery: CpuDelivery | CudaDelivery | None = None
        self._seqs = itertools.count()
        self._slot_of: dict[int, int] = {}  # seq -> slot, for tasks whose slot is not yet ready
        self._wanted: set[int] = set()  # tickets submitted, not yet taken nor cancelled
        self._outcomes: deque[tuple[int, Outcome]] = deque()  # (ticket, outcome), for take_outcomes
        self._probed: Probed | Failure | None = None  # the reply to the layout probe
        self._probe_seq: int | None = None  # the layout probe's task, once sent (Datasets only)
        self._collect_at = 0  # ring size at which a starved ring next runs the garbage collector
        self._part_of: dict[int, int] = {}  # seq of a part of a split batch -> the batch's seq
        self._split: dict[int, _Parts] = {}  # batch seq -> its parts' joined outcome so far
        self._slots = _RingSlots()  # how tasks run on this thread (inline) find a slot's memory
        self.workers = spec.num_workers if session is None else session.workers
        # Batches in flight: as the user said, else sized from the batch's bytes once they are known
        # (`spec.ring_prefetch`); until a Dataset's sample is probed, DataLoader's two per worker.
        self.prefetch = spec.prefetch or 2 * max(1, self.workers)
        if self.layout is not None:
            self.prefetch = spec.ring_prefetch(self.workers, self.layout.slot_bytes)
        install_signal_cleanup()
        reap_orphans()
        reap_engine_dirs()
        if self.layout is not None and session is None and not spec.decodes_in_trainer:
            # Before any worker is forked: a ring that cannot fit fails here, leaving nothing behind.
            preflight(self.layout.slot_bytes * (self.prefetch + EXTRA_SLOTS))
        self.executor: Executor
        # Tasks run in poll, on this thread (the DALI executor's run on threads of its own).
        self.inline = session is None and spec.num_workers == 0 and not spec.decodes_in_trainer
        if session is not None:
            self.executor = session
        elif job is None:
            raise ValueError("a pipeline needs a job or a daemon session")
        elif spec.decodes_in_trainer:
            self.executor = _dali_executor(job, spec)
            self.opaque = True  # its batches are finished where they go: no ring
        elif spec.num_workers > 0:
            self.executor = Engine(
                {0: job},
                num_workers=spec.num_workers,
                mp_context=spec.mp_context,
                worker_init_fn=spec.worker_init_fn,
                hang_timeout_s=spec.hang_timeout_s,
            )
        else:
            self.executor = InlineExecutor(job, self._slots.buffer)
        self.stats = StatsWriter(
            spec.label, "daemon" if session is not None else "local", spec.device.type,
            self.workers, spec.slot_batch_size,
        )
        self._slot_wait_since: float | None = None
        # Closed in reverse order of creation: delivery, ring, then the executor's workers.
        # NOTE [no reference back]: nothing in this list may refer to the pipeline itself (no
        # bound methods of it), or the finalizer would keep it alive and a loader dropped without
        # close() would keep its workers and segments until the interpreter exits.
        self._resources: list[Any] = [self.executor, self.stats]
        self._finalizer = weakref.finalize(self, _close_all, self._resources, os.getpid())
        if session is not None:  # the daemon fixed the layout and made the ring, of its size
            self.layout = session.layout
            self._build_ring_or_close(session.attach_ring)
            assert self.ring is not None
            self.prefetch = len(self.ring) - EXTRA_SLOTS

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
            self.prefetch = self.spec.ring_prefetch(self.workers, self.layout.slot_bytes)
        layout = self.layout
        self._build_ring_or_close(lambda: Ring(layout.slot_bytes, self.prefetch + EXTRA_SLOTS))
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
        self._slots.ring = ring
        plan, spec = self.spec.transforms, self.spec
        stages = (
            TrainerStages(plan, spec.seed, not spec.pixels_in_workers, not spec.normalize_in_workers)
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
        parts = 1 if self.spec.iterable else self._split_count(len(indices))
        if parts == 1:
            worker = self._worker_of(indices)
            self.executor.submit(Task(seq, epoch, batch_index, indices, slot_name, worker=worker))
            return seq
        # NOTE [split batches]: one worker decoding a whole batch makes a batch take batch-time
        # (256 x 2 ms = 0.5 s) to exist, and batches complete in bursts, out of plan order; so
        # every batch is split into row ranges of its slot, one per worker, and is ready in
        # about batch-time / workers, in plan order (the first batch of an epoch too). Per-sample
        # seeds make the result identical to one task's; parts report into the same slot.
        n = len(indices)
        self._split[seq] = _Parts(left=parts)
        for row, end in itertools.pairwise([n * k // parts for k in range(parts + 1)]):
            part = self.next_seq()
            self._part_of[part] = seq
            self.executor.submit(Task(part, epoch, batch_index, indices[row:end], slot_name, row=row))
        return seq

    def _worker_of(self, indices: np.ndarray) -> int | None:
        """The worker an iterable stream's batch must run on (its stream's: NOTE [iterable
        streams]); any worker for other batches, and on this thread (inline) there is one."""
        if not self.spec.iterable or self.inline:
            return None
        return int(indices[0])

    def _split_count(self, n: int) -> int:
        """How many tasks to make of a batch of `n`: one per worker (see NOTE [split batches])."""
        if self.opaque:
            return 1
        return max(1, min(self.workers, n // _MIN_SPLIT_ROWS))

    def _join_part(self, event: Done | Failure) -> Done | Failure | None:
        """Fold one part's outcome into its batch's; the batch's outcome once every part is in."""
        seq = self._part_of.pop(event.seq)
        parts = self._split[seq]
        parts.left -= 1
        if isinstance(event, Done):
            parts.counters += event.counters
            parts.skipped += event.skipped
        elif parts.failure is None:
            parts.failure = dataclasses.replace(event, seq=seq)
        if parts.left:
            return None  # the slot stays taken until every part has stopped writing into it
        del self._split[seq]
        if parts.failure is not None:
            return parts.failure
        return Done(seq, parts.counters, skipped=parts.skipped)

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
        if isinstance(event, (Done, Failure)) and event.seq in self._part_of:
            joined = self._join_part(event)
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

    def deliver(self, outcome: Outcome, epoch: int, indices: np.ndarray | None) -> Any:
        """The user's batch from an outcome (`indices`: its samples, which key the random draws of
        the transforms that run in this process), or the batch's error raised."""
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
            batch = self.delivery.deliver(slot, count, (epoch, indices) if indices is not None else None)
        if self.spec.sample_ids and indices is not None:
            return [*batch, SampleIds(indices, self._name_of)]
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
            self.delivery.on_new_slot(self.ring.segments[self.ring.grow()])  # type: ignore[union-attr]
        return True

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


def _dali_executor(job: Job, spec: LoaderSpec) -> Executor:
    """The in-process GPU-decoding executor for a source's image job (`spec.decodes_in_trainer`)."""
    from fastload._loading.dali_executor import DaliExecutor
    from fastload._loading.jobs import ImageJob
    from fastload._loading.nvjpeg_decoder import NVJPEG_READ_THREADS
    from fastload._native_jpeg import built_native_jpeg

    if not isinstance(job, ImageJob) or spec.transforms is None or spec.images is None:
        raise ValueError("the DALI executor runs sources of encoded images only")
    threads = max(1, spec.num_workers)
    if spec.backend == "nvjpeg":
        threads = min(threads, NVJPEG_READ_THREADS)
    return DaliExecutor(
        job.index, spec.transforms, spec.seed, spec.slot_batch_size, spec.images, spec.device,
        threads=threads, pin_memory=spec.pin_memory, jpeg=built_native_jpeg(), decoder=spec.backend,
    )


def deadline_after(timeout_s: float) -> float | None:
    """The monotonic time `timeout_s` from now, or None (no limit) for 0."""
    return time.monotonic() + timeout_s if timeout_s > 0 else None
