"""A source kind declared outside the package is a source like the others: `ListedFolder`, defined
here and nowhere else, loads locally, with 2 workers, and through a daemon that imports this file
as a plugin (`fastload serve --plugin tests/test_extension_source.py`), giving the batches of the
same images read as an ImageFolder; the daemon's allowlist checks the files it names.

This file is the daemon's plugin too: what it imports at the top must import in a daemon (no
`helpers` or `daemon_helpers`, which only pytest's path finds; those are imported in the tests).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from fastload import FastLoader
from fastload import transforms as T
from fastload._errors import DaemonError
from fastload.sources import ImageFolder, Naming, Source, as_source
from fastload.sources._indexes.sample_index import PathIndex

PLUGIN = str(Path(__file__).resolve())
TF = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]


@dataclass(frozen=True)
class ListedFolder(Source, kind="listed_folder", named_by=Naming((".lines",)), served_by_daemon=True):
    """A listing of an image folder: a text file of `DIR/CLASS/FILE` lines, relative to the
    listing's own directory (`#` starts a comment); labels index the sorted class names, as an
    ImageFolder's do."""

    path_fields: ClassVar[tuple[str, ...]] = ("path",)
    path: str

    @property
    def where(self) -> str:
        return os.path.abspath(self.path)

    def open(self) -> PathIndex:
        base = os.path.dirname(self.where)
        with open(self.where, encoding="utf-8") as f:
            entries = [line.strip() for line in f if line.strip() and not line.startswith("#")]
        classes = sorted({os.path.basename(os.path.dirname(e)) for e in entries})
        labels = np.array([classes.index(os.path.basename(os.path.dirname(e))) for e in entries], np.int64)
        paths = [os.path.join(base, e).encode("utf-8", "surrogateescape") for e in entries]
        return PathIndex.from_paths(self.where, classes, paths, labels)


@pytest.fixture(scope="module")
def listed(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(an image folder, a listing of it in its scan order), both under one directory."""
    root = tmp_path_factory.mktemp("listed")
    folder = root / "images"
    shutil.copytree(image_folder, folder)
    index = ImageFolder(str(folder)).open()
    listing = root / "train.lines"
    lines = [os.path.relpath(index.path(i), root) for i in range(len(index))]
    listing.write_text("# the image folder, listed\n" + "".join(f"{line}\n" for line in lines))
    return folder, listing


@pytest.fixture(scope="module")
def plugin_daemon(listed: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A daemon confined to the listing's directory, with this file as its plugin."""
    from daemon_helpers import DaemonPool

    pool = DaemonPool(tmp_path_factory.mktemp("daemon"))
    try:
        yield pool.start(workers=2, extra=["--plugin", PLUGIN, "--root", str(listed[1].parent)])
    finally:
        problems = pool.close()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _epoch(source: Source | str, workers: int, **kwargs: Any) -> list[list[Any]]:
    from daemon_helpers import take

    options = {"batch_size": 5, "shuffle": True, "seed": 5, "transform": TF, "device": "cpu", **kwargs}
    with FastLoader(source, num_workers=workers, **options) as loader:
        return take(loader)


def test_a_plain_path_with_its_suffix_means_the_new_kind(listed: tuple[Path, Path]) -> None:
    assert as_source(listed[1]) == ListedFolder(str(listed[1]))


@pytest.mark.parametrize("workers", [0, 2])
def test_it_loads_the_batches_of_the_same_images_as_a_folder(listed: tuple[Path, Path], workers: int) -> None:
    from daemon_helpers import assert_same_batches

    folder, listing = listed
    assert_same_batches(_epoch(ListedFolder(str(listing)), workers), _epoch(str(folder), 0))


def test_a_daemon_with_it_as_a_plugin_serves_it(listed: tuple[Path, Path], plugin_daemon: Any) -> None:
    from daemon_helpers import assert_same_batches

    folder, listing = listed
    served = _epoch(ListedFolder(str(listing)), 1, daemon=plugin_daemon.address)
    assert_same_batches(served, _epoch(str(folder), 0))


def test_the_daemons_allowlist_checks_the_files_it_names(
    listed: tuple[Path, Path], plugin_daemon: Any, tmp_path: Path
) -> None:
    """A listing outside the roots is refused (its own file, `files_before_open`); one inside
    naming images outside is refused by the image (the opened index's files)."""
    outside = tmp_path / "outside.lines"
    shutil.copy(listed[1], outside)
    with pytest.raises(DaemonError, match="its path is outside the daemon's dataset roots"):
        _epoch(ListedFolder(str(outside)), 1, daemon=plugin_daemon.address)
    images = tmp_path / "images"
    shutil.copytree(listed[0], images)
    escaping = listed[1].parent / "escaping.lines"
    outside_images = sorted(images.rglob("*.*"))
    escaping.write_text("".join(f"{os.path.relpath(p, escaping.parent)}\n" for p in outside_images))
    with pytest.raises(DaemonError, match="sample 0's file is outside the daemon's dataset roots"):
        _epoch(ListedFolder(str(escaping)), 1, daemon=plugin_daemon.address)


def test_a_peer_cannot_name_a_plugin(plugin_daemon: Any) -> None:
    from daemon_helpers import RawClient, hello_fields

    from fastload._loading.link import daemon_link as wire

    with RawClient(plugin_daemon.address) as client:
        client.send(wire.encode("hello", **hello_fields(Path("/x")), plugins=[PLUGIN]))
        reply = client.reply()
    assert reply is not None and reply[0] == "error" and "unexpected field 'plugins'" in reply[1]["message"]


def test_a_plugin_that_fails_to_import_stops_serve_naming_it(tmp_path: Path) -> None:
    from daemon_helpers import refused_serve, serve_command

    broken = tmp_path / "broken_kinds.py"
    broken.write_text("raise RuntimeError('no such dataset service')\n")
    code, err = refused_serve(serve_command(tmp_path / "sock", extra=["--plugin", str(broken)]))
    assert code == 1, err
    assert f"plugin {broken} failed to import (RuntimeError: no such dataset service)" in err
    assert "leave it out of `--plugin`" in err
    code, err = refused_serve(serve_command(tmp_path / "sock", extra=["--plugin", "no_such_module_here"]))
    assert code == 1 and "plugin no_such_module_here failed to import (ModuleNotFoundError" in err, err


def test_the_daemon_table_names_plugins_and_the_flag_replaces_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastload._daemon.control import load_config
    from fastload._errors import ConfigError

    monkeypatch.chdir(tmp_path)
    table = tmp_path / "daemon.toml"
    table.write_text('[daemon]\nplugins = ["kinds.py", "mylab.kinds"]\n')
    assert load_config(str(table), {})[0].plugins == (str(tmp_path / "kinds.py"), "mylab.kinds")
    assert load_config(str(table), {"plugins": [PLUGIN]})[0].plugins == (PLUGIN,)
    for bad, says in (('"kinds.py"', "plugins must be a list"), ('["my lab"]', "neither a module name")):
        table.write_text(f"[daemon]\nplugins = {bad}\n")
        with pytest.raises(ConfigError, match=says):
            load_config(str(table), {})
