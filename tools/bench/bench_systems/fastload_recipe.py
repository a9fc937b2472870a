"""Benchmark system: FastLoader over the image folder, one train recipe, float32 normalized out.

The same recipes as dataloader_recipe.py (see recipe_common), in fastload's declarative transforms,
normalized by the loader (`normalize=(mean, std)`). `--recipe basic|deit` (default basic):

- basic: RandomResizedCrop(224) + RandomHorizontalFlip; labels int64 (B,);
- deit: basic + RandAugment(2, 9) + ColorJitter(0.4, 0.4, 0.4) + RandomErasing(0.25) +
  RandomChoice([MixUp(alpha=0.8), CutMix(alpha=1.0)]); labels float32 (B, num_classes).

`deit` needs the augmentations of issue 12 in `fastload.transforms`; without them it exits with a
message naming the missing ones (basic still runs). Run with .venv/bin/python (from the repo root);
prints the bench_common JSON line.
"""

from __future__ import annotations

import time
from typing import Any

from bench_common import batches_of, measure, parse_args
from recipe_common import IMAGENET_MEAN, IMAGENET_STD, SIZE, class_count, consume, take_recipe

from fastload import FastLoader
from fastload import transforms as T

DEIT_TRANSFORMS = ("RandAugment", "ColorJitter", "RandomErasing", "RandomChoice", "MixUp", "CutMix")


def recipe_transforms(recipe: str, num_classes: int) -> list[Any]:
    """The recipe's transform chain; SystemExit naming what is missing when fastload lacks a part."""
    geometry: list[Any] = [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]
    if recipe == "basic":
        return geometry
    missing = [name for name in DEIT_TRANSFORMS if not hasattr(T, name)]
    if missing:
        raise SystemExit(
            f"fastload_recipe.py --recipe deit: fastload.transforms ({T.__file__}) lacks "
            f"{', '.join(missing)}, the DeiT recipe's augmentations (issue 12); "
            "--recipe basic runs without them"
        )
    return [
        *geometry,
        T.RandAugment(num_ops=2, magnitude=9),
        T.ColorJitter(0.4, 0.4, 0.4),
        T.RandomErasing(p=0.25),
        T.RandomChoice(
            [T.MixUp(alpha=0.8, num_classes=num_classes), T.CutMix(alpha=1.0, num_classes=num_classes)]
        ),
    ]


def main() -> None:
    recipe = take_recipe()
    options = parse_args(__doc__.splitlines()[0])
    assert options.data is not None
    start = time.monotonic()
    num_classes = class_count(options.data)
    loader = FastLoader(
        options.data,
        batch_size=options.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=options.workers,
        device="cpu",
        normalize=(IMAGENET_MEAN, IMAGENET_STD),
        transform=recipe_transforms(recipe, num_classes),
    )
    with loader:
        batches = consume(batches_of(loader, options), recipe, options.batch_size, num_classes)
        measure(start, batches, lambda batch: len(batch[1]))


if __name__ == "__main__":
    main()
