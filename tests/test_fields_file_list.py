"""A file list's columns as declared fields (`FileList(path, fields=...)`, issue 31 item 1).

Protects: the cells of a CSV's columns come with their images (captions with commas and quotes,
JSON values, labels), in dict batches equal to a plain list's images and labels, for 0 and 2
workers and through a daemon (the cells in the index's shared segment); a line with another
number of columns is a DatasetError naming it; a list at a URL is refused when made.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from daemon_helpers import DaemonPool
from fields_helpers import assert_same_batches, caption, epoch, meta

from fastload import ConfigError, DatasetError, sources
from fastload.sources import ImageFolder

FIELDS = {"image": "jpg", "text": "txt", "meta": "json", "label": "cls"}


def write_lists(folder: Path, directory: Path) -> tuple[Path, Path]:
    """The folder as a list with caption, JSON and label columns, and as a plain path,label list."""
    index = ImageFolder(str(folder)).open()
    directory.mkdir(parents=True, exist_ok=True)
    rich, plain = directory / "pairs.csv", directory / "plain.csv"
    with open(rich, "w", newline="") as f, open(plain, "w", newline="") as g:
        writer, plain_writer = csv.writer(f), csv.writer(g)
        writer.writerow(["path", "caption", "meta", "label"])
        for i in range(len(index)):
            label = int(index.labels[i])
            text = f'{caption(i)}, "quoted"'
            writer.writerow([index.path(i), text, json.dumps(meta(i)), label])
            plain_writer.writerow([index.path(i), label])
    return rich, plain


def test_columns_come_with_their_images(image_folder: Path, tmp_path: Path) -> None:
    rich, plain = write_lists(image_folder, tmp_path)
    source = sources.FileList(str(rich), fields=FIELDS)
    got = epoch(source, 0, sample_ids=True)
    want = epoch(sources.FileList(str(plain)), 0)
    assert len(got) == len(want) == 5
    for batch, (images, labels) in zip(got, want, strict=True):
        indices = batch.pop("sample_ids").indices.tolist()
        assert list(batch) == list(FIELDS)
        assert torch.equal(batch["image"], images) and torch.equal(batch["label"], labels)
        assert batch["text"] == [f'{caption(i)}, "quoted"' for i in indices]
        assert batch["meta"] == [meta(i) for i in indices]
    assert_same_batches(epoch(source, 0), epoch(source, 2))


def test_a_line_of_other_columns_is_named(image_folder: Path, tmp_path: Path) -> None:
    rich, _ = write_lists(image_folder, tmp_path)
    lines = rich.read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 1)[0]  # its label left out
    rich.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"line 5: 3 columns, expected 4"):
        sources.FileList(str(rich), fields=FIELDS).open()
    with pytest.raises(ConfigError, match="local file list"):
        sources.FileList("s3://bucket/pairs.csv", fields=FIELDS)
    with pytest.raises(ConfigError, match="image field first"):
        sources.FileList(str(rich), fields={"text": "txt", "image": "jpg"}).open()


def test_a_daemon_serves_a_lists_columns(image_folder: Path, tmp_path: Path, daemon_pool: DaemonPool) -> None:
    rich, _ = write_lists(image_folder, tmp_path)
    source = sources.FileList(str(rich), fields=FIELDS)
    daemon = daemon_pool.start(workers=2, extra=["--root", str(tmp_path), "--root", str(image_folder)])
    assert_same_batches(epoch(source, 0), epoch(source, 1, daemon=daemon.address))
