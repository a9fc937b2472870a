"""`fastload demo`: make a small photo-like JPEG dataset, load it, compare with torch DataLoader.

The dataset is synthetic but JPEG-realistic (smooth colour fields, shapes, edges and grain, so it
compresses like photographs, not like noise); it is made once into a cache folder. The baseline is
what most people run: DataLoader with the same crop, flip, ToTensor and Normalize done in numpy
per sample in worker processes, and the default collate. `photo_like` draws one such image: the
one generator of photo-like images that the demo, the tests and the benchmarks share.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
import torch

from fastload._errors import ConfigError
from fastload._loading.loader import FastLoader
from fastload.transforms import RandomHorizontalFlip, RandomResizedCrop, Transform

if TYPE_CHECKING:
    from PIL import Image as PILImage

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def default_demo_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "fastload" / "demo-data"


def photo_like(rng: np.random.Generator, width: int, height: int) -> PILImage.Image:
    """A `width` x `height` RGB image that compresses like a photograph, drawn from `rng`.

    A bicubic-upscaled grid of random colours (smooth fields), 3 to 11 filled ellipses and
    rectangles (hard edges), a Gaussian blur of 0.5 to 2 pixels (a lens), then sensor-like grain.
    The same `rng` state gives the same pixels.
    """
    _require_pil()
    from PIL import Image, ImageDraw, ImageFilter

    grid = rng.integers(0, 256, (int(rng.integers(3, 7)), int(rng.integers(3, 7)), 3), dtype=np.uint8)
    img = Image.fromarray(grid).resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 12))):
        # Shapes of 20 pixels to half the image (less in images under 80 pixels).
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1 = x0 + int(rng.integers(min(20, width // 4), max(width // 2, 1)))
        y1 = y0 + int(rng.integers(min(20, height // 4), max(height // 2, 1)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.5, 2.0))))
    grain = rng.normal(0, 6, (height, width, 3))
    pixels = np.clip(np.asarray(img, dtype=np.float32) + grain, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def _require_pil() -> None:
    """Raise ConfigError, saying how to get it, where PIL cannot be imported."""
    try:
        import PIL  # noqa: F401
    except ImportError as e:
        raise ConfigError("the demo dataset needs Pillow: `pip install pillow` (or pillow-simd)") from e


def make_demo_dataset(root: Path, images: int = 512, classes: int = 4, seed: int = 0) -> Path:
    """Write `images` photo-like JPEGs (ImageNet layout, ~500x375) under `root`; idempotent."""
    _require_pil()
    marker = root / ".complete"
    if marker.exists() and marker.read_text() == f"{images} {classes} {seed}":
        return root
    rng = np.random.default_rng(seed)
    for i in range(images):
        class_dir = root / f"class_{i % classes:02d}"
        class_dir.mkdir(parents=True, exist_ok=True)
        w, h = int(rng.integers(400, 600)), int(rng.integers(300, 500))
        if rng.random() < 0.2:
            w, h = h, w
        photo_like(rng, w, h).save(class_dir / f"img_{i:05d}.JPEG", quality=90)
    marker.write_text(f"{images} {classes} {seed}")
    return root


class _BaselineDataset(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """ImageFolder + RandomResizedCrop + flip + ToTensor + Normalize, as most people run it."""

    def __init__(self, root: Path, size: int) -> None:
        from fastload.sources._folder import scan_image_folder

        self.index = scan_image_folder(root)
        self.crop = RandomResizedCrop(size)
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        rng = np.random.default_rng()
        with Image.open(self.index.path(i)) as f:
            img = f.convert("RGB")
        top, left, h, w = self.crop.sample_box(img.height, img.width, rng)
        size = (self.crop.size, self.crop.size) if isinstance(self.crop.size, int) else self.crop.size
        img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous().float().div_(255)
        return (x - self.mean) / self.std, int(self.index.labels[i])


def _progress(batches: Iterable[Any], total: int, label: str, out: TextIO) -> Iterator[Any]:
    """Yield from `batches`, drawing a one-line progress bar with images/s on `out`."""
    start = time.perf_counter()
    images = 0
    for done, batch in enumerate(batches, 1):
        images += len(batch[1])
        elapsed = max(time.perf_counter() - start, 1e-9)
        filled = int(30 * done / max(total, 1))
        bar = "#" * filled + "." * (30 - filled)
        out.write(f"\r{label:<22} [{bar}] {done}/{total} {images / elapsed:8.0f} img/s")
        out.flush()
        yield batch
    out.write("\n")


# A rate timed over fewer batches, or less time, than this is noise: three demo runs on a
# 512-image folder (7 timed batches an epoch) gave ratios of 0.53x, 0.98x and 4.62x.
MIN_TIMED_BATCHES = 20
MIN_TIMED_S = 1.0


def _measure(loader: Iterable[Any], total: int, label: str, out: TextIO) -> tuple[float, int, float]:
    """(images per second, batches timed, seconds timed) over one pass, counted from the first
    batch (start-up excluded)."""
    images, batches, first = 0, 0, None
    for batch in _progress(loader, total, label, out):
        if first is None:
            first = time.perf_counter()
            continue
        images += len(batch[1])
        batches += 1
    seconds = time.perf_counter() - (first or time.perf_counter())
    return images / max(seconds, 1e-9), batches, seconds


def too_few(batches: int, seconds: float) -> bool:
    """Whether a rate timed over `batches` batches in `seconds` is too short to compare."""
    return batches < MIN_TIMED_BATCHES or seconds < MIN_TIMED_S


def _best(runs: list[tuple[float, int, float]]) -> tuple[float, bool]:
    """(the best epoch's rate, whether even that epoch was timed too briefly to mean much)."""
    rate, batches, seconds = max(runs)
    return rate, too_few(batches, seconds)


def run_demo(
    data: Path | None,
    epochs: int,
    workers: int,
    batch_size: int,
    images: int,
    baseline: bool,
    out: TextIO = sys.stdout,
) -> dict[str, float]:
    """Run the demo; return the measured images/s per system."""
    root = data if data is not None else make_demo_dataset(default_demo_dir(), images=images)
    out.write(f"dataset: {root}\n")
    results: dict[str, float] = {}
    transform: list[Transform] = [RandomResizedCrop(224), RandomHorizontalFlip()]
    with FastLoader(
        root,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        transform=transform,
        normalize=(IMAGENET_MEAN, IMAGENET_STD),
        seed=0,
    ) as loader:
        out.write(
            f"FastLoader: {len(loader)} batches of {batch_size}, {workers} workers, device {loader.device}\n"
        )
        runs = [_measure(loader, len(loader), f"fastload epoch {e}", out) for e in range(epochs)]
        results["fastload"], short = _best(runs)
    if baseline:
        dataset = _BaselineDataset(root, 224)
        loader_dl = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            persistent_workers=workers > 0,
        )
        runs = [_measure(loader_dl, len(loader_dl), f"DataLoader epoch {e}", out) for e in range(epochs)]
        results["dataloader"], short_dl = _best(runs)
        fast, slow = results["fastload"], results["dataloader"]
        out.write(f"\nfastload {fast:.0f} img/s vs torch DataLoader {slow:.0f} img/s: {fast / slow:.2f}x\n")
        if short or short_dl:
            out.write(
                f"(timed over too little to mean much: fewer than {MIN_TIMED_BATCHES} batches or "
                f"{MIN_TIMED_S:g} s an epoch; use more --images, a smaller --batch-size or a larger "
                "--data folder)\n"
            )
    return results
