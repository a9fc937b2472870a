"""Benchmark system: FastLoader on an image folder, RandomResizedCrop(224) + flip, uint8 out.

Prints one JSON line: {"images", "steady_seconds", "ttfb_seconds"} (steady = after batch one).
"""

from __future__ import annotations

import argparse
import json
import time

from fastload import FastLoader
from fastload import transforms as T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=0, help="stop after this many batches (0: all)")
    parser.add_argument("--backend", default="native")
    args = parser.parse_args()

    start = time.perf_counter()
    loader = FastLoader(
        args.data, batch_size=args.batch_size, shuffle=True, drop_last=True, seed=0,
        num_workers=args.workers, device="cpu", backend=args.backend,
        transform=[T.RandomResizedCrop(224), T.RandomHorizontalFlip()],
    )
    images, ttfb, first = 0, 0.0, 0.0
    done = 0
    with loader:
        for _ in range(args.epochs):
            for x, _y in loader:
                done += 1
                if done == 1:
                    first = time.perf_counter()
                    ttfb = first - start
                else:
                    images += x.shape[0]
                if args.batches and done >= args.batches:
                    break
            if args.batches and done >= args.batches:
                break
    steady = time.perf_counter() - first
    print(json.dumps({"images": images, "steady_seconds": steady, "ttfb_seconds": ttfb}))


if __name__ == "__main__":
    main()
