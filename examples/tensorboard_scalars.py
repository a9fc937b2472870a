"""The input pipeline's health beside the loss curves: fastload.ScalarLogger into TensorBoard.

    pip install tensorboard
    python examples/tensorboard_scalars.py --logdir runs/fastload      # the demo dataset
    tensorboard --logdir runs/fastload

Each epoch writes the loss and, under fastload/, the loader's images per second, each stage's
share of its time per sample (read, decode, augment, slot wait, host-to-device), the share of
the time the step waited for a batch, failures, skipped samples and iostat's verdict. A Lightning
logger works the same way: `fastload.ScalarLogger(loader, trainer.logger)` in
`on_train_epoch_end`, with `scalars.log(trainer.current_epoch)`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

import fastload
from fastload import FastLoader
from fastload import transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="an ImageNet-layout folder (default: the demo dataset)")
    parser.add_argument("--logdir", type=Path, default=Path("runs/fastload"))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.data is None:
        from fastload._demo import default_demo_dir, make_demo_dataset

        args.data = make_demo_dataset(default_demo_dir(), images=256)
    loader = FastLoader(
        args.data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, device="cpu",
        transform=[T.RandomResizedCrop(64), T.RandomHorizontalFlip()], normalize=(MEAN, STD),
    )
    model = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 8 * 8, len(loader.classes)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with loader, SummaryWriter(args.logdir) as writer:
        scalars = fastload.ScalarLogger(loader, writer)
        for epoch in range(args.epochs):
            total, count = 0.0, 0
            for images, labels in loader:
                loss = nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total, count = total + loss.item() * len(labels), count + len(labels)
            writer.add_scalar("train/loss", total / count, epoch)
            figures = scalars.log(epoch)
            print(
                f"epoch {epoch}: loss {total / count:.3f}, {figures['fastload/img_per_s']:.0f} img/s, "
                f"trainer waited {100 * figures['fastload/trainer_wait_share']:.0f}%",
                flush=True,
            )


if __name__ == "__main__":
    main()
