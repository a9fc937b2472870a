"""The loader daemon's doors: its pid file, its local socket (ipc, in a 0700 directory) and, only
when asked for, a TCP listener that admits nothing but the CURVE keys configured; each socket's
connections are tracked (`peers`) so that a session can end with its connection.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import zmq

from fastload._daemon.peers import ConnectionTracker
from fastload._errors import ConfigError, DaemonError
from fastload._loading.link import daemon_link as wire
from fastload._machine import pid_alive
from fastload._paths import remove_if_fallback

# TCP peers that vanish (cable, crash) are noticed by ZMTP heartbeats, then their sessions end.
_TCP_HEARTBEAT_MS, _TCP_HEARTBEAT_TIMEOUT_MS = 5_000, 30_000
# How long closing waits for replies still queued to peers that are alive (dead ones: not at all).
_LINGER_MS = 1000


class Listeners:
    """The daemon's sockets in `directory` (and on `listen`, a tcp://HOST:PORT, with CURVE)."""

    def __init__(
        self,
        directory: str,
        listen: str | None = None,
        curve_secret_key: str | None = None,
        curve_public_key: str | None = None,
        curve_clients: tuple[str, ...] = (),
    ) -> None:
        if listen:  # checked before anything is created that a refusal would leave behind
            check_tcp_config(curve_secret_key, curve_public_key, curve_clients)
        self.dir = directory
        self.pid_path = os.path.join(directory, "daemon.pid")
        self.sock_path = os.path.join(directory, "daemon.sock")
        self._claim_pidfile()
        self.ctx = zmq.Context()
        self.tcp: Any = None
        self.local: Any = None
        self._auth: Any = None
        self.trackers: dict[int, ConnectionTracker] = {}  # id(socket) -> its connections
        try:
            self.local = self.ctx.socket(zmq.ROUTER)
            self.local.setsockopt(zmq.LINGER, 0)
            self.local.setsockopt(zmq.ROUTER_HANDOVER, 1)
            self.local.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
            self.trackers[id(self.local)] = ConnectionTracker(self.local, local=True)
            old_umask = os.umask(0o077)
            try:
                self.local.bind(f"ipc://{self.sock_path}")
            finally:
                os.umask(old_umask)
            if listen:
                assert curve_secret_key and curve_public_key
                self.tcp = self._bind_tcp(listen, curve_secret_key, curve_public_key, curve_clients)
        except BaseException:
            self.close()
            raise

    @property
    def sockets(self) -> list[tuple[Any, bool]]:
        """(socket, is it the local one) for each socket clients reach."""
        return [(self.local, True)] + ([(self.tcp, False)] if self.tcp is not None else [])

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

    def _bind_tcp(self, listen: str, secret_key: str, public_key: str, clients: tuple[str, ...]) -> Any:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, wire.MAX_FRAME_BYTES)
        sock.setsockopt(zmq.HEARTBEAT_IVL, _TCP_HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _TCP_HEARTBEAT_TIMEOUT_MS)
        sock.curve_server = True
        sock.curve_secretkey = secret_key.encode()
        sock.curve_publickey = public_key.encode()
        sock.zap_domain = b"fastload"
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(self.ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="fastload", credentials_provider=_AllowList(clients))
        self.trackers[id(sock)] = ConnectionTracker(sock, local=False)
        try:
            sock.bind(listen)
        except zmq.ZMQError as e:
            sock.close(0)
            raise DaemonError(f"cannot listen on {listen}: {e}") from e
        return sock

    def close(self) -> None:
        """Close every socket, then remove the socket and pid files (and a fallback directory)."""
        for tracker in self.trackers.values():
            tracker.close()
        self.trackers.clear()
        for sock in (self.local, self.tcp):
            if sock is not None:
                # The last replies (a drain's final `done`s) are still queued: give them a moment.
                sock.close(linger=_LINGER_MS)
        self.local = self.tcp = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self.ctx.term()
        for path in (self.sock_path, self.pid_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        remove_if_fallback(self.dir)


def check_tcp_config(secret_key: str | None, public_key: str | None, clients: tuple[str, ...]) -> None:
    if not (secret_key and public_key):
        raise ConfigError("--listen tcp://... needs CURVE keys (curve_secret_key, curve_public_key)")
    if not clients:
        raise ConfigError("--listen tcp://... needs at least one allowed client key (curve_clients)")


class _AllowList:
    """ZAP CURVE callback: only the configured client public keys get in."""

    def __init__(self, clients: tuple[str, ...]) -> None:
        self._keys = {k.encode() for k in clients}

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self._keys
