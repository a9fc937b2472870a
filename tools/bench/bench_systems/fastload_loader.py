"""Benchmark system: FastLoader over the image folder, RandomResizedCrop(224) + flip, uint8 out.

Run with .venv/bin/python (from the repo root); prints the bench_common JSON line. fastload's own
options, taken out before the common parser runs: `--backend NAME` (native, pil, dali: DALI's
CPU operators in fastload's workers, needs `pip install fastload[dali]`); `--val` for the
validation transform Resize(256) + CenterCrop(224), in order (shuffle off); `--daemon ADDRESS`
to attach to a running `fastload serve` instead of starting workers; `--seed N`.
"""

from __future__ import annotations

import sys
import time

from bench_common import batches_of, measure, parse_args

from fastload import FastLoader
from fastload import transforms as T


def _take(flag: str, default: str | None) -> str | None:
    """Remove `flag VALUE` from sys.argv and return VALUE (or `default`)."""
    if flag not in sys.argv:
        return default
    at = sys.argv.index(flag)
    value = sys.argv[at + 1]
    del sys.argv[at : at + 2]
    return value


def main() -> None:
    backend = _take("--backend", "native") or "native"
    daemon = _take("--daemon", None)
    seed = int(_take("--seed", "0") or 0)
    val = "--val" in sys.argv
    if val:
        sys.argv.remove("--val")
    transform = (
        [T.Resize(256), T.CenterCrop(224)] if val else [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    )
    options = parse_args(__doc__.splitlines()[0])
    start = time.monotonic()
    loader = FastLoader(
        options.data, batch_size=options.batch_size, shuffle=not val, drop_last=True, seed=seed,
        num_workers=options.workers, device="cpu", backend=backend, transform=transform, daemon=daemon,
    )
    with loader:
        measure(start, batches_of(loader, options), lambda batch: len(batch[1]))


if __name__ == "__main__":
    main()
