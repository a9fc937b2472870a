"""Two-process trainers for tests/test_distributed.py: each writes OUT/rank<r>.json, what it loaded.

    python tests/dist_trainer.py spawn DATA OUT PORT
    python -m torch.distributed.run --nproc_per_node=2 ... tests/dist_trainer.py torchrun DATA OUT
    python -m torch.distributed.run --nproc_per_node=2 ... tests/dist_trainer.py skip DATA OUT
    python -m torch.distributed.run --nproc_per_node=2 ... tests/dist_trainer.py unseeded DATA OUT

spawn: `torch.multiprocessing.spawn` starts 2 processes with the environment Lightning's launcher
gives (WORLD_SIZE, NODE_RANK, LOCAL_RANK; no RANK). Each makes a folder loader before joining a
gloo process group (its rank then comes from the environment) and one after, in a group that
numbers the processes the other way round from LOCAL_RANK (its rank must come from the group).
torchrun: each process joins the gloo group torchrun describes, makes a folder loader, and a
Dataset loader over a DistributedSampler whose epoch it sets to 3 itself.

skip: each process trains two epochs over a folder with a broken file, on_error="skip", an
all-reduce per step, and records its steps, the files each batch held, and what was skipped.

unseeded: each process seeds torch per rank, as timm's `random_seed(seed, rank)` does, then
shuffles a folder with no seed= (the README's distributed snippet) for two epochs, and records the
files each epoch held and the warnings the loader gave.

The folder loaders read unshuffled with batch size 2; an image is recorded by its pixels' digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

from fastload import FastLoader
from fastload import transforms as T

RESIZE = [T.Resize((16, 16))]
BATCH_SIZE = 2
DATASET_SIZE = 11
SAMPLER_SEED = 7
SAMPLER_EPOCH = 3


def digest(image: torch.Tensor) -> str:
    return hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest()


def folder_shard(data: str, num_workers: int) -> list[str]:
    """The digests of the images one epoch of this process's folder loader yields, in order."""
    with FastLoader(
        data, batch_size=BATCH_SIZE, shuffle=False, num_workers=num_workers, transform=RESIZE, device="cpu"
    ) as loader:
        return [digest(image) for images, _ in loader for image in images]


class Indices(Dataset[int]):
    def __len__(self) -> int:
        return DATASET_SIZE

    def __getitem__(self, i: int) -> int:
        return i


def write(out: str, rank: int, record: dict[str, Any]) -> None:
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def spawned(local_rank: int, data: str, out: str, port: int) -> None:
    os.environ.pop("RANK", None)
    os.environ.update({"WORLD_SIZE": "2", "NODE_RANK": "0", "LOCAL_RANK": str(local_rank)})
    record: dict[str, Any] = {"local_rank": local_rank, "from_environment": folder_shard(data, 0)}
    group_rank = 1 - local_rank
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=group_rank, world_size=2)
    try:
        record["group_rank"] = group_rank
        record["from_process_group"] = folder_shard(data, 1)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    write(out, local_rank, record)


def torchrun(data: str, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        record: dict[str, Any] = {"rank": rank, "folder": folder_shard(data, 1)}
        sampler = DistributedSampler(Indices(), shuffle=True, seed=SAMPLER_SEED)
        sampler.set_epoch(SAMPLER_EPOCH)
        with FastLoader(Indices(), batch_size=BATCH_SIZE, sampler=sampler, num_workers=1) as loader:
            record["sampler_indices"] = [int(i) for batch in loader for i in batch]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    write(out, rank, record)


def skipping(data: str, out: str) -> None:
    """Two epochs of a folder with a broken file, on_error="skip", one all-reduce a step as DDP
    does (a rank with fewer steps would leave the other waiting in it: the test's timeout)."""
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        record: dict[str, Any] = {"rank": rank, "steps": [], "names": [], "skipped": []}
        with FastLoader(
            data, batch_size=BATCH_SIZE, shuffle=True, seed=3, num_workers=1, transform=RESIZE, device="cpu",
            sample_ids=True, on_error="skip", max_skipped=1,
        ) as loader:
            for epoch in range(2):
                loader.set_epoch(epoch)
                steps = 0
                for _, labels, ids in loader:
                    total = torch.tensor([float(len(labels))])
                    dist.all_reduce(total)  # every rank must get here as often
                    steps += 1
                    record["names"].append(list(ids.names))
                record["steps"].append(steps)
            record["skipped"] = [name for name, _ in loader.skipped()]
            stats = loader.stats()
            record["skipped_count"] = stats.skipped if stats is not None else -1
        dist.barrier()
    finally:
        dist.destroy_process_group()
    write(out, rank, record)


def unseeded(data: str, out: str) -> None:
    """Two shuffled epochs with no seed=, after a per-rank `torch.manual_seed` (timm's recipe)."""
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        torch.manual_seed(42 + rank)
        record: dict[str, Any] = {"rank": rank, "epochs": []}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with FastLoader(
                data, batch_size=BATCH_SIZE, shuffle=True, num_workers=1, transform=RESIZE, device="cpu",
                sample_ids=True,
            ) as loader:
                for epoch in range(2):
                    loader.set_epoch(epoch)
                    record["epochs"].append([name for _, _, ids in loader for name in ids.names])
        record["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    write(out, rank, record)


def main(argv: list[str]) -> int:
    mode, data, out = argv[:3]
    if mode == "spawn":
        torch.multiprocessing.spawn(spawned, args=(data, out, int(argv[3])), nprocs=2, join=True)
    elif mode == "torchrun":
        torchrun(data, out)
    elif mode == "skip":
        skipping(data, out)
    elif mode == "unseeded":
        unseeded(data, out)
    else:
        raise SystemExit(f"unknown mode {mode!r}: spawn, torchrun, skip or unseeded")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
