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
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
import torch

from fastload._errors import ConfigError
from fastload._loading.loader import FastLoader
from fastload._progress import ProgressLine
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
        from fastload.sources._formats.folder import scan_image_folder

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


def _timed_epoch(loader: Iterable[Any], total: int, label: str, out: TextIO) -> tuple[float, int, float]:
    """(images per second, batches, seconds) of one whole epoch, start of the epoch included (as
    a training loop waits for it), with a progress bar on `out` (NOTE [progress lines])."""
    line = ProgressLine(out)
    images, batches = 0, 0
    start = time.perf_counter()
    for batches, batch in enumerate(loader, 1):
        images += len(batch[1])
        if line.due():
            filled = int(30 * batches / max(total, 1))
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar = "#" * filled + "." * (30 - filled)
            line.update(f"{label:<26} [{bar}] {batches}/{total} {images / elapsed:8.0f} img/s")
    seconds = max(time.perf_counter() - start, 1e-9)
    line.done(f"{label:<26} {batches} batches in {seconds:5.2f} s {images / seconds:8.0f} img/s")
    return images / seconds, batches, seconds


# NOTE [demo timing]: the figure is the median rate of `epochs` whole epochs, timed after one
# untimed warm-up epoch (worker start, page cache, the allocator's first touches). The earlier
# demo timed the batches after the first of each of 2 epochs of 8: a first batch that arrived with
# the pipeline already full made the next 7 nearly free, and three runs of it gave 0.53x, 0.98x
# and 4.62x. Whole epochs count each epoch's refill as a training loop meets it, and the median
# of 3 drops one disturbed epoch (2 shared cores). The defaults (1536 images, batches of 32:
# 48 an epoch) took 25 s with the baseline on a shared 2-core VM (fastload ~1 s an epoch, the
# baseline ~2.4 s), plus 25 s to make the dataset on the first run.
WARMUP_EPOCHS = 1
# An epoch timed over fewer batches, or less time, than this is still noise: said with the figure.
MIN_TIMED_BATCHES = 20
MIN_TIMED_S = 0.5


def too_few(batches: int, seconds: float) -> bool:
    """Whether a rate timed over `batches` batches in `seconds` is too short to compare."""
    return batches < MIN_TIMED_BATCHES or seconds < MIN_TIMED_S


def _median_rate(
    loader: Iterable[Any], total: int, name: str, epochs: int, out: TextIO
) -> tuple[float, bool]:
    """(the median epoch's rate, whether it was timed too briefly to mean much), after the warm-up."""
    for e in range(WARMUP_EPOCHS):
        _timed_epoch(loader, total, f"{name} warm-up {e + 1}", out)
    runs = sorted(_timed_epoch(loader, total, f"{name} epoch {e + 1}/{epochs}", out) for e in range(epochs))
    rate, batches, seconds = runs[len(runs) // 2]
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
    """Run the demo; return the measured images/s per system (NOTE [demo timing]): `epochs`
    timed epochs after a warm-up one, the median of them."""
    if epochs < 1:
        raise ConfigError(f"--epochs must be at least 1, got {epochs}")
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
        results["fastload"], short = _median_rate(loader, len(loader), "fastload", epochs, out)
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
        results["dataloader"], short_dl = _median_rate(loader_dl, len(loader_dl), "DataLoader", epochs, out)
        short = short or short_dl
        fast, slow = results["fastload"], results["dataloader"]
        out.write(
            f"\nfastload {fast:.0f} img/s vs torch DataLoader {slow:.0f} img/s: {fast / slow:.2f}x "
            f"(the median of {epochs} whole epochs each, after {WARMUP_EPOCHS} of warm-up)\n"
        )
    else:
        out.write(f"\nfastload {results['fastload']:.0f} img/s (the median of {epochs} whole epochs)\n")
    if short:
        out.write(
            f"(an epoch here is under {MIN_TIMED_BATCHES} batches or {MIN_TIMED_S:g} s: too short to "
            "compare; use more --images, a smaller --batch-size or a larger --data folder)\n"
        )
    return results
