"""The extension points, together: a source kind (`ListedFolder`, tests/test_extension_source.py)
and a transform with its kernel (`PermuteChannels`, tests/test_extension_transform.py), each
defined in a test file alone — no file of the package edited — load together in one chain locally,
with 2 workers, and through a daemon that imports both files as plugins
(`fastload serve --plugin A.py --plugin B.py`): the same batches every way, and the channels those
of the plain chain, reordered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_extension_source as source_file
import test_extension_transform as transform_file
import torch
from daemon_helpers import DaemonPool, assert_same_batches, take
from test_extension_source import ListedFolder
from test_extension_transform import PermuteChannels

from fastload import FastLoader
from fastload import transforms as T

listed = source_file.listed  # the module fixture: (an image folder, a listing of it), one directory

GEOMETRY: list[T.Transform] = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
CHAIN: list[T.Transform] = [*GEOMETRY, PermuteChannels((2, 0, 1))]


@pytest.fixture(scope="module")
def both_plugins_daemon(listed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A daemon confined to the listing's directory, importing both test files as plugins."""
    pool = DaemonPool(tmp_path_factory.mktemp("daemon"))
    plugins = [str(Path(source_file.__file__).resolve()), str(Path(transform_file.__file__).resolve())]
    try:
        yield pool.start(
            workers=2,
            extra=["--plugin", plugins[0], "--plugin", plugins[1], "--root", str(listed[1].parent)],
        )
    finally:
        problems = pool.close()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _epoch(source: Any, chain: list[T.Transform], workers: int, **kwargs: Any) -> list[list[Any]]:
    options = {"batch_size": 5, "shuffle": True, "seed": 5, "device": "cpu", **kwargs}
    with FastLoader(source, transform=chain, num_workers=workers, **options) as loader:
        return take(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_new_kind_and_a_new_transform_load_together(listed: tuple[Path, Path], workers: int) -> None:
    folder, listing = listed
    plain = _epoch(str(folder), GEOMETRY, 0)  # fastload's own kind and transforms only
    loaded = _epoch(ListedFolder(str(listing)), CHAIN, workers)
    assert len(loaded) == len(plain) > 1
    for (images, labels), (expected, expected_labels) in zip(loaded, plain, strict=True):
        assert torch.equal(labels, expected_labels)
        assert torch.equal(images, expected[:, [2, 0, 1]])


def test_a_daemon_with_both_files_as_plugins_serves_them(
    listed: tuple[Path, Path], both_plugins_daemon: Any
) -> None:
    listing = listed[1]
    local = _epoch(ListedFolder(str(listing)), CHAIN, 0)
    served = _epoch(ListedFolder(str(listing)), CHAIN, 1, daemon=both_plugins_daemon.address)
    assert_same_batches(served, local)
