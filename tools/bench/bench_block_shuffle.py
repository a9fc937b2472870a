"""Measure what a block shuffle (ShuffledPlan(..., block=R, window=W)) costs in mixing and saves in reads.

The samples' labels lie in storage order as an ImageNet folder tree's do, sorted by class
(label = index * classes // samples), so that a run of neighbours is mostly one class. For the
full shuffle, block shuffles for every R in --blocks and W in --windows, and the sequential order
(no shuffle), it prints one markdown row per order, over the epoch's full batches:

  labels/batch    mean number of distinct labels in a batch
  TV              mean total-variation distance between a batch's label histogram and the
                  dataset's (a full shuffle is not 0: a batch is a small sample)
  neighbour gap   mean |order[i+1] - order[i]|, relative to the full shuffle's (~samples / 3)
  reads/batch     contiguous storage ranges a batch touches: its indices sorted, adjacent ones merged
  samples/read    batch size / reads per batch
  window reads    the same for the union of each window's W batches (aligned as the plan's windows;
    /batch        W = 1 for the full shuffle and sequential), divided by W: the reads per batch
                  where a run, once read, serves the window's later batches (chunked storage,
                  readahead, the page cache). With W > 1 a batch takes ~R / W samples of each of
                  its window's runs, rarely adjacent ones, so reads/batch alone misses that.
  order ms        time to build the rank's order for the epoch (ShuffledPlan.order), best of 3

    .venv/bin/python tools/bench/bench_block_shuffle.py [--samples 1281167] [--classes 1000]
        [--batch-size 256] [--blocks 1,8,32,128,1024] [--windows 1,8,32] [--world-size 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fastload._loading.order.plan import ShuffledPlan

CHUNK = 1024  # batches whose label histograms are counted at once (CHUNK x classes counts)


def batches(order: np.ndarray, batch_size: int) -> np.ndarray:
    """The order's full batches, one per row."""
    whole = len(order) // batch_size
    return order[: whole * batch_size].reshape(whole, batch_size)


def label_mixing(rows: np.ndarray, labels: np.ndarray, classes: int) -> tuple[float, float]:
    """(mean distinct labels per batch, mean TV distance of a batch's label histogram to the dataset's)."""
    dataset = np.bincount(labels, minlength=classes) / len(labels)
    distinct, tv = [], []
    for at in range(0, len(rows), CHUNK):
        chunk = labels[rows[at : at + CHUNK]]
        flat = chunk + classes * np.arange(len(chunk))[:, None]
        counts = np.bincount(flat.ravel(), minlength=len(chunk) * classes).reshape(len(chunk), classes)
        distinct.append((counts > 0).sum(axis=1))
        tv.append(0.5 * np.abs(counts / rows.shape[1] - dataset).sum(axis=1))
    return float(np.concatenate(distinct).mean()), float(np.concatenate(tv).mean())


def reads_per_batch(rows: np.ndarray, window: int = 1) -> float:
    """Mean number of contiguous index ranges per batch (indices sorted, adjacent ones merged),
    counted over the union of each `window` consecutive batches and divided by `window`."""
    whole = len(rows) // window * window
    ordered = np.sort(rows[:whole].reshape(whole // window, -1), axis=1)
    return float((1 + (np.diff(ordered, axis=1) > 1).sum(axis=1)).mean()) / window


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1_281_167, help="dataset size (ImageNet-1k train)")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--blocks", default="1,8,32,128,1024", help="run lengths R, comma-separated")
    parser.add_argument("--windows", default="1,8,32", help="window sizes W in batches, comma-separated")
    parser.add_argument("--world-size", type=int, default=1, help="measure rank 0 of this many")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument(
        "--storage", choices=("sorted", "shuffled"), default="sorted",
        help="labels in storage order: sorted by class (a folder), or shuffled (fastload pack --shuffle)",
    )  # fmt: skip
    args = parser.parse_args()
    n, classes, batch_size = args.samples, args.classes, args.batch_size
    labels = np.arange(n, dtype=np.int64) * classes // n
    if args.storage == "shuffled":
        labels = np.random.default_rng(12345).permutation(labels)

    def plan(shuffle: bool, block: int | None = None, window: int = 8) -> ShuffledPlan:
        return ShuffledPlan(
            n, batch_size, shuffle=shuffle, drop_last=False, seed=args.seed,
            world_size=args.world_size, block=block, window=window,
        )  # fmt: skip

    plans = [("full shuffle", plan(True), 1)]
    for block in (int(b) for b in args.blocks.split(",")):
        for window in (int(w) for w in args.windows.split(",")):
            plans.append((f"block R={block}, window={window}", plan(True, block, window), window))
    plans.append(("sequential", plan(False), 1))

    print(
        f"{n} samples, {classes} classes {args.storage} in storage order, batch size {batch_size}, "
        f"rank 0 of {args.world_size}, epoch {args.epoch}\n"
    )
    print(
        "| order | labels/batch | TV | neighbour gap (x full) | reads/batch | samples/read "
        "| window reads/batch | order ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    full_gap = 0.0
    for name, p, window in plans:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            order = p.order(args.epoch)
            times.append(time.perf_counter() - start)
        gap = float(np.abs(np.diff(order)).mean())
        full_gap = full_gap or gap  # the first row's, the full shuffle's
        rows = batches(order, batch_size)
        distinct, tv = label_mixing(rows, labels, classes)
        reads = reads_per_batch(rows)
        print(
            f"| {name} | {distinct:.1f} | {tv:.3f} | {gap / full_gap:.4f} | {reads:.1f} "
            f"| {batch_size / reads:.2f} | {reads_per_batch(rows, window):.1f} | {min(times) * 1000:.0f} |"
        )


if __name__ == "__main__":
    main()
