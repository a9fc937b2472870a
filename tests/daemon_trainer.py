"""A trainer process for the daemon fault tests: attach to a daemon, save every batch and the state.

    python tests/daemon_trainer.py ADDRESS DATA OUT [--epochs N] [--pause-after K] [--resume]

Writes OUT/e<epoch>_b<batch>.pt for every batch it gets and OUT/state.pt (the loader's
state_dict after it) after each one; prints `started <epoch> <batch>` for its first batch and
`batch <epoch> <batch>` for each; with --pause-after K it prints `paused` after K batches and
sleeps (with batches in flight) until it is killed; with --resume it first loads OUT/state.pt.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from fastload import FastLoader
from fastload import transforms as T

BATCH_SIZE = 4
SEED = 11


def make_loader(data: str, daemon: str | None) -> FastLoader:
    """The loader both this trainer and the tests' uninterrupted runs use."""
    return FastLoader(
        data, batch_size=BATCH_SIZE, shuffle=True, seed=SEED, num_workers=0 if daemon is None else 1,
        prefetch=3, transform=[T.RandomResizedCrop(24, scale=(0.5, 1.0)), T.RandomHorizontalFlip()],
        device="cpu", daemon=daemon,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--pause-after", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    state_path = os.path.join(args.out, "state.pt")
    with make_loader(args.data, args.address) as loader:
        if args.resume:
            loader.load_state_dict(torch.load(state_path))
        first_epoch = loader.state_dict()["epoch"]
        taken = 0
        for _ in range(first_epoch, args.epochs):
            for images, labels in loader:
                state = loader.state_dict()
                epoch, batch = state["epoch"], state["batches_yielded"] - 1
                if taken == 0:
                    print(f"started {epoch} {batch}", flush=True)
                torch.save([images.clone(), labels.clone()], os.path.join(args.out, f"e{epoch}_b{batch}.pt"))
                torch.save(state, state_path + ".tmp")
                os.replace(state_path + ".tmp", state_path)
                print(f"batch {epoch} {batch}", flush=True)
                taken += 1
                if taken == args.pause_after:
                    print("paused", flush=True)
                    time.sleep(120)
                    return 3
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
