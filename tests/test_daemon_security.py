"""The daemon's attack surface: who can reach it, what it exposes, what it does with hostile input.

Protects: the socket lives in a 0700 directory (a socket directory others can enter is refused)
and other users cannot connect; ring segments are 0600 files with 128-bit random names; without
--listen there is no TCP socket at all, and --listen without CURVE keys refuses to start (leaving
nothing behind) while with them only allowed keys are answered; and hundreds of malformed or
hostile messages each get an `error` reply while the daemon keeps serving correct batches.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
import zmq
from daemon_helpers import (
    RESIZE,
    DaemonPool,
    DaemonProcess,
    RawClient,
    answer,
    assert_same_batches,
    hello_fields,
    local_epoch,
    refused_serve,
    serve_command,
    take,
)
from helpers import wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastload import DaemonError, FastLoader
from fastload import transforms as T
from fastload._loading.link import daemon_link as wire
from fastload._loading.link.daemon_addresses import default_address
from fastload._paths import runtime_dir

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(90)]

NOBODY = 65534


def _run_as_nobody(code: str, *args: str) -> str:
    """Run Python `code` as user nobody (we are root); return what it prints."""
    python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if os.geteuid() != 0 or python is None:
        pytest.skip("needs root (to act as another user) and a system python3")
    result = subprocess.run(
        [python, "-c", code, *args], user=NOBODY, group=NOBODY, extra_groups=[],
        capture_output=True, text=True, timeout=30, cwd="/",
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


_CONNECT_AS_OTHER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("denied")
else:
    print("connected")
for name in sys.argv[2:]:
    try:
        open("/dev/shm/" + name, "rb")
    except PermissionError:
        print("denied")
    else:
        print("opened")
"""


# ---------------------------------------------------------------------------------------------
# Files: socket directory, socket, segments


def test_socket_directory_and_segments_are_private(shared_daemon: DaemonProcess, image_folder: Path) -> None:
    uid = os.getuid()
    st_dir = os.stat(shared_daemon.socket_dir)
    assert (stat.S_IMODE(st_dir.st_mode), st_dir.st_uid) == (0o700, uid)
    st_sock = os.lstat(shared_daemon.sock_path)
    assert stat.S_ISSOCK(st_sock.st_mode) and st_sock.st_uid == uid
    assert stat.S_IMODE(st_sock.st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(shared_daemon.pid_path).st_mode) == 0o600

    before = shared_daemon.segments()
    with FastLoader(
        image_folder, batch_size=4, prefetch=3, transform=RESIZE, device="cpu", daemon=shared_daemon.address
    ) as loader:
        next(iter(loader))
        ring = sorted(shared_daemon.segments() - before)
        assert len(ring) == 5 + (not before)  # prefetch + 2 slots, and the dataset's index if new
        for name in shared_daemon.segments():  # the ring and the dataset's index
            assert re.fullmatch(rf"fastload_{shared_daemon.pid}_[0-9a-f]{{32}}", name), name
            st_seg = os.stat(f"/dev/shm/{name}")
            assert (stat.S_IMODE(st_seg.st_mode), st_seg.st_uid) == (0o600, uid), name
        # 128 random bits each: no two alike, no counter in them
        randoms = [int(name.rsplit("_", 1)[1], 16) for name in ring]
        assert len(set(randoms)) == len(randoms)
        assert len({r >> 96 for r in randoms}) == len(randoms)
        # Another user can neither connect nor open a slot.
        answers = _run_as_nobody(_CONNECT_AS_OTHER, str(shared_daemon.sock_path), *ring[:2])
    assert answers.split() == ["denied"] * 3


