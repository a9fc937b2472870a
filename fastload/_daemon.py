"""`fastload serve`: one decode pool per machine, shared by every trainer that attaches.

The daemon runs the same `Engine` a local loader runs; what it adds is sessions. A session is one
trainer: its declarative configuration (dataset folder, transforms, backend, seed) becomes a job
the workers build for themselves, and its ring is made by the daemon, counted against the memory
budget, and unlinked when the session ends — by `bye`, or within a second of its trainer dying.
The trainer plans its own batches (the same code as local mode, so the same batches bit for bit)
and sends tasks naming one of its slots; the daemon validates them, queues them per session and
feeds the pool round-robin across sessions, so a busy trainer cannot starve another.

Loop: poll the client sockets and the workers' socket; on SIGTERM/SIGINT stop accepting sessions,
finish the tasks in flight, then exit, unlinking every segment and the socket.
Security: the ipc socket is in a 0700 directory; a TCP listener exists only when asked for, and
then requires CURVE; every message is validated (`_wire`), and malformed ones get an error reply.
A TCP session's batches cannot be mapped by its trainer: each `done` carries the batch's rows as
zero-copy views of the slot, and the session is reclaimed after 120 s without a word.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

from fastload import _wire as wire
from fastload._client import private_dir, runtime_dir
from fastload._engine import Engine, Event, Task
from fastload._errors import ConfigError, DaemonError, FastloadError
from fastload._jobs import FolderJob
from fastload._layout import BatchLayout
from fastload._protocol import Done, Failure
from fastload._shm import Segment, pid_alive, preflight, reap_orphans
from fastload._sources import ImageFolderIndex
from fastload.transforms import compile_transforms, from_config

log = logging.getLogger("fastload.daemon")

_POLL_MS = 100
_LIVENESS_S = 1.0
_DRAIN_LIMIT_S = 30.0
_MAX_SLOTS_PER_SESSION = 256
# A TCP trainer has no pid we can check: a session silent this long is taken as gone.
_REMOTE_IDLE_S = 120.0
_MAX_PID = 2**31 - 1  # pid_t; os.kill() refuses larger numbers


@dataclass(frozen=True)
class DaemonConfig:
    """What `fastload serve` runs with (command line or `--config fastload.toml`)."""

    workers: int
    memory_budget_bytes: int
    socket_dir: str | None = None  # default: runtime_dir()
    listen: str | None = None  # tcp://HOST:PORT, only when asked for
    curve_secret_key: str | None = None  # Z85; required with `listen`
    curve_public_key: str | None = None
    curve_clients: tuple[str, ...] = ()  # Z85 public keys allowed over TCP
    max_sessions: int = 64


@dataclass
class _Session:
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
    pending: deque[Task] = field(default_factory=deque)
    client_seq: dict[int, int] = field(default_factory=dict)  # daemon seq -> trainer seq
    started: float = field(default_factory=time.monotonic)
    images: int = 0
    epoch: int = -1  # the newest (epoch, batch) the trainer asked for: its position
    batch: int = -1
    layout: BatchLayout | None = None
    task_rows: dict[int, tuple[str, int]] = field(default_factory=dict)  # TCP: daemon seq -> (slot, row)
    last_heard: float = field(default_factory=time.monotonic)

    @property
    def memory(self) -> int:
        return self.slot_bytes * len(self.segments)


class Daemon:
    """The loader daemon; `serve_forever` until SIGTERM/SIGINT or a local `stop`."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        if config.listen:
            _check_tcp_config(config)  # before anything is created that a refusal would leave behind
        self.dir = private_dir(config.socket_dir) if config.socket_dir else runtime_dir()
        self.pid_path = os.path.join(self.dir, "daemon.pid")
        self.sock_path = os.path.join(self.dir, "daemon.sock")
        self._claim_pidfile()
        self._ctx = zmq.Context()
        self._tcp: Any = None
        try:
            reap_orphans()
            self._local = self._ctx.socket(zmq.ROUTER)
            self._local.setsockopt(zmq.LINGER, 0)
            self._local.setsockopt(zmq.ROUTER_HANDOVER, 1)
            old_umask = os.umask(0o077)
            try:
                self._local.bind(f"ipc://{self.sock_path}")
            finally:
                os.umask(old_umask)
            if config.listen:
                self._tcp = self._bind_tcp(config)
            self.engine = Engine({}, num_workers=config.workers, mp_context="fork", worker_init_fn=None)
        except BaseException:
            if getattr(self, "_auth", None) is not None:
                self._auth.stop()
            self._ctx.destroy(linger=0)
            self._remove_files()
            raise
        self._sessions: dict[int, _Session] = {}
        self._by_identity: dict[tuple[int, bytes], _Session] = {}
        self._datasets: dict[str, tuple[ImageFolderIndex, Segment]] = {}
        self._ids = itertools.count(1)
        self._seqs = itertools.count()
        self._seq_owner: dict[int, _Session] = {}
        self._stopping = False
        self._rr = 0
        self._last_liveness = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def _claim_pidfile(self) -> None:
        try:
            with open(self.pid_path, encoding="utf-8") as f:
                other = int(f.read().strip() or 0)
        except (OSError, ValueError):
            other = 0
        if other and other != os.getpid() and pid_alive(other):
            raise DaemonError(f"a fastload daemon is already running (pid {other}, socket {self.sock_path})")
        # A daemon killed with SIGKILL left these behind: take them over.
        for stale in (self.sock_path, self.pid_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        fd = os.open(self.pid_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))

    def _bind_tcp(self, config: DaemonConfig) -> Any:
        assert config.curve_secret_key and config.curve_public_key
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_server = True
        sock.curve_secretkey = config.curve_secret_key.encode()
        sock.curve_publickey = config.curve_public_key.encode()
        sock.zap_domain = b"fastload"
        self._start_authenticator(config.curve_clients)
        try:
            sock.bind(str(config.listen))
        except zmq.ZMQError as e:
            raise DaemonError(f"cannot listen on {config.listen}: {e}") from e
        return sock

    def _start_authenticator(self, clients: tuple[str, ...]) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="fastload", credentials_provider=_AllowList(clients))

    def request_stop(self, *_: Any) -> None:
        """Stop accepting sessions; finish what is in flight; then `serve_forever` returns."""
        if not self._stopping:
            log.info("stopping: no new sessions, finishing %d tasks in flight", self.engine.in_flight)
        self._stopping = True

    def serve_forever(self) -> None:
        previous = {s: signal.signal(s, self.request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        log.info(
            "serving on %s (%d workers, budget %d MiB)",
            self.sock_path,
            self.config.workers,
            self.config.memory_budget_bytes >> 20,
        )
        poller = zmq.Poller()
        poller.register(self._local, zmq.POLLIN)
        poller.register(self.engine.socket, zmq.POLLIN)
        if self._tcp is not None:
            poller.register(self._tcp, zmq.POLLIN)
        drain_deadline: float | None = None
        try:
            while True:
                ready = dict(poller.poll(_POLL_MS))
                if self._local in ready:
                    self._read_clients(self._local, local=True)
                if self._tcp is not None and self._tcp in ready:
                    self._read_clients(self._tcp, local=False)
                self._on_events(self.engine.drain() if self.engine.socket in ready else [])
                if time.monotonic() - self._last_liveness >= _LIVENESS_S:
                    self._last_liveness = time.monotonic()
                    self.engine.supervise()
                    self._reap_dead_sessions()
                self._schedule()
                if self._stopping:
                    drain_deadline = drain_deadline or time.monotonic() + _DRAIN_LIMIT_S
                    if self.engine.in_flight == 0 or time.monotonic() > drain_deadline:
                        return
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.close()

    def close(self) -> None:
        """Stop the workers, unlink every ring and index, remove the socket and the pid file."""
        self.engine.close()
        for session in list(self._sessions.values()):
            self._end_session(session, notify_engine=False)
        for _, segment in self._datasets.values():
            segment.close()
        self._datasets.clear()
        self._local.close(0)
        if self._tcp is not None:
            self._tcp.close(0)
            self._auth.stop()
        self._ctx.term()
        self._remove_files()

    def _remove_files(self) -> None:
        for path in (self.sock_path, self.pid_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # -- client messages ---------------------------------------------------------------------

    def _read_clients(self, sock: Any, local: bool) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, body = frames[0], frames[1:]
            try:
                if not body:
                    raise wire.WireError("empty message")
                op, fields = wire.decode(body[0])
                self._handle(sock, identity, local, op, fields, body[1:])
            except FastloadError as e:
                self._reply(sock, identity, "error", message=str(e))
            except Exception as e:  # a bug must not take the daemon down with every session
                log.exception("error while handling a client message")
                self._reply(sock, identity, "error", message=f"internal error: {type(e).__name__}: {e}")

    def _reply(self, sock: Any, identity: bytes, op: str, *extra: Any, **fields: Any) -> None:
        # copy=False: a TCP batch's frames are views of its slot; pyzmq copies small frames anyway.
        with contextlib.suppress(zmq.ZMQError):
            sock.send_multipart([identity, wire.encode(op, **fields), *extra], copy=not extra)

    def _handle(
        self, sock: Any, identity: bytes, local: bool, op: str, fields: dict[str, Any], extra: list[bytes]
    ) -> None:
        session = self._by_identity.get((id(sock), identity))
        if session is not None:
            session.last_heard = time.monotonic()
        if op == "hello":
            if session is not None:
                raise wire.WireError("this connection already has a session")
            self._hello(sock, identity, local, fields)
        elif op == "task":
            if session is None:
                raise wire.WireError("task before hello")
            self._task(session, fields, extra)
        elif op == "grow":
            if session is None:
                raise wire.WireError("grow before hello")
            self._reply(sock, identity, "slot", name=self._new_slot(session).name)
        elif op == "ping":
            self._reply(sock, identity, "pong")
        elif op == "bye":
            if session is not None:
                self._end_session(session)
        elif op == "status":
            self._reply(sock, identity, "status_reply", **self.status())
        elif op == "stop":
            if not local:
                raise wire.WireError("stop is only accepted on the local socket")
            self.request_stop()
            self._reply(sock, identity, "pong")
        else:
            raise wire.WireError(f"{op} is not a request")

    def _hello(self, sock: Any, identity: bytes, local: bool, f: dict[str, Any]) -> None:
        if self._stopping:
            raise DaemonError("the daemon is shutting down and accepts no new sessions")
        if len(self._sessions) >= self.config.max_sessions:
            raise DaemonError(f"the daemon already serves {self.config.max_sessions} sessions")
        batch_size, prefetch = f["batch_size"], f["prefetch"]
        if not (1 <= batch_size <= wire.MAX_BATCH and 1 <= prefetch <= 64):
            raise ConfigError(f"batch_size must be 1..{wire.MAX_BATCH} and prefetch 1..64")
        if not (f["world_size"] >= 1 and 0 <= f["rank"] < f["world_size"]):
            raise ConfigError(f"rank {f['rank']} is not within world_size {f['world_size']}")
        if not (1 <= f["pid"] <= _MAX_PID and f["seed"] >= 0):
            raise ConfigError("pid must be a process id and seed must not be negative")
        if not os.path.isabs(f["dataset"]) or "\0" in f["dataset"]:
            raise ConfigError("dataset must be an absolute path (the daemon's working directory is not ours)")
        plan = compile_transforms(from_config(f["transforms"]))
        if plan.out_height * plan.out_width * 3 * batch_size > self.config.memory_budget_bytes:
            raise DaemonError(  # refused before any of it is allocated, even to infer its layout
                f"one batch of {batch_size} images of {plan.out_height}x{plan.out_width} is larger than "
                f"the daemon's {self.config.memory_budget_bytes / 2**20:.0f} MiB budget"
            )
        index, index_segment = self._dataset(f["dataset"])
        session_id = next(self._ids)
        job = FolderJob(index, plan, f["backend"], f["seed"], batch_size)
        assert job.layout is not None
        slots = prefetch + 2
        need = job.layout.slot_bytes * slots
        used = self._used_bytes()
        if used + need > self.config.memory_budget_bytes:
            raise DaemonError(
                f"this session's ring needs {need / 2**20:.0f} MiB but only "
                f"{(self.config.memory_budget_bytes - used) / 2**20:.0f} MiB of the daemon's "
                f"{self.config.memory_budget_bytes / 2**20:.0f} MiB budget is left: lower batch_size or "
                "prefetch, or start the daemon with a larger --memory-budget"
            )
        preflight(need)
        session = _Session(
            id=session_id,
            identity=identity,
            sock=sock,
            local=local,
            pid=f["pid"],
            rank=f["rank"],
            world_size=f["world_size"],
            dataset=f["dataset"],
            num_samples=len(index),
            segments={},
            slot_bytes=job.layout.slot_bytes,
            batch_size=batch_size,
            layout=job.layout,
        )
        try:
            for _ in range(slots):
                segment = Segment.create(session.slot_bytes)
                session.segments[segment.name] = segment
        except BaseException:
            for segment in session.segments.values():
                segment.close()
            raise
        self._sessions[session_id] = session
        self._by_identity[(id(sock), identity)] = session
        self.engine.add_job(session_id, job.to_config(index_segment.name))
        log.info(
            "session %d: pid %d rank %d/%d, %s, %d slots of %d KiB",
            session_id,
            session.pid,
            session.rank,
            session.world_size,
            f["dataset"],
            slots,
            session.slot_bytes >> 10,
        )
        self._reply(
            sock,
            identity,
            "welcome",
            session=session_id,
            daemon_pid=os.getpid(),
            slots=list(session.segments),
            slot_bytes=session.slot_bytes,
            layout=job.layout.to_json(),
            num_samples=len(index),
            classes=list(index.classes),
            workers=self.config.workers,
        )

    def warm(self, path: str) -> tuple[ImageFolderIndex, Segment]:
        """Index a dataset now, so that its first session starts fast."""
        return self._dataset(path)

    def _dataset(self, path: str) -> tuple[ImageFolderIndex, Segment]:
        """The index of a folder, scanned once and shared with the workers through shm."""
        key = os.path.realpath(path)
        cached = self._datasets.get(key)
        if cached is None:
            index = ImageFolderIndex.scan(key)
            cached = (index, index.to_segment())
            self._datasets[key] = cached
        return cached

    def _used_bytes(self) -> int:
        return sum(s.memory for s in self._sessions.values()) + sum(
            seg.size for _, seg in self._datasets.values()
        )

    def _new_slot(self, session: _Session) -> Segment:
        if len(session.segments) >= _MAX_SLOTS_PER_SESSION:
            raise DaemonError(f"a session may hold at most {_MAX_SLOTS_PER_SESSION} slots")
        if self._used_bytes() + session.slot_bytes > self.config.memory_budget_bytes:
            raise DaemonError(
                "no memory left in the daemon's budget for another slot: stop holding every batch "
                "(e.g. list(loader)), or raise --memory-budget"
            )
        segment = Segment.create(session.slot_bytes)
        session.segments[segment.name] = segment
        return segment

    def _task(self, session: _Session, f: dict[str, Any], extra: list[bytes]) -> None:
        if self._stopping:
            raise DaemonError("the daemon is shutting down; resume from the last state_dict() later")
        if f["slot"] not in session.segments:
            raise wire.WireError("the task names a slot that is not this session's")
        if len(extra) != 1:
            raise wire.WireError("a task carries exactly one index frame")
        if f["epoch"] < 0 or f["batch_index"] < 0:
            raise wire.WireError("a task's epoch and batch_index must not be negative")
        indices = wire.decode_indices(extra[0], session.num_samples)
        if f["row"] < 0 or f["row"] + len(indices) > session.batch_size:
            raise wire.WireError(
                f"rows {f['row']}..{f['row'] + len(indices)} exceed the batch of {session.batch_size}"
            )
        session.epoch, session.batch = max((session.epoch, session.batch), (f["epoch"], f["batch_index"]))
        seq = next(self._seqs)
        session.client_seq[seq] = f["seq"]
        self._seq_owner[seq] = session
        if not session.local:
            session.task_rows[seq] = (f["slot"], f["row"])
        session.pending.append(
            Task(
                seq, f["epoch"], f["batch_index"], indices.copy(), f["slot"], job_id=session.id, row=f["row"]
            )
        )

    # -- scheduling and results --------------------------------------------------------------

    def _schedule(self) -> None:
        """Feed the pool round-robin across sessions, two tasks per worker at most."""
        limit = 2 * max(1, self.config.workers)
        sessions = [s for s in self._sessions.values() if s.pending]
        while sessions and self.engine.in_flight < limit:
            self._rr = (self._rr + 1) % len(sessions)
            session = sessions[self._rr]
            self.engine.submit(session.pending.popleft())
            if not session.pending:
                sessions.remove(session)
        self._on_events(self.engine.drain())  # dispatches what was just submitted

    def _on_events(self, events: list[Event]) -> None:
        for event in events:
            if not isinstance(event, (Done, Failure)):
                continue
            session = self._seq_owner.pop(event.seq, None)
            if session is None or session.id not in self._sessions:
                continue
            client_seq = session.client_seq.pop(event.seq)
            rows = session.task_rows.pop(event.seq, None)
            if isinstance(event, Done):
                session.images += event.count
                self._reply(
                    session.sock,
                    session.identity,
                    "done",
                    *(self._payload(session, rows, event.count) if rows is not None else ()),
                    seq=client_seq,
                    count=event.count,
                    read_ns=event.read_ns,
                    decode_ns=event.decode_ns,
                    bytes=event.bytes_read,
                    read_cpu_ns=event.read_cpu_ns,
                )
            else:
                self._reply(
                    session.sock,
                    session.identity,
                    "failed",
                    seq=client_seq,
                    message=event.message,
                    path=event.path,
                    index=event.index,
                    exc_type=event.exc_type,
                    traceback=event.traceback,
                )

    @staticmethod
    def _payload(session: _Session, rows: tuple[str, int], count: int) -> list[Any]:
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

    def _reap_dead_sessions(self) -> None:
        now = time.monotonic()
        for session in list(self._sessions.values()):
            if session.local and not pid_alive(session.pid):
                log.info("session %d: trainer pid %d is gone; reclaiming it", session.id, session.pid)
                self._end_session(session)
            elif not session.local and now - session.last_heard > _REMOTE_IDLE_S:
                log.info(
                    "session %d: no word from its TCP trainer for %.0f s; reclaiming it",
                    session.id,
                    _REMOTE_IDLE_S,
                )
                self._end_session(session)

    def _end_session(self, session: _Session, notify_engine: bool = True) -> None:
        self._sessions.pop(session.id, None)
        self._by_identity.pop((id(session.sock), session.identity), None)
        for seq in session.client_seq:
            self._seq_owner.pop(seq, None)
        if notify_engine:
            self.engine.drop_job(session.id)
        for segment in session.segments.values():
            segment.close()
        session.segments.clear()

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "pid": os.getpid(),
            "workers": self.config.workers,
            "budget_bytes": self.config.memory_budget_bytes,
            "used_bytes": self._used_bytes(),
            "draining": self._stopping,
            "sessions": [
                {
                    "session": s.id,
                    "pid": s.pid,
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
                for s in self._sessions.values()
            ],
        }


def _check_tcp_config(config: DaemonConfig) -> None:
    if not (config.curve_secret_key and config.curve_public_key):
        raise ConfigError("--listen tcp://... needs CURVE keys (curve_secret_key, curve_public_key)")
    if not config.curve_clients:
        raise ConfigError("--listen tcp://... needs at least one allowed client key (curve_clients)")


class _AllowList:
    """ZAP CURVE callback: only the configured client public keys get in."""

    def __init__(self, clients: tuple[str, ...]) -> None:
        self._keys = {k.encode() for k in clients}

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self._keys
