"""Benchmark system: FastLoader's worker-to-trainer transport alone, on the same dataset as
transport_dataloader.py (one fixed 3x224x224 uint8 tensor and an int label per sample), with
the same DataLoader arguments. Needs no --data; prints the bench_common JSON line with "bytes".
"""

from __future__ import annotations

import time

from bench_common import batches_of, measure, parse_args
from transport_dataloader import FixedImages

from fastload import FastLoader


def main() -> None:
    options = parse_args(__doc__.splitlines()[0], needs_data=False)
    start = time.monotonic()
    loader = FastLoader(
        FixedImages(), batch_size=options.batch_size, shuffle=False, drop_last=True,
        num_workers=options.workers, pin_memory=False, persistent_workers=options.workers > 0,
    )
    with loader:
        measure(
            start,
            batches_of(loader, options),
            lambda batch: len(batch[1]),
            lambda batch: batch[0].nbytes + batch[1].nbytes,
        )


if __name__ == "__main__":
    main()
