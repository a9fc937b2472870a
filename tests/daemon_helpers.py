"""Run `fastload serve` as a subprocess for the daemon tests, and talk to it raw.

`DaemonProcess` is one daemon: started on its own private (0700) socket directory, ready once it
answers `status` (so its worker processes exist), stopped with SIGTERM (SIGKILL if it does not
exit). `DaemonPool` starts daemons for one test or module and, at teardown, also after a failed
test, stops every one still running and checks that none left a process or a segment behind.
`ConfinedTcpDaemon` is one CURVE daemon with a dataset root per test, shared by a module's tests
that only send it hellos (a daemon start costs ~1.7 s of CPU, mostly importing torch); a test
that kills, pauses or configures its daemon starts its own. `refused_serve` runs a configuration
`fastload serve` must refuse through the command line's `main` in a forked child (no fresh
interpreter to import torch into).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import torch
import zmq
from helpers import fastload_segments, pid_alive, unlink_segments, wait_until

from fastload import FastLoader
from fastload import transforms as T
from fastload._daemon.control import request
from fastload._loading.link import daemon_link as wire

# Hang guards, not speed limits: a daemon starts in about a second and stops at once, but on a
# machine busy with other work (and importing torch in a fresh process) either can take many times
# that. Only a daemon that never answers or never exits should fail a test.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0
# sun_path is 108 bytes; zmq refuses longer ipc paths.
_MAX_IPC_PATH = 100


class DaemonProcess:
    """One `fastload serve` subprocess with its socket directory and log file."""

    def __init__(self, proc: subprocess.Popen[bytes], socket_dir: Path, log_path: Path) -> None:
        self.proc = proc
        self.socket_dir = socket_dir
        self.log_path = log_path
        self.worker_pids: list[int] = []
        self.killed = False  # SIGKILLed on purpose by the test: it could not clean up

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def sock_path(self) -> Path:
        return self.socket_dir / "daemon.sock"

    @property
    def pid_path(self) -> Path:
        return self.socket_dir / "daemon.pid"

    @property
    def address(self) -> str:
        return f"ipc://{self.sock_path}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def status(self, timeout_s: float = REPLY_TIMEOUT_S) -> dict[str, Any]:
        return request(self.address, "status", timeout_s)

    def sessions(self) -> list[dict[str, Any]]:
        return list(self.status()["sessions"])

    def segments(self) -> set[str]:
        """Its segments in /dev/shm (rings and dataset indexes, all named after its pid)."""
        return fastload_segments(self.pid)

    def signal_workers(self, signum: int) -> None:
        for pid in self.worker_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait; SIGKILL when it does not exit in time. Returns its exit status."""
        if self.proc.poll() is None:
            self.signal_workers(signal.SIGCONT)  # a test may have paused them
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"daemon pid {self.pid} ignored SIGTERM for {timeout_s:g} s; log:\n{self.log()}"
                ) from None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, and reap it at once (an unreaped zombie still looks alive to kill(pid, 0))."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(STOP_TIMEOUT_S)

    def workers_gone(self, timeout_s: float = REPLY_TIMEOUT_S) -> bool:
        """Its worker processes exit by themselves once it is gone (they poll their parent every
        second); True as soon as they have, False if they outlive it by `timeout_s`."""
        return wait_until(lambda: not any(pid_alive(p) for p in self.worker_pids), timeout_s)


def serve_command(
    socket_dir: Path, *, workers: int = 2, budget: str = "64MiB", extra: Sequence[str] = ()
) -> list[str]:
    return [
        sys.executable, "-m", "fastload", "serve", "--workers", str(workers),
        "--socket-dir", str(socket_dir), "--memory-budget", budget, *extra,
    ]


def private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    assert len(str(path / "daemon.sock")) < _MAX_IPC_PATH, f"socket path too long for ipc: {path}"
    return path


