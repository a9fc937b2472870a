"""The trainer's side of a daemon session: the executor interface, spoken over a socket.

A `DaemonSession` says hello with the loader's declarative configuration, attaches to the ring
the daemon made for it, and then behaves like the local `Engine` (`submit`, `poll`, `in_flight`,
`close`), so the epoch iterator, the ring and the delivery are the same code in both modes.
Every wait is bounded: when no reply comes, the daemon's liveness is checked (its pid for a local
socket, a ping for TCP) and a `DaemonError` says what happened instead of hanging. It tells a
daemon that reads them how much its trainer waits (`need_report`, NOTE [need reports]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from fastload._errors import DaemonError
from fastload._loading.jobs.executor import Event, Failure, Task
from fastload._loading.link import daemon_link as wire
from fastload._loading.link.daemon_addresses import no_daemon_at
from fastload._loading.link.need_report import NeedReport
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring import Ring
from fastload._machine import pid_alive
from fastload._shm import Segment

_BYE_LINGER_MS = 200  # how long `DaemonSession.close` lets its `bye` leave before it drops it

CONNECT_TIMEOUT_S = 5.0
_PING_EVERY_S = 1.0
_TCP_SILENCE_LIMIT_S = 10.0
_TCP_HEARTBEAT_MS, _TCP_HEARTBEAT_TIMEOUT_MS = 5_000, 30_000


@dataclass(frozen=True)
class Welcome:
    session: int
    daemon_pid: int
    slots: list[str]
    slot_bytes: int
    layout: BatchLayout
    num_samples: int
    classes: tuple[str, ...]
    workers: int


class DaemonSession:
    """One trainer's session with a loader daemon."""

    def __init__(self, address: str, hello: dict[str, Any], timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.address = address
        self._local = address.startswith("ipc://")
        if no_daemon_at(address):
            raise DaemonError(f"no fastload daemon is running at {address}: start one with `fastload serve`")
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if not self._local:
            _set_curve_client(self._sock)
            # Answered by ZeroMQ's I/O thread even while the trainer computes: the daemon keeps
            # the session as long as this connection lives.
            self._sock.setsockopt(zmq.HEARTBEAT_IVL, _TCP_HEARTBEAT_MS)
            self._sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _TCP_HEARTBEAT_TIMEOUT_MS)
        self._sock.connect(address)
        self._events: deque[Event] = deque()
        self._in_flight: set[int] = set()
        # Over TCP the daemon's slots are on another machine: the trainer keeps a ring of its own
        # (local slot name -> the daemon's slot it mirrors) and copies each batch's bytes into it.
        self._remote_slots: dict[str, str] = {}
        self._local_segments: dict[str, Segment] = {}
        self._rows: dict[int, tuple[str, int]] = {}  # seq -> (local slot, first row)
        self._last_heard = time.monotonic()
        self._last_ping = 0.0
        self._closed = False
        self._need = NeedReport(time.monotonic)
        try:
            self._send("hello", **hello)
            _op, fields = self._wait_for(("welcome",), timeout_s)
        except BaseException:
            self.close()
            raise
        self.welcome = Welcome(
            session=fields["session"],
            daemon_pid=fields["daemon_pid"],
            slots=[str(s) for s in fields["slots"]],
            slot_bytes=fields["slot_bytes"],
            layout=BatchLayout.from_json(fields["layout"]),
            num_samples=fields["num_samples"],
            classes=tuple(str(c) for c in fields["classes"]),
            workers=fields["workers"],
        )
        # NOTE [need reports]: does this daemon read them? Its answer comes among the batch events.
        self._send("status")

    def _send(self, op: str, *extra: bytes, **fields: Any) -> None:
        self._sock.send_multipart([wire.encode(op, **fields), *extra])

    def _receive(self, timeout_s: float) -> tuple[str, dict[str, Any]] | None:
        if not self._sock.poll(int(max(0.0, timeout_s) * 1000)):
            return None
        frames = self._sock.recv_multipart()
        self._last_heard = time.monotonic()
        op, fields = wire.decode(frames[0], wire.MAX_REPLY_HEADER_BYTES)
        if op == "error":
            raise DaemonError(f"the daemon at {self.address} refused: {fields['message']}")
        if op == "done" and not self._local:
            self._copy_in(fields, frames[1:])
        return op, fields

    def _copy_in(self, fields: dict[str, Any], payload: list[bytes]) -> None:
        """Write a remote batch's bytes (one frame per leaf, its rows only) into the local slot."""
        where = self._rows.pop(fields["seq"], None)
        if where is None:
            raise wire.WireError("a done message for a task this session did not send")
        name, row = where
        layout, count = self.welcome.layout, fields["count"]
        if len(payload) != len(layout.leaves) or count < 0 or row + count > layout.batch_size:
            raise wire.WireError("a remote batch does not match the session's layout")
        for array, leaf, frame in zip(
            layout.arrays(self._local_segments[name].buf), layout.leaves, payload, strict=True
        ):
            if len(frame) != count * leaf.nbytes:
                raise wire.WireError("a remote batch frame has the wrong size")
            array[row : row + count] = np.frombuffer(frame, dtype=array.dtype).reshape((count, *leaf.shape))

    def _wait_for(self, ops: tuple[str, ...], timeout_s: float) -> tuple[str, dict[str, Any]]:
        """Wait for a reply whose op is in `ops`, keeping batch events that arrive meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._receive(min(0.1, max(0.0, deadline - time.monotonic())))
            if message is None:
                self._check_alive()
                if time.monotonic() >= deadline:
                    raise DaemonError(
                        f"no answer from the fastload daemon at {self.address} within {timeout_s:g} s: "
                        "is it running (`fastload status`)?"
                    )
                continue
            if message[0] in ops:
                return message
            if message[0] == "indexing":  # the daemon is indexing our folder: it is alive, wait on
                deadline = max(deadline, time.monotonic() + timeout_s)
                continue
            self._keep(*message)

    def _keep(self, op: str, fields: dict[str, Any]) -> None:
        if op == "status_reply" and hasattr(self, "welcome"):
            self._need.enable_if_read(fields, self.welcome.session)
        if op not in ("done", "failed"):
            return
        event = wire.event_from_message(op, fields)
        self._in_flight.discard(event.seq)
        self._need.finished(event.seq)
        if isinstance(event, Failure) and not event.exc_class.startswith("builtins:"):
            # The daemon is a network peer: only a builtin exception type it names is re-raised
            # as such (NOTE [original exception types] in `_errors`).
            event = dataclasses.replace(event, exc_class="")
        self._events.append(event)

    def _check_alive(self) -> None:
        now = time.monotonic()
        if self._local:
            pid = getattr(self, "welcome", None)
            if pid is not None and not pid_alive(pid.daemon_pid):
                raise DaemonError(
                    f"the fastload daemon (pid {pid.daemon_pid}) is gone; restart it with `fastload serve` "
                    "and resume from your loader's last state_dict()"
                )
            return
        if now - self._last_heard > _TCP_SILENCE_LIMIT_S:
            raise DaemonError(f"the fastload daemon at {self.address} stopped answering")
        if now - self._last_ping > _PING_EVERY_S:
            self._last_ping = now
            self._send("ping")

    def attach_ring(self) -> Ring:
        """The session's ring: the daemon's, attached (it owns and unlinks it); over TCP, a local
        mirror of it that this process owns."""
        segments = [self._slot(name) for name in self.welcome.slots]
        return Ring(self.welcome.slot_bytes, len(segments), allocate=self._grow, initial=segments)

    def _slot(self, daemon_name: str) -> Segment:
        if self._local:
            return Segment.attach(daemon_name)
        segment = Segment.create(self.welcome.slot_bytes)
        self._remote_slots[segment.name] = daemon_name
        self._local_segments[segment.name] = segment
        return segment

    def _grow(self, slot_bytes: int) -> Segment:
        self._send("grow")
        _, fields = self._wait_for(("slot",), CONNECT_TIMEOUT_S)
        return self._slot(fields["name"])

    # -- the executor interface (fastload._loading.jobs.executor.RemoteExecutor) ---------------------------

    @property
    def workers(self) -> int:
        return self.welcome.workers

    @property
    def layout(self) -> BatchLayout:
        return self.welcome.layout

    @property
    def worker_pids(self) -> list[int]:
        return []

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def set_layout(self, layout: BatchLayout, job_id: int = 0) -> None:
        """The daemon fixed the layout in its welcome."""

    def submit(self, task: Task) -> None:
        self._in_flight.add(task.seq)
        self._need.sent(task.seq, task.slot_name)
        slot = task.slot_name
        if not self._local:
            self._rows[task.seq] = (slot, task.row)
            slot = self._remote_slots[slot]
        self._send(
            "task",
            task.indices.astype("<i8", copy=False).tobytes(),
            seq=task.seq,
            epoch=task.epoch,
            batch_index=task.batch_index,
            slot=slot,
            row=task.row,
        )

    def poll(self, timeout_s: float) -> list[Event]:
        deadline = time.monotonic() + timeout_s
        while not self._events:
            entered = time.monotonic()
            message = self._receive(min(0.1, max(0.0, deadline - entered)))
            self._need.waited(time.monotonic() - entered)  # only next() waits here (`need_report`)
            self._report_need()
            if message is not None:
                self._keep(*message)
                continue
            if self._in_flight:
                self._check_alive()
            if time.monotonic() >= deadline:
                break
        events = list(self._events)
        self._events.clear()
        self._report_need()
        return events

    def _report_need(self) -> None:
        fields = self._need.due()
        if fields is not None:
            self._send("need", **fields)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(zmq.ZMQError):
            self._send("bye")
        # A short linger lets the queued `bye` leave (with linger 0 it could be dropped, and the
        # daemon logged "its connection closed" instead); bounded, so a dead daemon costs no wait.
        self._sock.close(linger=_BYE_LINGER_MS)
        self._ctx.term()



def _set_curve_client(sock: zmq.Socket) -> None:  # type: ignore[type-arg]
    """CURVE keys for a TCP daemon: the server's public key and this client's key pair.

    Read from FASTLOAD_CURVE_SERVER_KEY, FASTLOAD_CURVE_PUBLIC_KEY and FASTLOAD_CURVE_SECRET_KEY
    (Z85 text, as `fastload keys` prints); a TCP daemon never accepts an unauthenticated client.
    """
    names = ("FASTLOAD_CURVE_SERVER_KEY", "FASTLOAD_CURVE_PUBLIC_KEY", "FASTLOAD_CURVE_SECRET_KEY")
    values = [os.environ.get(n, "") for n in names]
    if not all(values):
        raise DaemonError("a TCP daemon needs CURVE keys: set " + ", ".join(names) + " (see `fastload keys`)")
    sock.curve_serverkey = values[0].encode()
    sock.curve_publickey = values[1].encode()
    sock.curve_secretkey = values[2].encode()
