"""Benchmark the native JPEG decoder (fastload._jpeg) against Pillow, one process on one core.

For every image a RandomResizedCrop(224)-like box (scale 0.08-1, ratio 3/4-4/3, torchvision's
algorithm) and a coin-flip horizontal flip are drawn once (fixed seed); each method then turns
the JPEG bytes (already in memory) into a 224x224x3 uint8 array:

  pillow-full   Image.open, convert("RGB"), resize(box=..., BILINEAR), flip
  pillow-draft  the same after draft("RGB", ...) (DCT-scaled decode, as fastload's Pillow backend)
  native        fastload._jpeg.decode_crop_resize (DCT scaling + ROI decode + resample + flip)
  native-clip   the same with clip=box (torchvision's crop-then-resize: no filter taps outside)
  entropy-floor fastload._jpeg.entropy_decode_only: Huffman decoding of the whole image only

Prints images/s per method (best of --repeat interleaved passes) and the DCT scales the native decoder chose.

Data: --data DIR (JPEGs, searched recursively); default $BENCH_DATA if set, else as many
photo-like ~500x375 JPEGs as --images, made as `fastload demo` makes its dataset, in a temporary
folder (removed once they are loaded).

    .venv/bin/python tools/bench/bench_native_decode.py [--data DIR] [--images 300] [--repeat 5] [--size 224]
"""

from __future__ import annotations

import argparse
import io
import math
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

SIZE = 224


def load(folder: Path, count: int) -> list[bytes]:
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg") and p.is_file())
    if not files:
        sys.exit(f"no JPEGs under {folder}")
    return [p.read_bytes() for p in files[:count]]


def random_resized_crop(
    width: int, height: int, rng: np.random.Generator
) -> tuple[float, float, float, float]:
    """torchvision's RandomResizedCrop.get_params (scale 0.08-1, ratio 3/4-4/3) as a box."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            return float(left), float(top), float(left + w), float(top + h)
    in_ratio = width / height
    if in_ratio < 3 / 4:
        w, h = width, round(width / (3 / 4))
    elif in_ratio > 4 / 3:
        h, w = height, round(height * (4 / 3))
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return float(left), float(top), float(left + w), float(top + h)


Job = tuple[bytes, tuple[float, float, float, float], bool]


def pillow_full(job: Job, out: np.ndarray) -> None:
    blob, box, flip = job
    with Image.open(io.BytesIO(blob)) as img:
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        res = rgb.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box)
    if flip:
        res = res.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out[...] = np.asarray(res)


def pillow_draft(job: Job, out: np.ndarray) -> None:
    blob, (left, top, right, bottom), flip = job
    with Image.open(io.BytesIO(blob)) as img:
        width, height = img.size
        wanted = (math.ceil(width * SIZE / (right - left)), math.ceil(height * SIZE / (bottom - top)))
        _, scaled_box = img.draft("RGB", wanted) or (None, (0, 0, width, height))
        sx, sy = scaled_box[2] / width, scaled_box[3] / height
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        res = rgb.resize(
            (SIZE, SIZE), Image.Resampling.BILINEAR, box=(left * sx, top * sy, right * sx, bottom * sy)
        )
    if flip:
        res = res.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    out[...] = np.asarray(res)


def main() -> None:
    global SIZE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data",
        type=Path,
        default=os.environ.get("BENCH_DATA") or None,
        help="JPEG folder (default: $BENCH_DATA; else generated into a temporary folder)",
    )
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5, help="passes per method; the best one counts")
    ap.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the first allowed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=224, help="output side (RandomResizedCrop(size))")
    args = ap.parse_args()
    SIZE = args.size

    try:
        from fastload import _jpeg
    except ImportError as e:
        sys.exit(f"fastload._jpeg is not built ({e}); run: pip install -e .")

    if hasattr(os, "sched_setaffinity"):
        cpu = args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        where = f"pinned to core {cpu}"
    else:
        where = "not pinned"

    folder = args.data
    if folder is None:
        from fastload._demo import make_demo_dataset

        with tempfile.TemporaryDirectory(prefix="fastload-bench-jpegs-") as tmp:
            folder = Path(tmp)
            print(f"no --data and no BENCH_DATA: generating {args.images} photo-like JPEGs in {folder}")
            make_demo_dataset(folder, images=args.images)
            blobs = load(folder, args.images)
    else:
        blobs = load(folder, args.images)

    rng = np.random.default_rng(args.seed)
    jobs: list[Job] = []
    for blob in blobs:
        width, height = _jpeg.jpeg_size(blob)
        jobs.append((blob, random_resized_crop(width, height, rng), bool(rng.random() < 0.5)))
    sizes = [_jpeg.jpeg_size(b) for b in blobs]
    print(
        f"{len(blobs)} JPEGs from {folder}: mean {np.mean([len(b) for b in blobs]) / 1024:.0f} KiB, "
        f"mean {np.mean([s[0] for s in sizes]):.0f}x{np.mean([s[1] for s in sizes]):.0f} px; "
        f"RandomResizedCrop({SIZE}) + flip; one process, {where}"
    )

    out = np.empty((SIZE, SIZE, 3), np.uint8)
    scales: Counter[int] = Counter()

    def native(job: Job, out: np.ndarray) -> None:
        scales[_jpeg.decode_crop_resize(job[0], job[1], out, SIZE, SIZE, job[2], _jpeg.BILINEAR)] += 1

    def native_clip(job: Job, out: np.ndarray) -> None:
        _jpeg.decode_crop_resize(job[0], job[1], out, SIZE, SIZE, job[2], _jpeg.BILINEAR, clip=job[1])

    def floor(job: Job, out: np.ndarray) -> None:
        _jpeg.entropy_decode_only(job[0])

    methods: list[tuple[str, Callable[[Job, np.ndarray], None]]] = [
        ("pillow-full", pillow_full),
        ("pillow-draft", pillow_draft),
        ("native", native),
        ("native-clip", native_clip),
        ("entropy-floor", floor),
    ]
    # Methods take turns pass by pass (best pass counts), so load from other processes on a shared
    # machine hits all of them alike rather than whichever happened to run at the time.
    results: dict[str, float] = {name: math.inf for name, _ in methods}
    for _ in range(args.repeat):
        for name, fn in methods:
            t0 = time.perf_counter()
            for job in jobs:
                fn(job, out)
            results[name] = min(results[name], time.perf_counter() - t0)

    base = results["pillow-full"]
    print(f"\n{'method':14s} {'images/s':>9s} {'ms/image':>9s} {'vs pillow-full':>15s}")
    for name, _ in methods:
        t = results[name]
        print(f"{name:14s} {len(jobs) / t:9.0f} {1e3 * t / len(jobs):9.3f} {base / t:14.2f}x")
    total = sum(scales.values())
    print("\nnative DCT scales: " + ", ".join(f"1/{d}: {100 * scales[d] / total:.0f}%" for d in (1, 2, 4, 8)))


if __name__ == "__main__":
    main()
