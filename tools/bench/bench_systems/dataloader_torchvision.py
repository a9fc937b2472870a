"""Benchmark system: torch DataLoader over torchvision ImageFolder with the standard ImageNet
training transforms (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize).

Run with a python that has torch and torchvision (e.g. $BENCH_VENVS/tv/bin/python); prints the
bench_common JSON line. `--val`: the validation transforms (Resize(256), CenterCrop(224), ToTensor,
Normalize), in order. Workers persist across epochs, so the small benchmark set's epoch ends
don't restart them (as they rarely would on a full-size dataset).
"""

from __future__ import annotations

import sys
import time

from bench_common import batches_of, measure, parse_args
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def main() -> None:
    val = "--val" in sys.argv  # removed before the common parser runs
    if val:
        sys.argv.remove("--val")
    options = parse_args(__doc__.splitlines()[0])
    start = time.monotonic()
    geometry = (
        [transforms.Resize(256), transforms.CenterCrop(224)]
        if val
        else [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()]
    )
    dataset = datasets.ImageFolder(
        str(options.data),
        transforms.Compose(
            [*geometry, transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
        ),
    )
    loader = DataLoader(
        dataset,
        batch_size=options.batch_size,
        shuffle=not val,
        drop_last=True,
        num_workers=options.workers,
        pin_memory=False,
        persistent_workers=options.workers > 0,
    )
    measure(start, batches_of(loader, options), lambda batch: len(batch[1]))


if __name__ == "__main__":
    main()
