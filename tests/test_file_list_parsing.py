"""How a file list's lines are read: headers skipped when clearly column names, delimiters given
or sniffed, and errors that show what was parsed and name the option to set, as the Python API
(`root=`, `delimiter=`, `header=`) and `fastload pack` (`--root`, ...) spell it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastload import ConfigError, DatasetError
from fastload.__main__ import main
from fastload.sources import FileList
from fastload.sources._formats.folder import scan_image_folder


def _files(folder: Path) -> list[tuple[str, int]]:
    """(path relative to folder, class index) of every image, in ImageFolder's order."""
    index = scan_image_folder(folder)
    return [(os.path.relpath(index.path(i), folder), int(index.labels[i])) for i in range(len(index))]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("header", ["img_path,class_id", "picture,class_id", "Image File,Label"])
def test_a_header_over_integer_labels_is_skipped(image_folder: Path, header: str) -> None:
    files = _files(image_folder)
    listing = _write(image_folder.parent / "with_header.csv", [header] + [f"{p},{y}" for p, y in files])
    index = FileList(str(listing), root=str(image_folder)).open()
    assert len(index) == len(files)
    assert index.labels.tolist() == [y for _, y in files]


def test_header_true_and_false_override_the_guess(image_folder: Path, tmp_path: Path) -> None:
    # Class-name labels under a header that is not a known column name: not skipped on a guess,
    # but the error says the next line's image exists and to pass header=True.
    files = _files(image_folder)[:4]
    listing = _write(tmp_path / "l.csv", ["picture,species"] + [f"{p},c{y}" for p, y in files])
    with pytest.raises(DatasetError) as caught:
        FileList(str(listing), root=str(image_folder)).open()
    message = str(caught.value)
    assert "path='picture', label='species'" in message and "header=True" in message
    assert "--header" in message
    assert len(FileList(str(listing), root=str(image_folder), header=True).open()) == 4
    # header=False keeps a first line that would be skipped as a header (and so fails on it).
    named = _write(tmp_path / "n.csv", ["img_path,class_id"] + [f"{p},{y}" for p, y in files])
    assert len(FileList(str(named), root=str(image_folder)).open()) == 4
    with pytest.raises(DatasetError, match="path='img_path'"):
        FileList(str(named), root=str(image_folder), header=False).open()


@pytest.mark.parametrize(("sep", "name"), [("\t", "tabs"), ("  ", "whitespace"), (";", "';'")])
def test_a_csv_split_otherwise_is_sniffed(image_folder: Path, sep: str, name: str) -> None:
    files = _files(image_folder)[:5]
    listing = _write(image_folder.parent / "odd.csv", [f"{p}{sep}{y}" for p, y in files])
    index = FileList(str(listing), root=str(image_folder)).open()
    assert len(index) == 5 and index.labels.tolist() == [y for _, y in files]
    # Sniffed or not, an error over such a list says how it was split.
    with pytest.raises(DatasetError, match=f"split at {name} \\(sniffed"):
        FileList(str(listing), root=str(image_folder.parent)).open()


def test_an_unsplit_line_says_what_was_parsed_and_names_delimiter(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)[:3]
    listing = _write(tmp_path / "pipes.csv", [f"{image_folder / p}|{y}" for p, y in files])
    with pytest.raises(DatasetError) as caught:
        FileList(str(listing)).open()
    message = str(caught.value)
    assert "label=none" in message and "split at ','" in message
    assert "delimiter=" in message and "--delimiter" in message
    assert len(FileList(str(listing), delimiter="|").open()) == 3


def test_a_wrong_root_names_root_for_both_the_api_and_the_cli(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)[:3]
    listing = _write(tmp_path / "l.csv", [f"{p},{y}" for p, y in files])
    with pytest.raises(DatasetError) as caught:
        FileList(str(listing)).open()
    message = str(caught.value)
    assert f"path={files[0][0]!r}, label='{files[0][1]}'" in message
    assert "pass root=" in message and "--root" in message and "delimiter=" in message


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="delimiter must be one character"):
        FileList("l.csv", delimiter=",,")
    with pytest.raises(ConfigError, match="header must be"):
        FileList("l.csv", header="yes")  # type: ignore[arg-type]


def test_pack_takes_a_lists_root_delimiter_and_header(
    image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _files(image_folder)[:6]
    listing = _write(tmp_path / "train.txt", ["picture|species"] + [f"{p}|c{y}" for p, y in files])
    dst = tmp_path / "pack"
    assert main(["pack", str(listing), str(dst), "--quiet", "--delimiter", "|", "--header"]) == 1
    error = capsys.readouterr().err
    assert "--root" in error and "does not exist" in error
    argv = ["pack", str(listing), str(dst), "--quiet", "--root", str(image_folder), "--delimiter", "|"]
    assert main([*argv, "--header"]) == 0
    assert (dst / "manifest.json").exists()
    assert main(["pack", str(image_folder), str(tmp_path / "p2"), "--quiet", "--root", "x"]) == 1
    assert "apply to a file list" in capsys.readouterr().err
