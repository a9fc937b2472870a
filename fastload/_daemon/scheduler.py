"""The daemon's scheduling: every session's tasks, validated as they arrive and queued per session,
are fed to the shared pool by each session's weighted fair share (NOTE [shares by need] in
`shares`: a trainer that waits gets more, one that never waits gives way, none stalls, and a
trainer that queued its whole epoch cannot starve one that just arrived), and each finished
task's event is traced back to its session and the seq its trainer knows it by.

NOTE [tasks bounded by slots]: what a session may make the daemon hold is bounded by its ring. A
trainer sends a batch's tasks only into a slot it holds, one per part (NOTE [split batches]: at
most one part per daemon worker, together at most the batch's rows), and sends into that slot
again only once every part's event has come back. So a session has at most slots x workers tasks
queued or running, holding at most slots x batch_size sample indices; a task beyond either is
refused with an error naming the bound (the session lives on), and a raw client flooding tasks
on its own slot holds no more memory than a real trainer's full window.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from fastload._daemon.sessions import Session
from fastload._daemon.shares import PoolMeter, Served, StrideShares, policy_from_environment, reserves
from fastload._loading.jobs.executor import Done, Event, Failure, Task
from fastload._loading.link import daemon_link as wire
from fastload._loading.running.engine import Engine


class Scheduler:
    """Queues, feeds and traces back the tasks of all sessions on one `Engine`."""

    def __init__(self, engine: Engine, workers: int, policy: str | None = None) -> None:
        self._engine = engine
        self._limit = 2 * max(1, workers)  # tasks in the pool at once: two per worker
        self._parts = max(1, workers)  # the most tasks a trainer splits one batch into
        self._seqs = itertools.count()
        self._owner: dict[int, Session] = {}  # engine seq -> the session whose task it is
        self._rows: dict[int, int] = {}  # engine seq -> its sample count (NOTE [tasks bounded by slots])
        self._rr = 0
        # "need" (NOTE [shares by need]) or "round-robin" (a benchmarking aid: `shares`)
        self.policy = policy_from_environment() if policy is None else policy
        self._shares = StrideShares()
        self._meter = PoolMeter()
        self._served = Served()

    def accept(self, session: Session, fields: dict[str, Any], extra: list[bytes]) -> None:
        """Check a `task` message against its session and queue it (WireError when it is wrong)."""
        if fields["slot"] not in session.segments:
            raise wire.WireError("the task names a slot that is not this session's")
        if len(extra) != 1:
            raise wire.WireError("a task carries exactly one index frame")
        if fields["epoch"] < 0 or fields["batch_index"] < 0:
            raise wire.WireError("a task's epoch and batch_index must not be negative")
        indices = wire.decode_indices(extra[0], session.num_samples)
        row = fields["row"]
        if row < 0 or row + len(indices) > session.batch_size:
            raise wire.WireError(f"rows {row}..{row + len(indices)} exceed the batch of {session.batch_size}")
        slots = len(session.segments)
        if len(session.client_seq) >= slots * self._parts:
            raise wire.WireError(
                f"this session already has {len(session.client_seq)} tasks queued or running, the most its "
                f"{slots} slots allow ({self._parts} per slot: one per daemon worker); wait for a batch's "
                "events before sending more (NOTE [tasks bounded by slots])"
            )
        if session.rows_out + len(indices) > slots * session.batch_size:
            raise wire.WireError(
                f"this session's tasks queued or running already hold {session.rows_out} samples; "
                f"{len(indices)} more exceed its {slots} slots of {session.batch_size} "
                "(NOTE [tasks bounded by slots])"
            )
        position = (fields["epoch"], fields["batch_index"])
        session.epoch, session.batch = max((session.epoch, session.batch), position)
        seq = next(self._seqs)
        session.client_seq[seq] = fields["seq"]
        self._owner[seq] = session
        self._rows[seq] = len(indices)
        session.rows_out += len(indices)
        if not session.local:
            session.task_rows[seq] = (fields["slot"], row)
        session.pending.append(
            Task(
                seq,
                fields["epoch"],
                fields["batch_index"],
                indices.copy(),
                fields["slot"],
                job_id=session.id,
                row=row,
            )
        )

    def set_workers(self, workers: int) -> None:
        """The pool now has `workers` workers (NOTE [a pool that follows need]): two tasks each in
        it at once. How many parts a trainer may split a batch into stays what its welcome said."""
        self._limit = 2 * max(1, workers)

    def feed(self, sessions: list[Session]) -> None:
        """Submit queued tasks of `sessions` by their shares while the pool has room."""
        waiting = {s.id: s for s in sessions if s.pending}
        if not waiting or self._engine.in_flight >= self._limit:
            return
        weights = {k: s.weight for k, s in waiting.items()}
        reserved = reserves({k: s.satisfied for k, s in waiting.items()}, self._served.fractions())
        while waiting and self._engine.in_flight < self._limit:
            if self.policy == "round-robin":
                self._rr = (self._rr + 1) % len(waiting)
                session = list(waiting.values())[self._rr]
                share = 1.0
            else:
                chosen, share = self._shares.pick(weights, reserved)
                session = waiting[chosen]
            task = session.pending.popleft()
            self._engine.submit(task)
            self._shares.charge(session.id, len(task.indices), share)
            session.scheduled += len(task.indices)
            self._served.add(session.id, len(task.indices))
            if not session.pending:
                del waiting[session.id], weights[session.id]
                reserved.pop(session.id, None)

    def pool_shares(self, sessions: list[Session]) -> dict[int, float]:
        """Session id -> its fraction of the pool's work over the last interval (`status`)."""
        return self._meter.fractions({s.id: s.worker_ns for s in sessions})

    def trace(self, events: list[Event]) -> Iterator[tuple[Session, Done | Failure, int]]:
        """(session, event, the trainer's seq) for each finished task of a session still known."""
        for event in events:
            if not isinstance(event, (Done, Failure)):
                continue
            session = self._owner.pop(event.seq, None)
            rows = self._rows.pop(event.seq, 0)
            if session is None or event.seq not in session.client_seq:
                continue
            session.rows_out -= rows
            yield session, event, session.client_seq.pop(event.seq)

    def forget(self, session: Session) -> None:
        """An ended session's tasks: their events, when they come, go nowhere."""
        for seq in session.client_seq:
            self._owner.pop(seq, None)
            self._rows.pop(seq, None)
        session.client_seq.clear()
        session.pending.clear()
        self._shares.forget(session.id)
        self._served.forget(session.id)
        session.rows_out = 0
