"""What a worker spends around the decode: the per-sample overhead of the loading path, one core.

A FastLoader with `num_workers=0` (the job runs in this process, as a worker runs it) loads the
dataset for --epochs epochs, pinned to one core, RandomResizedCrop(224) + flip, batch 64. The
native decoder's `decode_crop_resize` is wrapped to time each call, so the overhead is measured
directly on the same crops: the share of the epoch's wall time spent outside the decode calls
(reading files, headers, drawing crops, labels, bookkeeping, delivery), and what that is per
image. Comparing a bare-decoder run with a loader run instead draws different crops and runs
minutes apart on a noisy machine; this does not.

Each round runs every tree of --trees (fastload checkouts, first on PYTHONPATH; default: this
one) in a subprocess, alternating, and the table gives the medians [min-max] over rounds of each
tree's median epoch (the first epoch of each run is dropped: it reads the files cold).

    .venv/bin/python tools/bench/bench_worker_overhead.py --data DIR [--trees A,B] [--rounds 3]
        [--epochs 4] [--cpu 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def measure(data: str, epochs: int, cpu: int) -> list[dict[str, float]]:
    """Per epoch after the first: overhead share, µs outside the decode per image, img/s."""
    os.sched_setaffinity(0, {cpu})
    import fastload
    import fastload._loading.decoding.native as native_backend
    from fastload._native_jpeg import native_jpeg
    from fastload.transforms import RandomHorizontalFlip, RandomResizedCrop

    jpeg = native_jpeg()
    if jpeg is None:
        sys.exit("fastload._jpeg is not built: this measures the native decoder's surroundings")
    in_decode = [0]

    class TimedJpeg:
        def __getattr__(self, name: str) -> Any:
            return getattr(jpeg, name)

        def decode_crop_resize(self, *args: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return jpeg.decode_crop_resize(*args)
            finally:
                in_decode[0] += time.perf_counter_ns() - t0

    make = native_backend.NativeBackend.__init__

    def with_timed_jpeg(self: Any, plan: Any, _jpeg: Any) -> None:
        make(self, plan, TimedJpeg())

    native_backend.NativeBackend.__init__ = with_timed_jpeg  # type: ignore[method-assign]
    loader = fastload.FastLoader(
        data,
        batch_size=64,
        shuffle=True,
        num_workers=0,
        device="cpu",
        transform=[RandomResizedCrop(224), RandomHorizontalFlip()],
    )
    results = []
    with loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            in_decode[0], images = 0, 0
            t0 = time.perf_counter_ns()
            for batch in loader:
                images += len(batch[1])
            wall = time.perf_counter_ns() - t0
            if epoch:
                outside = wall - in_decode[0]
                results.append(
                    {"overhead": outside / wall, "us_per_image": outside / images / 1e3,
                     "images_per_s": images * 1e9 / wall}
                )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA"), help="ImageNet-layout JPEG folder")
    parser.add_argument("--trees", default=str(Path(__file__).resolve().parents[2]),
                        help="comma-separated fastload checkouts to compare (default: this one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the first allowed)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.data:
        parser.error("no data: pass --data DIR or set BENCH_DATA (tools/bench/make_bench_dataset.py "
                     "makes one)")
    cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
    if args.child:
        print(json.dumps(measure(args.data, args.epochs, cpu)))
        return
    trees = [t for t in args.trees.split(",") if t]
    best: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": tree}
            command = [sys.executable, __file__, "--child", "--data", args.data,
                       "--epochs", str(args.epochs), "--cpu", str(cpu)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            epochs = json.loads(out.strip().splitlines()[-1])
            pick = sorted(epochs, key=lambda e: e["overhead"])[len(epochs) // 2]  # the median epoch
            best[tree].append(pick)
            print(f"round {r} {tree}: {pick['overhead']:.1%} outside the decode, "
                  f"{pick['us_per_image']:.1f} us/image, {pick['images_per_s']:.0f} img/s", file=sys.stderr)
    print(f"\nnum_workers=0 on core {cpu}, RandomResizedCrop(224) + flip, batch 64; "
          f"median [min-max] of {args.rounds} rounds (each the median of {args.epochs - 1} epochs)")
    print("| tree | outside the decode | µs/image outside | img/s |")
    print("|---|---:|---:|---:|")
    for tree, picks in best.items():
        cells = []
        for key, fmt in (("overhead", "{:.1%}"), ("us_per_image", "{:.1f}"), ("images_per_s", "{:.0f}")):
            values = [p[key] for p in picks]
            cells.append(f"{fmt.format(statistics.median(values))} "
                         f"[{fmt.format(min(values))}–{fmt.format(max(values))}]")
        print(f"| {Path(tree).name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
