"""Who is on the other end of the daemon's sockets, and when their connection ends.

A session belongs to the connection that said hello, and to the peer behind it as the kernel
or CURVE says it is, never as the hello claims: on the local socket the peer's pid and uid come
from SO_PEERCRED on the connection's file descriptor (ZMQ_SRCFD), over TCP the peer is its CURVE
public key (the ZAP User-Id). A monitor on each socket reports connections accepted and closed,
so a session ends when its connection does, even if the process behind it lives on.

NOTE [fd reuse]: the monitor names a connection by its file descriptor, and the kernel reuses
numbers. Events arrive in order (a connection's DISCONNECTED before the ACCEPTED of the next
connection on the same fd), and `identify` reads every pending event before it looks a message's
fd up, so a hello is bound to the connection it came on.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True)
class Peer:
    """The other end of one connection."""

    connection: int  # unique for the daemon's life; -1 when the connection is not known
    pid: int | None = None  # local socket: from the kernel
    uid: int | None = None
    key: str | None = None  # TCP: the CURVE public key (Z85)

    @property
    def name(self) -> str:
        """What limits and logs call this peer: its pid, or its key."""
        if self.pid is not None:
            return f"pid {self.pid}"
        if self.key is not None:
            return f"key {self.key[:12]}"
        return f"connection {self.connection}"


def peer_credentials(fd: int) -> tuple[int, int] | None:
    """(pid, uid) of the process at the other end of a Unix socket, or None if unknown."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:  # a duplicate: closing it leaves zmq's fd
            if sock.family != socket.AF_UNIX:
                return None
            pid, uid, _gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
    except (OSError, AttributeError):
        return None
    return (pid, uid) if pid > 0 else None


class ConnectionTracker:
    """Connections of one bound ZeroMQ socket, from its monitor events."""

    def __init__(self, sock: Any, local: bool) -> None:
        self.local = local
        self.monitor: Any = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        self._connection_of_fd: dict[int, int] = {}
        self._ids = itertools.count(1)
        self._closed: list[int] = []

    def pump(self) -> None:
        """Read every pending monitor event."""
        while True:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                self._connection_of_fd[fd] = next(self._ids)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                connection = self._connection_of_fd.pop(fd, None)
                if connection is not None:
                    self._closed.append(connection)

    def closed(self) -> list[int]:
        """Connections that ended since the last call."""
        self.pump()
        closed, self._closed = self._closed, []
        return closed

    def identify(self, frame: Any) -> Peer:
        """The peer that sent `frame` (a zmq.Frame received with copy=False)."""
        self.pump()
        try:
            fd = int(frame.get(zmq.SRCFD))
        except (zmq.ZMQError, TypeError, ValueError, AttributeError):
            return Peer(-1)
        connection = self._connection_of_fd.get(fd, -1)
        if not self.local:
            try:
                key = frame.get("User-Id")
            except zmq.ZMQError:
                key = None
            return Peer(connection, key=str(key) if key else None)
        credentials = peer_credentials(fd)
        if credentials is None:
            return Peer(connection)
        return Peer(connection, pid=credentials[0], uid=credentials[1])

    def close(self) -> None:
        self.monitor.close(0)
