"""Rows/s of FastLoader(sources.HDF5(...)) against torch's DataLoader on a tabular HDF5 file.

The file holds `x`, ROWS x FEATURES float32, and `y`, an int64 label per row; it is written by this
script into --dir (default: a temporary directory, removed afterwards), once per layout:
contiguous, chunked (CHUNK_ROWS x FEATURES chunks, uncompressed) and, if asked for, gzip (the same
chunks, compressed). Both loaders run shuffled batches of --batch-size with --workers workers on
the CPU:

  fastload    FastLoader(HDF5(path, data="x", labels="y"), num_workers=W, device="cpu")
  DataLoader  DataLoader(H5Rows(path), batch_size=B, shuffle=True, num_workers=W), where
              H5Rows.__getitem__ reads one row and its label with h5py from a file each worker
              opens lazily (what users are told to do with HDF5 and DataLoader)

Each round builds each loader afresh (alternating which goes first), skips --warmup batches, then
times --batches batches; the loader is closed before the other one runs. Printed: one markdown row
per layout with the medians and [min-max] over the rounds, and each round's ratio.

    .venv/bin/python tools/bench/bench_hdf5.py [--dir DIR] [--rows 1000000] [--features 64]
        [--batch-size 1024] [--workers 2] [--rounds 5] [--batches 200] [--warmup 10]
        [--layouts contiguous,chunked] [--chunk-rows 1024]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import h5py
import numpy as np
import torch

from fastload import FastLoader, sources

LAYOUTS = ("contiguous", "chunked", "gzip")


class H5Rows(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """One row and its label per __getitem__, read with h5py from a file opened once per worker."""

    def __init__(self, path: str) -> None:
        self.path = path
        with h5py.File(path, "r") as f:
            self.rows = len(f["x"])
        self.file: Any = None

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.file is None:  # in the worker, never in the parent: handles must not cross fork
            self.file = h5py.File(self.path, "r")
            self.x, self.y = self.file["x"], self.file["y"]
        return torch.from_numpy(self.x[i]), int(self.y[i])


def write_file(path: str, layout: str, rows: int, features: int, chunk_rows: int) -> None:
    rng = np.random.default_rng(0)
    chunks = None if layout == "contiguous" else (min(chunk_rows, rows), features)
    compression = "gzip" if layout == "gzip" else None
    step = 1 << 17
    with h5py.File(path, "w") as f:
        x = f.create_dataset("x", (rows, features), np.float32, chunks=chunks, compression=compression)
        for at in range(0, rows, step):
            x[at : at + step] = rng.standard_normal((min(step, rows - at), features), dtype=np.float32)
        f.create_dataset("y", data=rng.integers(0, 1000, rows, dtype=np.int64))


def rows_per_s(batches: Iterable[Any], warmup: int, count: int) -> float:
    """Rows/s over `count` batches after `warmup` ones."""
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    rows = 0
    started = time.perf_counter()
    for _ in range(count):
        x, _labels = next(it)[:2]
        rows += len(x)
    return rows / (time.perf_counter() - started)


def measure_fastload(path: str, args: argparse.Namespace) -> float:
    source = sources.HDF5(path, data="x", labels="y")
    with FastLoader(
        source, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, device="cpu"
    ) as loader:
        return rows_per_s(loader, args.warmup, args.batches)


def measure_dataloader(path: str, args: argparse.Namespace) -> float:
    loader = torch.utils.data.DataLoader(
        H5Rows(path), batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )
    it = iter(loader)
    try:
        return rows_per_s(it, args.warmup, args.batches)
    finally:
        it._shutdown_workers()  # type: ignore[attr-defined]


def spread(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    med, low, high = (v / scale for v in (statistics.median(values), min(values), max(values)))
    return f"{med:,.{digits}f} [{low:,.{digits}f}–{high:,.{digits}f}]"


def bench_layout(path: str, args: argparse.Namespace) -> tuple[list[float], list[float]]:
    runs: dict[str, list[float]] = {"fastload": [], "DataLoader": []}
    measures: dict[str, Callable[[str, argparse.Namespace], float]] = {
        "fastload": measure_fastload,
        "DataLoader": measure_dataloader,
    }
    for round_ in range(args.rounds):
        order = ["fastload", "DataLoader"] if round_ % 2 == 0 else ["DataLoader", "fastload"]
        for name in order:
            runs[name].append(measures[name](path, args))
        print(
            f"  round {round_ + 1}: fastload {runs['fastload'][-1]:,.0f} rows/s, "
            f"DataLoader {runs['DataLoader'][-1]:,.0f} rows/s, "
            f"ratio {runs['fastload'][-1] / runs['DataLoader'][-1]:.1f}x",
            flush=True,
        )
    return runs["fastload"], runs["DataLoader"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", help="where to write the files (default: a temporary directory)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200, help="timed batches per measurement")
    parser.add_argument("--warmup", type=int, default=10, help="batches skipped before timing")
    parser.add_argument(
        "--layouts", default="contiguous,chunked", help=f"comma-separated: {', '.join(LAYOUTS)}"
    )
    parser.add_argument("--chunk-rows", type=int, default=1024, help="rows per chunk (chunked, gzip)")
    args = parser.parse_args()
    layouts = [name for name in args.layouts.split(",") if name]
    unknown = set(layouts) - set(LAYOUTS)
    if unknown:
        parser.error(f"unknown layouts {sorted(unknown)}; known: {', '.join(LAYOUTS)}")
    directory = args.dir or tempfile.mkdtemp(prefix="bench_hdf5_")
    os.makedirs(directory, exist_ok=True)
    rows: list[str] = []
    try:
        for layout in layouts:
            path = os.path.join(directory, f"tabular_{layout}.h5")
            write_file(path, layout, args.rows, args.features, args.chunk_rows)
            print(f"{layout}: {path} ({os.path.getsize(path) / 2**20:,.0f} MiB)", flush=True)
            fast, torch_rows = bench_layout(path, args)
            ratios = [f / t for f, t in zip(fast, torch_rows, strict=True)]
            rows.append(
                f"| {layout} | {spread(fast)} | {spread(torch_rows)} | {spread(ratios, digits=1)} | "
                f"{', '.join(f'{r:.1f}' for r in ratios)} |"
            )
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    print(
        f"\n{args.rows:,} rows x {args.features} float32 + int64 label, batch {args.batch_size}, shuffled, "
        f"{args.workers} workers, {args.rounds} rounds of {args.batches} batches after {args.warmup}\n"
    )
    print("| layout | fastload rows/s | DataLoader rows/s | ratio (median [min–max]) | ratio per round |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
