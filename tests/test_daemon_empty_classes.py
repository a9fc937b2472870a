"""A folder with a class folder of no images, served by a daemon: refused as a local loader
refuses it (naming the folder), kept with `ImageFolder(..., allow_empty=True)`, and the two are
separate indexes in the daemon (one refused does not make the other so, nor the reverse)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from daemon_helpers import DaemonProcess

from fastload import FastLoader, FastloadError
from fastload import transforms as T
from fastload.sources import ImageFolder


def test_a_daemon_refuses_an_empty_class_unless_allowed(
    shared_daemon: DaemonProcess, image_folder: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "data"
    shutil.copytree(image_folder, folder)
    (folder / "zz_empty").mkdir()
    options = {"batch_size": 4, "num_workers": 1, "device": "cpu", "transform": [T.Resize((16, 16))]}
    with (
        pytest.raises(FastloadError, match=r"'zz_empty'.*allow_empty=True"),
        FastLoader(folder, daemon=shared_daemon.address, **options) as loader,  # type: ignore[arg-type]
    ):
        next(iter(loader))
    allowed = ImageFolder(str(folder), allow_empty=True)
    with FastLoader(allowed, daemon=shared_daemon.address, **options) as loader:  # type: ignore[arg-type]
        assert loader.classes[-1] == "zz_empty"
        labels = [int(y) for _, y in loader for y in y]
    assert len(labels) == 24 and len(loader.classes) - 1 not in labels
    # And the plain folder is still refused after the allowing one was indexed.
    with (
        pytest.raises(FastloadError, match="'zz_empty'"),
        FastLoader(folder, daemon=shared_daemon.address, **options) as loader,  # type: ignore[arg-type]
    ):
        next(iter(loader))
