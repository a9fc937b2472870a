"""Benchmark system: the torch DataLoader's worker-to-main transport alone. A map-style dataset
returns one fixed 3x224x224 uint8 tensor and an int label; batches are made by the default
collate in the workers and shipped to the main process. Reports the bytes delivered so the
harness can give GB/s.

Run with any python that has torch (e.g. .venv/bin/python, from the repo root); prints the
bench_common JSON line with "bytes". Needs no --data. Workers persist across epochs.
"""

from __future__ import annotations

import time

import torch
from bench_common import batches_of, measure, parse_args
from torch.utils.data import DataLoader, Dataset

SAMPLES_PER_EPOCH = 50_000


class FixedImages(Dataset[tuple[torch.Tensor, int]]):
    """SAMPLES_PER_EPOCH copies of one random 3x224x224 uint8 image, labelled by index % 1000."""

    def __init__(self) -> None:
        self.image = torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8)

    def __len__(self) -> int:
        return SAMPLES_PER_EPOCH

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.image, index % 1000


def main() -> None:
    options = parse_args(__doc__.splitlines()[0], needs_data=False)
    start = time.monotonic()
    loader = DataLoader(
        FixedImages(),
        batch_size=options.batch_size,
        shuffle=False,
        drop_last=True,
        num_workers=options.workers,
        pin_memory=False,
        persistent_workers=options.workers > 0,
    )
    measure(
        start,
        batches_of(loader, options),
        lambda batch: len(batch[1]),
        lambda batch: batch[0].nbytes + batch[1].nbytes,
    )


if __name__ == "__main__":
    main()
