"""Real parts for the object-storage tests: moto's S3-compatible server in its own process, an
HTTP server that honours Range requests, a TCP proxy in front of either that adds latency,
drops connections, answers 503 or stalls, and counts the ranges and paths asked for; and an HTTP
server that drips its answers."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """moto's standalone S3 server on a free loopback port; its endpoint URL. Stopped after."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's server did not start (exit {proc.poll()})")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Files of a directory, with `Range: bytes=a-b` answered 206; paths under /denied/ are 403;
    /moved/NAME redirects (302) to /NAME, /away/NAME to `away`/NAME (another server)."""

    away = ""

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        if self.path.startswith("/denied/"):
            self.send_error(403)
            return
        if self.path.startswith(("/moved/", "/away/")):
            there = self.away if self.path.startswith("/away/") else ""
            self.send_response(302)
            self.send_header("Location", there + "/" + self.path.split("/", 2)[2])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = Path(self.directory) / self.path.lstrip("/")  # type: ignore[attr-defined]
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if wanted:
            start = int(wanted.group(1))
            end = int(wanted.group(2)) + 1 if wanted.group(2) else len(data)
            body = data[start:end]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{int(path.stat().st_mtime_ns)}"')
        self.end_headers()
        if not head:
            self.wfile.write(body)


@contextlib.contextmanager
def range_http_server(directory: Path, away: str = "") -> Iterator[str]:
    """An HTTP server of `directory` on a loopback port, answering ranges (and redirecting
    /away/NAME to `away`/NAME); its base URL."""
    handling = type("Range", (_RangeHandler,), {"away": away})

    def handler(*args: object, **kwargs: object) -> _RangeHandler:
        return handling(*args, directory=str(directory), **kwargs)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _DripHandler(http.server.BaseHTTPRequestHandler):
    """Every path is an object of `size` bytes; a GET's answer comes one byte each `gap_s`."""

    size = 64
    gap_s = 0.5
    stop: threading.Event

    def log_message(self, *args: object) -> None:
        pass

    def _head(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(self.size))
        if status == 206:
            self.send_header("Content-Range", f"bytes 0-{self.size - 1}/{self.size}")
        self.send_header("ETag", '"drip-1"')
        self.end_headers()

    def do_HEAD(self) -> None:
        self._head(200)

    def do_GET(self) -> None:
        self._head(206)
        with contextlib.suppress(OSError):
            for _ in range(self.size):
                if self.stop.wait(self.gap_s):
                    return
                self.wfile.write(b"x")
                self.wfile.flush()


@contextlib.contextmanager
def drip_http_server(gap_s: float = 0.5) -> Iterator[str]:
    """An HTTP server whose answers come a byte each `gap_s` seconds (never stalling long enough
    for a read timeout); its base URL."""
    stop = threading.Event()
    handler = type("Drip", (_DripHandler,), {"gap_s": gap_s, "stop": stop})
    with _serving(handler) as url:
        try:
            yield url
        finally:
            stop.set()


@contextlib.contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


_UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class FaultProxy:
    """A TCP proxy to `upstream` (host, port). Each new connection takes the next action of
    `faults` ("pass" once they run out): "reset" (closed at once), "503" (the request answered
    503 and closed), "stall" (the request read, nothing answered for `stall_s`). `latency_s` is
    added before each request is passed on. `ranges` counts the `Range` headers passed on.
    `down()` takes the store away (every open connection cut, every new one reset) until `up()`."""

    def __init__(self, upstream: tuple[str, int], faults: list[str] | None = None, latency_s: float = 0.0,
                 stall_s: float = 5.0) -> None:
        self.upstream = upstream
        self.faults = list(faults or [])
        self.latency_s = latency_s
        self.stall_s = stall_s
        self.ranges: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()  # every request's path (and query)
        self.requests = 0
        self.faulted: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._down = False
        self._open: set[socket.socket] = set()  # connections passed on now, cut by `down`
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def down(self) -> None:
        """The store is gone: open connections are cut, new ones reset, until `up`."""
        with self._lock:
            self._down = True
            cut, self._open = list(self._open), set()
        for sock in cut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def up(self) -> None:
        """The store is back: new connections are passed on (or take the next of `faults`)."""
        with self._lock:
            self._down = False

    def close(self) -> None:
        self._stop.set()
        # Closing a socket does not wake a thread blocked in its accept() (Linux): shutting it down
        # does, so the accepting thread ends now rather than after the join's 5 s.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self._accepting.join(5)
        assert not self._accepting.is_alive(), "FaultProxy: the accepting thread did not end"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                action = "reset" if self._down else self.faults.pop(0) if self.faults else "pass"
            thread = threading.Thread(target=self._serve, args=(client, action), daemon=True)
            thread.start()

    def _serve(self, client: socket.socket, action: str) -> None:
        with client:
            if action != "pass":
                with self._lock:
                    self.faulted[action] += 1
            if action == "reset":
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                return
            if action in ("503", "stall"):
                with contextlib.suppress(OSError):
                    client.recv(65536)
                    if action == "stall":
                        self._stop.wait(self.stall_s)
                    else:
                        client.sendall(_UNAVAILABLE)
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                return
            with upstream:
                with self._lock:
                    if self._down:  # taken down between the accept and now
                        return
                    self._open.update((client, upstream))
                back = threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True)
                back.start()
                self._pipe(client, upstream, True)
                back.join(10)
            with self._lock:
                self._open.difference_update((client, upstream))

    def _pipe(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                if requests:
                    self._saw(data)
                    if self.latency_s:
                        time.sleep(self.latency_s)
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _saw(self, data: bytes) -> None:
        """Count the requests (and their ranges) in a piece of the client's stream."""
        for block in data.decode("latin-1").split("\r\n\r\n"):
            lines = block.split("\r\n")
            method = re.match(r"(GET|HEAD|PUT|POST) (\S+) HTTP/", lines[0])
            if not method:
                continue
            wanted = [ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.lower().startswith("range:")]
            with self._lock:
                self.requests += 1
                self.paths[method.group(2)] += 1
                if wanted:
                    self.ranges[f"{method.group(2)} {wanted[0]}"] += 1


def s3_environment(endpoint: str) -> dict[str, str]:
    """What a process needs to reach moto's server as S3 (any credentials are accepted)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
    }


def upload(endpoint: str, bucket: str, directory: Path, prefix: str) -> None:
    """Every file of `directory` to s3://bucket/prefix/NAME, through boto3 (made here, fork-free)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in _keys().items()})
    with contextlib.suppress(Exception):
        s3.create_bucket(Bucket=bucket)
    for path in sorted(directory.iterdir()):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")


def _keys() -> dict[str, str]:
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "REGION_NAME": "us-east-1"}


def env_without_remote_state() -> None:
    """Forget the filesystems this process made (they hold the endpoint they were made with)."""
    from fastload.sources._storage import node_cache as _node_cache
    from fastload.sources._storage import remote as _remote

    _remote._filesystems.clear()
    _remote._stores.clear()
    _node_cache._caches.clear()
    os.environ.pop("FASTLOAD_CACHE_LIMIT", None)


def list_objects(endpoint: str, bucket: str, prefix: str) -> dict[str, bytes]:
    """name (below `prefix`) -> bytes of every object under `prefix`."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, **{k.lower(): v for k, v in _keys().items()})
    found = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in found}
