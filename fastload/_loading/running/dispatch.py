"""Dispatch: which worker of the pool runs which queued task.

The least busy ready worker gets the next task, up to `MAX_TASKS_PER_WORKER`; a task that names
its worker (an iterable stream's batch) waits for that worker; a retiring worker takes none; a
suspect task (NOTE [blame] in `supervision`) runs alone on an idle worker, and a worker running
one takes nothing else, so that its death is that task's. Tasks keep their order in the queue
otherwise.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from fastload._loading.jobs.executor import Task
from fastload._loading.running import worker_link as proto
from fastload._loading.slots.ring_plan import MAX_IN_FLIGHT

# Tasks one worker may hold; the rest wait in the engine. Why `MAX_IN_FLIGHT`: a batch is split
# into at most one part per worker (NOTE [split batches] in `split_batches`) and tasks go to the
# least busy worker, so one loader's window (at most MAX_IN_FLIGHT batches) keeps about a window's
# worth of tasks on a worker; the cap bounds what a daemon's worker holds of many sessions'
# tasks, and keeps its socket queue far below ZeroMQ's send high-water mark (1,000), so that a
# full queue (EAGAIN) only ever means a worker that stopped reading (NOTE [one socket, addressed
# workers] in `engine`).
MAX_TASKS_PER_WORKER = MAX_IN_FLIGHT


@dataclass
class PoolWorker:
    """One worker process of the pool, as the engine sees it."""

    worker_id: int
    identity: bytes
    process: Any  # multiprocessing.Process (fork/spawn/forkserver flavours)
    ready: bool = False
    tasks: dict[int, Task] = field(default_factory=dict)  # in dispatch order: the first one runs
    busy_since: float | None = None  # when the task it runs now started
    lost: bool = False  # unreachable: killed by the engine, sent nothing more
    hung: bool = False  # killed by the engine: its task ran past the hang bound
    retiring: bool = False  # retired (NOTE [retiring workers] in `engine`): takes no new task
    stopped: bool = False  # retiring, held nothing and was sent STOP (or killed if unreachable)


def dispatch(
    queue: deque[Task], workers: Iterable[PoolWorker], send: Callable[[PoolWorker, list[bytes]], bool]
) -> deque[Task]:
    """Hand queued tasks to ready workers, the least busy first, at most MAX_TASKS_PER_WORKER
    each (`send`: False when a worker cannot be reached, which then takes nothing more); the
    tasks still queued."""
    # A worker running a suspect task takes nothing else, so that its death is that task's.
    # A retiring worker takes nothing new (NOTE [retiring workers] in `engine`).
    ready = [
        w for w in workers
        if w.ready and not w.lost and not w.retiring and not any(t.suspect for t in w.tasks.values())
    ]
    if queue and queue[0].worker is not None:
        return _dispatch_pinned(queue, ready, send)
    while queue and ready:
        if queue[0].suspect:
            idle = [w for w in ready if not w.tasks]
            if not idle:
                return queue  # wait for a worker to finish what it holds; the suspect goes first
            worker = idle[0]
        else:
            worker = min(ready, key=lambda w: len(w.tasks))
            if len(worker.tasks) >= MAX_TASKS_PER_WORKER:
                return queue
        task = queue.popleft()
        if not _assign(worker, task, send):
            ready.remove(worker)
    return queue


def _assign(worker: PoolWorker, task: Task, send: Callable[[PoolWorker, list[bytes]], bool]) -> bool:
    """Give `task` to `worker`; whether the worker may take more now (not if the send failed:
    a lost worker takes nothing more; nor after a suspect, which runs alone)."""
    if not worker.tasks:
        worker.busy_since = time.monotonic()
    worker.tasks[task.seq] = task  # re-run with the others if the send fails
    sent = send(worker, proto.encode_task(task, proto.PROBE if task.probe else proto.TASK))
    return sent and not task.suspect


def _dispatch_pinned(
    queue: deque[Task], ready: list[PoolWorker], send: Callable[[PoolWorker, list[bytes]], bool]
) -> deque[Task]:
    """Send each queued task that names its worker to that worker, once it is ready (an
    iterable stream's batches, NOTE [iterable streams]); the others keep their order."""
    by_id = {w.worker_id: w for w in ready}
    kept: deque[Task] = deque()
    for task in queue:
        worker = by_id.get(task.worker) if task.worker is not None else None
        full = worker is not None and len(worker.tasks) >= MAX_TASKS_PER_WORKER
        if worker is None or full or (task.suspect and worker.tasks):
            kept.append(task)  # a suspect waits until its worker holds nothing else
            continue
        if not _assign(worker, task, send):
            del by_id[worker.worker_id]
    return kept
