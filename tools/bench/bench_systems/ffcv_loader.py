"""Benchmark system: an FFCV Loader over a .beton made from the ImageNet-layout folder, decoding
with RandomResizedCropRGBImageDecoder((224, 224)), then RandomHorizontalFlip, ToTensor and
ToTorchImage (uint8 NCHW on the CPU), random order, drop_last.

Run with a python that has ffcv (e.g. $BENCH_VENVS/ffcv/bin/python); prints the bench_common JSON
line. The .beton (DIR.beton beside DIR, images stored as JPEG at quality 90, original sizes) is
made by `--prepare`, or before the timer starts if missing or older than DIR; else reused. FFCV's
"workers" are threads of this process. `--val`: CenterCropRGBImageDecoder((224, 224), ratio=224/256)
(FFCV's Resize(256) + CenterCrop(224)), ToTensor, ToTorchImage, sequential order.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench_common import batches_of, measure, parse_args
from ffcv.fields import IntField, RGBImageField
from ffcv.fields.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.transforms import RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage
from ffcv.writer import DatasetWriter
from PIL import Image

MAX_RESOLUTION = 1024  # above any benchmark image's longer side: originals are kept


class ImageFolderSamples:
    """(RGB PIL image, class index) samples of DIR/<class>/<file>, classes in sorted order."""

    def __init__(self, root: Path) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [
            (path, label)
            for label, name in enumerate(classes)
            for path in sorted((root / name).iterdir())
            if path.is_file()
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        path, label = self.samples[index]
        with Image.open(path) as image:
            return image.convert("RGB"), label


def write_beton(data: Path, beton: Path) -> None:
    """Convert the folder to `beton` (via a temporary name, so a partial file is never used)."""
    partial = beton.with_name(beton.name + ".partial")
    writer = DatasetWriter(
        str(partial),
        {
            "image": RGBImageField(write_mode="jpg", max_resolution=MAX_RESOLUTION),
            "label": IntField(),
        },
    )
    writer.from_indexed_dataset(ImageFolderSamples(data))
    partial.rename(beton)


def main() -> None:
    val = "--val" in sys.argv  # removed before the common parser runs
    if val:
        sys.argv.remove("--val")
    options = parse_args(__doc__.splitlines()[0], can_prepare=True)
    assert options.data is not None
    data = options.data.resolve()
    beton = data.with_name(data.name + ".beton")
    if not beton.exists() or beton.stat().st_mtime < data.stat().st_mtime:
        write_beton(data, beton)
    if options.prepare:
        return
    start = time.monotonic()
    decode = (
        [CenterCropRGBImageDecoder((224, 224), ratio=224 / 256)]
        if val
        else [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip()]
    )
    loader = Loader(
        str(beton),
        batch_size=options.batch_size,
        num_workers=options.workers,
        order=OrderOption.SEQUENTIAL if val else OrderOption.RANDOM,
        drop_last=True,
        pipelines={
            "image": [*decode, ToTensor(), ToTorchImage()],
            "label": [IntDecoder(), ToTensor(), Squeeze()],
        },
    )
    measure(start, batches_of(loader, options), lambda batch: len(batch[1]))


if __name__ == "__main__":
    main()
