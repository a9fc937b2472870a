"""A 3-source mixture against the same sources loaded one after another (issue 31's target: the
mixture at >= 97% of the sequential rate).

Three sources of the same images: an ImageNet-layout folder, its pack (`fastload pack`) and
WebDataset tar shards of it (both made here when missing). Two systems deliver the same
samples per measurement, every image of every source once:

  mix         one FastLoader over `sources.Mix([folder, pack, shards])`, one epoch (weights in
              proportion to the sizes, the default: equal here; the epoch its children's total)
  sequential  three FastLoaders, one per source (shuffle=True), one epoch of each in turn

Each system reads whole epochs, so that both decode their next epoch's first batches ahead at
an epoch's tail alike (persistent workers) and neither abandons batches in flight.

Both decode with RandomResizedCrop(224) + flip (native backend), --workers workers, batch
--batch-size, on the CPU. Every loader keeps its workers (persistent_workers) and is warmed by
one batch before the rounds, so that neither system is timed starting processes. Each round
times both systems, their order alternated between rounds (paired); the table gives each
system's median images/s and spread (min..max) over --rounds rounds, and the median of the
per-round ratios mix / sequential.

    python tools/bench/bench_mixture.py --folder DIR --packed DIR2 --shards DIR3
        [--batch-size 64] [--workers 2] [--rounds 3]

Make the folder with tools/bench/make_bench_dataset.py (a throwaway venv's python with
scikit-image); the page cache is warm after the warm-up (the sources are read once each).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from fastload import FastLoader, sources
from fastload import transforms as T


def write_shards(folder: Path, directory: Path, per_shard: int) -> list[str]:
    """WebDataset shards of `folder`'s images in its order: KEY.jpg + KEY.cls each."""
    index = sources.ImageFolder(str(folder)).open()
    directory.mkdir(parents=True)
    shards = []
    for number, first in enumerate(range(0, len(index), per_shard)):
        shard = directory / f"shard-{number:06d}.tar"
        with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(first, min(len(index), first + per_shard)):
                for suffix, payload in (
                    (".jpg", Path(index.path(i)).read_bytes()), (".cls", str(int(index.labels[i])).encode())
                ):
                    info = tarfile.TarInfo(f"s{i:07d}{suffix}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        shards.append(str(shard))
    return shards


def loader(source: sources.Source, args: argparse.Namespace) -> FastLoader:
    return FastLoader(
        source, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, seed=1,
        device="cpu", persistent_workers=True,
        transform=[T.RandomResizedCrop(224), T.RandomHorizontalFlip()],
    )  # fmt: skip


def epoch(batches: FastLoader) -> int:
    """Iterate one epoch of `batches`; the samples delivered."""
    return sum(len(images) for images, _ in batches)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="an ImageNet-layout folder")
    parser.add_argument("--packed", type=Path, required=True, help="its pack (made when missing)")
    parser.add_argument("--shards", type=Path, required=True, help="its tar shards' folder (made if missing)")
    parser.add_argument("--per-shard", type=int, default=200, help="images per tar shard, when making them")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    if not (args.packed / "manifest.json").exists():
        sources.pack(args.folder, args.packed)
    shard_paths = sorted(str(p) for p in args.shards.glob("*.tar")) if args.shards.exists() else []
    if not shard_paths:
        shard_paths = write_shards(args.folder, args.shards, args.per_shard)
    folder, packed = sources.ImageFolder(str(args.folder)), sources.Packed(str(args.packed))
    children: list[sources.Source] = [folder, packed, sources.TarShards(shard_paths)]
    mix = loader(sources.Mix(children), args)
    each = [loader(child, args) for child in children]
    print(
        f"sources of {[len(one.dataset.open()) for one in each]} images; batch {args.batch_size}, "
        f"{args.workers} workers, {args.rounds} rounds; {os.cpu_count()} CPUs",
        file=sys.stderr,
    )

    def run_mix() -> float:
        start = time.perf_counter()
        taken = epoch(mix)
        return taken / (time.perf_counter() - start)

    def run_sequential() -> float:
        start = time.perf_counter()
        taken = sum(epoch(one) for one in each)
        return taken / (time.perf_counter() - start)

    for one in (mix, *each):  # workers started, every file read once: not timed
        epoch(one)
    systems: list[tuple[str, Callable[[], float]]] = [("mix", run_mix), ("sequential", run_sequential)]
    rates: dict[str, list[float]] = {name: [] for name, _ in systems}
    try:
        for r in range(args.rounds):
            for name, run in systems if r % 2 == 0 else systems[::-1]:
                rates[name].append(run())
                print(f"round {r + 1}: {name} {rates[name][-1]:.1f} img/s", file=sys.stderr)
    finally:
        for one in (mix, *each):
            one.close()
    ratios = [m / s for m, s in zip(rates["mix"], rates["sequential"], strict=True)]
    print("| system | img/s (median) | spread (min..max) |")
    print("|---|---|---|")
    for name, _ in systems:
        values = rates[name]
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f}..{max(values):.1f} |")
    print(
        f"| mix / sequential (paired, per round) | {statistics.median(ratios):.3f} | "
        f"{min(ratios):.3f}..{max(ratios):.3f} |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
