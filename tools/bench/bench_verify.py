"""How long `fastload verify` takes against one training epoch of the same source (issue 22).

Target: verify within 10% of one epoch's decode time with the same workers. Each round times, in
turn (alternating which goes first), `verify(DATA, workers=W)` and one epoch of a FastLoader
over DATA with the training recipe (RandomResizedCrop(224) + flip, batch 64, the same W
workers, device="cpu"), each in a fresh process so that neither warms the other's workers; the
page cache is warmed once before the first round. Medians and [min-max] over the rounds.

    python tools/bench/bench_verify.py --data DIR [--workers 2] [--rounds 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VERIFY = """
import sys
from fastload._diagnostics.verify import verify
result = verify(sys.argv[1], workers=int(sys.argv[2]), progress=None)
print(result.samples, len(result.broken))
"""
EPOCH = """
import sys
from fastload import FastLoader, transforms as T
recipe = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
with FastLoader(sys.argv[1], batch_size=64, num_workers=int(sys.argv[2]), transform=recipe, device="cpu",
                shuffle=True, seed=0) as loader:
    print(sum(len(labels) for _, labels in loader), 0)
"""


def _timed(script: str, data: str, workers: int) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", script, data, str(workers)], capture_output=True, text=True, check=True
    )
    return time.perf_counter() - started, done.stdout.strip()


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA"), help="a source (an image folder)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="append the result here as one JSON line")
    args = parser.parse_args()
    if not args.data:
        parser.error("--data (or $BENCH_DATA) is required")
    _timed(EPOCH, args.data, args.workers)  # the page cache, warmed for both
    times: dict[str, list[float]] = {"verify": [], "epoch": []}
    for round_ in range(args.rounds):
        order = ("verify", "epoch") if round_ % 2 == 0 else ("epoch", "verify")
        for name in order:
            seconds, out = _timed(VERIFY if name == "verify" else EPOCH, args.data, args.workers)
            times[name].append(seconds)
            print(f"round {round_ + 1} {name}: {seconds:.2f} s ({out})", flush=True)
    ratios = [v / e for v, e in zip(times["verify"], times["epoch"], strict=True)]
    row = {
        "data": args.data, "workers": args.workers, "rounds": args.rounds,
        **{f"{k}_s": statistics.median(v) for k, v in times.items()},
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
    }
    print(
        f"verify {row['verify_s']:.2f} s [{min(times['verify']):.2f}-{max(times['verify']):.2f}], "
        f"epoch {row['epoch_s']:.2f} s [{min(times['epoch']):.2f}-{max(times['epoch']):.2f}]; "
        f"verify / epoch {row['ratio_median']:.2f} [{row['ratio_min']:.2f}-{row['ratio_max']:.2f}] "
        "(target <= 1.10)"
    )
    if args.json:
        with open(args.json, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
