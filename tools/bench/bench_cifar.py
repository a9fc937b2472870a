"""The CIFAR recipe, fastload vs DataLoader + torchvision v2, on the same images in the same pack.

    python tools/bench/bench_cifar.py --data /path/cifar-pack --peer-python /path/tv/bin/python

The recipe: RandomCrop(32, padding=4) + RandomHorizontalFlip, then uint8 -> float32 normalized
(CIFAR-10's mean and std), batches of 128, shuffled, 2 workers each, one epoch per run. The data:
--images 32x32 images (default 50,000, CIFAR-10's training set: 10 classes) encoded as PNG (as
CIFAR's pixels are lossless; --format jpeg for JPEGs at quality 95), made once into a fastload
pack at --data (`fastload.sources.pack`: data files + numpy index) if none is there. The images
are synthetic (gradients + noise + a few shapes: CIFAR-sized PNGs of ~2-3 KB), no download.

Systems, each its own process (the peer with --peer-python, where torchvision is), alternating
within each of --rounds rounds (the first one alternates too: paired):
- fastload: `FastLoader(Packed(data), transform=[RandomCrop(32, padding=4), RandomHorizontalFlip()],
  normalize=..., num_workers=2)`;
- dataloader: `torch.utils.data.DataLoader` over a Dataset that reads the same pack's files
  (`os.pread` at the index's offsets: the same bytes), decodes with PIL, then torchvision v2's
  `Compose([ToImage(), RandomCrop(32, padding=4), RandomHorizontalFlip(), ToDtype(float32,
  scale=True), Normalize(...)])`, num_workers=2, persistent workers off.
images/s = images after the first batch / seconds from the first batch to the last. Prints each
run, then a table of medians and spreads (min..max) and the paired ratio's median.
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

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
REPO = Path(__file__).resolve().parents[2]


def make_pack(data: Path, images: int, fmt: str) -> None:
    """`images` synthetic 32x32 images, 10 classes, packed at `data` (from a folder beside it,
    removed after)."""
    import shutil

    import numpy as np
    from PIL import Image, ImageDraw

    from fastload.sources import pack

    folder = data.with_name(data.name + "-folder")
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 1, 32)
    for i in range(images):
        label = i % 10
        colours = rng.uniform(0, 255, (2, 3))
        angle = rng.uniform(0, 1)
        t = angle * ramp[None, :, None] + (1 - angle) * ramp[:, None, None]
        pixels = colours[0] * (1 - t) + colours[1] * t + rng.normal(0, 12, (32, 32, 3))
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(3):
            x, y = rng.integers(0, 28, 2)
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            draw.ellipse((int(x), int(y), int(x) + 8, int(y) + 8), fill=colour)
        out = folder / f"class{label}" / f"{i:05d}.{'png' if fmt == 'png' else 'jpg'}"
        out.parent.mkdir(parents=True, exist_ok=True)
        img.save(out, **({"quality": 95} if fmt == "jpeg" else {}))
    pack(str(folder), str(data), shuffle_seed=0, progress=False)
    shutil.rmtree(folder)


def run_fastload(data: str, workers: int, batch_size: int) -> dict[str, float]:
    import torch

    from fastload import FastLoader
    from fastload import transforms as T
    from fastload.sources import Packed

    chain = [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
    loader = FastLoader(
        Packed(data), batch_size=batch_size, shuffle=True, num_workers=workers, seed=0,
        transform=chain, normalize=(MEAN, STD), dtype=torch.float32, device="cpu",
    )
    with loader:
        return _timed(loader)


class PackDataset:
    """A fastload pack read with numpy and os.pread alone (its index is plain .npy files), each
    image decoded with PIL and passed through `transform`: what a user's Dataset would do."""

    def __init__(self, root: str, transform: object) -> None:
        import numpy as np

        self.root = root
        manifest = json.loads(Path(root, "manifest.json").read_text())
        self.files = [str(Path(root, name)) for name in manifest["files"]]
        self.offsets = np.load(Path(root, "offsets.npy"))
        self.sizes = np.load(Path(root, "sizes.npy"))
        self.file_ids = np.load(Path(root, "file_ids.npy"))
        self.labels = np.load(Path(root, "labels.npy"))
        self.transform = transform
        self._fds: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> tuple[object, int]:
        from PIL import Image

        file_id = int(self.file_ids[i])
        fd = self._fds.get(file_id)
        if fd is None:  # opened in the worker that first reads it
            fd = self._fds[file_id] = os.open(self.files[file_id], os.O_RDONLY)
        blob = os.pread(fd, int(self.sizes[i]), int(self.offsets[i]))
        with Image.open(io.BytesIO(blob)) as img:
            image = img.convert("RGB")
        return self.transform(image), int(self.labels[i])  # type: ignore[operator]


def run_dataloader(data: str, workers: int, batch_size: int) -> dict[str, float]:
    import torch
    from torchvision.transforms import v2

    recipe = v2.Compose(
        [
            v2.ToImage(),
            v2.RandomCrop(32, padding=4),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )
    dataset = PackDataset(data, recipe)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)  # type: ignore[arg-type,var-annotated]
    return _timed(loader)


def _timed(loader: object) -> dict[str, float]:
    images = 0
    first = last = 0.0
    for k, (x, _) in enumerate(loader):  # type: ignore[attr-defined]
        now = time.perf_counter()
        if k == 0:
            first = now
        else:
            images += len(x)
        last = now
    return {"images": images, "seconds": last - first, "images_per_s": images / max(last - first, 1e-9)}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}..{max(values):,.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data", required=True, help="the pack (made here if absent)")
    parser.add_argument("--peer-python", help="a python with torch + torchvision (v2) for the DataLoader")
    parser.add_argument("--images", type=int, default=50_000)
    parser.add_argument("--format", choices=("png", "jpeg"), default="png")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--run", choices=("fastload", "dataloader"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:  # one system, in this process: print its result as a JSON line
        run = run_fastload if args.run == "fastload" else run_dataloader
        print(json.dumps(run(args.data, args.workers, args.batch_size)))
        return 0
    data = Path(args.data)
    if not (data / "manifest.json").exists():
        print(f"making {args.images} {args.format.upper()} images into {data} ...", flush=True)
        make_pack(data, args.images, args.format)
    pythons = {"fastload": sys.executable}
    if args.peer_python:
        pythons["dataloader"] = args.peer_python
    results: dict[str, list[float]] = {name: [] for name in pythons}
    common = ["--data", str(data), "--workers", str(args.workers), "--batch-size", str(args.batch_size)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for r in range(args.rounds):
        order = list(pythons) if r % 2 == 0 else list(reversed(pythons))
        for name in order:
            cmd = [pythons[name], __file__, "--run", name, *common]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(done.stderr[-3000:], file=sys.stderr)
                return 1
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[name].append(result["images_per_s"])
            print(f"round {r + 1}: {name:<10} {result['images_per_s']:>9,.0f} images/s", flush=True)
    print(f"\n| system | images/s, median (min..max) of {args.rounds} |\n|---|---|")
    for name, values in results.items():
        print(f"| {name} | {_spread(values)} |")
    if "dataloader" in results:
        ratios = [a / b for a, b in zip(results["fastload"], results["dataloader"], strict=True)]
        print(f"\npaired ratio fastload / dataloader: median {statistics.median(ratios):.2f}x "
              f"({min(ratios):.2f}..{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
