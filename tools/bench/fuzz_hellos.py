"""Fuzzed hellos for `bench_reliability.py --only fuzz-hellos`: valid hellos of every source kind
a daemon serves, with their fields mutated, replaced or typed wrong, sent to a real daemon over
its local socket (no roots: any path) or loopback TCP as an allowed CURVE client (with roots).

Every hello must get its answer (`welcome` or `error`, past `indexing` notes) within a deadline;
the phase counts answers by kind, "internal error" replies (a bug: an exception the daemon did
not expect), hangs (no answer in time), and checks that the daemon still answers `status` after
every 500 hellos and at the end. Welcomed sessions are closed at once (`bye`).

    .venv/bin/python tools/bench/bench_reliability.py --only fuzz-hellos [--fuzz-hellos 10000]
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import zmq

from fastload._loading.link import daemon_link as wire

OPEN_DEADLINE_S = 8  # the daemon's index_timeout: a slow open (a walk of /) is refused after this
ANSWER_GRACE_S = 30  # past the open's deadline, an unanswered hello is a hang
STATUS_EVERY = 500

# Values a hostile peer puts where a field belongs: wrong types, NULs, lone surrogates, huge
# strings, paths that climb or name another process's files, patterns, URLs.
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63 - 1, -(2**63), 1.5, float("nan"), float("inf"),
    "", "x" * 5000, "\x00", "a\x00b", "/a\x00b", "\ud800", "/\ud800/x", "relative", "~", "..",
    "/proc/1/cwd", "/proc/self/root/etc/passwd", "/dev/zero", "/etc/passwd", "/", "/../../etc/passwd",
    "http://127.0.0.1:9/x.tar", "/x/{0..999999}.tar", "/x/*", "/" + "a/" * 3000,
    [], [1], ["a", "b"], [[1]], ["/a\x00b"], {}, {"a": 1}, {"kind": "folder", "root": "/"},
]


def _tar(path: Path, images: list[Path]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for k, image in enumerate(images):
            for name, data in ((f"{k:04d}.jpg", image.read_bytes()), (f"{k:04d}.cls", str(k % 2).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def seed_sources(root: Path, data: Path) -> list[dict[str, Any] | None]:
    """A valid source description of every kind a daemon serves, under `root`, made from the
    images of the folder `data`; None: the plain hello (its `dataset` an image folder)."""
    import h5py
    import numpy as np

    from fastload.sources import pack

    root.mkdir(parents=True, exist_ok=True)
    images = sorted(p for p in data.glob("*/*") if p.is_file())[:8]
    folder = root / "folder"
    for k, image in enumerate(images):
        (folder / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        shutil.copy(image, folder / f"c{k % 2}" / image.name)
    listing = root / "list.txt"
    listing.write_text("".join(f"{p} {k % 2}\n" for k, p in enumerate(images)))
    _tar(root / "shard-0.tar", images[:4])
    _tar(root / "shard-1.tar", images[4:])
    h5 = root / "data.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset(
            "images", data=[np.frombuffer(p.read_bytes(), np.uint8) for p in images],
            dtype=h5py.vlen_dtype(np.uint8),
        )
        f.create_dataset("labels", data=np.arange(len(images)) % 2)
    pack(folder, root / "packed", progress=False)
    return [
        None,
        {"kind": "folder", "root": str(folder)},
        {"kind": "folder", "root": str(folder), "allow_empty": True},
        {"kind": "file_list", "path": str(listing)},
        {"kind": "file_list", "path": str(listing), "root": "/", "classes": ["a", "b"], "multi_label": False},
        {"kind": "tar", "paths": str(root / "shard-{0..1}.tar")},
        {"kind": "tar", "paths": [str(root / "shard-0.tar"), str(root / "shard-*.tar")]},
        {"kind": "packed", "path": str(root / "packed")},
        {"kind": "hdf5", "path": str(h5), "data": "images", "labels": "labels", "cache_mb": 8},
    ]


def valid_hello(dataset: str, source: dict[str, Any] | None) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "dataset": dataset, "transforms": [{"type": "Resize", "size": [32, 32]}], "backend": "native",
        "seed": 1, "batch_size": 4, "prefetch": 2, "pid": os.getpid(), "rank": 0, "world_size": 1,
    }
    if source is not None:
        fields["dataset"] = str(source.get("root") or source.get("path") or source.get("paths") or dataset)
        fields["source"] = json.dumps(source)
    return fields


def _odd(rng: random.Random) -> Any:
    value = rng.choice(ODD_VALUES)
    return list(value) if isinstance(value, list) else dict(value) if isinstance(value, dict) else value


def _mutate_source(source: dict[str, Any], rng: random.Random) -> str:
    """The source description with one field replaced, removed, added, wrapped, or the JSON broken."""
    config = dict(source)
    action = rng.randrange(7)
    key = rng.choice(sorted(config))
    if action <= 2:  # replace a field's value
        config[key] = _odd(rng)
    elif action == 3:  # drop a field
        del config[key]
    elif action == 4:  # a field no source has, or another kind's
        config[rng.choice(["evil", "path", "root", "paths", "cache_dir", "cache_limit", "num_classes",
                           "delimiter", "header", "data", "labels", "cache_mb", "classes"])] = _odd(rng)
    elif action == 5:  # a list where a string was, a string where a list was, a tar pattern bomb
        value = config[key]
        config[key] = (
            [value] * rng.choice((2, 64)) if isinstance(value, str) else json.dumps(value)
        )
        if config.get("kind") == "tar" and rng.random() < 0.3:
            config["paths"] = ["/x/{0..999999}.tar"] * 64
    else:  # the JSON text itself damaged
        text = bytearray(json.dumps(config).encode())
        for _ in range(rng.randint(1, 4)):
            text[rng.randrange(len(text))] = rng.randrange(32, 127)
        return text.decode("ascii", "replace")
    return json.dumps(config)


def mutated_hello(rng: random.Random, dataset: str, seeds: list[dict[str, Any] | None]) -> tuple[str, bytes]:
    """(what was mutated, the header) of one fuzzed hello."""
    source = rng.choice(seeds)
    fields = valid_hello(dataset, source)
    target = rng.random()
    if source is not None and target < 0.5:
        what = f"source.{source['kind']}"
        fields["source"] = _mutate_source(source, rng)
    elif target < 0.65:
        what = "transforms"
        chain = [dict(t) for t in fields["transforms"]]
        choice = rng.randrange(4)
        if choice == 0:
            chain[0]["size"] = _odd(rng)
        elif choice == 1:
            chain[0][rng.choice(["type", "evil", "interpolation", "antialias"])] = _odd(rng)
        elif choice == 2:
            chain.append(_odd(rng))
        else:
            chain = [{"type": rng.choice(["RandomResizedCrop", "Normalize", "CenterCrop", "RandomErasing",
                                          "ColorJitter", "Nope"]), "size": _odd(rng)}]
        fields["transforms"] = chain
    else:
        key = rng.choice([*sorted(fields), "evil"])
        what = f"hello.{key}"
        if rng.random() < 0.15 and key in fields:
            del fields[key]
        else:
            fields[key] = _odd(rng)
    return what, json.dumps({"v": wire.VERSION, "op": "hello", **fields}).encode()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Daemon:
    """A `fastload serve` for the phase: over ipc with no roots, or over TCP (CURVE) with roots."""

    def __init__(self, base: Path, tcp: bool, roots: list[str], open_deadline_s: float) -> None:
        self.dir = base / ("fht" if tcp else "fhi")
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.local = f"ipc://{self.dir / 'daemon.sock'}"
        table: dict[str, Any] = {"index_timeout": open_deadline_s, "index_memory": "256MiB"}
        extra: list[str] = []
        self.keys: tuple[bytes, bytes, bytes] | None = None
        self.address = self.local
        if tcp:
            server_public, server_secret = zmq.curve_keypair()
            client_public, client_secret = zmq.curve_keypair()
            port = _free_port()
            table.update(
                curve_public_key=server_public.decode(), curve_secret_key=server_secret.decode(),
                curve_clients=[client_public.decode()], roots=roots,
            )
            extra = ["--listen", f"tcp://127.0.0.1:{port}"]
            self.address = f"tcp://127.0.0.1:{port}"
            self.keys = (server_public, client_public, client_secret)
        config = base / ("fht.toml" if tcp else "fhi.toml")
        config.write_text("[daemon]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
        self.log = base / ("fht.log" if tcp else "fhi.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fastload", "serve", "--workers", "1", "--socket-dir", str(self.dir),
                 "--memory-budget", "512MiB", "--config", str(config), *extra],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while self.status(1.0) is None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the daemon did not start:\n{self.log.read_text(errors='replace')}")
            time.sleep(0.1)

    def socket(self, ctx: zmq.Context) -> zmq.Socket:  # type: ignore[type-arg]
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.keys is not None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self.keys
        sock.connect(self.address)
        return sock

    def status(self, timeout_s: float = 10.0) -> dict[str, Any] | None:
        if not (self.dir / "daemon.sock").exists():
            return None
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(self.local)
            sock.send(wire.encode("status"))
            if not sock.poll(int(timeout_s * 1000)):
                return None
            return wire.decode(sock.recv_multipart()[0], wire.MAX_REPLY_HEADER_BYTES)[1]
        finally:
            sock.close(0)
            ctx.term()

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


def _answer(sock: Any, deadline: float) -> tuple[str, dict[str, Any]] | None:
    """The hello's answer past its `indexing` notes, None when none came before `deadline`."""
    while sock.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
        op, fields = wire.decode(sock.recv_multipart()[0], wire.MAX_REPLY_HEADER_BYTES)
        if op != "indexing":
            return op, fields
    return None