def start_daemon(
    socket_dir: Path,
    *,
    workers: int = 2,
    budget: str = "64MiB",
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> DaemonProcess:
    """Start a daemon on `socket_dir` (made 0700) and wait until it answers `status`: its
    readiness signal, sent once its workers exist. Fails with its log if it exits first, or if it
    has not answered within START_TIMEOUT_S (a hang). `cwd`: its working directory (PYTHONPATH
    made absolute, so that it still imports this checkout)."""
    private_dir(socket_dir)
    log_path = socket_dir.parent / f"daemon-{socket_dir.name}-{time.monotonic_ns()}.log"
    if cwd is not None:
        env = dict(os.environ if env is None else env)
        paths = env.get("PYTHONPATH", "").split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in paths if p)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            serve_command(socket_dir, workers=workers, budget=budget, extra=extra),
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
        )
    daemon = DaemonProcess(proc, socket_dir, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {proc.returncode} while starting:\n{daemon.log()}")
        if daemon.sock_path.exists():
            with contextlib.suppress(Exception):
                if daemon.status(timeout_s=1.0)["pid"] == proc.pid:
                    break
        if time.monotonic() > deadline:
            daemon.kill()
            raise AssertionError(f"the daemon did not answer within {START_TIMEOUT_S:g} s:\n{daemon.log()}")
        time.sleep(0.05)
    daemon.worker_pids = _worker_pids(proc.pid, workers)
    return daemon


def _helper_process(process: psutil.Process) -> bool:
    """The fork server a daemon opens sources from, and its resource tracker: not workers."""
    with contextlib.suppress(psutil.Error):
        command = " ".join(process.cmdline())
        return "multiprocessing.forkserver" in command or "multiprocessing.resource_tracker" in command
    return False


def _worker_pids(daemon_pid: int, workers: int) -> list[int]:
    """The daemon's worker processes: its children but its helpers. A helper (fork server, resource
    tracker) is a fork that then execs a fresh interpreter: until it has, it carries the daemon's
    command line and looks like a worker, so the count is read until it settles at `workers`."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        found = [c.pid for c in psutil.Process(daemon_pid).children() if not _helper_process(c)]
        if len(found) == workers or time.monotonic() > deadline:
            assert len(found) == workers, found
            return found
        time.sleep(0.05)


def opening_children(daemon: DaemonProcess) -> list[int]:
    """The processes opening a source for `daemon` now (children of its fork server)."""
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(daemon.pid).children():
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                found += [c.pid for c in child.children()]
    return found


class DaemonPool:
    """The daemons one test (or module) started; `close` stops them and checks for leaks."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.daemons: list[DaemonProcess] = []

    def start(self, socket_dir: Path | None = None, **kwargs: Any) -> DaemonProcess:
        socket_dir = socket_dir or self.base / f"s{len(self.daemons)}"
        daemon = start_daemon(socket_dir, **kwargs)
        self.daemons.append(daemon)
        return daemon

    def close(self) -> list[str]:
        """Stop every daemon; return what was left behind (and clean it up)."""
        problems: list[str] = []
        for daemon in self.daemons:
            was_running = daemon.proc.poll() is None
            try:
                code = daemon.terminate()
            except AssertionError as e:
                problems.append(str(e))
                continue
            if was_running and code != 0:
                problems.append(f"daemon pid {daemon.pid} exited with {code} on SIGTERM:\n{daemon.log()}")
            if not daemon.workers_gone():
                problems.append(f"daemon pid {daemon.pid}: workers still alive: {daemon.worker_pids}")
                for pid in daemon.worker_pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            left = daemon.segments()
            if left:
                # A daemon the test SIGKILLed cannot clean up (the next one reaps); any other must.
                if not daemon.killed:
                    problems.append(f"daemon pid {daemon.pid} left segments in /dev/shm: {sorted(left)}")
                unlink_segments(left)
            if not daemon.killed:
                for path in (daemon.sock_path, daemon.pid_path):
                    if path.exists() and not _owned_by_a_live_daemon(path, self.daemons):
                        problems.append(f"daemon pid {daemon.pid} left {path}")
        return problems


def _owned_by_a_live_daemon(path: Path, daemons: list[DaemonProcess]) -> bool:
    """A later daemon on the same directory owns the socket and pid file now."""
    return any(d.socket_dir == path.parent and d.proc.poll() is None for d in daemons)


# Batches


RESIZE = [T.Resize((24, 24))]  # deterministic: a sample's pixels identify it
AUGMENT = [T.RandomResizedCrop(24, scale=(0.3, 1.0)), T.RandomHorizontalFlip()]

Batches = list[list[torch.Tensor]]


def take(loader: FastLoader) -> Batches:
    """One epoch, every batch copied (a batch's memory is reused once the next is taken)."""
    return [[t.clone() for t in batch] for batch in loader]


def assert_resumes_after_two(make: Callable[..., FastLoader], full: Batches) -> None:
    """A loader from `make()` stopped after two batches, its state loaded into `make(seed=99)` (the
    state's seed wins), gives the rest of the epoch `full`."""
    with make() as saver:
        it = iter(saver)
        next(it), next(it)
        state = saver.state_dict()
    with make(seed=99) as restored:
        restored.load_state_dict(state)
        assert_same_batches(take(restored), full[2:])


def assert_same_batches(got: Batches, expected: Batches) -> None:
    assert len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a[0].dtype == b[0].dtype and a[0].shape == b[0].shape, k
        assert torch.equal(a[0], b[0]), f"batch {k}: images differ"
        assert torch.equal(a[1], b[1]), f"batch {k}: labels differ"


def local_epoch(folder: Path, **kwargs: Any) -> Batches:
    """What the same loader yields in local mode (inline: no processes to start)."""
    with FastLoader(folder, **{"device": "cpu", **kwargs, "num_workers": 0}) as loader:
        return take(loader)


# Raw protocol


class RawClient:
    """A bare DEALER on the daemon's socket: send any frames, read one reply."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def reply(self, timeout_s: float = REPLY_TIMEOUT_S) -> tuple[str, dict[str, Any]] | None:
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        return wire.decode(self.sock.recv_multipart()[0])

    def call(self, *frames: bytes, timeout_s: float = REPLY_TIMEOUT_S) -> tuple[str, dict[str, Any]] | None:
        self.send(*frames)
        return self.reply(timeout_s)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def hello_fields(folder: Path, /, **overrides: Any) -> dict[str, Any]:
    """A valid hello (24x24 images, batches of 4) with some fields replaced."""
    fields: dict[str, Any] = {
        "dataset": str(folder),
        "transforms": [{"type": "Resize", "size": [24, 24]}],
        "backend": "native",
        "seed": 1,
        "batch_size": 4,
        "prefetch": 2,
        "pid": os.getpid(),
        "rank": 0,
        "world_size": 1,
    }
    fields.update(overrides)
    return fields


def answer(
    client: RawClient, *frames: bytes, timeout_s: float = REPLY_TIMEOUT_S
) -> tuple[str, dict[str, Any]] | None:
    """The reply to a message past any `indexing` notes: a hello whose source is opened (in a
    child process: a second or more on a busy machine) is told `indexing` before its answer."""
    reply = client.call(*frames, timeout_s=timeout_s)
    while reply is not None and reply[0] == "indexing":
        reply = client.reply(timeout_s)
    return reply


def hello_reply(
    client: RawClient, fields: dict[str, Any], timeout_s: float = REPLY_TIMEOUT_S
) -> tuple[str, dict[str, Any]]:
    """Send a hello and return its answer (`welcome` or `error`), past the `indexing` notes; a
    welcome is followed by `bye`, so the session ends at once."""
    client.send(wire.encode("hello", **fields))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = client.reply(timeout_s=max(0.01, deadline - time.monotonic()))
        if reply is None:
            break
        if reply[0] != "indexing":
            if reply[0] == "welcome":
                client.send(wire.encode("bye"))
            return reply
    raise AssertionError(f"no answer to a hello within {timeout_s:g} s")


def curve_client(port: int, server_public: bytes, keys: tuple[bytes, bytes]) -> RawClient:
    """A RawClient over TCP with CURVE, as an allowed remote trainer."""
    client = RawClient.__new__(RawClient)
    client.ctx = zmq.Context()
    client.sock = client.ctx.socket(zmq.DEALER)
    client.sock.setsockopt(zmq.LINGER, 0)
    client.sock.curve_serverkey = server_public
    client.sock.curve_publickey, client.sock.curve_secretkey = keys
    client.sock.connect(f"tcp://127.0.0.1:{port}")
    return client


# A confined TCP daemon shared by a module's tests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_tcp_daemon(
    pool: DaemonPool, base: Path, *, workers: int = 1, cwd: Path | None = None, **settings: Any
) -> tuple[DaemonProcess, Callable[[], RawClient]]:
    """A daemon on a free loopback TCP port with CURVE, its `[daemon]` table written to
    `base/tcp.toml` with `settings` (roots, caches, limits); (the daemon, a function that makes a
    client holding its one allowed key)."""
    server_public, server_secret = zmq.curve_keypair()
    keys = zmq.curve_keypair()
    port = free_port()
    table = {
        "curve_public_key": server_public.decode(),
        "curve_secret_key": server_secret.decode(),
        "curve_clients": [keys[0].decode()],
        **settings,
    }
    config = base / "tcp.toml"
    config.write_text("[daemon]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    daemon = pool.start(
        base / "sock", workers=workers, cwd=cwd,
        extra=["--listen", f"tcp://127.0.0.1:{port}", "--config", str(config)],
    )
    return daemon, lambda: curve_client(port, server_public, keys)


class ConfinedTcpDaemon:
    """One daemon (1 worker) on loopback TCP with CURVE, confined to `rooms` dataset roots, for the
    tests of a module that only send it hellos and tasks (a daemon start costs seconds of CPU:
    `fastload serve` imports torch). Each test takes a room of its own (`room()`): a fresh
    directory whose `root_name` subdirectory is one of the daemon's roots and whose other entries
    are outside every root, as a per-test daemon confined to that subdirectory would see them.
    `cwd`: the daemon's working directory. A test that kills or configures a daemon starts its own."""

    def __init__(
        self, pool: DaemonPool, base: Path, *, rooms: int, root_name: str = "root", cwd: Path | None = None
    ) -> None:
        self.cwd = cwd
        self._rooms = [base / f"room{k}" for k in range(rooms)]
        self._root_name = root_name
        for room in self._rooms:
            (room / root_name).mkdir(parents=True)
        roots = [str(room / root_name) for room in self._rooms]
        self.daemon, self.client = start_tcp_daemon(pool, base, cwd=cwd, roots=roots)

    def room(self) -> Path:
        """A directory of the test's own; `room / root_name` is a (still empty) root of the daemon."""
        if not self._rooms:
            raise AssertionError("ConfinedTcpDaemon: more tests than rooms; raise `rooms`")
        return self._rooms.pop(0)



@contextlib.contextmanager
def confined_tcp_daemon(base: Path, **kwargs: Any) -> Iterator[ConfinedTcpDaemon]:
    """A ConfinedTcpDaemon, stopped and checked for leaks after the module (for a module-scoped
    fixture: `with confined_tcp_daemon(tmp_path_factory.mktemp("tcp"), rooms=N) as shared: yield shared`)."""
    pool = DaemonPool(base)
    try:
        yield ConfinedTcpDaemon(pool, base, **kwargs)
    finally:
        problems = pool.close()
    if problems:
        raise AssertionError("\n".join(problems))


def refused_serve(command: Sequence[str], timeout_s: float = START_TIMEOUT_S) -> tuple[int, str]:
    """Run a `serve_command(...)` as the command line does (`fastload.__main__.main`), in a child
    forked from this test process, for a configuration the daemon must refuse before it starts:
    (its exit status, its stderr). A fresh `python -m fastload serve` spends ~1.7 s of CPU on
    imports (torch) before it reads its configuration; the fork has them already. A child still
    running at `timeout_s` (a daemon that started instead of refusing) is killed: status -9."""
    assert list(command[1:4]) == ["-m", "fastload", "serve"], command
    with tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 70
            try:
                os.dup2(err.fileno(), 2)
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                # pytest's capture stands in for sys.stdout/stderr: write to the descriptors instead.
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                from fastload.__main__ import main

                code = main(list(command[3:]))
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(BaseException):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        deadline = time.monotonic() + timeout_s
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                code = -signal.SIGKILL
                break
            time.sleep(0.01)
        err.seek(0)
        return code, err.read().decode(errors="replace")
