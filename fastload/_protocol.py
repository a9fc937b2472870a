"""The engine<->worker wire format: ZeroMQ multipart messages of fixed structs, never pickles.

Engine (ROUTER) -> worker (DEALER):
    TASK    [b"T", TASK_HEAD(seq, batch_index, epoch, count, job, row), slot name, int64 indices]
    PROBE   [b"P", TASK_HEAD(seq, batch_index, epoch, 1, job, 0), b"", int64 index]
    JOB     [b"J", JOB_HEAD(job), job JSON]        (a daemon's jobs; local mode forks job 0 in)
    DROP    [b"X", JOB_HEAD(job)]                  (forget a job)
    LAYOUT  [b"L", JOB_HEAD(job), layout JSON]
    STOP    [b"S"]
Worker -> engine:
    READY   [b"R", READY_HEAD(pid)]
    DONE    [b"D", DONE_HEAD(seq, count, read_ns, decode_ns, bytes_read, read_cpu_ns, read_runq_ns)]
    FAILED  [b"E", SEQ_HEAD(seq), error JSON {message, path, index, exc_type, exc_class, traceback}]
    PROBED  [b"P", SEQ_HEAD(seq), layout JSON or b""]
    OPAQUE  [b"B", SEQ_HEAD(seq), pickle-5 stream, *out-of-band buffers]

NOTE [OPAQUE batches]: a Dataset whose samples are not fixed-shape arrays/numbers (strings,
ragged shapes, a custom collate_fn) is collated in the worker and sent pickled, as torch's
DataLoader does. It only ever travels between a trainer and the worker processes it forked
itself, over an ipc socket in a 0700 directory, never over a network.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

TASK = b"T"
PROBE = b"P"
JOB = b"J"
DROP = b"X"
LAYOUT = b"L"
STOP = b"S"
READY = b"R"
DONE = b"D"
FAILED = b"E"
PROBED = b"P"
OPAQUE = b"B"

TASK_HEAD = struct.Struct("<qqqqqq")
JOB_HEAD = struct.Struct("<q")
READY_HEAD = struct.Struct("<q")
DONE_HEAD = struct.Struct("<qqqqqqq")
SEQ_HEAD = struct.Struct("<q")


@dataclass(frozen=True)
class Done:
    """A worker finished batch `seq`; the stage timings feed the loader's statistics."""

    seq: int
    count: int
    read_ns: int
    decode_ns: int
    bytes_read: int
    # CPU time of the read stage: near read_ns when reading computes (a Dataset decoding in
    # __getitem__), far below it when the worker waits, for storage or for a CPU.
    read_cpu_ns: int = 0
    # Time the reading thread was runnable but waiting for a CPU (the kernel's run-queue delay;
    # 0 where it is not reported): what separates the two waits on an oversubscribed machine.
    read_runq_ns: int = 0

    def encode(self) -> list[bytes]:
        return [
            DONE,
            DONE_HEAD.pack(
                self.seq,
                self.count,
                self.read_ns,
                self.decode_ns,
                self.bytes_read,
                self.read_cpu_ns,
                self.read_runq_ns,
            ),
        ]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Done:
        return cls(*DONE_HEAD.unpack(frames[1]))


@dataclass(frozen=True)
class Failure:
    """A worker could not load batch `seq`: which sample, which file, and the worker's traceback.

    `exc_type` is the exception's class name ("KeyError"), `exc_class` its "module:qualname"
    ("builtins:KeyError"; "" when unknown), which the trainer re-raises it as (`_errors`).
    """

    seq: int
    message: str
    path: str
    index: int
    exc_type: str
    traceback: str
    exc_class: str = ""

    def encode(self) -> list[bytes]:
        body = {
            "message": self.message,
            "path": self.path,
            "index": self.index,
            "exc_type": self.exc_type,
            "exc_class": self.exc_class,
            "traceback": self.traceback,
        }
        return [FAILED, SEQ_HEAD.pack(self.seq), json.dumps(body).encode()]

    @classmethod
    def decode(cls, frames: list[bytes]) -> Failure:
        (seq,) = SEQ_HEAD.unpack(frames[1])
        body: dict[str, Any] = json.loads(frames[2])
        return cls(
            seq,
            str(body["message"]),
            str(body["path"]),
            int(body["index"]),
            str(body["exc_type"]),
            str(body["traceback"]),
            str(body.get("exc_class", "")),
        )
