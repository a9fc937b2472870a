"""Settings that run but would train wrong are said at construction: MixUp/CutMix num_classes
against the source's classes, drop_last with a batch larger than a rank's samples, and more
workers than CPU cores."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from fastload import ConfigError, FastLoader, SettingsWarning
from fastload import transforms as T
from fastload.sources import FileList

RESIZE = T.Resize((16, 16))
NORMALIZE = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))


def _make(dataset: object, **kw: object) -> FastLoader:
    options: dict[str, object] = {"batch_size": 4, "num_workers": 0, "device": "cpu", "transform": [RESIZE]}
    options.update(kw)
    return FastLoader(dataset, **options)  # type: ignore[arg-type]


def test_mixing_fewer_classes_than_labels_is_refused(image_folder: Path) -> None:
    # image_folder has 3 classes: one-hot targets over 2 would index out of range.
    for mix in (T.MixUp(num_classes=2), T.RandomChoice([T.MixUp(num_classes=2), T.CutMix(num_classes=2)])):
        with pytest.raises(ConfigError, match=r"num_classes=2\).*3 classes.*label 2.*num_classes=3"):
            _make(image_folder, transform=[RESIZE, mix], normalize=NORMALIZE)


def test_mixing_more_classes_than_the_source_has_warns(image_folder: Path) -> None:
    with pytest.warns(SettingsWarning, match=r"MixUp\(num_classes=10\).*3 classes.*7 columns"):
        _make(image_folder, transform=[RESIZE, T.MixUp(num_classes=10)], normalize=NORMALIZE).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _make(image_folder, transform=[RESIZE, T.CutMix(num_classes=3)], normalize=NORMALIZE).close()


def test_integer_labels_count_by_the_largest(image_folder: Path, tmp_path: Path) -> None:
    images = sorted(str(p) for p in image_folder.rglob("*.jpg"))[:6]
    listing = tmp_path / "l.csv"
    listing.write_text("".join(f"{p},{i % 4}\n" for i, p in enumerate(images)))
    with pytest.raises(ConfigError, match=r"integer labels up to 3.*num_classes=4"):
        _make(FileList(str(listing)), transform=[RESIZE, T.MixUp(num_classes=3)], normalize=NORMALIZE)


def test_drop_last_with_a_batch_larger_than_the_data_is_said(image_folder: Path) -> None:
    """A warning, not an error: DataLoader gives an empty epoch there, and a drop-in must too."""
    said = r"batch_size=32 with drop_last=True gives no batches.*24 samples"
    with pytest.warns(SettingsWarning, match=said), _make(image_folder, batch_size=32, drop_last=True) as dry:
        assert list(dry) == []
    with pytest.warns(SettingsWarning, match=r"rank 1 of 2 gets 12.*batch_size <= 12"):
        _make(image_folder, batch_size=16, drop_last=True, rank=1, world_size=2, seed=0).close()
    with _make(image_folder, batch_size=32, drop_last=False) as loader:
        assert len(loader) == 1
    with _make(image_folder, batch_size=12, drop_last=True, rank=1, world_size=2, seed=0) as loader:
        assert len(loader) == 1


def test_more_workers_than_cores_warns_with_the_numbers(image_folder: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    expected = f"num_workers={cores + 1}, but this process may use {cores} CPU"
    with pytest.warns(SettingsWarning, match=expected):
        _make(image_folder, num_workers=cores + 1).close()