def fuzz_hellos(
    data: str, base: Path, count: int, tcp: bool, lanes: int = 4, seed: int = 29,
    open_deadline_s: float = OPEN_DEADLINE_S,
) -> dict[str, Any]:
    """`count` fuzzed hellos on `lanes` connections at once; what came back, by kind."""
    seeds_root = base / ("seeds-tcp" if tcp else "seeds-ipc")
    seeds = seed_sources(seeds_root, Path(data))
    roots = [os.path.realpath(data), os.path.realpath(seeds_root)]
    daemon = _Daemon(base, tcp, roots, open_deadline_s)
    ctx = zmq.Context()
    replies: Counter[str] = Counter()
    internal: list[str] = []
    hangs: list[str] = []
    slowest = [0.0]
    sent = [0]
    lock = threading.Lock()
    failure: list[str] = []
    started = time.monotonic()

    def lane(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        sock = daemon.socket(ctx)
        try:
            while not failure:
                with lock:
                    if sent[0] >= count:
                        return
                    sent[0] += 1
                    n = sent[0]
                what, header = mutated_hello(rng, os.path.abspath(data), seeds)
                t0 = time.monotonic()
                sock.send(header)
                reply = _answer(sock, t0 + open_deadline_s + ANSWER_GRACE_S)
                seconds = time.monotonic() - t0
                with lock:
                    slowest[0] = max(slowest[0], seconds)
                    if reply is None:
                        hangs.append(f"{what}: {header[:300]!r}")
                        replies["hang"] += 1
                    elif reply[0] == "error" and str(reply[1]["message"]).startswith("internal error"):
                        internal.append(f"{what}: {reply[1]['message'][:300]} <- {header[:300]!r}")
                        replies["internal error"] += 1
                    else:
                        replies[reply[0]] += 1
                if reply is None:  # its pending hello holds the connection: a new one
                    sock.close(0)
                    sock = daemon.socket(ctx)
                elif reply[0] == "welcome":
                    sock.send(wire.encode("bye"))
                if n % STATUS_EVERY == 0 and (daemon.proc.poll() is not None or daemon.status() is None):
                    failure.append(f"the daemon stopped answering after {n} hellos")
        finally:
            sock.close(0)

    try:
        threads = [threading.Thread(target=lane, args=(k,), daemon=True) for k in range(lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        status = daemon.status()
        alive = daemon.proc.poll() is None and status is not None
        rss = psutil.Process(daemon.proc.pid).memory_info().rss / 2**20 if alive else -1.0
        tracebacks = daemon.log.read_text(errors="replace").count("Traceback")
        return {
            "transport": "tcp+curve" if tcp else "ipc",
            "hellos": sent[0],
            "replies": dict(sorted(replies.items())),
            "internal_errors": len(internal),
            "hangs": len(hangs),
            "slowest_answer_s": round(slowest[0], 2),
            "seconds": round(time.monotonic() - started, 1),
            "daemon_alive": alive and not failure,
            "daemon_rss_mib": round(rss, 1),
            "tracebacks_in_log": tracebacks,
            "examples": (internal + hangs + failure)[:10],
        }
    finally:
        ctx.term()
        daemon.close()
