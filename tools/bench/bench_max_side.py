"""What smaller stored images buy per core: `fastload pack --max-side N` at several N, decoded on one core.

From a folder of JPEGs (tools/bench/make_bench_dataset.py makes photo-like ones of ImageNet sizes),
packs it once as it is and once per N of --sides (into --work, reused when already complete; the
time each pack took is reported), then measures each pack's decode + RandomResizedCrop(224) + flip
rate on one core: a FastLoader with `num_workers=0` (the job runs in this process, as a worker
runs it), pinned to one core, batch 64, in a subprocess per measurement. Each round measures every
pack, alternating, so a noisy machine's drift spreads over all of them; each measurement is the
median of --epochs epochs after a first one that warms the page cache. Two rates: images per
second of wall time, and per second of the process's CPU time (user + system), which a machine
shared with other work disturbs less (waiting for the core is not counted). The table gives
medians [min-max] over rounds, the pack's size on disk and its images' mean size.

    .venv/bin/python tools/bench/bench_max_side.py --data DIR --work DIR [--sides 256,320,512]
        [--rounds 5] [--epochs 2] [--workers N] [--cpu 0]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def measure(pack: str, epochs: int, cpu: int) -> list[tuple[float, float]]:
    """(img/s of wall time, img/s of CPU time) of each epoch after the first, num_workers=0 on
    core `cpu`."""
    os.sched_setaffinity(0, {cpu})
    import fastload
    from fastload.transforms import RandomHorizontalFlip, RandomResizedCrop

    rates = []
    with fastload.FastLoader(
        pack, batch_size=64, shuffle=True, num_workers=0, device="cpu", seed=0,
        transform=[RandomResizedCrop(224), RandomHorizontalFlip()],
    ) as loader:  # fmt: skip
        for epoch in range(epochs + 1):
            loader.set_epoch(epoch)
            images = 0
            t0, c0 = time.perf_counter(), time.process_time()
            for _, labels in loader:
                images += len(labels)
            if epoch:
                rates.append((images / (time.perf_counter() - t0), images / (time.process_time() - c0)))
    return rates


def make_pack(data: str, dst: Path, side: int | None, workers: int) -> float:
    """Pack `data` into `dst` (max_side `side`); seconds it took (0 when it was already there)."""
    from fastload import sources

    manifest = dst / "manifest.json"
    if manifest.exists() and json.loads(manifest.read_text()).get("complete"):
        return 0.0
    t0 = time.perf_counter()
    sources.pack(data, dst, progress=False, max_side=side, workers=workers if side else None)
    return time.perf_counter() - t0


def describe(dst: Path) -> dict[str, float]:
    """Bytes on disk, mean stored bytes and mean pixels per image of the pack at `dst`."""
    import numpy as np
    from PIL import Image

    from fastload import sources

    index = sources.Packed(str(dst)).open()
    disk = sum(p.stat().st_blocks * 512 for p in dst.glob("data-*.bin"))
    picks = np.linspace(0, len(index) - 1, min(len(index), 200)).astype(np.int64)
    pixels = []
    for blob in index.read(picks):
        with Image.open(io.BytesIO(blob)) as image:
            pixels.append(image.width * image.height)
    return {
        "disk": disk,
        "mean_bytes": float(np.asarray(index.sizes).mean()),
        "mean_pixels": float(np.mean(pixels)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA"), help="ImageNet-layout JPEG folder")
    parser.add_argument("--work", help="where the packs go (kept: a later run reuses them)")
    parser.add_argument("--sides", default="256,320,512", help="the --max-side values to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per measurement")
    parser.add_argument("--workers", type=int, default=None, help="processes that re-encode (default: all)")
    parser.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the first allowed)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
    if args.child:
        print(json.dumps(measure(args.child, args.epochs, cpu)))
        return
    if not args.data or not args.work:
        parser.error("pass --data DIR (or set BENCH_DATA; tools/bench/make_bench_dataset.py makes one) "
                     "and --work DIR")
    workers = args.workers or len(os.sched_getaffinity(0))
    sides: list[int | None] = [None, *(int(s) for s in args.sides.split(",") if s)]
    packs = {side: Path(args.work) / ("pack-full" if side is None else f"pack-{side}") for side in sides}
    built = {side: make_pack(args.data, dst, side, workers) for side, dst in packs.items()}
    facts = {side: describe(dst) for side, dst in packs.items()}
    from fastload import sources

    count = len(sources.Packed(str(packs[None])).open())
    wall: dict[int | None, list[float]] = {side: [] for side in sides}
    cpu_rates: dict[int | None, list[float]] = {side: [] for side in sides}
    for r in range(args.rounds):
        for side, dst in packs.items():
            command = [sys.executable, __file__, "--child", str(dst), "--epochs", str(args.epochs),
                       "--cpu", str(cpu)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            epochs = json.loads(out.strip().splitlines()[-1])
            wall[side].append(statistics.median(e[0] for e in epochs))
            cpu_rates[side].append(statistics.median(e[1] for e in epochs))
            print(f"round {r} max_side {side or 'none'}: {wall[side][-1]:.0f} img/s, "
                  f"{cpu_rates[side][-1]:.0f} img/s of CPU time", file=sys.stderr)
    base = statistics.median(cpu_rates[None])
    print(f"\n{count} images; num_workers=0 on core {cpu}, RandomResizedCrop(224) + flip, batch 64; "
          f"median [min-max] of {args.rounds} rounds (each the median of {args.epochs} warm epochs); "
          f"packs made with {workers} re-encoding processes")
    print("| --max-side | img/s per CPU-second | vs as stored | img/s (wall) on one core | mean pixels "
          "| mean bytes | pack on disk | pack time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):,.0f} [{min(values):,.0f}–{max(values):,.0f}]"

    for side in sides:
        fact = facts[side]
        took = f"{built[side]:.0f} s" if built[side] else "(reused)"
        print(f"| {side or 'none (as stored)'} | {spread(cpu_rates[side])} "
              f"| {statistics.median(cpu_rates[side]) / base:.2f}x | {spread(wall[side])} "
              f"| {fact['mean_pixels'] / 1e3:,.0f} k | {fact['mean_bytes'] / 1e3:,.1f} kB "
              f"| {fact['disk'] / 2**20:,.1f} MiB | {took} |")


if __name__ == "__main__":
    main()
