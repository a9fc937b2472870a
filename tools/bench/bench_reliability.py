"""Reliability figures for docs/RELIABILITY.md: kills survived, messages fuzzed, sessions held,
memory over a soak. Each phase checks its invariant and reports what it did; nothing is timed.

1. kills-local: a FastLoader (Dataset of indexed vectors, W workers) runs E epochs while a thread
   SIGKILLs a random worker every K seconds; every epoch must hold each sample exactly once.
2. kills-daemon: a `fastload serve` with W workers and T trainers attached (image folder), the
   same killer on the daemon's workers; every trainer's batches must equal local mode's, bit for
   bit, and the daemon must still answer.
3. fuzz, fuzz-tcp: N seeded messages (valid ones mutated: bytes flipped, fields replaced, frames
   added, truncated, random bytes, oversized frames) on the daemon's local socket, and over
   loopback TCP as an allowed CURVE client; it must answer `status` after every 500.
   fuzz-hellos, fuzz-hellos-tcp: H hellos of every source kind with fields mutated, replaced or
   typed wrong (`fuzz_hellos.py`): every one answered, none with "internal error", none hanging.
4. sessions: P connections each say hello claiming pid 1 and are closed; all sessions must be
   reclaimed; then a real trainer must attach.
5. soak: for S seconds trainers attach, load four batches and leave; daemon RSS sampled each
   second: first, last, max (flat memory: nothing per session is kept after it ends).

    .venv/bin/python tools/bench/bench_reliability.py --data DIR [--seconds 300] [--fuzz 13000]
        [--fuzz-hellos 10000]
(--data: an ImageNet-layout folder; default: a generated demo folder in a temporary directory)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
import zmq

from fastload import FastLoader
from fastload import transforms as T
from fastload._loading.link import daemon_link as wire

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_hellos import fuzz_hellos

RESIZE = [T.Resize((32, 32))]


class Killer(threading.Thread):
    """SIGKILLs a random child of `parent` every ~`every_s` seconds until stopped."""

    def __init__(self, parent: int, every_s: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.parent, self.every_s, self.rng, self.sent = parent, every_s, random.Random(seed), 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.rng.uniform(0.5, 1.5) * self.every_s):
            try:
                pids = [c.pid for c in psutil.Process(self.parent).children() if c.status() != "zombie"]
                if pids:
                    os.kill(self.rng.choice(pids), signal.SIGKILL)
                    self.sent += 1
            except (psutil.NoSuchProcess, ProcessLookupError):
                continue

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


class Vectors(torch.utils.data.Dataset[tuple[np.int64, np.ndarray]]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.int64, np.ndarray]:
        time.sleep(0.001)
        return np.int64(i), np.full(64, i, np.float32)


def kills_local(workers: int, epochs: int, every_s: float) -> dict[str, Any]:
    n = 2000
    killer = Killer(os.getpid(), every_s, seed=1)
    start = time.monotonic()
    with FastLoader(Vectors(n), batch_size=8, shuffle=True, num_workers=workers, seed=3) as loader:
        killer.start()
        try:
            for _ in range(epochs):
                seen = sorted(torch.cat([b[0] for b in loader]).tolist())
                if seen != list(range(n)):
                    raise AssertionError("an epoch lost or repeated samples")
        finally:
            killer.stop()
    return {
        "kills": killer.sent,
        "epochs": epochs,
        "samples": n * epochs,
        "seconds": time.monotonic() - start,
    }


def _serve(socket_dir: Path, workers: int, extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    socket_dir.mkdir(mode=0o700, exist_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fastload",
            "serve",
            "--workers",
            str(workers),
            "--socket-dir",
            str(socket_dir),
            "--memory-budget",
            "512MiB",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (socket_dir / "daemon.sock").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the daemon did not start")
        time.sleep(0.05)
    _call(f"ipc://{socket_dir}/daemon.sock", [wire.encode("status")])
    return proc


def _call(address: str, frames: list[bytes], timeout_s: float = 5.0) -> tuple[str, dict[str, Any]] | None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send_multipart(frames)
        return wire.decode(sock.recv_multipart()[0]) if sock.poll(int(timeout_s * 1000)) else None
    finally:
        sock.close(0)
        ctx.term()


def _epochs(loader: FastLoader, epochs: int) -> list[list[torch.Tensor]]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append([b[0].clone() for b in loader])
    return out


def kills_daemon(
    data: str, base: Path, workers: int, trainers: int, epochs: int, every_s: float
) -> dict[str, Any]:
    proc = _serve(base / "kd", workers)
    address = f"ipc://{base / 'kd' / 'daemon.sock'}"
    configs = [
        {"batch_size": 8, "shuffle": True, "seed": k, "transform": RESIZE, "device": "cpu"}
        for k in range(trainers)
    ]
    killer = Killer(proc.pid, every_s, seed=2)
    results: list[Any] = [None] * trainers
    try:
        loaders = [FastLoader(data, num_workers=1, daemon=address, **c) for c in configs]
        killer.start()

        def run(k: int) -> None:
            results[k] = _epochs(loaders[k], epochs)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(trainers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        killer.stop()
        for loader in loaders:
            loader.close()
        alive = proc.poll() is None and _call(address, [wire.encode("status")]) is not None
        for k, config in enumerate(configs):
            with FastLoader(data, num_workers=0, **config) as local:
                expected = _epochs(local, epochs)
            if any(
                not all(torch.equal(a, b) for a, b in zip(x, y, strict=True))
                for x, y in zip(results[k], expected, strict=True)
            ):
                raise AssertionError(f"trainer {k}: batches differ from local mode")
        return {"kills": killer.sent, "trainers": trainers, "epochs": epochs, "daemon_alive": alive}
    finally:
        killer.stop()
        proc.terminate()
        proc.wait(30)


def _mutations(rng: random.Random, dataset: str) -> list[list[bytes]]:
    valid: list[list[bytes]] = [
        [wire.encode("status")],
        [wire.encode("ping")],
        [
            wire.encode(
                "hello",
                dataset=dataset,
                transforms=[{"type": "Resize", "size": [32, 32]}],
                backend="native",
                seed=1,
                batch_size=4,
                prefetch=2,
                pid=os.getpid(),
                rank=0,
                world_size=1,
            )
        ],
        [
            wire.encode("task", seq=1, epoch=0, batch_index=0, slot="fastload_1_" + "0" * 32, row=0),
            np.arange(4, dtype="<i8").tobytes(),
        ],
    ]
    frames = list(rng.choice(valid))
    kind = rng.randrange(6)
    if kind == 0:  # flip bytes
        head = bytearray(frames[0])
        for _ in range(rng.randint(1, 8)):
            head[rng.randrange(len(head))] = rng.randrange(256)
        frames[0] = bytes(head)
    elif kind == 1:  # replace a field's value
        message = json.loads(frames[0])
        key = rng.choice(sorted(message))
        message[key] = rng.choice([None, -1, 2**70, "x" * 300, [], {}, 1.5, True, "../../etc/passwd"])
        frames[0] = json.dumps(message).encode()
    elif kind == 2:  # extra frames
        frames += [os.urandom(rng.randint(0, 64)) for _ in range(rng.randint(1, 4))]
    elif kind == 3:  # truncate
        frames[0] = frames[0][: rng.randrange(len(frames[0]))]
    elif kind == 4:  # random bytes
        frames = [os.urandom(rng.randint(0, 256))]
    else:  # oversized frame: the connection is dropped
        frames = [b"x" * (wire.MAX_FRAME_BYTES + rng.randint(1, 1 << 20))]
    return [frames]


def _tcp_daemon(base: Path) -> tuple[subprocess.Popen[bytes], str, bytes, tuple[bytes, bytes]]:
    """A daemon on loopback TCP with CURVE and one allowed client key."""
    server_public, server_secret = zmq.curve_keypair()
    client = zmq.curve_keypair()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = base / "tcp.toml"
    config.write_text(
        f'[daemon]\ncurve_public_key = "{server_public.decode()}"\n'
        f'curve_secret_key = "{server_secret.decode()}"\ncurve_clients = ["{client[0].decode()}"]\n'
    )
    proc = _serve(base / "fzt", 1, ("--listen", f"tcp://127.0.0.1:{port}", "--config", str(config)))
    return proc, f"tcp://127.0.0.1:{port}", server_public, client


def fuzz(data: str, base: Path, count: int, tcp: bool) -> dict[str, Any]:
    """`count` mutated messages on the local socket, or over TCP as an allowed CURVE client."""
    if tcp:
        proc, address, server_key, client = _tcp_daemon(base)
        local = f"ipc://{base / 'fzt' / 'daemon.sock'}"
    else:
        proc = _serve(base / "fz", 1)
        address = local = f"ipc://{base / 'fz' / 'daemon.sock'}"
    rng = random.Random(13)
    ctx = zmq.Context()
    sent = answered = 0
    try:
        for start in range(0, count, 500):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            if tcp:
                sock.curve_serverkey = server_key
                sock.curve_publickey, sock.curve_secretkey = client
            sock.connect(address)
            for _ in range(min(500, count - start)):
                (frames,) = _mutations(rng, os.path.abspath(data))
                sock.send_multipart(frames)
                sent += 1
                if sock.poll(50):
                    sock.recv_multipart()
                    answered += 1
            sock.close(0)
            if proc.poll() is not None or _call(local, [wire.encode("status")]) is None:
                raise AssertionError(f"the daemon stopped answering after {sent} fuzzed messages")
        rss = psutil.Process(proc.pid).memory_info().rss
        return {
            "transport": "tcp+curve" if tcp else "ipc",
            "messages": sent,
            "answered": answered,
            "daemon_alive": True,
            "daemon_rss_mib": rss / 2**20,
        }
    finally:
        ctx.term()
        proc.terminate()
        proc.wait(30)


def sessions(data: str, base: Path, peers: int) -> dict[str, Any]:
    proc = _serve(base / "ss", 1)
    address = f"ipc://{base / 'ss' / 'daemon.sock'}"
    hello = wire.encode(
        "hello",
        dataset=os.path.abspath(data),
        transforms=[{"type": "Resize", "size": [32, 32]}],
        backend="native",
        seed=1,
        batch_size=4,
        prefetch=2,
        pid=1,
        rank=0,
        world_size=1,
    )
    ctx = zmq.Context()
    socks = []
    try:
        welcomed = refused = 0
        for _ in range(peers):  # all held open at once, all claiming pid 1
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
            sock.send(hello)
            socks.append(sock)
            reply = wire.decode(sock.recv_multipart()[0]) if sock.poll(10_000) else None
            welcomed += reply is not None and reply[0] == "welcome"
            refused += reply is not None and reply[0] == "error"
        held = _call(address, [wire.encode("status")])
        held_pids = sorted({s["pid"] for s in held[1]["sessions"]}) if held else []
        for sock in socks:
            sock.close(0)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status = _call(address, [wire.encode("status")])
            if status is not None and not status[1]["sessions"]:
                break
            time.sleep(0.1)
        left = len(status[1]["sessions"]) if status is not None else -1
        with FastLoader(data, batch_size=4, transform=RESIZE, device="cpu", daemon=address) as loader:
            attached = sum(1 for _ in zip(range(3), loader, strict=False)) == 3
        return {
            "hellos": peers,
            "welcomed": welcomed,
            "refused": refused,
            "session_pids": held_pids,
            "left_after_disconnect": left,
            "real_trainer_attached": attached,
        }
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()
        proc.terminate()
        proc.wait(30)


def soak(data: str, base: Path, seconds: float) -> dict[str, Any]:
    proc = _serve(base / "sk", 2)
    address = f"ipc://{base / 'sk' / 'daemon.sock'}"
    daemon = psutil.Process(proc.pid)
    samples: list[float] = []
    cycles = 0
    try:
        end = time.monotonic() + seconds
        next_sample = 0.0
        while time.monotonic() < end:
            loader = FastLoader(
                data, batch_size=8, shuffle=True, seed=cycles, transform=RESIZE, device="cpu", daemon=address
            )
            for _ in zip(range(4), loader, strict=False):
                pass
            loader.close()
            cycles += 1
            if time.monotonic() >= next_sample:
                samples.append(daemon.memory_info().rss / 2**20)
                next_sample = time.monotonic() + 1.0
        status = _call(address, [wire.encode("status")])
        return {
            "seconds": seconds,
            "sessions_opened": cycles,
            "rss_first_mib": samples[0],
            "rss_last_mib": samples[-1],
            "rss_max_mib": max(samples),
            "sessions_left": len(status[1]["sessions"]) if status else -1,
        }
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="an ImageNet-layout folder (default: a generated one)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=0.1, help="seconds between worker kills")
    parser.add_argument("--trainers", type=int, default=3)
    parser.add_argument("--fuzz", type=int, default=13000)
    parser.add_argument("--fuzz-hellos", type=int, default=10000, help="fuzzed hellos per transport")
    parser.add_argument("--peers", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=300.0, help="length of the soak")
    parser.add_argument(
        "--only",
        choices=[
            "kills-local", "kills-daemon", "fuzz", "fuzz-tcp", "fuzz-hellos", "fuzz-hellos-tcp",
            "sessions", "soak",
        ],
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fastload-rel-") as tmp:
        base = Path(tmp)
        data = args.data
        if data is None:
            from fastload._demo import make_demo_dataset

            data = str(make_demo_dataset(base / "data", images=256))
        phases = {
            "kills-local": lambda: kills_local(args.workers, args.epochs, args.kill_every),
            "kills-daemon": lambda: kills_daemon(
                data, base, args.workers, args.trainers, args.epochs, args.kill_every
            ),
            "fuzz": lambda: fuzz(data, base, args.fuzz, tcp=False),
            "fuzz-tcp": lambda: fuzz(data, base, args.fuzz, tcp=True),
            "fuzz-hellos": lambda: fuzz_hellos(data, base, args.fuzz_hellos, tcp=False),
            "fuzz-hellos-tcp": lambda: fuzz_hellos(data, base, args.fuzz_hellos, tcp=True),
            "sessions": lambda: sessions(data, base, args.peers),
            "soak": lambda: soak(data, base, args.seconds),
        }
        for name, phase in phases.items():
            if args.only and name != args.only:
                continue
            print(json.dumps({"phase": name, **phase()}), flush=True)


if __name__ == "__main__":
    main()
