"""`fastload verify PATH`: load every sample of a source once, in parallel, and list what is broken.

A dataset of millions of images is checked once, before a week of training, not one `SampleError`
at a time during it. Every sample is read and decoded whole (a resize to a thumbnail: libjpeg's
DCT scaling still entropy-decodes every block, so a damaged or cut file fails as it would in
training) by the loader's own workers, with `on_error="skip"`; the broken ones are written as an
exclusion list (`_exclusion`) that `FastLoader(exclude=...)` reads.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from fastload._errors import ConfigError, SampleError
from fastload._exclusion import write_list
from fastload._progress import ProgressLine

# Small batches: a broken sample makes its batch load again with a stand-in (NOTE [bad samples]).
VERIFY_BATCH = 16
_THUMBNAIL = 32


@dataclass(frozen=True)
class Verified:
    """What a verification found: samples loaded, the broken ones (name, why), and its time."""

    samples: int
    broken: list[tuple[str, str]]
    seconds: float


def verify(
    path: str | os.PathLike[str],
    *,
    workers: int | None = None,
    batch_size: int = VERIFY_BATCH,
    progress: Callable[[int, int, int, float], None] | None = None,
) -> Verified:
    """Load every sample of the source at `path` once; `progress(done, total, broken, seconds)`
    about once a second."""
    from fastload import transforms as T
    from fastload._loading.loader import FastLoader

    started = last = time.monotonic()
    failed: dict[str, str] = {}  # batches whose stand-ins were all broken too: named by their error
    done = 0
    with (
        warnings.catch_warnings(),
        FastLoader(
            path, batch_size=batch_size, shuffle=False, num_workers=workers, device="cpu",
            transform=[T.Resize((_THUMBNAIL, _THUMBNAIL))], on_error="skip", max_skipped=1.0,
        ) as loader,
    ):
        warnings.simplefilter("ignore")  # each broken sample is listed at the end, not warned of
        total = loader._assembly.num_samples
        iterator = iter(loader)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            except SampleError as e:  # a batch with no stand-in left: its sample is broken, go on
                failed[e.path or str(e.index)] = str(e.args[0])[:300]
                done += batch_size
                continue
            done += len(batch[-1])
            now = time.monotonic()
            if progress is not None and now - last >= 1.0:
                last = now
                progress(min(done, total), total, len(loader.skipped()) + len(failed), now - started)
        broken = dict(loader.skipped())
    broken.update(failed)
    seconds = time.monotonic() - started
    if progress is not None:
        progress(total, total, len(broken), seconds)
    return Verified(total, sorted(broken.items()), seconds)


def progress_line(stream: TextIO = sys.stderr) -> Callable[[int, int, int, float], None]:
    """A progress reporter: samples, rate, broken, time left (NOTE [progress lines])."""
    line = ProgressLine(stream)

    def report(done: int, total: int, broken: int, seconds: float) -> None:
        rate = done / max(seconds, 1e-9)
        left = (total - done) / rate if rate > 0 else 0.0
        said = (
            f"verified {done:,} / {total:,} samples ({rate:,.0f}/s), {broken:,} broken, "
            f"{left / 60:.1f} min left"
        )
        if done >= total:
            line.done(said)
        else:
            line.update(said)

    return report


def run(path: str, output: str | None, workers: int | None, quiet: bool) -> int:
    """The command: the list to `output` (or stdout), a summary on stderr; exit 1 if any is broken."""
    if output is not None:
        _check_writable(output)  # before the whole source is decoded, not after
    result = verify(path, workers=workers, progress=None if quiet else progress_line())
    found = f"{len(result.broken)} of {result.samples} samples broken"
    header = f"fastload verify {os.path.abspath(path)}: {found}"
    if output is None:
        for name, why in result.broken:
            print(f"{name}\t{why}")
    else:
        write_list(output, result.broken, header)
    listed = output and result.broken
    where = f"; the list is in {output} (FastLoader(..., exclude={output!r}))" if listed else ""
    print(f"{header}, {result.seconds:.1f} s{where}", file=sys.stderr)
    return 1 if result.broken else 0


def _check_writable(path: str) -> None:
    """ConfigError when a list cannot be written at `path` (its folder missing, not a folder, or
    not writable; `path` a folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"--output {path} is a directory: give a file's path for the list")
    if not os.path.isdir(folder):
        raise ConfigError(
            f"--output {path}: {folder} is not a directory: create it, or write the list elsewhere"
        )
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise ConfigError(
            f"--output {path}: cannot write there (permission denied): write the list elsewhere"
        )
