"""The worker process body: receive tasks over ZeroMQ, write batches into ring slots, reply.

State machine (one task at a time, in arrival order):

    start ──► READY sent ──► wait ──TASK──► run job ──► DONE / FAILED ──► wait
                              │ └─PROBE─► load one sample ──► PROBED ──► wait
                              │ └─LAYOUT► remember the batch layout ──► wait
                              │ └─FORGET► unmap a slot the ring let go of ──► wait
                              └─STOP, or the parent is gone (checked every second) ──► exit

A worker ignores SIGINT (Ctrl-C reaches the whole process group; the trainer decides) and never
creates or unlinks shared memory: it only attaches to the slots it is told about.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from fastload._loading.jobs.contract import Job, failure_of, run_task
from fastload._loading.jobs.executor import Event
from fastload._loading.jobs.image_job import ImageJob
from fastload._loading.running import worker_link as proto
from fastload._loading.slots.layout import BatchLayout
from fastload._shm import Segment

_PARENT_CHECK_MS = 1000


@dataclass
class WorkerSpec:
    """Everything a worker process needs, fixed when it is started."""

    address: str
    identity: bytes
    parent_pid: int
    worker_id: int
    jobs: dict[int, Job]  # forked in (local mode); a daemon sends JOB messages
    worker_init_fn: Callable[[int], Any] | None
    num_workers: int = 1  # the pool's size, for get_worker_info()
    close_inherited_sockets: bool = False  # a daemon's worker: drop its listeners (see below)


def close_inherited_sockets() -> int:
    """Close every socket this forked process inherited (stdio aside); return how many.

    A daemon's workers are forked from a process that listens (its ipc socket, a TCP port when
    asked for): an inherited listening socket would keep the port bound and accept connections
    nobody serves if the daemon died first. Workers only ever use the sockets they make
    themselves, after this runs.
    """
    closed = 0
    try:
        fds = [int(fd) for fd in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    for fd in fds:
        if fd <= 2:
            continue
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                os.close(fd)
                closed += 1
        except OSError:
            continue  # the listing's own fd, already closed
    return closed


def set_worker_info(spec: WorkerSpec) -> None:
    """Make `torch.utils.data.get_worker_info()` answer in this worker as in a DataLoader's.

    Datasets use it to shard an IterableDataset-like source or open one file handle per worker;
    `worker_init_fn` sees it too, as there. `seed` is the loader's seed plus the worker id
    (DataLoader: its base seed plus the id); `dataset` is the worker's copy of the Dataset, or the
    folder's path. A daemon's workers serve many trainers' jobs and set nothing.
    """
    job = spec.jobs.get(0)
    if job is None:
        return
    dataset: Any = job.worker_dataset()
    # DataLoader sets this same private global in its workers; there is no public setter.
    worker_module = torch.utils.data._utils.worker
    worker_module._worker_info = worker_module.WorkerInfo(
        id=spec.worker_id,
        num_workers=spec.num_workers,
        seed=(job.seed + spec.worker_id) % 2**64,
        dataset=dataset,
    )


def worker_main(spec: WorkerSpec) -> None:
    """Run one worker until told to stop or until the trainer process disappears."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.close_inherited_sockets:
        close_inherited_sockets()
    torch.set_num_threads(1)
    set_worker_info(spec)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, spec.identity)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(spec.address)
    try:
        if spec.worker_init_fn is not None:
            try:
                spec.worker_init_fn(spec.worker_id)
            except Exception as e:
                sock.send_multipart(proto.encode_event(failure_of(-1, e, -1, "", "worker_init_fn")))
                return
        sock.send_multipart([proto.READY, proto.READY_HEAD.pack(os.getpid())])
        _serve(sock, spec)
    finally:
        sock.close()
        ctx.term()


def _serve(sock: zmq.Socket, spec: WorkerSpec) -> None:  # type: ignore[type-arg]
    jobs: dict[int, Job] = dict(spec.jobs)
    layouts: dict[int, BatchLayout | None] = {job_id: job.layout for job_id, job in jobs.items()}
    segments: dict[str, Segment] = {}
    job_slots: dict[int, set[str]] = {}  # a daemon's job -> the slots its tasks named

    def slot_buffer(job_id: int) -> Callable[[str], Any]:
        def attach(name: str) -> Any:
            if name not in segments:
                segments[name] = Segment.attach(name, populate=True)
                job_slots.setdefault(job_id, set()).add(name)
            return segments[name].buf

        return attach

    while True:
        if not sock.poll(_PARENT_CHECK_MS):
            if os.getppid() != spec.parent_pid:
                return
            continue
        frames = sock.recv_multipart()
        kind = frames[0][:1]
        if kind == proto.STOP:
            return
        if kind == proto.FORGET:  # the ring shrank: its memory comes back once nobody maps it
            name = frames[1].decode()
            forgotten = segments.pop(name, None)
            if forgotten is not None:
                forgotten.close()
            for names in job_slots.values():
                names.discard(name)
            continue
        if kind in (proto.JOB, proto.DROP, proto.LAYOUT):
            (job_id,) = proto.JOB_HEAD.unpack(frames[1])
            if kind == proto.JOB:
                folder_job = ImageJob.from_config(json.loads(frames[2]))
                jobs[job_id], layouts[job_id] = folder_job, folder_job.layout
            elif kind == proto.DROP:
                dropped = jobs.pop(job_id, None)
                layouts.pop(job_id, None)
                if dropped is not None:
                    dropped.close()
                for name in job_slots.pop(job_id, ()):
                    segments.pop(name).close()
            else:
                layouts[job_id] = BatchLayout.from_json(frames[2])
            continue
        task = proto.decode_task(frames[0])
        job = jobs.get(task.job_id)
        if job is None:
            error = KeyError(f"job {task.job_id} is unknown to this worker")
            event: Event = failure_of(task.seq, error, -1, "", "batch")
        else:
            event = run_task(job, task, layouts.get(task.job_id), slot_buffer(task.job_id), in_trainer=False)
        sock.send_multipart(proto.encode_event(event), copy=False)
