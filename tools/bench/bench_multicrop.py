"""DINO-style multi-crop on a folder of JPEGs: fastload's `Views` vs DataLoader + torchvision v2
doing the same views (issue 31's target: >= 2.5x).

Each sample gives 2 global views (RandomResizedCrop 224, scale (0.4, 1), bicubic; flip;
RandomApply(ColorJitter(0.4, 0.4, 0.2, 0.1), p=0.8); RandomGrayscale(0.2); GaussianBlur(23,
(0.1, 2)) always on the first, with p=0.1 on the second, which also solarizes with p=0.2) and 6
local views (RandomResizedCrop 96, scale (0.05, 0.4); flip; the same colour; blur with p=0.5), all
normalized with ImageNet's mean and std: DINO's `DataAugmentationDINO`. torchvision has no
p on GaussianBlur: RandomApply([GaussianBlur], p) on both sides.

Each system runs in its own process (fastload with this repository's python, torchvision with
--peer-python, a venv outside the repository; its images decoded by `torchvision.io.decode_image`
into tensors, or with --peer-decode pil by Pillow, v2 running on either), `--workers` workers each, batches of
`--batch-size`, timing `--batches` batches after the first: images/s, and CPU ms per image over
the process tree (workers included; /proc, as tools/bench/bench_loaders.py reads it), which moves
less than the rate when other work shares the cores. Rounds alternate the systems (the order
rotates each round); the table gives each system's medians over the rounds with their spread
(min..max), and the medians of the per-round ratios (paired).

`--decode-cost` instead measures, on the native decoder alone (one process, one thread), what the
NOTE [views] in fastload/transforms/_views.py weighs: decoding each view's region fused with its
crop (what the loader does) against one full-size decode per image, alone and followed by torch
crops and resizes of every view (what "decode once, then crop each view" would cost).

    python tools/bench/make_bench_dataset.py DATA --images 1000   # with the peer venv's python
    python tools/bench/bench_multicrop.py --data DATA --peer-python PEER_VENV/bin/python
    python tools/bench/bench_multicrop.py --data DATA --decode-cost
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

REPO = Path(__file__).resolve().parents[2]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
GLOBAL, LOCAL, LOCAL_VIEWS = 224, 96, 6
GLOBAL_SCALE, LOCAL_SCALE = (0.4, 1.0), (0.05, 0.4)
BICUBIC = 3  # the native decoder's filter number (`_loading.decoding.native`)


def _fastload_views(decode: str = "each") -> Any:
    from fastload import transforms as T

    def colour() -> list[Any]:
        return [T.RandomApply((T.ColorJitter(0.4, 0.4, 0.2, 0.1),), p=0.8), T.RandomGrayscale(0.2)]

    def blur(p: float) -> list[Any]:
        return [T.RandomApply((T.GaussianBlur(23, (0.1, 2.0)),), p=p)]

    def crop(size: int, scale: tuple[float, float]) -> list[Any]:
        return [T.RandomResizedCrop(size, scale=scale, interpolation="bicubic"), T.RandomHorizontalFlip()]

    first = [*crop(GLOBAL, GLOBAL_SCALE), *colour(), *blur(1.0)]
    second = [*crop(GLOBAL, GLOBAL_SCALE), *colour(), *blur(0.1), T.RandomSolarize(128.0, p=0.2)]
    local = [*crop(LOCAL, LOCAL_SCALE), *colour(), *blur(0.5)]
    return T.Views([first, second] + [local] * LOCAL_VIEWS, decode=decode)


def _torchvision_views() -> Any:
    import torch
    from torchvision.transforms import InterpolationMode, v2

    def chain(size: int, scale: tuple[float, float], blur: float, solarize: float = 0.0) -> Any:
        return v2.Compose([
            v2.RandomResizedCrop(size, scale=scale, interpolation=InterpolationMode.BICUBIC, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.RandomApply([v2.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
            v2.RandomGrayscale(0.2),
            v2.RandomApply([v2.GaussianBlur(23, (0.1, 2.0))], p=blur),
            v2.RandomSolarize(128, p=solarize),
            v2.ToImage(),  # a PIL image (--peer-decode pil) to a tensor; a tensor as it is
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ])

    chains = [chain(GLOBAL, GLOBAL_SCALE, 1.0), chain(GLOBAL, GLOBAL_SCALE, 0.1, 0.2)]
    chains += [chain(LOCAL, LOCAL_SCALE, 0.5)] * LOCAL_VIEWS
    return lambda image: [c(image) for c in chains]


def _tree_cpu_seconds() -> float:
    """User + system CPU of this process and every live process below it (its workers)."""
    from bench_loaders import cpu_seconds, descendants  # beside this script; standard library only

    return sum(cpu_seconds(pid) for pid in [os.getpid(), *descendants(os.getpid())])


def _timed(batches: Any, count: int, batch_size: int) -> dict[str, float]:
    """Images/s, and CPU ms per image over the process tree, over `count` batches after the first
    (start-up and the first batch left out): the CPU figure moves less with what else runs."""
    iterator = iter(batches)
    views, _ = next(iterator)
    assert len(views) == 2 + LOCAL_VIEWS
    start, cpu, images = time.perf_counter(), _tree_cpu_seconds(), 0
    for _ in range(count):
        views, labels = next(iterator)
        images += int(labels.shape[0])
    seconds, cpu = time.perf_counter() - start, _tree_cpu_seconds() - cpu
    return {
        "images": images, "seconds": seconds, "images_per_s": images / seconds, "cpu_ms": cpu * 1e3 / images,
    }


def run_fastload(args: argparse.Namespace) -> dict[str, float]:
    from fastload import FastLoader

    with FastLoader(
        args.data, transform=_fastload_views(args.decode), batch_size=args.batch_size, shuffle=True, seed=0,
        num_workers=args.workers, device="cpu", normalize=(MEAN, STD), drop_last=True,
    ) as loader:
        return _timed(_epochs(loader), args.batches, args.batch_size)


def run_torchvision(args: argparse.Namespace) -> dict[str, float]:
    import torch
    from torchvision.datasets import DatasetFolder
    from torchvision.io import ImageReadMode, decode_image, read_file

    def load(path: str) -> Any:
        if args.peer_decode == "pil":
            from PIL import Image

            with Image.open(path) as image:
                return image.convert("RGB")
        return decode_image(read_file(path), mode=ImageReadMode.RGB)

    exts = (".jpg", ".jpeg", ".png")
    dataset = DatasetFolder(args.data, loader=load, extensions=exts, transform=_torchvision_views())
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, drop_last=True,
        persistent_workers=True, generator=torch.Generator().manual_seed(0),
    )
    return _timed(_epochs(loader), args.batches, args.batch_size)


def _epochs(loader: Any) -> Any:
    while True:
        yield from loader


def decode_cost(args: argparse.Namespace) -> None:
    """Per-view fused decodes vs one full-size decode per image (alone, and with each view then
    cropped and resized by torch), on the native decoder, one thread."""
    import numpy as np
    import torch

    from fastload._native_jpeg import native_jpeg
    from fastload.transforms import compile_transforms

    jpeg = native_jpeg()
    if jpeg is None:
        sys.exit("the native decoder is not built here")
    torch.set_num_threads(1)
    paths = sorted(p for p in Path(args.data).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    blobs = [p.read_bytes() for p in paths[: args.batches * args.batch_size]]
    views = compile_transforms([_fastload_views()]).views
    rng = np.random.default_rng(0)

    def fused(blob: bytes, width: int, height: int) -> None:
        for plan in views:
            g = plan.sample(height, width, rng)
            out = np.empty((g.out_height, g.out_width, 3), np.uint8)
            jpeg.decode_crop_resize(blob, g.box, out, g.out_height, g.out_width, g.flip, BICUBIC, g.clip)

    def full(blob: bytes, width: int, height: int) -> torch.Tensor:
        image = np.empty((height, width, 3), np.uint8)
        whole = (0.0, 0.0, float(width), float(height))
        jpeg.decode_crop_resize(blob, whole, image, height, width, False, BICUBIC)
        return torch.from_numpy(image).permute(2, 0, 1)[None]

    def full_then_crops(blob: bytes, width: int, height: int) -> None:
        image = full(blob, width, height)
        for plan in views:
            g = plan.sample(height, width, rng)
            left, top, right, bottom = (int(round(v)) for v in g.box)
            crop = image[:, :, top:bottom, left:right]
            size = (g.out_height, g.out_width)
            torch.nn.functional.interpolate(crop, size, mode="bilinear", antialias=True)

    ways = {
        "each view's region, fused (the loader)": fused,
        "one full-size decode alone": full,
        "full decode + 8 torch crops (bilinear u8)": full_then_crops,
    }
    rows: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, way in ways.items():
            start = time.perf_counter()
            for blob in blobs:
                width, height = jpeg.jpeg_size(blob)
                way(blob, width, height)
            rows[name].append((time.perf_counter() - start) / len(blobs) * 1e3)
    print(f"{len(blobs)} images, {args.rounds} rounds, one thread: ms per image (DINO's 8 views)")
    print("| way | median | spread (min..max) |\n|---|---|---|")
    for name, times in rows.items():
        print(f"| {name} | {statistics.median(times):.2f} | {min(times):.2f}..{max(times):.2f} |")


def _one_run(system: str, args: argparse.Namespace) -> dict[str, float]:
    python = sys.executable if system == "fastload" else args.peer_python
    argv = [python, str(Path(__file__).resolve()), "--run", system, "--data", args.data]
    argv += ["--workers", str(args.workers), "--batch-size", str(args.batch_size)]
    argv += ["--batches", str(args.batches), "--peer-decode", args.peer_decode, "--decode", args.decode]
    env = {**os.environ, "PYTHONPATH": str(REPO)} if system == "fastload" else dict(os.environ)
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env, timeout=args.timeout_s)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _figures(run: dict[str, float]) -> str:
    return f"{run['images_per_s']:.1f} img/s, {run['cpu_ms']:.0f} CPU ms/img"


def compare(args: argparse.Namespace) -> None:
    systems = ["fastload", "torchvision"]
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
    for r in range(args.rounds):
        order = systems[r % 2 :] + systems[: r % 2]
        this_round = {s: _one_run(s, args) for s in order}
        for s in systems:
            runs[s].append(this_round[s])
        shown = ", ".join(f"{s} {_figures(this_round[s])}" for s in order)
        print(f"round {r + 1}: {shown}", flush=True)
    timed = f"{args.batches} batches timed after the first"
    print(f"\n{args.workers} workers each, batch {args.batch_size}, {timed}, {args.rounds} rounds")
    print("| system | images/s median (min..max) | CPU ms per image median (min..max) |\n|---|---|---|")
    for s in systems:
        rates, cpus = [run["images_per_s"] for run in runs[s]], [run["cpu_ms"] for run in runs[s]]
        print(
            f"| {s} | {statistics.median(rates):.1f} ({min(rates):.1f}..{max(rates):.1f}) "
            f"| {statistics.median(cpus):.0f} ({min(cpus):.0f}..{max(cpus):.0f}) |"
        )
    pairs = list(zip(runs["fastload"], runs["torchvision"], strict=True))
    for what, key in (("images/s", "images_per_s"), ("CPU per image", "cpu_ms")):
        # fastload's advantage either way: its rate over theirs; their CPU per image over its.
        ratios = [f[key] / t[key] if key == "images_per_s" else t[key] / f[key] for f, t in pairs]
        print(f"fastload vs torchvision, {what}, paired per round: median {statistics.median(ratios):.2f}x "
              f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="an ImageNet-layout folder of JPEGs")
    parser.add_argument("--peer-python", help="the python of a venv with torchvision (not this repo's)")
    parser.add_argument(
        "--peer-decode", choices=["tensor", "pil"], default="tensor",
        help="torchvision's input: decode_image tensors (default) or PIL images (v2 runs on both)",
    )
    parser.add_argument(
        "--decode", choices=["each", "once"], default="each",
        help="fastload's Views(decode=...): each view's region fused (default), or one decode per image",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=15, help="batches timed after the first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=900.0, help="for one system's run")
    parser.add_argument("--decode-cost", action="store_true", help="the decoder alone: see the docstring")
    parser.add_argument("--run", choices=["fastload", "torchvision"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        result = run_fastload(args) if args.run == "fastload" else run_torchvision(args)
        print(json.dumps(result))
    elif args.decode_cost:
        decode_cost(args)
    elif not args.peer_python:
        parser.error("--peer-python is needed to compare with torchvision (or pass --decode-cost)")
    else:
        compare(args)


if __name__ == "__main__":
    main()
