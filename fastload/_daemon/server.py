"""`fastload serve`: one decode pool per machine, shared by every trainer that attaches.

The daemon runs the same `Engine` a local loader runs; what it adds is sessions. A session is one
trainer: its declarative configuration (dataset folder, transforms, backend, seed) becomes a job
the workers build for themselves, and its ring is made by the daemon, counted against the memory
budget, and unlinked when the session ends — by `bye`, or within a second of its trainer dying.
The trainer plans its own batches (the same code as local mode, so the same batches bit for bit)
and sends tasks naming one of its slots; the daemon validates them, queues them per session and
feeds the pool by each session's share (`shares`: priority x how much its trainer waits, with a
floor), so a busy trainer cannot starve another and a starving one gets more.

Its rooms: `config` (what it runs with), `admission` (hellos, the index they wait for, opening a
session and its ring within the budget), `sessions` (a session's record), `scheduler` (feeding
the pool) with `shares` (the share policy), `listeners` and `peers` (the doors and who is at
them); this module is the loop.

Loop: poll the client sockets, their connection monitors and the workers' socket; on
SIGTERM/SIGINT stop accepting sessions, finish the tasks in flight, then exit, unlinking every
segment and the socket. Nothing a client or a worker does may end the loop: a worker's death is
the engine's to repair, a folder is indexed on a background thread (`indexes`), and an error
while handling one message is logged and answered, never raised.
Security: the ipc socket is in a 0700 directory; a TCP listener exists only when asked for, and
then requires CURVE; every message is validated (`daemon_link`), frames past the largest legal one drop
the connection (ZMQ_MAXMSGSIZE), and malformed ones get an error reply. A session is bound to its
connection and to the peer the kernel (SO_PEERCRED) or CURVE names (`peers`): it ends when the
connection closes or that process dies, and each peer may hold only a few sessions.
A TCP session's batches cannot be mapped by its trainer: each `done` carries the batch's rows as
zero-copy views of the slot.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import replace
from typing import Any

import zmq

from fastload._daemon.admission import Admission, internal_error
from fastload._daemon.config import DaemonConfig, use_cache_settings
from fastload._daemon.confine import check_roots
from fastload._daemon.indexes import DatasetIndexes, IndexEntry
from fastload._daemon.listeners import Listeners
from fastload._daemon.logs import event as log_event
from fastload._daemon.plugins import import_plugins
from fastload._daemon.pool_tuning import PoolTuner
from fastload._daemon.scheduler import Scheduler
from fastload._daemon.sessions import Session, batch_frames, check_need, peer_view, status_row
from fastload._errors import DaemonError, FastloadError, WorkerError
from fastload._labels import label
from fastload._loading.jobs.executor import Done, Event, Failure
from fastload._loading.link import daemon_link as wire
from fastload._loading.running.engine import Engine
from fastload._machine import pid_alive
from fastload._paths import private_dir, reap_engine_dirs, runtime_dir
from fastload._shm import reap_orphans
from fastload._sizes import format_size

log = logging.getLogger("fastload.daemon")

_POLL_MS = 100
_LIVENESS_S = 1.0
_DRAIN_LIMIT_S = 30.0
_PUBLISH_EVERY_S = 0.1  # NOTE [published status]
# The largest message a worker sends (DONE, FAILED with a clipped traceback, READY).
_MAX_WORKER_MESSAGE_BYTES = 1 << 20


class Daemon:
    """The loader daemon; `serve_forever` until SIGTERM/SIGINT or a local `stop`."""

    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        check_roots(config.listen, config.roots)  # before anything a refusal would leave behind
        import_plugins(config.plugins)  # before the workers fork: they inherit what it declares
        use_cache_settings(config)
        directory = private_dir(config.socket_dir) if config.socket_dir else runtime_dir()
        self._doors = Listeners(
            directory, config.listen, config.curve_secret_key, config.curve_public_key, config.curve_clients
        )
        self.dir, self.sock_path, self.pid_path = directory, self._doors.sock_path, self._doors.pid_path
        try:
            reap_orphans()
            reap_engine_dirs()
            self.engine = Engine(
                {},
                num_workers=config.workers,
                mp_context="fork",
                worker_init_fn=None,
                hang_timeout_s=config.hang_timeout_s,
                max_message_bytes=_MAX_WORKER_MESSAGE_BYTES,
                close_inherited_sockets=True,
            )
        except BaseException:
            self._doors.close()
            raise
        self._sessions: dict[int, Session] = {}
        self._by_identity: dict[tuple[int, bytes], Session] = {}
        self._indexes = DatasetIndexes(config.index, config.index_idle_s, config.roots, config.plugins)
        self._scheduler = Scheduler(self.engine, config.workers)
        self._pool = PoolTuner(config.workers) if config.tune_workers else None
        self._stopping = False
        self._last_liveness = 0.0
        # Every session's counters, summed as they come and kept past the session's end; refusals
        # are hellos refused.
        self._totals = dict.fromkeys(
            ("samples", "tasks", "bytes_read", "failures", "sessions", "refusals"), 0
        )
        self._admission = Admission(
            config, self.engine, self._indexes, self._sessions, self._by_identity, self._totals,
            self._reply, self._refused, lambda: self._stopping,
        )
        # NOTE [published status]: what the metrics thread reads. The loop replaces it whole at most
        # every _PUBLISH_EVERY_S (an assignment: no lock); a scrape never asks the loop for anything.
        self._published: dict[str, Any] | None = None
        self._published_at = 0.0
        self._metrics: Any = None
        if config.metrics is not None:
            from fastload._diagnostics.metrics import DaemonCollector, MetricsServer

            try:
                self._metrics = MetricsServer(*config.metrics, DaemonCollector(lambda: self._published))
            except BaseException:
                self.engine.close()
                self._doors.close()
                raise
            self._publish()

    # -- lifecycle ---------------------------------------------------------------------------

    def request_stop(self, *_: Any) -> None:
        """Stop accepting sessions; finish what is in flight; then `serve_forever` returns."""
        if not self._stopping:
            log.info("stopping: no new sessions, finishing %d tasks in flight", self.engine.in_flight)
        self._stopping = True

    def serve_forever(self) -> None:
        previous = {s: signal.signal(s, self.request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        log.info(
            "serving on %s (%d workers%s, budget %s%s)",
            self.sock_path,
            self.config.workers,
            ", sized by need: NOTE [a pool that follows need]" if self._pool is not None else "",
            format_size(self.config.memory_budget_bytes),
            f", metrics on {self._metrics.url}" if self._metrics is not None else "",
            extra=log_event(
                "serving", socket=self.sock_path, workers=self.config.workers,
                budget_bytes=self.config.memory_budget_bytes, metrics=self.metrics_url,
            ),
        )
        poller = zmq.Poller()
        for sock in [self.engine.socket, *(sock for sock, _ in self._doors.sockets)]:
            poller.register(sock, zmq.POLLIN)
        for tracker in self._doors.trackers.values():
            poller.register(tracker.monitor, zmq.POLLIN)
        drain_deadline: float | None = None
        try:
            while True:
                ready = dict(poller.poll(_POLL_MS))
                try:
                    self._turn(ready)
                except WorkerError:
                    raise  # workers cannot even start: nothing to serve with
                except Exception:  # a bug must not take every session down with the daemon
                    log.exception("error in the daemon's loop; carrying on")
                if self._stopping:
                    drain_deadline = drain_deadline or time.monotonic() + _DRAIN_LIMIT_S
                    if self.engine.in_flight == 0 or time.monotonic() > drain_deadline:
                        return
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.close()

    def _turn(self, ready: dict[Any, int]) -> None:
        """One turn of the loop: clients, connections, workers, supervision, scheduling."""
        for sock, local in self._doors.sockets:
            if sock in ready:
                self._read_clients(sock, local)
        self._end_closed_connections()
        self._on_events(self.engine.drain() if self.engine.socket in ready else [])
        self._admission.resume()
        if time.monotonic() - self._last_liveness >= _LIVENESS_S:
            self._last_liveness = time.monotonic()
            self.engine.supervise()
            self._reap_dead_sessions()
            self._indexes.evict()
        if self._pool is not None and not self._stopping:
            resized = self._pool.tick(self.engine, self._sessions.values())
            if resized is not None:
                self._scheduler.set_workers(resized)
        self._schedule()
        if self._metrics is not None and time.monotonic() - self._published_at >= _PUBLISH_EVERY_S:
            self._publish()

    def _publish(self) -> None:
        self._published = self.status()
        self._published_at = time.monotonic()

    @property
    def metrics_url(self) -> str | None:
        """Where the Prometheus metrics are served (None: not asked for)."""
        return self._metrics.url if self._metrics is not None else None

    def close(self) -> None:
        """Stop the workers, unlink every ring and index, remove the socket and the pid file."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        self.engine.close()
        for session in list(self._sessions.values()):
            self._end_session(session, notify_engine=False)
        self._admission.pending.clear()
        self._indexes.close()
        self._doors.close()

    # -- client messages ---------------------------------------------------------------------

    def _read_clients(self, sock: Any, local: bool) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = frames[0].bytes
            op = ""
            try:
                if len(frames) < 2:
                    raise wire.WireError("empty message")
                op, fields = wire.decode(frames[1].bytes)
                self._handle(sock, identity, local, op, fields, frames[1:])
            except FastloadError as e:
                if op == "hello":  # a session refused (other requests' errors are answers, not events)
                    self._refused(str(e), local, peer=None, request=op)
                self._reply(sock, identity, "error", message=str(e))
            except Exception as e:  # a bug must not take the daemon down with every session
                log.exception("error while handling a client message")
                self._reply(sock, identity, "error", message=internal_error(e, local))

    def _reply(self, sock: Any, identity: bytes, op: str, *extra: Any, **fields: Any) -> None:
        # copy=False: a TCP batch's frames are views of its slot; pyzmq copies small frames anyway.
        with contextlib.suppress(zmq.ZMQError):
            sock.send_multipart([identity, wire.encode(op, **fields), *extra], copy=not extra)

    def _handle(
        self, sock: Any, identity: bytes, local: bool, op: str, fields: dict[str, Any], frames: list[Any]
    ) -> None:
        session = self._by_identity.get((id(sock), identity))
        if op != "task" and len(frames) > 1:
            raise wire.WireError(f"{op} takes no frames after its header, got {len(frames) - 1}")
        extra = [f.bytes for f in frames[1:]]
        if op == "hello":
            if session is not None or (id(sock), identity) in self._admission.pending:
                raise wire.WireError("this connection already has a session")
            peer = self._doors.trackers[id(sock)].identify(frames[0])
            self._admission.hello(sock, identity, local, fields, peer)
        elif op == "task":
            if session is None:
                raise wire.WireError("task before hello")
            self._task(session, fields, extra)
        elif op == "grow":
            if session is None:
                raise wire.WireError("grow before hello")
            self._reply(sock, identity, "slot", name=self._admission.new_slot(session).name)
        elif op == "need":  # NOTE [need reports]: no reply
            if session is None:
                raise wire.WireError("need before hello")
            check_need(session, fields)
        elif op == "ping":
            self._reply(sock, identity, "pong")
        elif op == "bye":
            self._admission.forget([(id(sock), identity)])
            if session is not None:
                self._end_session(session)
        elif op == "status":  # NOTE [what a TCP peer sees]
            key = None if local else self._doors.trackers[id(sock)].identify(frames[0]).key
            status = self.status() if local else peer_view(self.status(), self._sessions.values(), key)
            self._reply(sock, identity, "status_reply", **status)
        elif op == "stop":
            if not local:
                raise wire.WireError("stop is only accepted on the local socket")
            self.request_stop()
            self._reply(sock, identity, "pong")
        else:
            raise wire.WireError(f"{op} is not a request")

    def _task(self, session: Session, f: dict[str, Any], extra: list[bytes]) -> None:
        if self._stopping:
            # That task alone fails, not the session: a trainer decoding its next epoch ahead
            # (NOTE [no drain]) still gets the batches already in flight of the epoch it is in.
            refused = Failure(
                -1, "the daemon is shutting down and refused this batch: start one again (`fastload "
                "serve`) and resume from the last state_dict()", "", -1,
                DaemonError.__name__, "", f"{DaemonError.__module__}:{DaemonError.__qualname__}",
            )
            op, fields = wire.event_message(refused, f["seq"])
            self._reply(session.sock, session.identity, op, **fields)
            return
        self._scheduler.accept(session, f, extra)
        if session.read_ahead is not None:  # NOTE [read-ahead]: the trainer's tasks are its plan
            session.read_ahead.ask(session.pending[-1].indices)

    def warm(self, path: str) -> IndexEntry:
        """Index a dataset now (at start-up) and keep it, so that its sessions start fast."""
        return self._admission.warm(path)

    # -- scheduling and results --------------------------------------------------------------

    def _schedule(self) -> None:
        self._scheduler.feed(list(self._sessions.values()))
        self._on_events(self.engine.drain())  # dispatches what was just submitted

    def _on_events(self, events: list[Event]) -> None:
        for session, event, client_seq in self._scheduler.trace(events):
            rows = session.task_rows.pop(event.seq, None)
            frames: Any = ()
            if session.read_ahead is not None:
                fetched = session.read_ahead.delivered()
                if fetched and isinstance(event, Done):  # the trainer's iostat counts what was fetched
                    counted = replace(event.counters, net_bytes=event.counters.net_bytes + fetched)
                    event = replace(event, counters=counted)
            session.record(event)
            self._count(event)
            if self._pool is not None and isinstance(event, Done):
                self._pool.record(event)
            if isinstance(event, Done) and rows is not None:  # over TCP: the batch's bytes go with it
                frames = batch_frames(session, rows, event.count)
            op, fields = wire.event_message(event, client_seq)
            self._reply(session.sock, session.identity, op, *frames, **fields)

    def _end_closed_connections(self) -> None:
        """End the sessions (and forget the waiting hellos) of connections that closed."""
        for sock_id, tracker in self._doors.trackers.items():
            closed = set(tracker.closed())
            if not closed:
                continue
            for session in list(self._sessions.values()):
                if id(session.sock) == sock_id and session.connection in closed:
                    self._end_session(session, why="its connection closed")
            pending = self._admission.pending
            self._admission.forget(
                [w for w, h in pending.items() if id(h.sock) == sock_id and h.peer.connection in closed]
            )

    def _reap_dead_sessions(self) -> None:
        for session in list(self._sessions.values()):
            if session.local and not pid_alive(session.pid):
                self._end_session(session, why=f"trainer pid {session.pid} is gone")

    def _end_session(self, session: Session, notify_engine: bool = True, why: str = "bye") -> None:
        if self._sessions.pop(session.id, None) is None:
            return
        why = why if notify_engine else "the daemon stopped"
        log.info(
            "session %d ended (%s): %d images in %d tasks, %.1f s",
            session.id, why, session.images, session.tasks, time.monotonic() - session.started,
            extra=log_event(
                "session_end", session=session.id, reason=why, pid=session.pid, rank=session.rank,
                images=session.images, tasks=session.tasks, failures=session.failures,
                seconds=round(time.monotonic() - session.started, 3),
            ),
        )
        self._by_identity.pop((id(session.sock), session.identity), None)
        self._scheduler.forget(session)
        if session.read_ahead is not None:
            session.read_ahead.stop()
        if notify_engine:
            self.engine.drop_job(session.id)
        for segment in session.segments.values():
            segment.close()
        session.segments.clear()
        self._indexes.release(session.index_key)

    def _count(self, event: Done | Failure) -> None:
        """The daemon's totals, which outlive sessions (the metrics' counters must never fall)."""
        if isinstance(event, Done):
            self._totals["samples"] += event.count
            self._totals["tasks"] += 1
            self._totals["bytes_read"] += event.counters.bytes_read
        else:
            self._totals["failures"] += 1

    def _refused(self, message: str, local: bool, peer: str | None, request: str) -> None:
        self._totals["refusals"] += 1
        message = label(message, limit=1000)  # it may quote the hello (NOTE [one record, one line])
        log.info(
            "refused %s%s: %s", request, f" from {peer}" if peer else "", message,
            extra=log_event("refusal", request=request, peer=peer, local=local, reason=message),
        )

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        sessions = list(self._sessions.values())
        shares = self._scheduler.pool_shares(sessions)
        return {
            "pid": os.getpid(),
            "workers": self.engine.active_workers,
            "budget_bytes": self.config.memory_budget_bytes,
            "used_bytes": self._admission.used_bytes(),
            "draining": self._stopping,
            "metrics": self.metrics_url,
            "totals": dict(self._totals),
            "datasets": self._indexes.describe(),
            "worker_deaths": {cause.name.lower(): n for cause, n in self.engine.deaths.items()},
            "sessions": [status_row(s, now, shares.get(s.id, 0.0)) for s in sessions],
        }

