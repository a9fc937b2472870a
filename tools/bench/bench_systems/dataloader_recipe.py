"""Benchmark system: torch DataLoader + ImageFolder + torchvision.transforms.v2, one train recipe.

Torchvision's own recommended way: v2 transforms on the PIL images of
`torchvision.datasets.ImageFolder`, a shuffling DataLoader with persistent workers, and (for `deit`)
MixUp or CutMix applied per batch in `collate_fn` after `default_collate`, as torchvision's
"How to use CutMix and MixUp" shows. `--recipe basic|deit` (default basic; see recipe_common):

- basic: RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor + ToDtype(float32, scale) +
  Normalize; labels int64 (B,);
- deit: RandomResizedCrop(224) + RandomHorizontalFlip + RandAugment(2, 9) + ColorJitter(0.4, 0.4,
  0.4) + PILToTensor + ToDtype + Normalize + RandomErasing(0.25), then per batch
  RandomChoice([MixUp(alpha=0.8), CutMix(alpha=1.0)]); labels float32 (B, num_classes).

Run with a python that has torch and torchvision (e.g. $BENCH_VENVS/tv/bin/python); prints the
bench_common JSON line.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from bench_common import batches_of, measure, parse_args
from recipe_common import IMAGENET_MEAN, IMAGENET_STD, SIZE, consume, take_recipe
from torch.utils.data import DataLoader, default_collate
from torchvision import datasets
from torchvision.transforms import v2


def sample_transform(recipe: str) -> v2.Compose:
    """The per-image part of the recipe, on PIL images."""
    geometry: list[Any] = [v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip()]
    augment: list[Any] = (
        [v2.RandAugment(num_ops=2, magnitude=9), v2.ColorJitter(0.4, 0.4, 0.4)] if recipe == "deit" else []
    )
    to_tensor = [
        v2.PILToTensor(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ]
    erase = [v2.RandomErasing(p=0.25)] if recipe == "deit" else []
    return v2.Compose([*geometry, *augment, *to_tensor, *erase])


class MixUpCutMixCollate:
    """default_collate, then MixUp or CutMix (one at random) on the whole batch: soft labels."""

    def __init__(self, num_classes: int) -> None:
        self.mix = v2.RandomChoice(
            [v2.MixUp(alpha=0.8, num_classes=num_classes), v2.CutMix(alpha=1.0, num_classes=num_classes)]
        )

    def __call__(self, samples: list[Any]) -> Any:
        return self.mix(*default_collate(samples))


def main() -> None:
    recipe = take_recipe()
    options = parse_args(__doc__.splitlines()[0])
    assert options.data is not None
    start = time.monotonic()
    dataset = datasets.ImageFolder(str(options.data), sample_transform(recipe))
    num_classes = len(dataset.classes)
    loader = DataLoader(
        dataset,
        batch_size=options.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=options.workers,
        persistent_workers=options.workers > 0,
        collate_fn=MixUpCutMixCollate(num_classes) if recipe == "deit" else None,
    )
    batches = consume(batches_of(loader, options), recipe, options.batch_size, num_classes)
    measure(start, batches, lambda batch: len(batch[1]))


if __name__ == "__main__":
    main()
