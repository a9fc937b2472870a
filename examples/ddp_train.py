"""Data-parallel training with FastLoader: one process per device, each reading its own shard.

    torchrun --nproc_per_node=2 examples/ddp_train.py                       # 2 CPU processes (gloo)
    torchrun --nproc_per_node=8 examples/ddp_train.py --data /path/to/train  # 8 GPUs (nccl)

Without --data it trains on the demo dataset `fastload demo` makes (rank 0 writes it once, under
~/.cache/fastload). The loader is made after `init_process_group`, so it takes its rank and world
size from torch.distributed: each rank reads DistributedSampler's shard of the folder, with the
same number of batches on every rank. `loader.set_epoch(epoch)` gives every epoch a new order,
the same on all ranks, as DistributedSampler.set_epoch does. `--recipe deit` adds the
augmentations of DeiT's recipe (RandAugment, ColorJitter, RandomErasing, MixUp/CutMix).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from fastload import FastLoader
from fastload import transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="an ImageNet-layout folder (default: the demo dataset)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes per rank")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument(
        "--recipe", choices=("basic", "deit"), default="basic",
        help="basic: crop + flip; deit: + RandAugment, ColorJitter, RandomErasing, MixUp/CutMix",
    )
    return parser.parse_args()


def recipe(name: str, size: int, classes: int) -> list[T.Transform]:
    """The training transforms: crop + flip, and for "deit" the augmentations of DeiT's recipe,
    whose MixUp/CutMix make the labels soft targets (cross_entropy takes those as they are)."""
    chain: list[T.Transform] = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
    if name == "deit":
        mixing = [T.MixUp(alpha=0.8, num_classes=classes), T.CutMix(alpha=1.0, num_classes=classes)]
        chain += [T.RandAugment(2, 9), T.ColorJitter(0.4, 0.4, 0.4), T.RandomErasing(0.25)]
        chain.append(T.RandomChoice(mixing))
    return chain


def demo_dataset() -> Path:
    from fastload._demo import default_demo_dir, make_demo_dataset  # what `fastload demo` uses

    root = default_demo_dir()
    if dist.get_rank() == 0:
        make_demo_dataset(root)
    dist.barrier()  # the others wait until rank 0 has written it
    return root


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    data = args.data if args.data is not None else demo_dataset()

    classes = sum(1 for p in data.iterdir() if p.is_dir())  # the class folders (MixUp's num_classes)
    loader = FastLoader(
        data, batch_size=args.batch_size, shuffle=True, drop_last=False, seed=0,
        num_workers=args.workers, device=device, normalize=(MEAN, STD),
        transform=recipe(args.recipe, args.image_size, classes),
    )  # rank and world size: from torch.distributed (or pass rank=, world_size=)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, len(loader.classes)),
    ).to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    with loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            batches = samples = 0
            loss = torch.zeros((), device=device)
            for images, labels in loader:
                loss = nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # DDP averages the gradients over the ranks
                optimizer.step()
                batches, samples = batches + 1, samples + len(labels)
            print(
                f"rank {rank}/{world_size} epoch {epoch}: {batches} batches, {samples} samples, "
                f"last loss {loss.item():.3f}",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
