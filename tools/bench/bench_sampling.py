"""Weighted and repeated-augmentation sampling against a plain shuffle's rate (issue 31's target:
>= 97% of it), on the same folder, the same chain and the same workers.

Systems (each a `FastLoader` over --folder, RandomResizedCrop + flip, CPU batches):
  shuffle     shuffle=True (the reference)
  weighted    sampler=samplers.Weighted(random weights), with replacement
  balanced    sampler=samplers.ClassBalanced()
  repeated    sampler=samplers.RepeatedAugmentation(repeats=3) (DeiT's RASampler)

A round runs every system once, in an order rotated each round (paired: a system's run is compared
with the shuffle's of the same round); each run builds its loader, takes --warmup batches, then
times --batches more (epoch after epoch, as training does). It prints, for two rates, the median
of --rounds rounds with its spread (min..max) and the median of the per-round ratios to the
shuffle's: images a second (wall clock), and images per CPU second of the trainer and its
workers over the timed batches (psutil), which other processes on a shared machine move less.

    python tools/bench/bench_sampling.py --folder DIR [--workers 2] [--rounds 3] [--batches 60]
        [--batch-size 64] [--size 224]

The folder: tools/bench/make_bench_dataset.py DIR --images 2000 (with a venv that has
scikit-image). Ratios on a shared machine move with what else runs: say so beside them.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastload import FastLoader, samplers
from fastload import transforms as T


def systems(num_samples: int) -> dict[str, dict[str, Any]]:
    """Each system's FastLoader arguments (beside the common ones)."""
    weights = np.random.default_rng(0).uniform(0.1, 1.0, num_samples)
    return {
        "shuffle": {"shuffle": True},
        "weighted": {"sampler": samplers.Weighted(weights)},
        "balanced": {"sampler": samplers.ClassBalanced()},
        "repeated": {"sampler": samplers.RepeatedAugmentation(repeats=3)},
    }


def epochs(loader: FastLoader) -> Iterator[Any]:
    """The loader's batches, epoch after epoch (its workers outlive an epoch)."""
    while True:
        yield from loader


@dataclass
class Run:
    """One run's rates: images a second (wall clock), and images per CPU second of the trainer
    and its workers together (what the sampling costs in work, less moved by other processes)."""

    wall: float
    cpu: float


def worker_cpu_s(pids: list[int]) -> float:
    """CPU seconds the workers have used since they started (psutil; 0 for one already gone)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def timed_run(make: Callable[[], FastLoader], warmup: int, batches: int) -> Run:
    """Rates over `batches` batches after `warmup` of one loader (epochs in a row); the CPU rate
    counts the CPU time of the trainer's process and of its workers over the timed batches (the
    workers' batches in flight at either end about even out)."""
    with make() as loader:
        it = epochs(loader)
        for _ in range(warmup):
            next(it)
        before = worker_cpu_s(loader.worker_pids)
        count, start, cpu0 = 0, time.perf_counter(), time.process_time()
        for _ in range(batches):
            images, _ = next(it)
            count += images.shape[0]
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu0 + worker_cpu_s(loader.worker_pids) - before
        return Run(count / wall, count / cpu)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", type=Path, required=True, help="an ImageNet-layout folder")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=60, help="timed batches a run (epochs in a row)")
    parser.add_argument("--warmup", type=int, default=3, help="batches before the timing starts")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--only", default="", help="comma-separated systems (default: all)")
    args = parser.parse_args()
    chain = [T.RandomResizedCrop(args.size), T.RandomHorizontalFlip()]
    with FastLoader(args.folder, transform=chain, num_workers=0, device="cpu") as probe:
        num_samples = len(probe.targets)
    table = systems(num_samples)
    names = [n for n in table if not args.only or n in args.only.split(",")]
    if "shuffle" not in names:
        names.insert(0, "shuffle")
    runs: dict[str, list[Run]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # alternated within the round
        for name in order:
            def make(name: str = name, seed: int = r) -> FastLoader:
                return FastLoader(
                    args.folder, batch_size=args.batch_size, num_workers=args.workers, device="cpu",
                    transform=chain, seed=seed, **table[name],
                )  # fmt: skip

            runs[name].append(timed_run(make, args.warmup, args.batches))
        print(f"round {r + 1}: " + ", ".join(f"{n} {runs[n][-1].wall:.0f}" for n in names), flush=True)
    print(
        f"\n{num_samples} images in {args.folder.name}, batch {args.batch_size}, {args.size}px, "
        f"{args.workers} workers, {args.rounds} rounds x {args.batches} batches\n"
    )
    for metric, title in (("wall", "img/s (wall)"), ("cpu", "img per CPU-s (trainer + workers)")):
        print(f"| system | {title} median | spread (min..max) | ratio to shuffle (median) | ratios |")
        print("|---|---:|---:|---:|---|")
        for name in names:
            rates = [getattr(run, metric) for run in runs[name]]
            ratios = [a / getattr(b, metric) for a, b in zip(rates, runs["shuffle"], strict=True)]
            print(
                f"| {name} | {statistics.median(rates):.0f} | {min(rates):.0f}..{max(rates):.0f} "
                f"| {statistics.median(ratios):.3f} | {', '.join(f'{x:.3f}' for x in ratios)} |"
            )
        print()


if __name__ == "__main__":
    main()
