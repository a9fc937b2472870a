"""A daemon session's record: one trainer's ring, queue and position, and how it is reported.

`check_hello` is what a session must ask for to be admitted; `Session` is what the daemon keeps per
attached trainer; `PendingHello` a hello waiting for its folder's index; `batch_frames` the rows a
TCP trainer receives inside its `done` message; `status_row` the line `fastload status` shows, and
`peer_view` what of `status` a TCP peer is told; `check_need` a trainer's `need` report.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fastload._bad_samples import ON_ERROR
from fastload._batch_counters import BatchCounters
from fastload._daemon.peers import Peer
from fastload._daemon.shares import NEED_GAIN, SATISFIED_WAIT, need_of
from fastload._errors import ConfigError, DaemonError
from fastload._loading.jobs.executor import Done, Failure, Task
from fastload._loading.link.daemon_link import MAX_BATCH, PRIORITY_RANGE, WireError
from fastload._loading.order.read_ahead import TaskReadAhead
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring_plan import MAX_IN_FLIGHT
from fastload._shm import Segment
from fastload._sizes import format_size
from fastload.samplers import MAX_REPEATS
from fastload.sources import ImageFolder, Source, source_from_config
from fastload.sources._storage.bounds import field_text_problem
from fastload.sources._storage.remote import is_url
from fastload.transforms import TransformPlan, compile_transforms, from_config

_MAX_PID = 2**31 - 1  # pid_t; os.kill() refuses larger numbers


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
    key: str | None = None  # a TCP trainer's CURVE public key (`peers`): whose `status` lists it
    pending: deque[Task] = field(default_factory=deque)
    client_seq: dict[int, int] = field(default_factory=dict)  # daemon seq -> trainer seq
    rows_out: int = 0  # samples its tasks queued or running hold (NOTE [tasks bounded by slots])
    started: float = field(default_factory=time.monotonic)
    # What its tasks cost, as the workers report them (`record`): `status` and the metrics show it.
    # A task is a batch or a part of one (a trainer splits its batches: NOTE [split batches]).
    tasks: int = 0
    counters: BatchCounters = field(default_factory=BatchCounters)  # its tasks', summed
    failures: int = 0
    epoch: int = -1  # the newest (epoch, batch) the trainer asked for: its position
    batch: int = -1
    layout: BatchLayout | None = None
    task_rows: dict[int, tuple[str, int]] = field(default_factory=dict)  # TCP: daemon seq -> (slot, row)
    read_ahead: TaskReadAhead | None = None  # of its tasks' chunks, when its data is remote
    # Its share of the pool (NOTE [shares by need] in `shares`): the hello's priority, what its
    # trainer last reported (None: no report yet), and the samples of its tasks sent to the pool.
    priority: float = 1.0
    reported_wait: float | None = None
    reported_ready: int = 0
    scheduled: int = 0

    @property
    def images(self) -> int:
        """Samples delivered to this session."""
        return self.counters.samples

    @property
    def memory(self) -> int:
        return self.slot_bytes * len(self.segments)

    @property
    def need(self) -> tuple[float, str]:
        """(need 1..1+NEED_GAIN, "trainer" or "slots": NOTE [shares by need])."""
        return need_of(self.reported_wait, self.rows_out, len(self.segments) * self.batch_size)

    @property
    def satisfied(self) -> bool:
        """Whether its trainer barely waits (NOTE [shares by need]: it keeps what it was served)."""
        return self.need[0] <= 1.0 + NEED_GAIN * SATISFIED_WAIT

    @property
    def weight(self) -> float:
        """Its weight in the pool's shares: priority x need."""
        return self.priority * self.need[0]

    @property
    def worker_ns(self) -> int:
        """The pool's time its finished tasks took (read, decode, augment)."""
        c = self.counters
        return c.read_ns + c.decode_ns + c.augment_ns

    def record(self, event: Done | Failure) -> None:
        """Count a finished task of this session's."""
        if isinstance(event, Failure):
            self.failures += 1
            return
        self.tasks += 1
        self.counters += event.counters


@dataclass
class PendingHello:
    """A validated hello waiting for its source's index (made in the background)."""

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


def status_row(s: Session, now: float, share: float = 0.0) -> dict[str, Any]:
    """One session as `status` reports it; `share`: its fraction of the pool's work over the last
    interval (`shares.PoolMeter`)."""
    need, need_from = s.need
    return {
        "session": s.id,
        "pid": s.pid,
        "peer": s.peer,
        "rank": s.rank,
        "world_size": s.world_size,
        "dataset": s.dataset,
        "images": s.images,
        "tasks": s.tasks,
        "bytes_read": s.counters.bytes_read,
        "read_s": s.counters.read_ns / 1e9,
        "decode_s": s.counters.decode_ns / 1e9,
        "augment_s": s.counters.augment_ns / 1e9,
        "failures": s.failures,
        "memory_bytes": s.memory,
        "images_per_s": s.images / max(now - s.started, 1e-9),
        "queued": len(s.pending),
        "running": len(s.client_seq) - len(s.pending),  # in the pool, not yet done
        "epoch": s.epoch,
        "batch": s.batch,
        # NOTE [shares by need] (a trainer reports its need once it sees `need` here: NOTE [need reports])
        "priority": s.priority,
        "need": round(need, 3),
        "need_from": need_from,
        "ready": s.reported_ready if s.reported_wait is not None else None,
        "weight": round(s.priority * need, 4),
        "share": round(share, 4),
        "scheduled": s.scheduled,
    }


