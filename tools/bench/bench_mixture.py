"""A 3-source mixture against the same sources loaded one after another (issue 31's target: the
mixture at >= 97% of the sequential rate).

Three sources of the same images: an ImageNet-layout folder, its pack (`fastload pack`) and
WebDataset tar shards of it (both made here when missing). Two systems deliver the same
samples per measurement, every image of every source once:

  mix         one FastLoader over `sources.Mix([folder, pack, shards])`, one epoch (weights in
              proportion to the sizes, the default: equal here; the epoch its children's total)
  sequential  three FastLoaders, one per source (shuffle=True), one epoch of each in turn

Each system reads whole epochs (neither abandons batches in flight), and every loader starts its
workers each epoch (no persistent_workers): kept alive, the three sequential loaders' workers
would decode their next epochs ahead while the other two run, six processes filling each
other's idle moments where the mix has two, which measures the pool size, not the mixing. The
sequential system then starts three pools a measurement where the mix starts one, so the table
gives each rate twice: the wall rate, and the rate without each epoch's wait for its first batch
(the pool's start and the first decode: what differs by construction).

Both decode with RandomResizedCrop(224) + flip (native backend), --workers workers, batch
--batch-size, on the CPU; one untimed epoch of each loader first reads every file into the page
cache. Each round times both systems, their order alternated between rounds (paired); the
table gives each system's median images/s and spread (min..max) over --rounds rounds, and the
median of the per-round ratios mix / sequential.

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
                    (".jpg", Path(index.path(i)).read_bytes()),
                    (".cls", str(int(index.labels[i])).encode()),
                ):
                    info = tarfile.TarInfo(f"s{i:07d}{suffix}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        shards.append(str(shard))
    return shards


def loader(source: sources.Source, args: argparse.Namespace) -> FastLoader:
    return FastLoader(
        source, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, seed=1,
        device="cpu",
        transform=[T.RandomResizedCrop(224), T.RandomHorizontalFlip()],
    )  # fmt: skip


def epoch(batches: FastLoader) -> tuple[int, float, float]:
    """One epoch of `batches`: (samples delivered, seconds, of them the wait for its first batch)."""
    start = time.perf_counter()
    first, samples = 0.0, 0
    for images, _ in batches:
        first = first or time.perf_counter() - start
        samples += len(images)
    return samples, time.perf_counter() - start, first


def rates(epochs: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(images/s, images/s without the first-batch waits) over `epochs` run one after another."""
    samples, seconds, first = (sum(e[i] for e in epochs) for i in range(3))
    return samples / seconds, samples / (seconds - first)


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

    for one in (mix, *each):  # every file read once: not timed
        epoch(one)
    systems: list[tuple[str, Callable[[], tuple[float, float]]]] = [
        ("mix", lambda: rates([epoch(mix)])),
        ("sequential", lambda: rates([epoch(one) for one in each])),
    ]
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in systems}
    try:
        for r in range(args.rounds):
            for name, run in systems if r % 2 == 0 else systems[::-1]:
                measured[name].append(run())
                wall, steady = measured[name][-1]
                print(f"round {r + 1}: {name} {wall:.1f} img/s, {steady:.1f} without first-batch waits",
                      file=sys.stderr)  # fmt: skip
    finally:
        for one in (mix, *each):
            one.close()
    print("| system | img/s (median) | spread (min..max) | img/s without first-batch waits | spread |")
    print("|---|---|---|---|---|")
    rows = [(name, measured[name]) for name, _ in systems]
    ratios = [
        (m[0] / s[0], m[1] / s[1]) for m, s in zip(measured["mix"], measured["sequential"], strict=True)
    ]
    rows.append(("mix / sequential (paired, per round)", ratios))
    for name, values in rows:
        cells = []
        for i in range(2):
            column = [v[i] for v in values]
            digits = 3 if values is ratios else 1
            cells += [
                f"{statistics.median(column):.{digits}f}",
                f"{min(column):.{digits}f}..{max(column):.{digits}f}",
            ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
