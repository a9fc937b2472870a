"""The engine: run batch tasks on a supervised pool of worker processes.

`Engine.submit` queues a task; `Engine.poll` dispatches queued tasks to the least-busy live
worker over a ROUTER socket, collects replies as events, and supervises: a worker that died
(killed, segfault, OOM) or that cannot be reached is replaced and every task it held is run
again, so no batch is lost or duplicated; a worker whose task runs past the hang bound is killed
and replaced the same way. Who is blamed for a death, and when a task is failed instead of
retried, is `running.supervision`'s policy (NOTE [blame]): never a task for kills from outside;
which worker runs which task is `running.dispatch`'s.
`inline.InlineExecutor` has the same interface and runs tasks in the caller's process
(num_workers=0).

NOTE [one socket, addressed workers]: tasks are sent to a chosen worker (ROUTER identity) rather
than load-balanced by ZeroMQ, because supervision must know which tasks died with which worker.
The socket lives in a fresh 0700 directory (`engine_socket_dir`), so other users cannot connect.
A send to a worker whose connection is gone (ROUTER_MANDATORY: EHOSTUNREACH) or whose queue is
full (EAGAIN: it stopped reading) never raises: that worker is killed and treated as dead.

NOTE [retiring workers]: the pool grows and shrinks while it runs (a tuner's handles).
`add_worker` spawns one more (the lowest free id; it is told every job and layout when READY,
as a replacement is). `retire_worker` marks the highest id retiring: dispatch gives it nothing
new, it finishes what it holds, and once it holds nothing it is sent STOP; a later
`supervise`/`poll` reaps it (never a join that waits). A retiring worker that dies holding
tasks has them run again at the front of the queue, in order, like any death, but is not
replaced; one that ends holding nothing (exit 0 after STOP) is retired, not counted as a death.
Tasks that name their worker (an iterable stream's) would wait for a retired one forever: a pool
running streams is never shrunk (`Pipeline.set_workers` refuses).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import multiprocessing as mp
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any, cast

import zmq

from fastload._errors import WorkerError
from fastload._loading.jobs.contract import Job
from fastload._loading.jobs.executor import Event, Task
from fastload._loading.running import worker_link as proto
from fastload._loading.running.dispatch import PoolWorker, dispatch
from fastload._loading.running.supervision import (
    MAX_STRIKES,
    Cause,
    HangBound,
    charge,
    classify,
    describe_exit,
    oom_kill_count,
)
from fastload._loading.running.worker import WorkerSpec, worker_main
from fastload._loading.slots.layout import BatchLayout
from fastload._paths import engine_socket_dir

log = logging.getLogger("fastload")

_LIVENESS_INTERVAL_S = 0.1
_OOM_BASELINE_EVERY_S = 1.0
_JOIN_TIMEOUT_S = 5.0
class Engine:
    """A supervised pool of worker processes running batch tasks."""

    def __init__(
        self,
        jobs: dict[int, Job],
        *,
        num_workers: int,
        mp_context: str | BaseContext | None,
        worker_init_fn: Callable[[int], Any] | None,
        hang_timeout_s: float | None = None,
        max_message_bytes: int = -1,
        close_inherited_sockets: bool = False,
    ) -> None:
        """`hang_timeout_s`: the floor of the hang bound (None: the default; 0: off).
        `max_message_bytes`: the largest message a worker may send (-1: any; a daemon, whose
        workers never send pickled batches, bounds it). `close_inherited_sockets`: forked
        workers close the sockets they inherit (a daemon's listeners) before anything else."""
        self._jobs = jobs  # forked into every worker; a daemon adds JSON jobs with add_job
        self._num_workers = num_workers
        self._worker_init_fn = worker_init_fn
        self._close_inherited_sockets = close_inherited_sockets
        self._mp: Any = (
            mp_context if isinstance(mp_context, BaseContext) else mp.get_context(mp_context or "fork")
        )
        self._dir = engine_socket_dir()
        self._address = f"ipc://{self._dir}/engine.sock"
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self._sock.bind(self._address)
        self._workers: dict[bytes, PoolWorker] = {}
        self._queue: deque[Task] = deque()
        self._startup_deaths = 0  # workers that crashed before READY, in a row: 3 means it cannot start
        # Failures found by supervision (a task that kept killing workers), returned by drain().
        self._supervision_events: list[Event] = []
        # What every worker must be told, per job, before its tasks: JOB and LAYOUT messages.
        self._announcements: dict[int, list[list[bytes]]] = {}
        self._generation = itertools.count()
        self._hang = HangBound(hang_timeout_s)
        self._oom_kills = oom_kill_count()
        self._oom_checked = time.monotonic()
        self._last_liveness = 0.0
        self.deaths: dict[Cause, int] = dict.fromkeys(Cause, 0)  # for reports and tests
        self._closed = False
        for worker_id in range(num_workers):
            self._spawn(worker_id)

    @property
    def worker_pids(self) -> list[int]:
        """Every worker process the engine holds now, retiring ones included until reaped."""
        return [w.process.pid for w in self._workers.values() if w.process.pid is not None]

    @property
    def active_workers(self) -> int:
        """The workers that take tasks: all but the retiring ones (NOTE [retiring workers])."""
        return sum(1 for w in self._workers.values() if not w.retiring)

    def add_worker(self) -> int:
        """Spawn one more worker (the lowest id not in use) and return its id; it takes tasks
        once READY, after every job and layout announced so far (NOTE [retiring workers])."""
        used = {w.worker_id for w in self._workers.values()}
        worker_id = next(i for i in itertools.count() if i not in used)
        self._num_workers = self.active_workers + 1
        self._spawn(worker_id)
        return worker_id

    def retire_worker(self) -> int | None:
        """Retire the active worker of the highest id and return its id (None when one active
        worker is left): it takes no new task, finishes what it holds, then is stopped and reaped
        without blocking (NOTE [retiring workers])."""
        active = [w for w in self._workers.values() if not w.retiring]
        if len(active) <= 1:
            return None
        worker = max(active, key=lambda w: w.worker_id)
        worker.retiring = True
        self._num_workers = len(active) - 1
        log.debug("worker %d (pid %s) retiring", worker.worker_id, worker.process.pid)
        self._stop_if_idle(worker)
        return worker.worker_id

    def _stop_if_idle(self, worker: PoolWorker) -> None:
        """Send STOP to a retiring worker that holds nothing (killed if it cannot be reached: it
        holds nothing to lose)."""
        if not worker.retiring or worker.stopped or worker.tasks or worker.lost:
            return
        worker.stopped = True
        try:
            self._sock.send_multipart([worker.identity, proto.STOP], flags=zmq.NOBLOCK)
        except zmq.ZMQError:  # not connected (yet, or any more)
            with contextlib.suppress(OSError, ValueError, AttributeError):
                worker.process.kill()

    def _spawn(self, worker_id: int) -> None:
        identity = f"w{worker_id}.{next(self._generation)}".encode()
        spec = WorkerSpec(
            address=self._address,
            identity=identity,
            parent_pid=os.getpid(),
            worker_id=worker_id,
            jobs=self._jobs,
            worker_init_fn=self._worker_init_fn,
            num_workers=self._num_workers,
            close_inherited_sockets=self._close_inherited_sockets,
        )
        process = self._mp.Process(
            target=worker_main, args=(spec,), name=f"fastload-worker-{worker_id}", daemon=True
        )
        process.start()
        self._workers[identity] = PoolWorker(worker_id, identity, process)

    @property
    def socket(self) -> zmq.Socket:  # type: ignore[type-arg]
        """The workers' socket, for a caller that waits on several sockets (the daemon)."""
        return self._sock

    def _announce(self, job_id: int, frames: list[bytes]) -> None:
        self._announcements.setdefault(job_id, []).append(frames)
        for worker in list(self._workers.values()):
            if worker.ready and not worker.lost and not worker.stopped:  # a stopped one hears no more
                self._send(worker, frames)

    def set_layout(self, layout: BatchLayout, job_id: int = 0) -> None:
        """Tell every worker (and every future one) the layout of a job's slot batches."""
        self._announce(job_id, [proto.LAYOUT, proto.JOB_HEAD.pack(job_id), layout.to_json().encode()])

    def add_job(self, job_id: int, config: dict[str, Any]) -> None:
        """Give every worker (and every future one) a job built from JSON (`ImageJob.to_config`)."""
        self._announce(job_id, [proto.JOB, proto.JOB_HEAD.pack(job_id), json.dumps(config).encode()])

    def drop_job(self, job_id: int) -> None:
        """Make every worker forget a job; its queued tasks are dropped too."""
        self._announcements.pop(job_id, None)
        self._queue = deque(t for t in self._queue if t.job_id != job_id)
        for worker in list(self._workers.values()):
            if worker.ready and not worker.lost and not worker.stopped:  # a stopped one hears no more
                self._send(worker, [proto.DROP, proto.JOB_HEAD.pack(job_id)])

    def forget_slot(self, name: str) -> None:
        """Tell every worker to unmap a ring slot that was unlinked (a shrunk ring), so that its
        memory comes back; a worker started later never maps it."""
        for worker in list(self._workers.values()):
            if worker.ready and not worker.lost and not worker.stopped:
                self._send(worker, [proto.FORGET, name.encode()])

    def submit(self, task: Task) -> None:
        """Queue a task and send it to a worker now: the trainer may not poll again for a while
        (it finds the next batch ready), and workers must not idle meanwhile."""
        self._queue.append(task)
        self._queue = dispatch(self._queue, self._workers.values(), self._send)

    @property
    def in_flight(self) -> int:
        return len(self._queue) + sum(len(w.tasks) for w in self._workers.values())

    def _send(self, worker: PoolWorker, frames: list[bytes]) -> bool:
        """Send to one worker; False (and the worker is given up) when it cannot be reached."""
        try:
            self._sock.send_multipart([worker.identity, *frames], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as e:
            self._give_up(worker, f"it cannot be reached ({e}): it died or stopped reading")
            return False

    def _give_up(self, worker: PoolWorker, why: str) -> None:
        """Kill a worker the engine cannot use; supervision replaces it and re-runs its tasks."""
        if worker.lost:
            return
        worker.lost = True
        then = "it was retiring: not replaced" if worker.retiring else "replacing it"
        log.warning("worker %d (pid %s): %s; %s", worker.worker_id, worker.process.pid, why, then)
        with contextlib.suppress(OSError, ValueError, AttributeError):  # already gone
            worker.process.kill()

    def drain(self) -> list[Event]:
        """Handle every reply already waiting (never blocks), then dispatch queued tasks."""
        events, self._supervision_events = self._supervision_events, []
        sock = self._sock
        while cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:  # no exception made to learn it is empty
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            event = self._handle(frames)
            if event is not None:
                events.append(event)
        self._queue = dispatch(self._queue, self._workers.values(), self._send)
        return events

    def supervise(self) -> None:
        """Replace dead and hung workers (re-queueing their tasks) and dispatch; cheap enough to
        call often."""
        now = time.monotonic()
        self._last_liveness = now
        if now - self._oom_checked >= _OOM_BASELINE_EVERY_S and not self._any_exited():
            # Keep the OOM baseline fresh, so an OOM kill long ago elsewhere is not taken for ours.
            self._oom_kills, self._oom_checked = oom_kill_count(), now
        self._check_hangs(now)
        self._check_liveness()
        self._queue = dispatch(self._queue, self._workers.values(), self._send)

    def poll(self, timeout_s: float) -> list[Event]:
        """Dispatch, then wait up to `timeout_s` for replies; supervise workers meanwhile."""
        self._queue = dispatch(self._queue, self._workers.values(), self._send)
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            wait_ms = int(max(0.0, min(remaining, _LIVENESS_INTERVAL_S)) * 1000)
            events = self.drain() if wait_ms == 0 or self._sock.poll(wait_ms) else []
            # Waited for nothing: a worker may be dead. A look without waiting (the trainer found
            # its batch ready) supervises only once per liveness interval.
            waited_in_vain = not events and timeout_s > 0
            if time.monotonic() - self._last_liveness >= _LIVENESS_INTERVAL_S or waited_in_vain:
                self.supervise()
                events.extend(self._supervision_events)
                self._supervision_events = []
            if events or time.monotonic() >= deadline:
                return events

    def _handle(self, frames: list[bytes]) -> Event | None:
        identity, body = frames[0], frames[1:]
        worker = self._workers.get(identity)
        if worker is None or not body:  # a reply from a worker already declared dead: re-run
            return None
        kind = body[0]
        if kind == proto.READY:
            worker.ready = True
            self._startup_deaths = 0
            for messages in self._announcements.values():
                for announcement in messages:
                    if not self._send(worker, announcement):
                        return None
            return None
        try:
            event = proto.decode_event(body)
        except ValueError as e:
            raise WorkerError(f"{e} (worker {identity.decode()})") from e
        self._finished(worker, event.seq)
        self._stop_if_idle(worker)
        return event

    def _finished(self, worker: PoolWorker, seq: int) -> None:
        """A worker answered task `seq`: time it (for the hang bound); its next task starts now."""
        task = worker.tasks.pop(seq, None)
        now = time.monotonic()
        if task is not None and worker.busy_since is not None:
            self._hang.record(now - worker.busy_since, len(task.indices))
        worker.busy_since = now if worker.tasks else None

    def _check_hangs(self, now: float) -> None:
        if not self._hang.enabled:
            return
        for worker in list(self._workers.values()):
            if worker.lost or worker.busy_since is None or not worker.tasks:
                continue
            task = next(iter(worker.tasks.values()))
            limit = self._hang.limit_s(len(task.indices), task.hangs)
            if now - worker.busy_since > limit:
                worker.hung = True
                self._give_up(
                    worker,
                    f"batch {task.batch_index} made no progress for {now - worker.busy_since:.1f} s "
                    f"(the bound is {limit:.1f} s: hung, or stopped with SIGSTOP)",
                )

    def _any_exited(self) -> bool:
        return any(w.process.exitcode is not None for w in self._workers.values())

    def _check_liveness(self) -> None:
        oom_now: int | None = None
        for identity, worker in list(self._workers.items()):
            code = worker.process.exitcode
            if code is None:
                continue
            del self._workers[identity]
            worker.process.join(0)
            if worker.retiring and not worker.tasks:  # NOTE [retiring workers]: nothing lost
                log.debug("worker %d (pid %s) retired: %s", worker.worker_id, worker.process.pid,
                          describe_exit(code))
                continue
            if oom_now is None:
                oom_now = oom_kill_count()
            cause = classify(
                code, hung=worker.hung, oom_kills_before=self._oom_kills, oom_kills_now=oom_now
            )
            self.deaths[cause] += 1
            log.info(
                "worker %d (pid %s) %s: %s; %s", worker.worker_id, worker.process.pid,
                cause.name.lower(), describe_exit(code),
                "retiring, not replaced" if worker.retiring else "replacing it",
                extra={"event": "worker_replaced", "fields": {
                    "worker": worker.worker_id, "pid": worker.process.pid, "cause": cause.name.lower(),
                    "exit": describe_exit(code), "tasks_redone": len(worker.tasks),
                }},
            )
            failed, again = charge(list(worker.tasks.values()), code, cause)
            if failed is not None:
                self._supervision_events.append(failed)
            self._queue.extendleft(reversed(again))  # at the front, in their order
            if not worker.ready and cause is Cause.CRASH and code != 0:
                self._startup_deaths += 1
            if self._startup_deaths >= MAX_STRIKES:
                raise WorkerError(
                    f"{self._startup_deaths} workers in a row exited before they were ready (the last, "
                    f"worker {worker.worker_id} pid {worker.process.pid}, with {describe_exit(code)}); "
                    "see their output above"
                )
            if not worker.retiring:
                self._spawn(worker.worker_id)
        if oom_now is not None:
            self._oom_kills, self._oom_checked = oom_now, time.monotonic()

    def close(self) -> None:
        """Stop every worker (politely, then by force) and remove the socket."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers.values():
            # Also a worker whose READY was not read yet: it is connected and reads STOP first.
            try:
                self._sock.send_multipart([worker.identity, proto.STOP], flags=zmq.NOBLOCK)
            except zmq.ZMQError:  # not connected (yet, or any more): it holds no task we want
                worker.process.kill()
        deadline = time.monotonic() + _JOIN_TIMEOUT_S
        for worker in self._workers.values():
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in self._workers.values():
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(_JOIN_TIMEOUT_S)
        self._workers.clear()
        self._sock.close(0)
        self._ctx.term()
        shutil.rmtree(self._dir, ignore_errors=True)

