"""Benchmark system: the machine's ceiling — one process per worker decoding + cropping the same
files with the decoder FastLoader uses (its backend, RandomResizedCrop(224) + flip, into one
reused buffer); no loader, no collate, no transport. Prints the bench_common JSON line; the
"first batch" is the moment every process starts, so ttfb is 0 by construction.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time

import numpy as np
from bench_common import parse_args

from fastload._loading.decoding.backend import make_backend
from fastload._sample_random import sample_randoms
from fastload.sources._formats.folder import scan_image_folder
from fastload.transforms import RandomHorizontalFlip, RandomResizedCrop, compile_transforms


def _work(args: tuple[str, list[int], float]) -> tuple[int, float]:
    root, indices, start_at = args
    index = scan_image_folder(root)
    backend = make_backend("native", compile_transforms([RandomResizedCrop(224), RandomHorizontalFlip()]))
    out = np.empty((1, 224, 224, 3), np.uint8)
    while time.monotonic() < start_at:  # every process starts together
        time.sleep(0.001)
    for i in indices:
        with open(index.path(i), "rb") as f:
            backend.decode_batch([f.read()], sample_randoms(0, 0, np.array([i])), out)
    return len(indices), time.monotonic()


def main() -> None:
    options = parse_args(__doc__.splitlines()[0])
    n = len(scan_image_folder(options.data))
    total = options.batches * options.batch_size if options.batches else n * options.epochs
    order = np.random.default_rng(0).permutation(np.resize(np.arange(n), total)).tolist()
    start_at = time.monotonic() + 0.5
    with mp.get_context("fork").Pool(options.workers) as pool:
        shares = [(str(options.data), order[w :: options.workers], start_at) for w in range(options.workers)]
        results = pool.map(_work, shares)
    images = sum(count for count, _ in results)
    end = max(t for _, t in results)
    print(json.dumps({
        "images": images, "steady_seconds": end - start_at, "ttfb_seconds": 0.0,
        "batches": total // options.batch_size, "steady_window": [start_at, end],
    }), flush=True)


if __name__ == "__main__":
    main()
