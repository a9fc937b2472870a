"""Write an ImageNet-layout folder of photo-like JPEGs derived from scikit-image's bundled photos.

Layout: DIR/<class>/<class>_<index>.JPEG, with ImageNet-like sizes (400-600 x 300-500, about a
quarter portrait) and JPEG quality 90 with 4:2:0 chroma subsampling. Every image is a distinct
derivation (random crop, rescale, flip, rotation by 90, colour jitter, blend or inset of a second
photo, sharpening and sensor-like grain) of the real photos shipped in `skimage.data`; the output depends only
on --seed, --images and --classes. Needs numpy, pillow and scikit-image (not project
dependencies: run it with a throwaway venv's python, e.g. $BENCH_VENVS/tv/bin/python).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

JPEG_QUALITY = 90
PORTRAIT_SHARE = 0.25

_sources: list[Image.Image] = []


def load_sources() -> list[Image.Image]:
    """The colour photos bundled with scikit-image (no download needed)."""
    from skimage import data

    left, right, _ = data.stereo_motorcycle()
    arrays = [
        data.astronaut(),
        data.chelsea(),
        data.coffee(),
        data.rocket(),
        data.hubble_deep_field(),
        data.retina(),
        data.immunohistochemistry(),
        left,
        right,
    ]
    return [Image.fromarray(np.ascontiguousarray(a[..., :3])) for a in arrays]


def _init_worker() -> None:
    _sources.extend(load_sources())


def target_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height): landscape 400-600 x 300-500 (width >= height), some swapped to portrait."""
    width = int(rng.integers(400, 601))
    height = int(rng.integers(300, min(width, 500) + 1))
    if rng.random() < PORTRAIT_SHARE:
        width, height = height, width
    return width, height


def random_view(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """A random source, rotated/flipped, cropped to the aspect of `size` and resized to it."""
    image = _sources[int(rng.integers(len(_sources)))]
    turns = int(rng.choice(4, p=[0.7, 0.1, 0.1, 0.1]))
    if turns:
        image = image.rotate(90 * turns, expand=True)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    aspect = size[0] / size[1]
    src_w, src_h = image.size
    full_w, full_h = min(src_w, src_h * aspect), min(src_h, src_w / aspect)
    scale = float(np.sqrt(rng.uniform(0.2, 1.0)))
    crop_w, crop_h = full_w * scale, full_h * scale
    left = rng.uniform(0, src_w - crop_w)
    top = rng.uniform(0, src_h - crop_h)
    box = (left, top, left + crop_w, top + crop_h)
    return image.resize(size, Image.Resampling.BICUBIC, box=box)


def jitter(rng: np.random.Generator, image: Image.Image) -> Image.Image:
    """Brightness, contrast and saturation jitter, then a per-channel white-balance gain."""
    image = ImageEnhance.Brightness(image).enhance(rng.uniform(0.7, 1.3))
    image = ImageEnhance.Contrast(image).enhance(rng.uniform(0.7, 1.3))
    image = ImageEnhance.Color(image).enhance(rng.uniform(0.6, 1.4))
    gains = rng.uniform(0.9, 1.1, size=3).astype(np.float32)
    pixels = np.asarray(image, dtype=np.float32) * gains
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make_image(seed: int, index: int) -> Image.Image:
    """The deterministic image number `index` for `seed`."""
    rng = np.random.default_rng([seed, index])
    size = target_size(rng)
    image = random_view(rng, size)
    mix = rng.random()
    if mix < 0.3:
        image = Image.blend(image, random_view(rng, size), float(rng.uniform(0.15, 0.4)))
    elif mix < 0.55:
        inset_size = (int(size[0] * rng.uniform(0.25, 0.5)), int(size[1] * rng.uniform(0.25, 0.5)))
        corner = (
            int(rng.integers(0, size[0] - inset_size[0] + 1)),
            int(rng.integers(0, size[1] - inset_size[1] + 1)),
        )
        image.paste(random_view(rng, inset_size), corner)
    image = jitter(rng, image)
    return sharpen_and_grain(rng, image)


def sharpen_and_grain(rng: np.random.Generator, image: Image.Image) -> Image.Image:
    """Unsharp mask, then luminance plus weaker chroma grain: restores the fine detail (and so
    the ~100 kB JPEG size) that upscaling the small source photos smooths away."""
    image = image.filter(ImageFilter.UnsharpMask(2, int(rng.integers(200, 301)), 2))
    width, height = image.size
    sigma = rng.uniform(5.0, 9.0)
    grain = rng.normal(0.0, sigma, size=(height, width, 1))
    grain = grain + rng.normal(0.0, sigma / 2, size=(height, width, 3))
    pixels = np.asarray(image, dtype=np.float32) + grain
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def write_one(job: tuple[int, int, Path]) -> int:
    """Write image `index` to `path`; return its size in bytes."""
    seed, index, path = job
    make_image(seed, index).save(path, "JPEG", quality=JPEG_QUALITY, subsampling=2)
    return path.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="output folder (must not exist or be empty)")
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if args.images < 1 or args.classes < 1:
        parser.error("--images and --classes must be positive")
    if args.dir.exists() and any(args.dir.iterdir()):
        parser.error(f"{args.dir} is not empty; remove it first")

    class_names = [f"n{c:08d}" for c in range(args.classes)]
    for name in class_names:
        (args.dir / name).mkdir(parents=True, exist_ok=True)
    jobs = []
    for index in range(args.images):
        name = class_names[index % args.classes]
        jobs.append((args.seed, index, args.dir / name / f"{name}_{index:08d}.JPEG"))
    with multiprocessing.Pool(args.jobs, initializer=_init_worker) as pool:
        sizes = pool.map(write_one, jobs, chunksize=16)

    total = sum(sizes)
    print(
        f"{args.images} images in {args.classes} classes under {args.dir}: "
        f"{total / 2**20:.1f} MiB total, {total / len(sizes) / 1000:.1f} kB mean per file"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
