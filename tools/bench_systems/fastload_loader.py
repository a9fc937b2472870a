"""Benchmark system: FastLoader over the image folder, RandomResizedCrop(224) + flip, uint8 out.

Run with /work/main/.venv/bin/python; prints the bench_common JSON line. `--backend` picks the
decode backend (native, pil); `--val` the validation transform Resize(256) + CenterCrop(224), in
order (shuffle off).
"""

from __future__ import annotations

import sys
import time

from bench_common import batches_of, measure, parse_args

from fastload import FastLoader
from fastload import transforms as T


def main() -> None:
    backend = "native"
    if "--backend" in sys.argv:  # fastload's own option, removed before the common parser runs
        at = sys.argv.index("--backend")
        backend = sys.argv[at + 1]
        del sys.argv[at : at + 2]
    val = "--val" in sys.argv
    if val:
        sys.argv.remove("--val")
    transform = (
        [T.Resize(256), T.CenterCrop(224)] if val else [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    )
    options = parse_args(__doc__.splitlines()[0])
    start = time.monotonic()
    loader = FastLoader(
        options.data, batch_size=options.batch_size, shuffle=not val, drop_last=True, seed=0,
        num_workers=options.workers, device="cpu", backend=backend,
        transform=transform,
    )
    with loader:
        measure(start, batches_of(loader, options), lambda batch: len(batch[1]))


if __name__ == "__main__":
    main()
