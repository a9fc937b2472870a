"""How long each epoch's first batch keeps the trainer waiting: a local loader against a daemon
session (issue 28: daemon sessions restarted cold every epoch, 14-80 ms against ~1 ms locally).

One FastLoader per round and mode, `--epochs` epochs each (`set_epoch(e)` at the top of the loop,
as a training loop does), a simulated model step of `--step-ms` per batch (a sleep: the trainer's
process idle, as while a GPU computes), RandomResizedCrop(224) + flip, device="cpu". The wait for
an epoch's first batch is the time its first `next()` takes. Rounds alternate local and daemon
(a `fastload serve --workers W` of its own, warm: started and the dataset indexed before the
round's loader is made). Reported per mode: the first epoch's wait and the later epochs' waits,
each as the median [min-max] over all rounds, and their difference, daemon - local.

    .venv/bin/python tools/bench/bench_epoch_start.py [--data DIR] [--rounds 3] [--epochs 10]
        [--workers 2] [--batch-size 64] [--step-ms 150]

--data defaults to $BENCH_DATA; without either, 1,024 photo-like JPEGs are written to a temporary
folder (`fastload demo`'s generator) and removed after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from fastload import FastLoader
from fastload import transforms as T
from fastload._demo import make_demo_dataset


@contextlib.contextmanager
def daemon(data: str, workers: int) -> Iterator[str]:
    """A `fastload serve` on a private socket directory, its dataset indexed: its address."""
    with tempfile.TemporaryDirectory(prefix="fastload-bench-") as socket_dir:
        os.chmod(socket_dir, 0o700)
        command = [sys.executable, "-m", "fastload", "serve", "--workers", str(workers),
                   "--socket-dir", socket_dir, "--dataset", data]
        log = Path(socket_dir, "daemon.log")
        with log.open("w") as stderr:
            proc = subprocess.Popen(command, stderr=stderr)
        address = f"ipc://{socket_dir}/daemon.sock"
        try:
            status = [sys.executable, "-m", "fastload", "status", "--address", address, "--json"]
            deadline = time.monotonic() + 120
            while subprocess.run(status, capture_output=True).returncode != 0:  # up, and indexed
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the daemon did not start:\n{log.read_text()[-2000:]}")
                time.sleep(0.2)
            yield address
        finally:
            proc.terminate()
            proc.wait(60)


def first_batch_waits(data: str, args: argparse.Namespace, address: str | None) -> list[float]:
    """Seconds each epoch's first next() took, for one loader over `args.epochs` epochs."""
    waits = []
    transform = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    with FastLoader(
        data, batch_size=args.batch_size, shuffle=True, seed=0, num_workers=args.workers,
        transform=transform, device="cpu", daemon=address,
    ) as loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            batches = iter(loader)
            started = time.perf_counter()
            next(batches)
            waits.append(time.perf_counter() - started)
            time.sleep(args.step_ms / 1000)
            for _batch in batches:
                time.sleep(args.step_ms / 1000)
    return waits


def _summary(seconds: list[float]) -> str:
    ms = [1000 * s for s in seconds]
    return f"{statistics.median(ms):7.1f} ms [{min(ms):.1f}-{max(ms):.1f}] (n={len(ms)})"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", default=os.environ.get("BENCH_DATA") or None, help="an ImageNet-layout folder"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=150.0, help="simulated model step per batch")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        data = args.data
        if data is None:
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            data = str(make_demo_dataset(scratch, images=1024))
        first: dict[str, list[float]] = {"local": [], "daemon": []}
        later: dict[str, list[float]] = {"local": [], "daemon": []}
        for round_ in range(args.rounds):
            for mode in ("local", "daemon") if round_ % 2 == 0 else ("daemon", "local"):
                with daemon(data, args.workers) if mode == "daemon" else contextlib.nullcontext() as address:
                    waits = first_batch_waits(data, args, address)
                first[mode].append(waits[0])
                later[mode].extend(waits[1:])
                shown = " ".join(f"{1000 * w:.1f}" for w in waits)
                print(f"round {round_ + 1} {mode:6s}: {shown} ms", flush=True)
        print(
            f"\n{args.epochs} epochs x {args.rounds} rounds, {args.workers} workers, batch "
            f"{args.batch_size}, step {args.step_ms:g} ms; wait for an epoch's first batch, median [min-max]:"
        )
        for mode in ("local", "daemon"):
            print(f"  {mode:6s} first epoch {_summary(first[mode])}   later epochs {_summary(later[mode])}")
        gap = statistics.median(later["daemon"]) - statistics.median(later["local"])
        print(f"  later epochs, daemon - local: {1000 * gap:+.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
