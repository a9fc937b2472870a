"""Read throughput of an image folder against its packed copy, full shuffle and block shuffle.

For each configuration it times the first --batches batches of epoch 0 of the plan, with a cold
page cache (POSIX_FADV_DONTNEED on every file of the dataset first: no root needed) and then warm
(the same batches again), in --rounds rounds whose configurations alternate; it prints the median
of each as a markdown table. Configurations:

  folder  full     the image folder, ShuffledPlan(shuffle=True)
  packed  full     its pack (`fastload pack`), the same plan (the same samples in every batch)
  packed  block    the pack, ShuffledPlan(block=R, window=W)
  packed  block-   the same without readahead (ExtentIndex.readahead = 0), to see what it buys

Modes (--modes):
  read     `index.read(batch)` for each batch of the plan, in this process: storage alone
  decode   a FastLoader (--workers, RandomResizedCrop(224) + flip, native decode) over the same
           batches (`shuffle_block=R, shuffle_window=W` for the block shuffle)

    python tools/bench/bench_sources.py --folder DIR --packed DIR2 [--generate 16000]
        [--batch-size 256] [--block 256] [--window 8] [--batches 30] [--rounds 3]
        [--modes read,decode] [--workers 2]

--generate N writes N photo-like JPEGs (~500x375, ~50 KB; fastload._demo.photo_like) in 100
classes into --folder when it does not exist; --packed is made with `fastload.sources.pack` when
it does not exist.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fastload import FastLoader, sources
from fastload import transforms as T
from fastload._loading.order.plan import ShuffledPlan
from fastload._progress import ProgressLine
from fastload.sources._indexes.extents import ExtentIndex

CLASSES = 100


def _write_images(job: tuple[str, int, int]) -> None:
    from fastload._demo import photo_like

    root, first, count = job
    for i in range(first, first + count):
        rng = np.random.default_rng(i)
        w, h = int(rng.integers(400, 600)), int(rng.integers(300, 500))
        if rng.random() < 0.2:
            w, h = h, w
        class_dir = Path(root) / f"class_{i % CLASSES:03d}"
        class_dir.mkdir(parents=True, exist_ok=True)
        photo_like(rng, w, h).save(class_dir / f"img_{i:06d}.JPEG", quality=90)


def generate(root: Path, images: int) -> None:
    step = 250
    jobs = [(str(root), first, min(step, images - first)) for first in range(0, images, step)]
    line = ProgressLine(sys.stderr)  # NOTE [progress lines]: no \r redraws in a log
    with multiprocessing.Pool(os.cpu_count()) as pool:
        for done, _ in enumerate(pool.imap_unordered(_write_images, jobs), 1):
            line.update(f"generated {min(done * step, images)}/{images}")
    line.done(f"generated {images} images")


def evict(paths: Iterable[str]) -> None:
    """Drop `paths` from the page cache (written pages are synced first, so they can go)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class PackedWithoutReadahead(sources.Packed):
    """A pack whose index asks for no readahead (to measure what it buys in a loader)."""

    def open(self) -> Any:
        return dataclasses.replace(super().open(), readahead=0)


def time_reads(index: Any, batches: list[np.ndarray]) -> tuple[float, int, int]:
    """(seconds, samples, bytes) to read `batches` through `index`."""
    start, samples, nbytes = time.perf_counter(), 0, 0
    for batch in batches:
        blobs = index.read(batch)
        samples += len(blobs)
        nbytes += sum(len(b) for b in blobs)
    return time.perf_counter() - start, samples, nbytes


