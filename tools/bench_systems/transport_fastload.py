"""Benchmark system: transport only — a Dataset returning one fixed 3x224x224 uint8 tensor.

FastLoader with the DataLoader arguments (batch 256, W workers). Prints one JSON line:
{"images", "bytes", "steady_seconds", "ttfb_seconds"}.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fastload import FastLoader


class FixedTensor(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int) -> None:
        self.n = n
        self.image = torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.image, i


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()

    start = time.perf_counter()
    loader = FastLoader(FixedTensor(args.batches * args.batch_size), batch_size=args.batch_size,
                        num_workers=args.workers)
    images = nbytes = 0
    first = ttfb = 0.0
    with loader:
        for k, (x, _y) in enumerate(loader):
            if k == 0:
                first = time.perf_counter()
                ttfb = first - start
                continue
            images += x.shape[0]
            nbytes += x.numel() * x.element_size()
    steady = time.perf_counter() - first
    print(json.dumps({"images": images, "bytes": nbytes, "steady_seconds": steady, "ttfb_seconds": ttfb}))


if __name__ == "__main__":
    main()
