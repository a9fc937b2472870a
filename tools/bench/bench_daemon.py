"""Benchmark the loader daemon: two trainers sharing it, and attach-to-first-batch latency.

1. Aggregate: two trainers at once on one daemon with W workers, against two torch DataLoaders
   with W/2 workers each, on the same folder (RandomResizedCrop(224) + flip). Images/s summed
   over both trainers (each timed from its first batch to its last), and CPU seconds per image of
   everything involved (trainers, daemon and workers; DataLoaders and their workers), alternating
   the two set-ups over R rounds; medians.
2. Attach latency: with the daemon warm (dataset indexed, workers up), seconds from a trainer's
   FastLoader(..., daemon=...) to its first batch, against DataLoader's construction to first
   batch (which starts its worker processes), each run N times in fresh processes; medians.

    .venv/bin/python tools/bench/bench_daemon.py --data DIR --rounds 3

--data defaults to $BENCH_DATA (an ImageNet-layout folder: tools/bench/make_bench_dataset.py makes one);
the DataLoader side runs in $BENCH_VENVS/tv, the venv tools/bench/bench_env.sh made.
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

import psutil

REPO = Path(__file__).resolve().parents[2]
SYSTEMS = Path(__file__).resolve().parent / "bench_systems"
MAIN_PYTHON = REPO / ".venv" / "bin" / "python"
VENVS = os.environ.get("BENCH_VENVS")
TV_PYTHON = Path(VENVS) / "tv" / "bin" / "python" if VENVS else None


def _tree_cpu(pids: list[int]) -> float:
    """user+sys seconds of these processes and all their live descendants (and reaped children)."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.NoSuchProcess:
                pass
    return total


def _run_pair(commands: list[list[str]], extra_pids: list[int]) -> dict[str, float]:
    """Start two trainers together; return aggregate images/s and CPU ms per image."""
    cpu_before = _tree_cpu(extra_pids)
    usage_before = os.times()
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in commands]
    outs = [p.communicate()[0] for p in procs]
    usage_after = os.times()
    cpu = (usage_after.children_user - usage_before.children_user) + (
        usage_after.children_system - usage_before.children_system
    )
    cpu += _tree_cpu(extra_pids) - cpu_before
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    images = sum(r["images"] for r in results)
    start = min(r["steady_window"][0] for r in results)
    end = max(r["steady_window"][1] for r in results)
    total_images = sum(r["images"] + r["images"] / max(r["batches"] - 1, 1) for r in results)
    return {"images_per_s": images / (end - start), "cpu_ms_per_image": 1000 * cpu / total_images}


def _start_daemon(socket_dir: str, workers: int, data: str) -> subprocess.Popen[bytes]:
    daemon = subprocess.Popen(
        [
            str(MAIN_PYTHON),
            "-m",
            "fastload",
            "serve",
            "--workers",
            str(workers),
            "--socket-dir",
            socket_dir,
            "--dataset",
            data,
        ],
        stderr=subprocess.DEVNULL,
    )
    sock = Path(socket_dir) / "daemon.sock"
    deadline = time.monotonic() + 30
    while not sock.exists():
        if time.monotonic() > deadline or daemon.poll() is not None:
            raise RuntimeError("the daemon did not start")
        time.sleep(0.05)
    time.sleep(1.0)  # let the workers finish starting: the daemon is "warm"
    return daemon


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data",
        default=os.environ.get("BENCH_DATA") or None,
        help="ImageNet-layout folder (default: $BENCH_DATA)",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=40, help="batches per trainer per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attach-runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.data is None:
        parser.error(
            "no data: pass --data DIR or set BENCH_DATA (tools/bench/make_bench_dataset.py makes one)"
        )
    if TV_PYTHON is None:
        parser.error(
            "set BENCH_VENVS to the folder where tools/bench/bench_env.sh made the peer venvs (uses tv)"
        )

    common = ["--data", args.data, "--batch-size", str(args.batch_size), "--batches", str(args.batches)]
    with tempfile.TemporaryDirectory(prefix="fastload-bench-") as socket_dir:
        os.chmod(socket_dir, 0o700)
        address = f"ipc://{socket_dir}/daemon.sock"
        daemon = _start_daemon(socket_dir, args.workers, args.data)
        try:
            fast = [str(MAIN_PYTHON), str(SYSTEMS / "fastload_loader.py"), "--daemon", address, *common]
            torch_dl = [
                str(TV_PYTHON),
                str(SYSTEMS / "dataloader_fastcollate.py"),
                "--workers",
                str(max(1, args.workers // 2)),
                *common,
            ]
            runs: dict[str, list[dict[str, float]]] = {"daemon, 2 trainers": [], "2 DataLoaders": []}
            for r in range(args.rounds):
                order = list(runs) if r % 2 == 0 else list(reversed(runs))
                for name in order:
                    if name.startswith("daemon"):
                        result = _run_pair([[*fast, "--seed", str(k)] for k in range(2)], [daemon.pid])
                    else:
                        result = _run_pair([torch_dl, torch_dl], [])
                    runs[name].append(result)
                    print(f"# round {r} {name}: {result['images_per_s']:.0f} img/s", file=sys.stderr)

            attach: dict[str, list[float]] = {
                "FastLoader attach to warm daemon": [],
                "DataLoader start-up": [],
            }
            short = ["--data", args.data, "--batch-size", str(args.batch_size), "--batches", "2"]
            for _ in range(args.attach_runs):
                out = subprocess.run(
                    [str(MAIN_PYTHON), str(SYSTEMS / "fastload_loader.py"), "--daemon", address, *short],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                attach["FastLoader attach to warm daemon"].append(
                    json.loads(out.splitlines()[-1])["ttfb_seconds"]
                )
                out = subprocess.run(
                    [
                        str(TV_PYTHON),
                        str(SYSTEMS / "dataloader_fastcollate.py"),
                        "--workers",
                        str(args.workers),
                        *short,
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                attach["DataLoader start-up"].append(json.loads(out.splitlines()[-1])["ttfb_seconds"])
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)

    print("| set-up | images/s (sum of 2 trainers) | CPU ms/img (everything) |")
    print("|---|---|---|")
    for name, results in runs.items():
        rate = statistics.median(x["images_per_s"] for x in results)
        cpu = statistics.median(x["cpu_ms_per_image"] for x in results)
        print(f"| {name} | {rate:.0f} | {cpu:.2f} |")
    print()
    print("| time to first batch | median s | runs |")
    print("|---|---|---|")
    for name, values in attach.items():
        print(f"| {name} | {statistics.median(values):.3f} | {', '.join(f'{v:.3f}' for v in values)} |")
    if args.json:
        args.json.write_text(json.dumps({"pairs": runs, "attach": attach}, indent=1))


if __name__ == "__main__":
    main()
