"""Benchmark the daemon's shares by need (NOTE [shares by need]) against round-robin.

Two set-ups, each on a daemon with W workers (2), trainers in processes of their own:
1. starving + trainer-bound: one trainer takes batches as fast as they come, the other sleeps a
   simulated step (a GPU's: no CPU) of 2x its batch's decode time (the pool's worker seconds per
   batch, measured first by a trainer alone) after each batch. Reported: the starving trainer's
   images/s and the trainer-bound one's steps/s, each as a ratio need / round-robin.
2. training + validation: two starving trainers, the second at priority=0.25 (a validation job
   beside training). Reported: the training trainer's images/s, need / round-robin.
Each round runs both policies (`FASTLOAD_DAEMON_SHARES`, read by `fastload serve` at start: a
benchmarking aid), in alternating order; each trainer is timed over the same steady window
(opened once both have attached); ratios are per round (paired), medians over the rounds.
Absolute rates move with whatever else loads the machine; each trainer's fraction of the images
the pool delivered in the same window (`*_fraction`) is what the policy decides, and is steadier.

    PYTHONPATH=. .venv/bin/python tools/bench/bench_daemon_shares.py --rounds 3 [--data DIR]

--data defaults to $BENCH_DATA, else a demo folder of 512 photo-like JPEGs made once under the
system's temporary directory. Not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TRANSFORM = "RandomResizedCrop(224) + RandomHorizontalFlip"


def trainer(args: argparse.Namespace) -> None:
    """One trainer: attaches, says `ready`, reads the window's start (unix time) from stdin, and
    prints {images, batches, seconds, worker_s_per_batch} of the batches it got in the window."""
    from fastload import FastLoader
    from fastload import transforms as T

    loader = FastLoader(
        args.data,
        batch_size=args.batch_size,
        shuffle=True,
        seed=args.seed,
        daemon=args.daemon,
        transform=[T.RandomResizedCrop(224), T.RandomHorizontalFlip()],
        device="cpu",
        priority=args.priority,
    )
    images = batches = 0
    with loader:
        print("ready", flush=True)
        start = float(sys.stdin.readline())
        end = start + args.seconds
        time.sleep(max(0.0, start - time.time()))
        while time.time() < end:
            for taken, _ in loader:
                if time.time() >= end:
                    break
                images += len(taken)
                batches += 1
                if args.step_s:
                    time.sleep(args.step_s)  # a GPU's step: the trainer's CPU is free meanwhile
        stats = loader.stats()
    worker_s = (stats.read_s + stats.decode_s + stats.augment_s) / max(stats.batches, 1) if stats else 0.0
    print(
        json.dumps(
            {
                "images": images,
                "batches": batches,
                "seconds": args.seconds,
                "worker_s_per_batch": worker_s,
            }
        ),
        flush=True,
    )


def _start_daemon(python: str, socket_dir: str, workers: int, data: str, policy: str) -> Any:
    """`fastload serve` feeding by `policy`, once it answers `status` (its workers up, the
    dataset indexed); its log goes to socket_dir/daemon-<policy>.log."""
    from fastload._daemon.control import request

    env = {**os.environ, "FASTLOAD_DAEMON_SHARES": policy}
    log = open(Path(socket_dir) / f"daemon-{policy}.log", "ab")  # noqa: SIM115 - the daemon's, for its life
    command = [python, "-m", "fastload", "serve", "--workers", str(workers), "--socket-dir", socket_dir]
    daemon = subprocess.Popen([*command, "--dataset", data], stdout=log, stderr=log, env=env)
    log.close()
    address = f"ipc://{socket_dir}/daemon.sock"
    deadline = time.monotonic() + 180
    while True:
        if time.monotonic() > deadline or daemon.poll() is not None:
            tail = (Path(socket_dir) / f"daemon-{policy}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the daemon did not start:\n{tail}")
        if (Path(socket_dir) / "daemon.sock").exists():
            try:
                if request(address, "status", 2.0)["pid"] == daemon.pid:
                    return daemon
            except Exception:  # not answering yet
                pass
        time.sleep(0.1)


def _run_trainers(command: list[str], specs: list[dict[str, Any]], seconds: float) -> list[dict[str, Any]]:
    """Start the trainers, wait until each has attached, then time them all over one window."""
    procs = []
    for spec in specs:
        extra = [f"--{k.replace('_', '-')}={v}" for k, v in spec.items()]
        procs.append(
            subprocess.Popen(
                [*command, *extra, "--seconds", str(seconds)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", "a trainer did not attach"
    start = time.time() + 0.5
    for p in procs:  # every trainer told before any is waited for
        assert p.stdin is not None
        p.stdin.write(f"{start}\n")
        p.stdin.close()
    outs = [p.stdout.read() for p in procs if p.stdout is not None]
    if any(p.wait() for p in procs):
        raise RuntimeError("a trainer failed (its error is above)")
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA") or None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0, help="each run's steady window")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    # trainer mode (run by the benchmark itself)
    parser.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--daemon", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--priority", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("--step-s", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trainer:
        trainer(args)
        return
    if args.data is None:
        from fastload._demo import make_demo_dataset

        args.data = str(make_demo_dataset(Path(tempfile.gettempdir()) / "fastload-shares-bench"))
    python = sys.executable
    script = str(Path(__file__).resolve())
    results: dict[str, list[dict[str, float]]] = {"need": [], "round-robin": []}
    common = [python, script, "--trainer", "--data", args.data, "--batch-size", str(args.batch_size)]
    with tempfile.TemporaryDirectory(prefix="fastload-shares-") as socket_dir:
        os.chmod(socket_dir, 0o700)
        address = f"ipc://{socket_dir}/daemon.sock"
        here = [*common, "--daemon", address]
        daemon = _start_daemon(python, socket_dir, args.workers, args.data, "need")
        try:  # calibration: a batch's decode time, a trainer alone
            (alone,) = _run_trainers(here, [{"seed": 9}], min(args.seconds, 8.0))
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
        step_s = 2 * alone["worker_s_per_batch"]
        print(
            f"# a batch's decode: {alone['worker_s_per_batch']:.3f} worker-s; step {step_s:.3f} s",
            file=sys.stderr,
        )
        for r in range(args.rounds):
            for policy in ("need", "round-robin") if r % 2 == 0 else ("round-robin", "need"):
                daemon = _start_daemon(python, socket_dir, args.workers, args.data, policy)
                try:
                    starving, bound = _run_trainers(
                        here, [{"seed": 1}, {"seed": 2, "step_s": step_s}], args.seconds
                    )
                    training, validation = _run_trainers(
                        here, [{"seed": 3}, {"seed": 4, "priority": 0.25}], args.seconds
                    )
                finally:
                    daemon.send_signal(signal.SIGTERM)
                    daemon.wait(60)
                row = {
                    "starving_img_s": starving["images"] / starving["seconds"],
                    "bound_steps_s": bound["batches"] / bound["seconds"],
                    "training_img_s": training["images"] / training["seconds"],
                    "validation_img_s": validation["images"] / validation["seconds"],
                    # what the policy decides, whatever else loads the machine: the fraction of the
                    # pool's output (images in the window) the starving / training trainer got
                    "starving_fraction": starving["images"] / (starving["images"] + bound["images"]),
                    "training_fraction": training["images"] / (training["images"] + validation["images"]),
                }
                results[policy].append(row)
                print(
                    f"# round {r} {policy}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()),
                    file=sys.stderr,
                )
    ratios = {
        key: statistics.median(
            n[key] / rr[key] for n, rr in zip(results["need"], results["round-robin"], strict=True)
        )
        for key in results["need"][0]
    }
    print(
        f"daemon, {args.workers} workers, batches of {args.batch_size} ({TRANSFORM}), "
        f"{args.seconds:g} s windows, {args.rounds} rounds; step {step_s:.3f} s (2x a batch's decode)"
    )
    print("| figure | need (median) | round-robin (median) | need / round-robin (median of paired) |")
    print("|---|---|---|---|")
    for key, ratio in ratios.items():
        need = statistics.median(x[key] for x in results["need"])
        rr = statistics.median(x[key] for x in results["round-robin"])
        print(f"| {key} | {need:.2f} | {rr:.2f} | {ratio:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"step_s": step_s, "runs": results, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
