"""Data-parallel training with FastLoader: one process per device, each reading its own shard.

    torchrun --nproc_per_node=2 examples/ddp_train.py                       # 2 processes (CPU: gloo)
    torchrun --nproc_per_node=8 examples/ddp_train.py --data /path/to/train  # 8 GPUs (nccl)

With more ranks on a machine than it has GPUs (2 ranks on a 1-GPU box: where an example is tried
first), ranks share them round-robin (local rank r on GPU r % count) over gloo, since NCCL takes
one GPU per rank; local rank 0 says so on stderr.

Without --data it trains on the demo dataset `fastload demo` makes (rank 0 writes it once, under
~/.cache/fastload). The loader is made after `init_process_group`, so it takes its rank and world
size from torch.distributed: each rank reads DistributedSampler's shard of the folder, with the
same number of batches on every rank. `loader.set_epoch(epoch)` gives every epoch a new order,
the same on all ranks, as DistributedSampler.set_epoch does. `--recipe deit` adds the
augmentations of DeiT's recipe (RandAugment, ColorJitter, RandomErasing, MixUp/CutMix), and
`--repeats 3` its repeated augmentation (`samplers.RepeatedAugmentation`, DeiT's RASampler: each
sample 3 times an epoch, on different ranks, each with its own crop); `--check-shards` gathers
each epoch's sample indices and checks that no sample was on two ranks.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from fastload import FastLoader, samplers
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
    parser.add_argument(
        "--check-shards", action="store_true",
        help="after each epoch, gather every rank's sample indices and check that no sample was on "
        "two ranks (but DistributedSampler's padding)",
    )
    parser.add_argument(
        "--repeats", type=int, default=0,
        help="repeated augmentation (DeiT's RASampler) with this many repeats; 0: a plain shuffle",
    )
    args = parser.parse_args()
    if args.repeats and args.check_shards:
        parser.error("--check-shards checks that no sample is on two ranks; --repeats puts each on several")
    return args


def check_shards(indices: list[int], epoch: int, rank: int, world_size: int) -> None:
    """Gather the epoch's sample indices of every rank; rank 0 says how many samples the ranks
    read together and fails if one was on two ranks beyond DistributedSampler's padding (at most
    world_size - 1 samples repeated to give every rank as many)."""
    shards: list[list[int] | None] = [None] * world_size
    dist.all_gather_object(shards, indices)
    if rank != 0:
        return
    every = [i for shard in shards for i in shard or []]
    repeated = len(every) - len(set(every))
    if repeated > world_size - 1:
        raise SystemExit(f"epoch {epoch}: {repeated} samples were read on two ranks: the shards overlap")
    print(f"shards epoch {epoch}: {len(set(every))} samples over {world_size} ranks, each on one rank "
          f"({repeated} repeated as padding)", flush=True)


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


def placement(local_rank: int, local_world_size: int, gpus: int) -> tuple[torch.device, str, str | None]:
    """This rank's device and the process group's backend, for `gpus` GPUs shared by
    `local_world_size` ranks on this machine; and, where ranks must share GPUs, a note saying so.

    One GPU per rank: cuda:<local rank> over NCCL. More ranks than GPUs: local rank r on GPU
    r % gpus over gloo (NCCL refuses two ranks on one GPU), decided alike on every rank of the
    machine, since all must join the group with the same backend. No GPU: the CPU over gloo.
    """
    if gpus == 0:
        return torch.device("cpu"), "gloo", None
    device = torch.device("cuda", local_rank % gpus)
    if local_world_size <= gpus:
        return device, "nccl", None
    note = (
        f"{local_world_size} ranks on this machine, {gpus} GPU(s): local rank r uses cuda:(r % {gpus}); "
        "process group on gloo, not nccl (nccl needs a GPU of its own per rank)"
    )
    return device, "gloo", note


def main() -> None:
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), local_rank + 1)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device, backend, note = placement(local_rank, local_world_size, gpus)
    if note is not None and local_rank == 0:
        print(f"ddp_train: {note}", file=sys.stderr, flush=True)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world_size} on {device}, process group on {backend}", flush=True)
    data = args.data if args.data is not None else demo_dataset()

    classes = sum(1 for p in data.iterdir() if p.is_dir())  # the class folders (MixUp's num_classes)
    order = {"sampler": samplers.RepeatedAugmentation(args.repeats)} if args.repeats else {"shuffle": True}
    loader = FastLoader(
        data, batch_size=args.batch_size, drop_last=False, seed=0, **order,
        num_workers=args.workers, device=device, normalize=(MEAN, STD),
        transform=recipe(args.recipe, args.image_size, classes), sample_ids=args.check_shards,
    )  # rank and world size: from torch.distributed (or pass rank=, world_size=)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(16, len(loader.classes)),
    ).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    with loader:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            batches = samples = 0
            loss = torch.zeros((), device=device)
            seen: list[int] = []
            for images, labels, *ids in loader:  # ids: with --check-shards, each batch's SampleIds
                if ids:
                    seen += ids[0].indices.tolist()
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
            if args.check_shards:
                check_shards(seen, epoch, rank, world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