def test_runtime_dir_is_made_private_and_a_shared_socket_dir_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    made = Path(runtime_dir())
    assert made == tmp_path / "fastload"
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o755)
    with pytest.raises(DaemonError, match="mode 0700"):
        runtime_dir()

    # Someone else holding the default path does not stop a daemon: it uses a private fallback
    # beside it, and trainers find that without configuration.
    made.rmdir()
    made.symlink_to(tmp_path)  # squatted: a link (as another uid's directory would be)
    fallback = Path(runtime_dir())
    assert fallback.parent == tmp_path and fallback.name.startswith("fastload.")
    assert stat.S_IMODE(fallback.stat().st_mode) == 0o700 and fallback.stat().st_uid == os.getuid()
    assert Path(runtime_dir()) == fallback  # reused, not one more directory per start
    (fallback / "daemon.sock").touch()
    assert default_address() == f"ipc://{fallback / 'daemon.sock'}"
    (fallback / "daemon.sock").unlink()
    made.unlink()

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    code, stderr = refused_serve(serve_command(shared, workers=1), timeout_s=30)
    assert code == 1, stderr
    assert f"{shared} must be a directory owned by you with mode 0700" in stderr
    assert list(shared.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# TCP


def _tcp_sockets(pid: int) -> list[tuple[str, str]]:
    """(local address, state) of every TCP socket process `pid` holds, from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    found.append((fields[1], "LISTEN" if fields[3] == "0A" else fields[3]))
    return found


def test_no_tcp_socket_without_listen(shared_daemon: DaemonProcess) -> None:
    for pid in (shared_daemon.pid, *shared_daemon.worker_pids):
        assert _tcp_sockets(pid) == [], f"pid {pid} has TCP sockets"
        assert psutil.Process(pid).net_connections(kind="inet") == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_config(path: Path, **table: Any) -> Path:
    lines = ["[daemon]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("keys", ["none", "no clients"])
def test_listen_without_curve_keys_refuses_to_start(tmp_path: Path, keys: str) -> None:
    port = _free_port()
    sock_dir = tmp_path / "sock"
    sock_dir.mkdir(mode=0o700)
    extra = ["--listen", f"tcp://127.0.0.1:{port}"]
    if keys == "no clients":
        public, secret = zmq.curve_keypair()
        config = _write_config(
            tmp_path / "fastload.toml", curve_public_key=public.decode(), curve_secret_key=secret.decode()
        )
        extra += ["--config", str(config)]
    code, stderr = refused_serve(serve_command(sock_dir, workers=1, extra=extra))
    assert code == 1
    expected = "needs CURVE keys" if keys == "none" else "needs at least one allowed client key"
    assert re.search(rf"fastload: error: --listen tcp://\.\.\. {expected}", stderr), stderr
    assert "Traceback" not in stderr
    assert list(sock_dir.iterdir()) == [], "a refused daemon left its socket or pid file"
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nobody took the port


def _curve_daemon(
    daemon_pool: DaemonPool, tmp_path: Path, workers: int
) -> tuple[DaemonProcess, int, bytes, tuple[bytes, bytes]]:
    """A daemon listening on loopback TCP with CURVE; returns it, its port, its public key and
    the one allowed client's key pair."""
    server_public, server_secret = zmq.curve_keypair()
    client_keys = zmq.curve_keypair()
    port = _free_port()
    config = _write_config(
        tmp_path / "fastload.toml", curve_public_key=server_public.decode(),
        curve_secret_key=server_secret.decode(), curve_clients=[client_keys[0].decode()],
        roots=[str(tmp_path.parent)],  # a TCP listener serves only under its roots: the test's datasets
    )
    daemon = daemon_pool.start(
        workers=workers, extra=["--listen", f"tcp://127.0.0.1:{port}", "--config", str(config)]
    )
    return daemon, port, server_public, client_keys


def test_tcp_listener_answers_only_allowed_curve_keys(daemon_pool: DaemonPool, tmp_path: Path) -> None:
    daemon, port, server_public, (client_public, client_secret) = _curve_daemon(daemon_pool, tmp_path, 1)
    stranger_public, stranger_secret = zmq.curve_keypair()
    listening = [addr for addr, state in _tcp_sockets(daemon.pid) if state == "LISTEN"]
    assert listening == [f"0100007F:{port:04X}"]
    for worker in daemon.worker_pids:  # forked workers closed the listener they inherited
        assert _tcp_sockets(worker) == [], f"worker {worker} holds the daemon's TCP socket"

    def ask_all(*requests: tuple[str, tuple[bytes, bytes] | None]) -> list[tuple[str, dict[str, Any]] | None]:
        """Each (op, client keys or None for plain text) sent on a connection of its own, all at
        once; each reply, or None where none came within 1.5 s (waited for together, not in turn)."""
        ctx = zmq.Context()
        socks = []
        try:
            for op, keys in requests:
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                socks.append(sock)
                if keys is not None:
                    sock.curve_serverkey = server_public
                    sock.curve_publickey, sock.curve_secretkey = keys
                sock.connect(f"tcp://127.0.0.1:{port}")
                sock.send(wire.encode(op, **(hello_fields(tmp_path) if op == "hello" else {})))
            deadline = time.monotonic() + 1.5
            return [
                wire.decode(sock.recv_multipart()[0])
                if sock.poll(max(0, int((deadline - time.monotonic()) * 1000)))
                else None
                for sock in socks
            ]
        finally:
            for sock in socks:
                sock.close(0)
            ctx.term()

    stranger, client = (stranger_public, stranger_secret), (client_public, client_secret)
    plain, strange, status, stop, strange_hello = ask_all(
        ("status", None), ("status", stranger), ("status", client), ("stop", client), ("hello", stranger)
    )
    assert plain is None  # plain text: no answer
    assert strange is None  # a key not allowed
    assert status is not None and status[0] == "status_reply"
    assert stop == ("error", {"message": "stop is only accepted on the local socket"})
    assert strange_hello is None  # no session for a stranger either
    assert daemon.status()["pid"] == daemon.pid


def test_tcp_session_gets_the_local_batches(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CURVE-authenticated trainer over TCP gets every batch bit for bit as in local mode (the
    bytes travel in the done messages into a ring the trainer owns)."""
    _, port, server_public, (client_public, client_secret) = _curve_daemon(daemon_pool, tmp_path, 2)
    monkeypatch.setenv("FASTLOAD_CURVE_SERVER_KEY", server_public.decode())
    monkeypatch.setenv("FASTLOAD_CURVE_PUBLIC_KEY", client_public.decode())
    monkeypatch.setenv("FASTLOAD_CURVE_SECRET_KEY", client_secret.decode())
    kw: dict[str, Any] = dict(
        batch_size=5, shuffle=True, seed=11, device="cpu", drop_last=False,
        transform=[T.RandomResizedCrop(48), T.RandomHorizontalFlip()],
    )
    with FastLoader(image_folder, num_workers=2, **kw) as local:
        expected = [(x.clone(), y.clone()) for x, y in local]
    with FastLoader(image_folder, daemon=f"tcp://127.0.0.1:{port}", **kw) as remote:
        got = list(remote)
    assert len(got) == len(expected)
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


# ---------------------------------------------------------------------------------------------
# Hostile messages


def _hostile_headers(dataset: Path) -> Iterator[tuple[str, list[bytes]]]:
    """Messages that must each get an error reply on a connection without a session."""
    rng = random.Random(7)
    for k in range(40):
        yield f"random bytes {k}", [rng.randbytes(rng.randrange(0, 200))]
    for text in (
        b"", b"\xff\xfe\x00", b"not json", b"{", b"[]", b"[1, 2]", b'"hello"', b"42", b"null", b"true", b"{}",
        b'{"v": 1}', b'{"op": "ping"}', b'{"v": 2, "op": "ping"}', b'{"v": 0, "op": "ping"}',
        b'{"v": "1", "op": "ping"}', b'{"v": null, "op": "ping"}', b'{"v": 1.5, "op": "ping"}',
        b'{"v": 1, "op": 5}', b'{"v": 1, "op": null}', b'{"v": 1, "op": ["ping"]}', b'{"v": 1, "op": "nope"}',
        b'{"v": 1, "op": ""}', b'{"v": 1, "op": "__class__"}', b'{"v": 1, "op": "\xff"}',
        b'{"v": 1, "op": "ping", "x": NaN}', b'{"v": 1, "op": "ping", "x": Infinity}',
        b"[" * 30000, b'{"v": 1, "op": "ping", "pad": "' + b"x" * (64 << 10) + b'"}',
        b'{"v": 1, "op": "ping"} trailing', b"\x00" * 64,
    ):
        yield f"header {text[:40]!r}", [text]
    for op, fields in (
        ("welcome", {}), ("done", {"seq": 1, "count": 1, "read_ns": 0, "decode_ns": 0, "bytes": 0}),
        ("error", {"message": "x"}), ("pong", {}), ("slot", {"name": "x"}), ("failed", {}),
        ("ping", {"x": 1}), ("status", {"verbose": True}), ("bye", {"session": 1}), ("stop", {"now": True}),
        ("grow", {}), ("grow", {"n": 1}),
        ("task", {"seq": 0, "epoch": 0, "batch_index": 0, "slot": "s", "row": 0}),
    ):
        yield f"{op} {fields}", [wire.encode(op, **fields), np.zeros(1, "<i8").tobytes()]
    for op in ("status", "ping"):  # only a task carries a frame after its header
        yield f"{op} with frames after it", [wire.encode(op), b"x", b"y" * 1000]
    bad_hello: list[dict[str, Any]] = [
        {"batch_size": "4"}, {"batch_size": 4.0}, {"batch_size": True}, {"batch_size": None},
        {"batch_size": 0}, {"batch_size": -1}, {"batch_size": wire.MAX_BATCH + 1}, {"batch_size": 2**64},
        {"prefetch": -1},
        {"prefetch": 65}, {"rank": 2, "world_size": 2}, {"rank": -1}, {"world_size": 0}, {"pid": 0},
        {"pid": -1}, {"pid": 2**31}, {"pid": 2**62}, {"pid": "1"}, {"seed": -1}, {"seed": 2**64},
        {"dataset": str(dataset / "missing")}, {"dataset": str(next(dataset.glob("*/*.jpg")))},
        {"dataset": ""}, {"dataset": "data"}, {"dataset": "/a\x00b"}, {"dataset": 5},
        {"dataset": [str(dataset)]},
        {"transforms": "Resize"}, {"transforms": []}, {"transforms": [{"type": "Nope"}]},
        {"transforms": [{"type": "Resize", "size": [0, 0]}]}, {"transforms": [{"type": "Resize"}]},
        {"transforms": [{"type": "Resize", "size": [24, 24], "evil": 1}]},
        {"transforms": [{"type": "Resize", "size": "x" * 100}]}, {"transforms": [{"size": [24, 24]}]},
        {"transforms": [{"type": "Resize", "size": [1e9, 1e9]}]},
        {"transforms": [{"type": "RandomHorizontalFlip"}] * 33 + [{"type": "Resize", "size": [24, 24]}]},
        {"transforms": [{"type": "Resize", "size": [60000, 60000]}]},  # over the budget
        {"transforms": [{"type": "Resize", "size": [24, 24]}, "x"]},
        {"backend": "nope"}, {"backend": ""}, {"extra": 1},
        # A source description comes from the peer too: JSON text, known kinds and fields only.
        {"source": "not json"}, {"source": "[]"}, {"source": '{"kind": "pickle"}'}, {"source": 5},
        {"source": '{"kind": "file_list"}'}, {"source": '{"kind": "file_list", "path": 5}'},
        {"source": '{"kind": "file_list", "path": "rel.csv"}'},
        {"source": '{"kind": "tar", "paths": [[1]]}'},
        {"source": '{"kind": "folder", "root": "/x", "evil": 1}'},
        {"source": json.dumps({"kind": "file_list", "path": str(dataset / "missing.csv")})},
        {"source": json.dumps({"kind": "hdf5", "path": str(dataset)})},
    ]
    for overrides in bad_hello:
        yield f"hello {str(overrides)[:60]}", [wire.encode("hello", **hello_fields(dataset, **overrides))]
    fields = hello_fields(dataset)
    del fields["pid"]
    yield "hello without pid", [wire.encode("hello", **fields)]


def _hostile_tasks(own: list[str], other: list[str]) -> Iterator[tuple[str, dict[str, Any], list[bytes]]]:
    """(what, task fields, frames after the header) that a session's connection must have refused."""
    good = {"seq": 1, "epoch": 0, "batch_index": 0, "slot": own[0], "row": 0}
    four = np.arange(4, dtype="<i8").tobytes()
    field_cases: list[dict[str, Any]] = [
        {"slot": other[0]}, {"slot": "fastload_1_" + "0" * 32}, {"slot": "../../etc/passwd"}, {"slot": ""},
        {"slot": 5}, {"slot": None}, {"epoch": -1}, {"batch_index": -1}, {"epoch": 2**63},
        {"batch_index": 2**64}, {"seq": 2**64}, {"seq": -(2**63) - 1}, {"seq": "1"}, {"seq": 1.0},
        {"seq": True}, {"row": -1}, {"row": 1}, {"row": 2**63 - 1}, {"row": None}, {"extra": 0},
    ]
    for case in field_cases:
        yield f"task {case}", {**good, **case}, [four]
    missing = dict(good)
    del missing["row"]
    yield "task without row", missing, [four]
    for what, frames in (
        ("no index frame", []), ("two index frames", [four, four]), ("empty index frame", [b""]),
        ("7-byte index frame", [b"\x00" * 7]), ("9-byte index frame", [b"\x00" * 9]),
        ("oversized index frame", [b"\x00" * (8 * (wire.MAX_BATCH + 1))]),
        ("5 samples for a batch of 4", [np.arange(5, dtype="<i8").tobytes()]),
        ("negative index", [np.array([0, -1], "<i8").tobytes()]),
        ("index == num_samples", [np.array([24], "<i8").tobytes()]),
        ("huge index", [np.array([2**62], "<i8").tobytes()]),
        ("int64 min", [np.array([-(2**63)], "<i8").tobytes()]),
        ("big-endian indices", [np.arange(1, 3, dtype=">i8").tobytes()]),
    ):
        yield what, good, frames


def _assert_error(reply: tuple[str, dict[str, Any]] | None, what: str) -> str:
    assert reply is not None, f"{what}: no reply"
    assert reply[0] == "error" and reply[1]["message"], f"{what}: {reply}"
    return str(reply[1]["message"])


def test_fuzzed_and_hostile_messages_get_errors_and_the_daemon_keeps_serving(
    shared_daemon: DaemonProcess, image_folder: Path
) -> None:
    daemon = shared_daemon
    internal: list[str] = []
    sent = [0]
    with RawClient(daemon.address) as fresh, RawClient(daemon.address) as c1, RawClient(daemon.address) as c2:
        for what, frames in _hostile_headers(image_folder):
            message = _assert_error(answer(fresh, *frames), what)  # some hellos open their source
            if message.startswith("internal error"):
                internal.append(f"{what}: {message}")
            sent[0] += 1

        welcome1 = answer(c1, wire.encode("hello", **hello_fields(image_folder)))
        welcome2 = answer(c2, wire.encode("hello", **hello_fields(image_folder, seed=2)))
        assert welcome1 is not None and welcome1[0] == "welcome", welcome1
        assert welcome2 is not None and welcome2[0] == "welcome", welcome2
        own, other = welcome1[1]["slots"], welcome2[1]["slots"]
        _assert_error(c1.call(wire.encode("hello", **hello_fields(image_folder))), "a second hello")
        for what, fields, frames in _hostile_tasks(own, other):
            header = json.dumps({"v": 1, "op": "task", **fields}).encode()
            message = _assert_error(c1.call(header, *frames), what)
            if message.startswith("internal error"):
                internal.append(f"{what}: {message}")
            sent[0] += 1

        # Generated: any header on a connection without a session, any task on one with a session.
        json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
        json_value = st.recursive(
            json_leaf,
            lambda inner: st.lists(inner, max_size=3)
            | st.dictionaries(st.text(max_size=6), inner, max_size=3),
            max_leaves=8,
        )
        names = sorted({n for schema in wire._SCHEMAS.values() for n in schema} | {"x"})
        headers = st.one_of(
            st.binary(max_size=120),
            st.builds(
                lambda v, op, f: json.dumps({"v": v, "op": op, **f}).encode(),
                st.sampled_from([1, 1, 1, 0, 2, "1", None, True]),
                st.sampled_from([*wire._SCHEMAS, "nope", ""]),
                st.dictionaries(st.sampled_from(names), json_value, max_size=5),
            ),
        )

        @settings(max_examples=200, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(headers)
        def any_header(header: bytes) -> None:
            try:
                op, fields = wire.decode(header)
            except wire.WireError:
                op, fields = "", {}
            if op in ("stop", "bye") and not fields:
                return  # valid: stop would stop the daemon, bye has no reply
            reply = answer(fresh, header)
            sent[0] += 1
            if op in ("ping", "status") and not fields:
                assert reply is not None and reply[0] in ("pong", "status_reply")
            else:
                _assert_error(reply, repr(header[:80]))

        @settings(max_examples=150, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(
            st.integers(-(2**64), 2**64), st.integers(-3, 3),
            st.integers(-3, 3) | st.integers(-(2**64), 2**64), st.integers(-2, 5),
            st.sampled_from([own[0], own[1], other[0], "x"]),
            st.lists(st.integers(-3, 27), max_size=6).map(lambda xs: np.array(xs, "<i8").tobytes())
            | st.binary(max_size=40),
        )
        def any_task(seq: int, epoch: int, batch_index: int, row: int, slot: str, index_frame: bytes) -> None:
            header = wire.encode("task", seq=seq, epoch=epoch, batch_index=batch_index, slot=slot, row=row)
            indices = np.frombuffer(index_frame[: len(index_frame) // 8 * 8], "<i8")
            valid = (
                all(-(2**63) <= x < 2**63 for x in (seq, batch_index)) and epoch >= 0 and batch_index >= 0
                and slot in own and len(index_frame) % 8 == 0 and len(indices) >= 1
                and row >= 0 and row + len(indices) <= 4 and bool(np.all((indices >= 0) & (indices < 24)))
            )
            reply = c1.call(header, index_frame)
            sent[0] += 1
            if valid:
                assert reply is not None and reply[0] == "done" and reply[1]["seq"] == seq, reply
                assert reply[1]["count"] == len(indices)
            else:
                _assert_error(reply, f"task {seq} {epoch} {batch_index} {row} {slot} {index_frame!r}")

        any_header()
        any_task()

        # The sessions still work: a valid task on each is done.
        for client, slots in ((c1, own), (c2, other)):
            reply = client.call(
                wire.encode("task", seq=77, epoch=0, batch_index=0, slot=slots[0], row=0),
                np.arange(4, dtype="<i8").tobytes(),
            )
            assert reply is not None and reply[0] == "done" and reply[1]["count"] == 4, reply
        c1.send(wire.encode("bye"))
        c2.send(wire.encode("bye"))
    assert sent[0] >= 400, sent
    assert daemon.proc.poll() is None, f"the daemon died:\n{daemon.log()}"
    assert daemon.status()["pid"] == daemon.pid
    assert not internal, "hostile messages hit unexpected errors:\n" + "\n".join(internal)
    assert "Traceback" not in daemon.log(), daemon.log()

    # A real trainer still gets exactly its batches.
    kwargs: dict[str, Any] = {
        "batch_size": 4, "shuffle": True, "seed": 21, "transform": RESIZE, "device": "cpu",
    }
    with FastLoader(image_folder, num_workers=2, daemon=daemon.address, **kwargs) as loader:
        assert_same_batches(take(loader), local_epoch(image_folder, **kwargs))
    assert wait_until(lambda: daemon.sessions() == [], 30.0), daemon.sessions()  # its bye, after close()
