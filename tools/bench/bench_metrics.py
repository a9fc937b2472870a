"""What Prometheus metrics cost a loader, and how fast the health-check commands start (issue 24).

Overhead: each round runs, in turn (alternating which goes first), the same epochs of a FastLoader
(RandomResizedCrop(224) + flip, batch 64, W workers, device="cpu") with metrics off and with
`metrics=PORT` while another process scrapes that endpoint every `--scrape-every` seconds (as
Prometheus would, at a far higher rate than its default 15 s). Each run is a fresh process (no
shared warm workers); the first epoch of each is a warm-up and not timed. Medians and
[min-max] of the img/s over the rounds.

Start-up: `fastload status` / `stop` / `iostat` with no daemon (the answer is "none runs", exit
1: the cost is the start-up), against the same `status` after `import torch` (what the package's
eager imports cost each call before NOTE [lazy package]); wall and CPU (user + system) seconds.

    python tools/bench/bench_metrics.py --data DIR [--workers 2] [--rounds 5] [--epochs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

EPOCHS = """
import sys, time
from fastload import FastLoader, transforms as T
data, workers, epochs, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
recipe = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
with FastLoader(data, batch_size=64, num_workers=workers, transform=recipe, device="cpu", shuffle=True,
                seed=0, metrics=None if port == "off" else int(port)) as loader:
    sum(len(labels) for _, labels in loader)  # warm-up epoch
    print("ready", flush=True)
    started, images = time.perf_counter(), 0
    for _ in range(epochs):
        images += sum(len(labels) for _, labels in loader)
    print(images / (time.perf_counter() - started), flush=True)
"""
BEFORE = "import torch, sys; from fastload.__main__ import main; sys.exit(main(['status']))"
SCRAPER = """
import sys, time, urllib.request
url, every = sys.argv[1], float(sys.argv[2])
while True:
    try:
        urllib.request.urlopen(url, timeout=5).read()
    except OSError:
        pass
    time.sleep(every)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(data: str, workers: int, epochs: int, metrics: bool, every: float) -> float:
    port = _free_port() if metrics else None
    loader = subprocess.Popen(
        [sys.executable, "-c", EPOCHS, data, str(workers), str(epochs), str(port or "off")],
        stdout=subprocess.PIPE, text=True,
    )
    assert loader.stdout is not None
    scraper = None
    try:
        assert loader.stdout.readline().strip() == "ready"
        if port is not None:
            url = f"http://127.0.0.1:{port}/metrics"
            scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, url, str(every)])
        rate = float(loader.stdout.readline())
        loader.wait(120)
        return rate
    finally:
        if scraper is not None:
            scraper.kill()
            scraper.wait()
        loader.kill()
        loader.wait()


def start_cost(args: list[str], runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds of `args` (a fresh process each time)."""
    env = {**os.environ, "XDG_RUNTIME_DIR": tempfile.mkdtemp()}  # no daemon answers there
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(args, env=env, capture_output=True)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--scrape-every", type=float, default=0.5)
    parser.add_argument("--json")
    args = parser.parse_args()
    fastload = [sys.executable, "-m", "fastload"]
    starts = {
        "status": start_cost([*fastload, "status"], 9),
        "status --json": start_cost([*fastload, "status", "--json"], 9),
        "stop": start_cost([*fastload, "stop"], 9),
        "iostat 0.01 1": start_cost([*fastload, "iostat", "0.01", "1"], 9),
        "status after import torch (before)": start_cost(
            [sys.executable, "-c", BEFORE], 9
        ),
    }
    for name, (wall, cpu) in starts.items():
        print(f"{name:<36} wall {wall:.2f} s, cpu {cpu:.2f} s", flush=True)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(args.rounds):
        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
        for mode in order:
            rates[mode].append(one_run(args.data, args.workers, args.epochs, mode == "on", args.scrape_every))
        print(f"round {r}: off {rates['off'][-1]:.0f} img/s, on {rates['on'][-1]:.0f} img/s", flush=True)
    ratio = statistics.median(rates["on"]) / statistics.median(rates["off"])
    print(f"metrics off {_summary(rates['off'])} img/s; on, scraped every {args.scrape_every:g} s: "
          f"{_summary(rates['on'])} img/s; on/off {ratio:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"starts": starts, "rates": rates, "ratio": ratio, "args": vars(args)}, f, indent=1)


if __name__ == "__main__":
    main()
