"""The engine<->worker wire format: ZeroMQ multipart messages of fixed structs, never pickles.

Engine (ROUTER) -> worker (DEALER):
    TASK    [b"T" TASK_HEAD(seq, batch_index, epoch, count, job, row) SLOT_LEN slot-name int64-indices]
    PROBE   [b"P" TASK_HEAD(seq, batch_index, epoch, 1, job, 0) SLOT_LEN(0) int64-index]
            (one frame each: a task is one send)
    JOB     [b"J", JOB_HEAD(job), job JSON]        (a daemon's jobs; local mode forks job 0 in)
    DROP    [b"X", JOB_HEAD(job)]                  (forget a job)
    LAYOUT  [b"L", JOB_HEAD(job), layout JSON]
    FORGET  [b"F", slot-name]                      (a slot the ring let go of: unmap it)
    STOP    [b"S"]
Worker -> engine:
    READY   [b"R", READY_HEAD(pid)]
    DONE    [b"D", DONE_HEAD(seq, *BatchCounters: samples, read_ns, decode_ns, bytes_read, read_cpu_ns,
                                read_runq_ns, augment_ns, net_bytes, net_wait_ns, cache_hits, cache_misses)
                 [, skipped JSON [[index, name, reason, row, replacement]]]]
    FAILED  [b"E", SEQ_HEAD(seq), error JSON {message, path, index, exc_type, exc_class, traceback}]
    PROBED  [b"P", SEQ_HEAD(seq), layout JSON or b""]
    OPAQUE  [b"B", OPAQUE_HEAD(seq, count, load_ns), skipped JSON, pickle-5 stream, *out-of-band buffers]

NOTE [OPAQUE batches]: a Dataset whose samples are not fixed-shape arrays/numbers (strings,
ragged shapes, a custom collate_fn) is collated in the worker and sent pickled, as torch's
DataLoader does. It only ever travels between a trainer and the worker processes it forked
itself, over an ipc socket in a 0700 directory, never over a network.

NOTE [DONE's layout]: one int64 per field of `BatchCounters`, in its declared order, after the
seq: a counter declared there is carried here with no edit. Both ends are the same code (the
trainer's or the daemon's workers are forked from it), so the layout needs no version of its
own; a frame of another length is refused (`decode_event`) rather than read askew.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import struct
from typing import Any

import numpy as np

from fastload._bad_samples import SkippedSample
from fastload._batch_counters import BatchCounters, counter_names
from fastload._loading.jobs.executor import Done, Event, Failure, Opaque, Probed, Task
from fastload._loading.slots.layout import BatchLayout

TASK = b"T"
PROBE = b"P"
JOB = b"J"
DROP = b"X"
LAYOUT = b"L"
STOP = b"S"
FORGET = b"F"
READY = b"R"
DONE = b"D"
FAILED = b"E"
PROBED = b"P"
OPAQUE = b"B"

TASK_HEAD = struct.Struct("<qqqqqq")
JOB_HEAD = struct.Struct("<q")
READY_HEAD = struct.Struct("<q")
DONE_HEAD = struct.Struct("<q" + "q" * len(counter_names()))  # NOTE [DONE's layout]
SEQ_HEAD = struct.Struct("<q")
OPAQUE_HEAD = struct.Struct("<qqq")
SLOT_LEN = struct.Struct("<H")


def encode_task(task: Task, kind: bytes) -> list[bytes]:
    """A TASK or PROBE message, one frame (the engine prepends the worker's identity): every
    frame is a send call on the trainer's thread, and a batch is a task per worker."""
    slot = task.slot_name.encode()
    head = TASK_HEAD.pack(task.seq, task.batch_index, task.epoch, len(task.indices), task.job_id, task.row)
    indices = task.indices.astype("<i8", copy=False).tobytes()
    return [b"".join((kind, head, SLOT_LEN.pack(len(slot)), slot, indices))]


def decode_task(frame: bytes) -> Task:
    """The task in a TASK or PROBE frame (`encode_task`)."""
    seq, batch_index, epoch, count, job_id, row = TASK_HEAD.unpack_from(frame, 1)
    at = 1 + TASK_HEAD.size
    (length,) = SLOT_LEN.unpack_from(frame, at)
    at += SLOT_LEN.size
    slot = frame[at : at + length].decode()
    indices = np.frombuffer(frame, dtype="<i8", count=count, offset=at + length).copy()  # aligned
    return Task(seq, epoch, batch_index, indices, slot, probe=frame[:1] == PROBE, job_id=job_id, row=row)


def encode_event(event: Event) -> list[Any]:
    """A worker's reply for one task's event (OPAQUE frames are buffers, sent with copy=False)."""
    if isinstance(event, Done):
        fields = (event.seq, *event.counters.values())
        extra = [json.dumps([v.to_json() for v in event.skipped]).encode()] if event.skipped else []
        return [DONE, DONE_HEAD.pack(*fields), *extra]
    if isinstance(event, Failure):
        body = {
            "message": event.message, "path": event.path, "index": event.index,
            "exc_type": event.exc_type, "exc_class": event.exc_class, "traceback": event.traceback,
        }
        return [FAILED, SEQ_HEAD.pack(event.seq), json.dumps(body).encode()]
    if isinstance(event, Probed):
        return [PROBED, SEQ_HEAD.pack(event.seq), event.layout.to_json().encode() if event.layout else b""]
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(event.batch, protocol=5, buffer_callback=buffers.append)
    opaque_head = OPAQUE_HEAD.pack(event.seq, event.count, event.load_ns)
    replaced = json.dumps([v.to_json() for v in event.skipped]).encode()
    return [OPAQUE, opaque_head, replaced, head, *(b.raw() for b in buffers)]


def decode_event(frames: list[bytes]) -> Event:
    """The event a worker's reply carries (`frames` without the identity; not READY)."""
    kind = frames[0]
    if kind == DONE:
        if len(frames[1]) != DONE_HEAD.size:  # NOTE [DONE's layout]
            raise ValueError(f"a DONE of {len(frames[1])} bytes from a worker, not {DONE_HEAD.size}")
        seq, *values = DONE_HEAD.unpack(frames[1])
        done = Done(seq, BatchCounters(*values))
        if len(frames) > 2:
            skipped = tuple(SkippedSample.from_json(v) for v in json.loads(frames[2]))
            done = dataclasses.replace(done, skipped=skipped)
        return done
    if kind == OPAQUE:  # see NOTE [OPAQUE batches]: only from the trainer's own forked workers
        seq, count, load_ns = OPAQUE_HEAD.unpack(frames[1])
        skipped = tuple(SkippedSample.from_json(v) for v in json.loads(frames[2]))
        return Opaque(seq, pickle.loads(frames[3], buffers=frames[4:]), count, load_ns, skipped)
    (seq,) = SEQ_HEAD.unpack(frames[1])
    if kind == FAILED:
        body: dict[str, Any] = json.loads(frames[2])
        return Failure(
            seq, str(body["message"]), str(body["path"]), int(body["index"]), str(body["exc_type"]),
            str(body["traceback"]), str(body.get("exc_class", "")),
        )
    if kind == PROBED:
        return Probed(seq, BatchLayout.from_json(frames[2]) if frames[2] else None)
    raise ValueError(f"unexpected message kind {kind!r} from a worker")
