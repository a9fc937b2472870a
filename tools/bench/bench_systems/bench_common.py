"""The command line and the timing protocol shared by the benchmark's system scripts.

Standard library only, so every system's venv can import it: a script run directly has this
folder first on sys.path. A system script parses its arguments with `parse_args`, notes
`time.monotonic()` just before it constructs its dataset and loader, and hands the loader to
`measure`, which prints the one JSON line the harness (tools/bench/bench_loaders.py) reads:

    {"images": int, "steady_seconds": float, "ttfb_seconds": float,
     "batches": int, "steady_window": [float, float], "bytes": int (only when asked)}

`images` and `bytes` count only the batches after the first; `steady_seconds` runs from the
first batch's arrival to the last one's; `ttfb_seconds` from the construction start to the first
batch; `steady_window` is that steady span in `time.monotonic()` seconds (one clock for every
process on Linux), so the harness can cut the process tree's CPU time to it.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

B = TypeVar("B")


@dataclass(frozen=True)
class Options:
    """What the harness passes to every system script."""

    data: Path | None
    workers: int
    batch_size: int
    epochs: int
    batches: int | None
    prepare: bool


def parse_args(description: str, *, needs_data: bool = True, can_prepare: bool = False) -> Options:
    """Parse --data/--workers/--batch-size/--epochs/--batches (and --prepare where offered)."""
    parser = argparse.ArgumentParser(description=description)
    if needs_data:
        parser.add_argument("--data", type=Path, required=True, help="ImageNet-layout folder")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1, help="passes over the data")
    parser.add_argument("--batches", type=int, help="stop after this many batches (epochs repeat as needed)")
    if can_prepare:
        parser.add_argument("--prepare", action="store_true", help="build the untimed cache, then exit")
    args = parser.parse_args()
    if args.epochs < 1 or (args.batches is not None and args.batches < 2):
        parser.error("need --epochs >= 1 and --batches >= 2 (the first batch is not timed)")
    return Options(
        data=getattr(args, "data", None),
        workers=args.workers,
        batch_size=args.batch_size,
        epochs=args.epochs,
        batches=args.batches,
        prepare=getattr(args, "prepare", False),
    )


def batches_of(loader: Iterable[B], options: Options) -> Iterator[B]:
    """The loader's batches over --epochs passes, or exactly --batches of them if given."""
    count = 0
    epoch = 0
    while options.batches is not None or epoch < options.epochs:
        produced = False
        for batch in loader:
            produced = True
            yield batch
            count += 1
            if count == options.batches:
                return
        if not produced:
            raise RuntimeError("the loader produced an empty epoch")
        epoch += 1


def measure(
    start: float,
    batches: Iterable[B],
    images_in: Callable[[B], int],
    bytes_in: Callable[[B], int] | None = None,
) -> None:
    """Time `batches` (loader construction began at monotonic `start`); print the JSON line."""
    first = last = 0.0
    count = images = nbytes = 0
    for batch in batches:
        last = time.monotonic()
        if count == 0:
            first = last
        else:
            images += images_in(batch)
            if bytes_in is not None:
                nbytes += bytes_in(batch)
        count += 1
    if count < 2:
        raise RuntimeError(f"need at least 2 batches to time a steady state, got {count}")
    result: dict[str, object] = {
        "images": images,
        "steady_seconds": last - first,
        "ttfb_seconds": first - start,
        "batches": count,
        "steady_window": [first, last],
    }
    if bytes_in is not None:
        result["bytes"] = nbytes
    print(json.dumps(result), flush=True)
