"""FastLoader in a Lightning DataModule, trained with DDP (Lightning is not a fastload dependency).

    pip install lightning
    python examples/lightning_datamodule.py                                # 2 CPU processes
    python examples/lightning_datamodule.py --data /path/to/train --accelerator gpu --devices 8

Without --data it trains on the demo dataset `fastload demo` makes (under ~/.cache/fastload).
Lightning puts a DistributedSampler only into torch DataLoader instances; FastLoader is not one,
so Lightning passes it through untouched (`use_distributed_sampler=False` says so) and FastLoader
shards the folder itself, by the rank of the process group Lightning sets up before it calls
`train_dataloader()`; `--check-shards` gathers each epoch's sample indices and checks that no
sample was on two ranks. Lightning saves the loader's `state_dict()` in its checkpoints and restores
it on resume; `on_train_epoch_start` ties the loader's epoch to Lightning's.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from fastload import FastLoader
from fastload import transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class FolderDataModule(L.LightningDataModule):
    """Batches of an ImageNet-layout folder, already on this rank's device."""

    def __init__(self, root: Path, batch_size: int, workers: int, image_size: int, ids: bool = False) -> None:
        super().__init__()
        self.root, self.batch_size, self.workers, self.image_size = root, batch_size, workers, image_size
        self.ids = ids  # each batch ends with its SampleIds (--check-shards)
        self.loader: FastLoader | None = None

    def train_dataloader(self) -> FastLoader:
        # The process group is up: FastLoader reads this rank's shard (or pass rank=, world_size=).
        self.loader = FastLoader(
            self.root, batch_size=self.batch_size, shuffle=True, seed=0, num_workers=self.workers,
            device=self.trainer.strategy.root_device, normalize=(MEAN, STD),
            transform=[T.RandomResizedCrop(self.image_size), T.RandomHorizontalFlip()], sample_ids=self.ids,
        )
        return self.loader

    def teardown(self, stage: str) -> None:
        if self.loader is not None:
            self.loader.close()  # stop its workers now rather than when it is collected


class TinyClassifier(L.LightningModule):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(16, classes),
        )
        self.samples = 0
        self.seen: list[int] = []  # the epoch's sample indices, with --check-shards

    def on_train_epoch_start(self) -> None:
        # A new order each epoch, the same on every rank (needed if dataloaders are reloaded;
        # otherwise the loader counts its epochs itself, and its state_dict resumes the count).
        self.trainer.train_dataloader.set_epoch(self.current_epoch)
        self.samples = 0
        self.seen = []

    def training_step(self, batch: list[Any], batch_idx: int) -> torch.Tensor:
        images, labels, *ids = batch
        self.samples += len(labels)
        if ids:
            self.seen += ids[0].indices.tolist()
        return nn.functional.cross_entropy(self.net(images), labels)

    def on_train_epoch_end(self) -> None:
        print(f"rank {self.global_rank}/{self.trainer.world_size} epoch {self.current_epoch}: "
              f"{self.samples} samples", flush=True)
        if self.seen:  # --check-shards: every rank's indices (as many on each: DistributedSampler's)
            every = self.all_gather(torch.tensor(self.seen)).flatten().tolist()
            repeated = len(every) - len(set(every))
            if repeated > self.trainer.world_size - 1:
                raise SystemExit(f"epoch {self.current_epoch}: {repeated} samples were read on two ranks")
            if self.global_rank == 0:
                print(f"shards epoch {self.current_epoch}: {len(set(every))} samples over "
                      f"{self.trainer.world_size} ranks, each on one rank ({repeated} repeated as padding)",
                      flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, help="an ImageNet-layout folder (default: the demo dataset)")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes per rank")
    parser.add_argument(
        "--check-shards", action="store_true",
        help="after each epoch, gather every rank's sample indices and check that no sample was on two ranks",
    )
    args = parser.parse_args()
    root = args.data
    if root is None:  # made before fit(): the ranks Lightning starts then find it complete
        from fastload._demo import default_demo_dir, make_demo_dataset  # what `fastload demo` uses

        root = make_demo_dataset(default_demo_dir())
    classes = sum(1 for d in root.iterdir() if d.is_dir())
    trainer = L.Trainer(
        accelerator=args.accelerator, devices=args.devices, strategy="ddp", max_epochs=args.epochs,
        use_distributed_sampler=False, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )
    data = FolderDataModule(root, args.batch_size, args.workers, 64, ids=args.check_shards)
    trainer.fit(TinyClassifier(classes), data)


if __name__ == "__main__":
    main()