def check_need(s: Session, f: dict[str, Any]) -> None:
    """Take a `need` report (NOTE [need reports]) into its session; WireError for values no
    trainer sends (the session lives on, with its last good report)."""
    wait, ready = f["wait"], f["ready"]
    if not (math.isfinite(wait) and 0.0 <= wait <= 1.0):
        raise WireError(f"need.wait must be a fraction 0..1 of the interval, got {wait!r}")
    if not 0 <= ready <= len(s.segments):
        raise WireError(f"need.ready must be 0..{len(s.segments)} (the session's slots), got {ready}")
    s.reported_wait, s.reported_ready = float(wait), ready


# NOTE [what a TCP peer sees]: the local socket's peers run as the daemon's user (its socket is in
# a 0700 directory), and `fastload status` and iostat read every session there. A TCP peer is
# another machine's trainer: its `status` lists only the sessions of its own CURVE key, with the
# datasets as it named them, and the daemon's health (pid, workers, budget, draining, workers
# replaced); no other session, pid or peer, no resolved path (an index is known by its real path),
# no totals of others' work, no metrics endpoint (which lists every session).
def peer_view(status: dict[str, Any], sessions: Iterable[Session], key: str | None) -> dict[str, Any]:
    """`status` (the daemon's whole) as the TCP peer of CURVE key `key` sees it."""
    own = [s for s in sessions if not s.local and key is not None and s.key == key]
    datasets: dict[str, dict[str, Any]] = {}
    for s in own:
        row = datasets.setdefault(
            s.dataset,
            {"path": s.dataset, "images": s.num_samples, "bytes": 0, "sessions": 0, "state": "ready"},
        )
        row["sessions"] += 1
    mine = {s.id for s in own}
    return {
        **status,
        "used_bytes": sum(s.memory for s in own),
        "metrics": None,
        "totals": {},
        "datasets": list(datasets.values()),
        "sessions": [row for row in status["sessions"] if row["session"] in mine],
    }


def check_hello(f: dict[str, Any], budget_bytes: int) -> tuple[TransformPlan, Source]:
    """Check a `hello`'s values (its types `daemon_link` checked), compile its transforms and
    rebuild its source (`dataset`, an image folder, unless `source` describes another); a batch
    larger than the whole budget is refused before anything of it is allocated."""
    batch_size, prefetch = f["batch_size"], f["prefetch"]
    if not (1 <= batch_size <= MAX_BATCH and 0 <= prefetch <= MAX_IN_FLIGHT):
        raise ConfigError(
            f"batch_size must be 1..{MAX_BATCH} and prefetch 1..{MAX_IN_FLIGHT} (0: the daemon's choice)"
        )
    if not (f["world_size"] >= 1 and 0 <= f["rank"] < f["world_size"]):
        raise ConfigError(f"rank {f['rank']} is not within world_size {f['world_size']}")
    if not (1 <= f["pid"] <= _MAX_PID and f["seed"] >= 0):
        raise ConfigError("pid must be a process id and seed must not be negative")
    if f.get("on_error", "raise") not in ON_ERROR:
        raise ConfigError(f"on_error must be one of {', '.join(ON_ERROR)}")
    low, high = PRIORITY_RANGE
    priority = f.get("priority", 1.0)
    if not (math.isfinite(priority) and low <= priority <= high):
        raise ConfigError(
            f"priority must be a number {low:g}..{high:g} (1: the default weight), got {priority!r}"
        )
    if not 1 <= f.get("repeats", 1) <= MAX_REPEATS:
        raise ConfigError(f"repeats must be 1..{MAX_REPEATS} (RepeatedAugmentation's)")
    if not (os.path.isabs(f["dataset"]) or is_url(f["dataset"])) or "\0" in f["dataset"]:
        raise ConfigError("dataset must be an absolute path (the daemon's working directory is not ours)")
    problem = field_text_problem(f["dataset"])  # NOTE [fields from a peer]
    if problem:
        raise ConfigError(f"dataset {problem}")
    source = _hello_source(f)
    plan = compile_transforms(from_config(f["transforms"]))
    if plan.image_bytes * batch_size > budget_bytes:
        sizes = " + ".join(f"{v.out_height}x{v.out_width}" for v in plan.each_view)
        raise DaemonError(
            f"one batch of {batch_size} images of {sizes} is larger than "
            f"the daemon's {format_size(budget_bytes)} budget"
        )
    return plan, source


def _hello_source(f: dict[str, Any]) -> Source:
    if "source" not in f:
        return ImageFolder(f["dataset"])
    try:
        config = json.loads(f["source"])
    except ValueError as e:
        raise ConfigError(f"source is not JSON: {e}") from None
    source = source_from_config(config)
    source.check_served_by_daemon()
    try:
        absolute = source.resolved() == source
    except (TypeError, ValueError) as e:  # a field of the wrong type, from a peer
        raise ConfigError(f"bad {source.kind} source description: {e}") from None
    if not absolute:
        raise ConfigError("a source's paths must be absolute (the daemon's working directory is not ours)")
    # NOTE [the daemon's cache]: a peer's source never chooses where or how much the daemon
    # caches. Remote data is read through the daemon's own node cache: its `cache_dir` and
    # `cache_limit` settings, which `Daemon` puts in the environment its workers and fork server
    # inherit (FASTLOAD_CACHE_DIR, FASTLOAD_CACHE_LIMIT); its workers and read-ahead attach the
    # shared index, which carries no cache settings. A peer's `machine_fields` would have the
    # daemon (as its user, often root) make and fill a directory of the peer's choosing, or a
    # `cache_limit` of a few bytes evict every session's chunks: a hello naming them is refused,
    # not silently served otherwise than it asked.
    named = sorted(set(source.machine_fields) & source.to_config().keys())
    if named:
        raise ConfigError(
            "a daemon reads remote data through its own node cache (its `cache_dir` and "
            f"`cache_limit` settings): leave {' and '.join(named)} out of a source it serves"
        )
    return source
