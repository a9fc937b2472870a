"""Indexing a folder: directory loops skipped, and a scan that can be bounded and cancelled.

Protects the daemon (which scans on a background thread) from a folder that never ends: a link
back to a directory the walk is inside used to multiply entries (os.walk follows it until the path
is too long), and a huge tree (/usr) used to grow without bound and could not be stopped. Loop-free
trees must still index exactly as torchvision's ImageFolder does (os.walk following links).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fastload import DatasetError
from fastload.sources._formats.folder import IMG_EXTENSIONS, scan_image_folder
from fastload.sources._indexes.sample_index import PathIndex


def os_walk_reference(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """torchvision's ImageFolder rules, the old way: sorted(os.walk(followlinks=True))."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    samples = []
    for label, name in enumerate(classes):
        for dirpath, _, filenames in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for filename in sorted(filenames):
                if filename.lower().endswith(IMG_EXTENSIONS):
                    samples.append((os.path.join(dirpath, filename), label))
    return classes, samples


def entries(index: PathIndex) -> list[tuple[str, int]]:
    return [(index.path(i), int(index.labels[i])) for i in range(len(index))]


def touch(root: Path, *names: str) -> None:
    """Tiny files: the scan only looks at names."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")


def loop_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "fastload" and r.levelno == logging.WARNING and "directory loop" in r.getMessage()
    ]


# Directory loops


def test_directory_loops_are_skipped_and_reported(
    make_folder: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    root = make_folder(classes=2, per_class=3)
    touch(root, "n01/sub/a.jpg", "n01/sub/deep/b.png", "n01/sub/deep/notes.txt")
    classes, expected = os_walk_reference(root)  # before any loop: os.walk still terminates
    real_files = len(expected)
    assert real_files == 8
    links = {
        "dirloop": root / "n00" / "dirloop",  # -> ".": the class folder itself
        "up": root / "n01" / "sub" / "deep" / "up",  # -> "../..": the class folder, two levels up
        "top": root / "n01" / "sub" / "top",  # -> the dataset root, above the class folder
    }
    os.symlink(".", links["dirloop"])
    os.symlink("../..", links["up"])
    os.symlink(root, links["top"])
    with caplog.at_level(logging.WARNING, logger="fastload"):
        index = scan_image_folder(root)
    got = entries(index)
    assert list(index.classes) == classes
    assert got == expected  # the real files, each once, in torchvision's order and labels
    assert len({os.path.realpath(path) for path, _ in got}) == len(got) == real_files
    warnings = loop_warnings(caplog)
    assert len(warnings) == len(links), warnings
    for link in links.values():
        assert sum(str(link) in message for message in warnings) == 1, (link, warnings)
    assert all("skipped" in message for message in warnings)


def test_a_loop_reached_twice_is_reported_once(
    make_folder: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    root = make_folder(classes=2, per_class=2)
    os.symlink("../n01", root / "n00" / "alias")  # a sibling: not a loop, walked (as torchvision)
    touch(root, "n01/sub/c.jpg")
    _, expected = os_walk_reference(root)
    assert any("/alias/sub/c.jpg" in path for path, _ in expected)
    os.symlink("..", root / "n01" / "sub" / "back")  # a loop, inside n01 and inside n00/alias
    with caplog.at_level(logging.WARNING, logger="fastload"):
        got = entries(scan_image_folder(root))
    assert got == expected
    warnings = loop_warnings(caplog)
    assert len(warnings) == 1, warnings  # one link, one warning, however many paths reach it
    assert "/sub/back" in warnings[0]


def test_links_to_non_ancestors_are_followed_as_torchvision_does(
    make_folder: Callable[..., Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = make_folder(classes=3, per_class=2)
    outside = tmp_path / "outside"
    touch(outside, "x.jpg", "inner/y.PNG", "skip.txt")
    os.symlink("../n01", root / "n00" / "sib")  # relative link to a sibling class
    (root / "n01" / "nested").mkdir()
    os.symlink(root / "n02", root / "n01" / "nested" / "cousin")  # absolute link to another class
    os.symlink(outside, root / "n02" / "ext")  # a folder outside the dataset
    os.symlink(outside, root / "n02" / "ext2")  # the same folder twice: both walked
    # Path-string order, which is not a depth-first order: '-' and '.' sort before '/'.
    touch(root, "n02/b/1.jpg", "n02/b-x/2.jpg", "n02/b/c/3.jpg", "n02/b.d/4.jpg")
    classes, expected = os_walk_reference(root)
    with caplog.at_level(logging.WARNING, logger="fastload"):
        index = scan_image_folder(root)
    assert list(index.classes) == classes
    assert entries(index) == expected
    names = [os.path.relpath(path, root) for path, _ in expected]
    assert "n00/sib/nested/cousin/ext/inner/y.PNG" in names and "n02/ext2/x.jpg" in names
    assert names.index("n02/b-x/2.jpg") < names.index("n02/b/c/3.jpg")
    assert loop_warnings(caplog) == []


def test_unreadable_subfolder_is_ignored(
    make_folder: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_folder(classes=2, per_class=2)
    touch(root, "n00/locked/a.jpg", "n00/open/b.jpg")
    locked = os.path.join(root, "n00", "locked")
    real_scandir = os.scandir

    def scandir(path: str) -> Iterator[os.DirEntry[str]]:  # as if chmod 000 (we may be root)
        if os.fspath(path) == locked:
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    _, expected = os_walk_reference(root)  # os.walk looks scandir up in os too
    got = entries(scan_image_folder(root))
    assert got == expected
    assert any(path.endswith("open/b.jpg") for path, _ in got)
    assert not any("locked" in path for path, _ in got)


# Bounds


def test_max_files(make_folder: Callable[..., Path]) -> None:
    root = make_folder(classes=3, per_class=4)
    assert len(scan_image_folder(root, max_files=12)) == 12
    with pytest.raises(DatasetError, match="max_files=11") as info:
        scan_image_folder(root, max_files=11)
    message = str(info.value)
    assert str(root) in message and "image files" in message and "directories" in message
    assert "not a parent such as /usr" in message and "index limits" in message


def test_max_files_also_bounds_empty_directories(tmp_path: Path) -> None:
    touch(tmp_path, "only/a.jpg")
    for i in range(30):
        (tmp_path / "only" / f"empty{i:02d}").mkdir()
    assert len(scan_image_folder(tmp_path, max_files=31)) == 1  # 31 directories, 1 file
    with pytest.raises(DatasetError, match="max_files=30: walked more than 30 directories"):
        scan_image_folder(tmp_path, max_files=30)


def test_max_bytes(make_folder: Callable[..., Path]) -> None:
    root = make_folder(classes=3, per_class=4)
    index = scan_image_folder(root)
    needed = int(index.path_blob.shape[0]) + 16 * len(index)  # paths + int64 offset and label each
    assert len(scan_image_folder(root, max_bytes=needed)) == 12
    with pytest.raises(DatasetError, match=f"max_bytes={needed - 1}") as info:
        scan_image_folder(root, max_bytes=needed - 1)
    assert "11 image files" in str(info.value) and "index limits" in str(info.value)


def test_passed_deadline(make_folder: Callable[..., Path]) -> None:
    root = make_folder(classes=2, per_class=2)
    with pytest.raises(DatasetError, match="time limit") as info:
        scan_image_folder(root, deadline=time.monotonic() - 1)
    assert str(root) in str(info.value) and "not a parent such as /usr" in str(info.value)


def test_set_cancel(make_folder: Callable[..., Path]) -> None:
    root = make_folder(classes=2, per_class=2)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(DatasetError, match=r"indexing .* was cancelled"):
        scan_image_folder(root, cancel=cancel)


def test_generous_limits_change_nothing(make_folder: Callable[..., Path], tmp_path: Path) -> None:
    root = make_folder(classes=3, per_class=4)
    os.symlink("../n01", root / "n00" / "sib")
    unbounded = scan_image_folder(root)
    bounded = scan_image_folder(
        root,
        max_files=10_000,
        max_bytes=2**30,
        deadline=time.monotonic() + 60,
        cancel=threading.Event(),
    )
    assert len(unbounded) == 16
    assert bounded.classes == unbounded.classes
    assert entries(bounded) == entries(unbounded) == os_walk_reference(root)[1]


@pytest.fixture
def endless_folder(tmp_path: Path) -> Path:
    """A loop-free tree with 2**40 paths: each level links twice to the next (no bound, no end)."""
    levels = tmp_path / "levels"
    for i in range(40):
        touch(levels, f"L{i:02d}/x.jpg")
    for i in range(39):
        for name in "ab":
            os.symlink(levels / f"L{i + 1:02d}", levels / f"L{i:02d}" / name)
    root = tmp_path / "data"
    (root / "c0").mkdir(parents=True)
    os.symlink(levels / "L00", root / "c0" / "in")
    return root


def test_cancel_stops_a_running_scan(endless_folder: Path) -> None:
    cancel = threading.Event()
    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(DatasetError, match="was cancelled after"):
            scan_image_folder(endless_folder, cancel=cancel)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 10


def test_deadline_stops_a_running_scan(endless_folder: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DatasetError, match="time limit") as info:
        scan_image_folder(endless_folder, deadline=started + 0.3)
    assert time.monotonic() - started < 10
    assert "directories" in str(info.value)


def test_max_files_stops_an_endless_scan(endless_folder: Path) -> None:
    with pytest.raises(DatasetError, match="max_files=5000"):
        scan_image_folder(endless_folder, max_files=5000)
