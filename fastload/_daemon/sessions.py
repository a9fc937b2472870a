"""A daemon session's record: one trainer's ring, queue and position, and how it is reported.

`Session` is what the daemon keeps per attached trainer; `PendingHello` a hello waiting for its
folder's index; `batch_frames` the rows a TCP trainer receives inside its `done` message;
`status_row` the line `fastload status` shows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fastload._daemon.peers import Peer
from fastload._loading.executor import Task
from fastload._loading.layout import BatchLayout
from fastload._loading.shm import Segment
from fastload.transforms import TransformPlan


@dataclass
class Session:
    """One attached trainer: its ring (daemon-owned segments), queued tasks and position."""

    id: int
    identity: bytes
    sock: Any
    local: bool
    pid: int
    rank: int
    world_size: int
    dataset: str
    num_samples: int
    segments: dict[str, Segment]
    slot_bytes: int
    batch_size: int
    connection: int  # the connection it said hello on (`peers`): the session ends with it
    peer: str
    index_key: str
    pending: deque[Task] = field(default_factory=deque)
    client_seq: dict[int, int] = field(default_factory=dict)  # daemon seq -> trainer seq
    started: float = field(default_factory=time.monotonic)
    images: int = 0
    epoch: int = -1  # the newest (epoch, batch) the trainer asked for: its position
    batch: int = -1
    layout: BatchLayout | None = None
    task_rows: dict[int, tuple[str, int]] = field(default_factory=dict)  # TCP: daemon seq -> (slot, row)

    @property
    def memory(self) -> int:
        return self.slot_bytes * len(self.segments)


@dataclass
class PendingHello:
    """A validated hello waiting for its folder's index (scanned in the background)."""

    sock: Any
    identity: bytes
    local: bool
    fields: dict[str, Any]
    plan: TransformPlan
    peer: Peer
    key: str
    progress_at: float = field(default_factory=time.monotonic)


def batch_frames(session: Session, rows: tuple[str, int], count: int) -> list[Any]:
    """A TCP session's batch: each leaf's written rows, as views of the slot (sent zero-copy;
    the slot is only reused after the trainer has received them and sent a new task)."""
    assert session.layout is not None
    name, row = rows
    view = memoryview(session.segments[name].buf)
    frames = []
    for leaf, offset in zip(session.layout.leaves, session.layout.offsets, strict=True):
        start = offset + row * leaf.nbytes
        frames.append(view[start : start + count * leaf.nbytes])
    return frames


def status_row(s: Session, now: float) -> dict[str, Any]:
    """One session as `status` reports it."""
    return {
        "session": s.id,
        "pid": s.pid,
        "peer": s.peer,
        "rank": s.rank,
        "world_size": s.world_size,
        "dataset": s.dataset,
        "images": s.images,
        "memory_bytes": s.memory,
        "images_per_s": s.images / max(now - s.started, 1e-9),
        "queued": len(s.pending),
        "epoch": s.epoch,
        "batch": s.batch,
    }