def time_loader(
    dataset: Any, plan: ShuffledPlan, args: argparse.Namespace, sizes: np.ndarray
) -> tuple[float, int, int]:
    """(seconds, samples, their encoded bytes) for a FastLoader to deliver the plan's first
    --batches batches."""
    transform = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    with FastLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, transform=transform,
        seed=0, device="cpu", shuffle_block=plan.block, shuffle_window=plan.window,
    ) as loader:  # fmt: skip
        start, samples = time.perf_counter(), 0
        for b, (images, _) in enumerate(loader):
            samples += len(images)
            if b + 1 == args.batches:
                break
        seconds = time.perf_counter() - start
    nbytes = sum(int(sizes[batch].sum()) for batch in list(plan.iter_batches(0))[: args.batches])
    return seconds, samples, nbytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="an ImageNet-layout folder")
    parser.add_argument("--packed", type=Path, required=True, help="its pack (made when missing)")
    parser.add_argument("--generate", type=int, default=0, help="images to write when --folder is missing")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--block", type=int, default=256, help="samples per run of the block shuffle")
    parser.add_argument("--window", type=int, default=8, help="batches mixed together by the block shuffle")
    parser.add_argument("--batches", type=int, default=30, help="batches timed per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="read,decode")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    if not args.folder.exists():
        if not args.generate:
            parser.error(f"{args.folder} does not exist (pass --generate N to make it)")
        generate(args.folder, args.generate)
    if not (args.packed / "manifest.json").exists():
        sources.pack(args.folder, args.packed)
    os.sync()
    folder = sources.ImageFolder(str(args.folder)).open()
    packed = sources.Packed(str(args.packed)).open()
    folder_files = [folder.path(i) for i in range(len(folder))]
    index_files = sources._formats.pack_format.INDEX_FILES
    packed_files = [*packed.files, *(str(args.packed / f"{n}.npy") for n in index_files)]
    n, batch = len(folder), args.batch_size
    full = ShuffledPlan(n, batch, shuffle=True, drop_last=False, seed=0)
    block = ShuffledPlan(
        n, batch, shuffle=True, drop_last=False, seed=0, block=args.block, window=args.window
    )
    first = lambda plan: list(plan.iter_batches(0))[: args.batches]  # noqa: E731
    total_bytes = int(packed.sizes.sum())
    print(
        f"{n} images, {total_bytes / 1e9:.2f} GB; {len(packed.files)} data files; batch {batch}, "
        f"block {args.block}, window {args.window}; {args.batches} batches a measurement, "
        f"{args.rounds} rounds; {os.cpu_count()} CPUs",
        file=sys.stderr,
    )
    sizes = packed.sizes

    no_readahead = PackedWithoutReadahead(str(args.packed))

    def decode(dataset: Any, plan: ShuffledPlan) -> Callable[[], tuple[float, int, int]]:
        return lambda: time_loader(dataset, plan, args, sizes)

    def read(index: Any, plan: ShuffledPlan) -> Callable[[], tuple[float, int, int]]:
        # A fresh copy each time: an index remembers the readahead it asked for lately.
        return lambda: time_reads(
            dataclasses.replace(index) if isinstance(index, ExtentIndex) else index, first(plan)
        )

    configs: list[tuple[str, str, str, list[str], Callable[[], tuple[float, int, int]]]] = []
    for mode in args.modes.split(","):
        if mode == "read":
            configs += [
                ("read", "folder", "full", folder_files, read(folder, full)),
                ("read", "packed", "full", packed_files, read(packed, full)),
                ("read", "packed", "block", packed_files, read(packed, block)),
                (
                    "read",
                    "packed",
                    "block-",
                    packed_files,
                    read(dataclasses.replace(packed, readahead=0), block),
                ),
            ]
        elif mode == "decode":
            configs += [
                ("decode", "folder", "full", folder_files, decode(args.folder, full)),
                ("decode", "packed", "full", packed_files, decode(args.packed, full)),
                ("decode", "packed", "block", packed_files, decode(args.packed, block)),
                ("decode", "packed", "block-", packed_files, decode(no_readahead, block)),
            ]
        else:
            parser.error(f"unknown mode {mode!r} (read, decode)")
    results: dict[tuple[str, str, str, str], list[tuple[float, int, int]]] = {}
    for r in range(args.rounds):
        for mode, data, order, files, run in configs if r % 2 == 0 else configs[::-1]:
            for cache in ("cold", "warm"):
                if cache == "cold":
                    evict(files)
                measured = run()
                results.setdefault((mode, data, order, cache), []).append(measured)
                seconds = measured[0]
                print(f"round {r}: {mode} {data} {order} {cache}: {seconds:.2f} s", file=sys.stderr)
    print("| mode | data | order | cache | samples/s | MB/s | median s |")
    print("|---|---|---|---|---:|---:|---:|")
    for (mode, data, order, cache), runs in results.items():
        seconds = statistics.median(s for s, _, _ in runs)
        _, samples, nbytes = runs[0]
        rates = f"{samples / seconds:,.0f} | {nbytes / 1e6 / seconds:,.1f}"
        print(f"| {mode} | {data} | {order} | {cache} | {rates} | {seconds:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
