"""Benchmark system: the machine's ceiling — W processes decoding + cropping, no loader at all.

Each process reads its share of the folder's files and runs the very decoder FastLoader uses
(fastload's Pillow backend, RandomResizedCrop(224) + flip) into one reused buffer; nothing is
collated or shipped. Prints one JSON line: {"images", "steady_seconds", "ttfb_seconds"}.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import numpy as np

from fastload._backends.pil import decode_into
from fastload._plan import sample_rng
from fastload._sources import ImageFolderIndex
from fastload.transforms import RandomHorizontalFlip, RandomResizedCrop, compile_transforms


def _work(args: tuple[str, list[int], float]) -> int:
    root, indices, start_at = args
    index = ImageFolderIndex.scan(root)
    plan = compile_transforms([RandomResizedCrop(224), RandomHorizontalFlip()])
    out = np.empty((224, 224, 3), np.uint8)
    while time.perf_counter() < start_at:  # start every process together
        time.sleep(0.001)
    for i in indices:
        with open(index.path(i), "rb") as f:
            decode_into(f.read(), plan, sample_rng(0, 0, i), out)
    return len(indices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=0)
    args = parser.parse_args()

    n = len(ImageFolderIndex.scan(args.data))
    total = min(n * args.epochs, args.batches * args.batch_size) if args.batches else n * args.epochs
    order = np.random.default_rng(0).permutation(np.resize(np.arange(n), total)).tolist()
    start_at = time.perf_counter() + 0.5
    with mp.get_context("fork").Pool(args.workers) as pool:
        shares = [(args.data, order[w :: args.workers], start_at) for w in range(args.workers)]
        images = sum(pool.map(_work, shares))
    steady = time.perf_counter() - start_at
    print(json.dumps({"images": images, "steady_seconds": steady, "ttfb_seconds": 0.0}))


if __name__ == "__main__":
    main()
