"""What the training-recipe systems share: the recipe flag, the output contract and the trainer's touch.

The recipe systems (dataloader_recipe.py, fastload_recipe.py) run one named train recipe end to
end, both ending in float32 normalized images, so each pair of systems does the same work:

- `basic`: RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor/Normalize; labels int64 (B,);
- `deit`: DeiT's train recipe, `basic` plus RandAugment(2, 9) + ColorJitter(0.4, 0.4, 0.4) +
  RandomErasing(0.25) + per batch MixUp(alpha=0.8) or CutMix(alpha=1.0), one of the two at
  random; labels are soft, float32 (B, num_classes).

`basic` against `deit` on one system reads off what the augmentations themselves cost.
`consume` is the trainer: it checks the first batch against this contract (so that no system is
timed doing less than the others) and then touches every batch's images and labels the way a
training step's first read would, without copying them. Imports torch (every recipe system's
venv has it), unlike bench_common.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RECIPES = ("basic", "deit")
SIZE = 224
# One float32 of every 4 KiB page: enough to fault in every page of a batch (as the first read of
# a training step does) while adding almost no arithmetic of its own.
PAGE_FLOATS = 4096 // 4


def take_recipe() -> str:
    """Remove `--recipe NAME` from sys.argv (before bench_common's parser runs) and return NAME."""
    if "--recipe" not in sys.argv:
        return "basic"
    at = sys.argv.index("--recipe")
    if at + 1 >= len(sys.argv) or sys.argv[at + 1] not in RECIPES:
        raise SystemExit(f"--recipe takes one of {', '.join(RECIPES)}")
    recipe = sys.argv[at + 1]
    del sys.argv[at : at + 2]
    return recipe


def class_count(root: Path) -> int:
    """The number of classes of an ImageNet-layout folder: its subfolders, as ImageFolder sees them."""
    count = sum(1 for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if count < 2:
        raise SystemExit(f"{root}: need at least 2 class folders for MixUp/CutMix labels, found {count}")
    return count


def check_batch(images: Any, labels: Any, recipe: str, batch_size: int, num_classes: int) -> None:
    """Fail loudly unless the batch is what `recipe` promises (float32 normalized images, labels)."""
    problems: list[str] = []
    if not isinstance(images, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise SystemExit(f"expected [images, labels] tensors, got {type(images)}, {type(labels)}")
    if images.dtype != torch.float32 or tuple(images.shape) != (batch_size, 3, SIZE, SIZE):
        want = f"float32 ({batch_size}, 3, {SIZE}, {SIZE})"
        problems.append(f"images {images.dtype} {tuple(images.shape)}, want {want}")
    elif not bool(torch.isfinite(images).all()) or float(images.min()) >= 0:
        problems.append("images are not normalized (non-finite, or no value below 0)")
    if recipe == "basic":
        if labels.dtype != torch.int64 or tuple(labels.shape) != (batch_size,):
            problems.append(f"labels {labels.dtype} {tuple(labels.shape)}, want int64 ({batch_size},)")
    elif not labels.is_floating_point() or tuple(labels.shape) != (batch_size, num_classes):
        problems.append(
            f"labels {labels.dtype} {tuple(labels.shape)}, want soft float ({batch_size}, {num_classes})"
        )
    elif not torch.allclose(labels.sum(dim=1), torch.ones(batch_size, dtype=labels.dtype), atol=1e-3):
        problems.append("soft labels' rows do not sum to 1")
    if problems:
        raise SystemExit(f"recipe {recipe}: the batch breaks the output contract: " + "; ".join(problems))


def touch(images: torch.Tensor, labels: torch.Tensor) -> float:
    """Read one float of every page of the images and all the labels, in place (no copy)."""
    if not (images.is_contiguous() or images.is_contiguous(memory_format=torch.channels_last)):
        raise SystemExit(f"images are not dense (strides {images.stride()}): a trainer would copy them")
    pages = images.as_strided((images.numel() // PAGE_FLOATS,), (PAGE_FLOATS,), images.storage_offset())
    return float(pages.sum()) + float(labels.sum())


def consume(
    batches: Iterable[Any], recipe: str, batch_size: int, num_classes: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield each `[images, labels]` batch after the trainer's touch; the first one is checked."""
    checked = False
    for batch in batches:
        images, labels = batch
        if not checked:
            check_batch(images, labels, recipe, batch_size, num_classes)
            checked = True
        touch(images, labels)
        yield images, labels
