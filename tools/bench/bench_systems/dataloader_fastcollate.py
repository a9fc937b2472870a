"""Benchmark system: torch DataLoader over torchvision ImageFolder with RandomResizedCrop(224)
and RandomHorizontalFlip on PIL images, batched by an Apex-style `fast_collate` into a uint8
NCHW tensor (no ToTensor, no Normalize: those move to the consumer, as in NVIDIA Apex's
ImageNet example).

Run with a python that has torch and torchvision (e.g. $BENCH_VENVS/tv/bin/python); prints the
bench_common JSON line. Workers persist across epochs, as in dataloader_torchvision.py.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from bench_common import batches_of, measure, parse_args
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def fast_collate(batch: list[tuple[Image.Image, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack equally sized RGB PIL images into one uint8 (N, 3, H, W) tensor via numpy."""
    targets = torch.tensor([target for _, target in batch], dtype=torch.int64)
    width, height = batch[0][0].size
    images = np.empty((len(batch), 3, height, width), dtype=np.uint8)
    for i, (image, _) in enumerate(batch):
        images[i] = np.rollaxis(np.asarray(image, dtype=np.uint8), 2)
    return torch.from_numpy(images), targets


def main() -> None:
    options = parse_args(__doc__.splitlines()[0])
    start = time.monotonic()
    dataset = datasets.ImageFolder(
        str(options.data),
        transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()]),
    )
    loader = DataLoader(
        dataset,
        batch_size=options.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=options.workers,
        pin_memory=False,
        persistent_workers=options.workers > 0,
        collate_fn=fast_collate,
    )
    measure(start, batches_of(loader, options), lambda batch: len(batch[1]))


if __name__ == "__main__":
    main()
