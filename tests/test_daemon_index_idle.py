"""A daemon keeps an idle index for `index_idle` (60 s by default): a trainer that asks for
another dataset meanwhile does not evict it; only when the memory budget is wanted are idle
indexes evicted, the longest idle first."""

from __future__ import annotations

import itertools
import os
import re
import shutil
from pathlib import Path
from typing import Any

from daemon_helpers import DaemonPool, DaemonProcess

from fastload import FastLoader
from fastload import transforms as T


def _epoch(daemon: DaemonProcess, folder: Path, size: int, batches: int | None = None, **kw: Any) -> None:
    """A session over `folder`: a whole epoch, or its first `batches` batches."""
    options: dict[str, Any] = {"batch_size": 4, "num_workers": 1, "device": "cpu"}
    options.update(kw)
    with FastLoader(folder, daemon=daemon.address, transform=[T.Resize((size, size))], **options) as loader:
        want = len(loader) if batches is None else batches
        assert sum(1 for _ in itertools.islice(loader, want)) == want


def _ready(daemon: DaemonProcess) -> dict[str, int]:
    """Path -> bytes of each index the daemon holds."""
    return {row["path"]: row["bytes"] for row in daemon.status()["datasets"] if row["state"] == "ready"}


def _big_folder(image_folder: Path, root: Path, links: int) -> Path:
    """`image_folder`'s first image linked `links` times into one class: a large index, small on disk."""
    image = next(p for p in sorted(image_folder.rglob("*.jpg")))
    (root / "c").mkdir(parents=True)
    for i in range(links):
        os.link(image, root / "c" / f"{'x' * 60}{i:06d}.jpg")
    return root


def test_an_idle_index_outlives_the_next_datasets_hello(
    daemon_pool: DaemonPool, image_folder: Path, tmp_path: Path
) -> None:
    daemon = daemon_pool.start(workers=1, budget="64MiB")
    other = tmp_path / "b"
    shutil.copytree(image_folder, other)
    _epoch(daemon, image_folder, 16)
    _epoch(daemon, other, 16)
    held = _ready(daemon)
    assert str(image_folder.resolve()) in held and str(other.resolve()) in held, held
    assert "evicted" not in daemon.log()


def test_an_idle_index_is_evicted_when_its_memory_is_wanted(
    daemon_pool: DaemonPool, image_folder: Path, tmp_path: Path
) -> None:
    # A's index (~1 MiB of paths) and B's ring (about 1.3 MiB) do not both fit a 2 MiB budget;
    # A's own session (a tiny ring) fits beside it, and B's index and ring fit alone.
    big = _big_folder(image_folder, tmp_path / "a", 10_000)
    daemon = daemon_pool.start(workers=1, budget="2MiB")
    _epoch(daemon, big, 8, batches=8, batch_size=1, prefetch=1)  # the index is the point, not its epoch
    size_a = _ready(daemon)[str(big.resolve())]
    assert size_a > 2**20 * 0.8, size_a
    _epoch(daemon, image_folder, 128, batch_size=6, prefetch=2)
    held = _ready(daemon)
    assert str(big.resolve()) not in held and str(image_folder.resolve()) in held, held
    assert re.search(r"\d [KM]iB of the memory budget were wanted", daemon.log()), daemon.log()
