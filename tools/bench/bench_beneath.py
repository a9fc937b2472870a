"""What opening samples beneath the dataset roots costs a confined daemon's worker (issue 29).

Opens (and closes) every file of a small tree (`--dirs` x `--files` files of `--kb` KB, page
cached) again and again: with `os.open` (an unconfined daemon, a local loader), with
`Beneath.open` through openat2 (RESOLVE_BENEATH), and with its fallback (open, then
/proc/self/fd read back); then `read_file` of the same files, plain and beneath. The best of
`--repeats` passes, in microseconds per file.

    python tools/bench/bench_beneath.py [--dirs 10] [--files 100] [--kb 48] [--rounds 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

from fastload.sources._indexes.sample_index import read_file
from fastload.sources._storage.beneath import READ_FLAGS, Beneath


def best_us(paths: list[str], use: Callable[[str], object], rounds: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(rounds):
            for path in paths:
                use(path)
        best = min(best, (time.perf_counter() - started) / (rounds * len(paths)))
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dirs", type=int, default=10)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--kb", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        paths = []
        for d in range(args.dirs):
            os.mkdir(os.path.join(root, f"c{d}"))
            for f in range(args.files):
                path = os.path.join(root, f"c{d}", f"{f}.jpg")
                with open(path, "wb") as out:
                    out.write(os.urandom(args.kb << 10))
                paths.append(path)
        beneath, fallback = Beneath((root,)), Beneath((root,), use_openat2=False)
        rows = [
            ("os.open", lambda p: os.close(os.open(p, READ_FLAGS)), args.rounds),
            ("Beneath.open (openat2)", lambda p: os.close(beneath.open(p)), args.rounds),
            ("Beneath.open (fallback)", lambda p: os.close(fallback.open(p)), args.rounds),
            (f"read_file {args.kb} KB", read_file, 1),
            (f"read_file {args.kb} KB beneath", lambda p: read_file(p, None, beneath), 1),
        ]
        for label, use, rounds in rows:
            print(f"{label:32s} {best_us(paths, use, rounds, args.repeats):7.2f} us per file")
        beneath.close()
        fallback.close()


if __name__ == "__main__":
    main()
