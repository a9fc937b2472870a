"""Bounds and integrity of sources on hostile input (issue 20; NOTE [source bounds]): a sample is a
regular file of bounded size, declared sizes are checked before allocation, and every refusal is
a DatasetError/SampleError naming the file, in a message of bounded length."""

from __future__ import annotations

import io
import json
import os
import signal
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from helpers import write_image, write_tar_shards

from fastload import ConfigError, DatasetError, FastLoader, SampleError, sources
from fastload import transforms as T
from fastload.sources._indexes.sample_index import ReadBuffer, read_file
from fastload.sources._storage import bounds as _bounds

pytestmark = pytest.mark.hostile

AUGMENT = [T.RandomResizedCrop(16)]


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail (rather than hang the suite) when the block takes longer than `seconds`."""

    def expired(*_: object) -> None:
        raise TimeoutError(f"took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _list_with(tmp_path: Path, target: str) -> Path:
    write_image(tmp_path / "a.jpg", 8, 8, seed=0)
    listing = tmp_path / "list.csv"
    listing.write_text(f"a.jpg,0\n{target},1\n")
    return listing


# -- samples that are not bounded regular files --------------------------------------------------


def test_a_sample_that_is_a_device_is_a_sample_error_naming_it(tmp_path: Path) -> None:
    source = sources.FileList(str(_list_with(tmp_path, "/dev/zero")))
    loader = FastLoader(source, batch_size=2, num_workers=0, transform=AUGMENT)
    with deadline(60), loader, pytest.raises(SampleError, match="not a regular file") as info:
        next(iter(loader))
    assert info.value.path == "/dev/zero"


def test_a_folder_link_to_dev_zero_and_a_fifo_are_refused_promptly(tmp_path: Path) -> None:
    os.symlink("/dev/zero", tmp_path / "zero.jpg")
    os.mkfifo(tmp_path / "pipe.jpg")
    with deadline(10):
        for name in ("zero.jpg", "pipe.jpg"):
            for into in (ReadBuffer(), None):
                with pytest.raises(OSError, match="not a regular file"):
                    read_file(str(tmp_path / name), into)


def test_a_sample_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as f:
        f.truncate(_bounds.MAX_SAMPLE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(OSError, match="over the 1,073,741,824-byte limit"):
        read_file(str(huge), ReadBuffer())


# -- lists, patterns and declared sizes -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_file_list_that_is_not_a_regular_file_is_a_dataset_error(tmp_path: Path, kind: str) -> None:
    if kind == "device":
        path = "/dev/zero"
    else:
        path = str(tmp_path / "list.txt")
        os.mkfifo(path)
    with deadline(10), pytest.raises(DatasetError, match="not a regular file"):
        sources.FileList(path).open()


def test_brace_patterns_are_counted_before_they_are_expanded(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DatasetError, match="expands to over"):
        sources.TarShards(str(tmp_path / "{0..9999}{0..9999}{0..9}.tar")).open()
    with pytest.raises(DatasetError, match="expands to over"):
        sources.TarShards(str(tmp_path / "{0..999999999999999}.tar")).open()
    with pytest.raises(DatasetError, match="does not exist"):  # 19+ digits: not a range, a literal
        sources.TarShards(str(tmp_path / "{0..99999999999999999999999}.tar")).open()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (["0", str(1 << 63)], "not a class index"),
        (["0", "1_000"], "mixes integer and class-name"),
        (["0", "\u0663"], "mixes integer and class-name"),
        (["0", "-5"], ">= 0"),
    ],
)
def test_list_labels_are_ascii_integers_within_int64(tmp_path: Path, labels: list[str], message: str) -> None:
    write_image(tmp_path / "a.jpg", 8, 8, seed=0)
    listing = tmp_path / "list.csv"
    listing.write_text("".join(f"a.jpg,{label}\n" for label in labels), encoding="utf-8")
    with pytest.raises(DatasetError, match=message):
        sources.FileList(str(listing)).open()


def test_multi_hot_targets_must_fit_their_budget(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 8, 8, seed=0)
    listing = tmp_path / "tags.tsv"
    listing.write_text("a.jpg\t1 2000000000\na.jpg\t3\n")
    with pytest.raises(DatasetError, match="budget of targets"):  # 2 x 2e9 x 4 bytes: refused, not tried
        sources.FileList(str(listing), multi_label=True).open()
    listing.write_text("a.jpg\t1 2\n" * 10)
    with pytest.raises(DatasetError, match="budget of targets"):
        sources.FileList(str(listing), multi_label=True, num_classes=1 << 28).open()
    with pytest.raises(ConfigError, match="num_classes must be a positive integer"):
        sources.FileList(str(listing), multi_label=True, num_classes=0)
    index = sources.FileList(str(listing), multi_label=True, num_classes=4).open()
    assert index.labels.shape == (10, 4)


def test_a_huge_label_is_not_echoed_whole(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 8, 8, seed=0)
    listing = tmp_path / "list.csv"
    listing.write_text("a.jpg,cat\na.jpg," + "x" * (1 << 20) + "\n")
    with pytest.raises(DatasetError) as info:
        sources.FileList(str(listing), classes=("cat",)).open()
    assert len(str(info.value)) < 1000


# -- tar shards ----------------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    return path


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (b"1_000", "not|cannot read"),
        ("\u0663".encode(), "cannot read"),
        (str(1 << 63).encode(), "cannot read"),
        (b'{"label": 9223372036854775808}', "2\\^63"),
        (b"[" * 200_000 + b"]" * 200_000, "cannot read"),
        (b"9" * (1 << 20), "cannot read"),
    ],
)
def test_tar_labels_are_bounded_and_errors_are_dataset_errors(
    tmp_path: Path, label: bytes, message: str
) -> None:
    ext = "json" if label.startswith((b"{", b"[")) else "cls"
    shard = _tar(tmp_path / "bad.tar", [("a.jpg", b"\xff\xd8"), (f"a.{ext}", label)])
    with pytest.raises(DatasetError, match=message) as info:
        sources.TarShards(str(shard)).open()
    assert "bad.tar:a" in str(info.value)
    assert len(str(info.value)) < 1000


def test_a_shard_cut_at_a_sample_boundary_is_reported_truncated(image_folder: Path, tmp_path: Path) -> None:
    (shard,) = write_tar_shards(image_folder, tmp_path, per_shard=24)
    index = sources.TarShards(str(shard)).open()
    # Cut right after sample 11's label member: every header intact, no end-of-archive blocks.
    with tarfile.open(shard) as tf:
        ends = [m.offset_data + -(-m.size // 512) * 512 for m in tf.getmembers()]
    assert len(index) == 24
    os.truncate(shard, ends[23])
    with pytest.raises(DatasetError, match="truncated") as info:
        sources.TarShards(str(shard)).open()
    assert str(shard) in str(info.value)
    with open(shard, "ab") as f:  # garbage where the next header should be
        f.write(b"\x01" * 1024)
    with pytest.raises(DatasetError, match="not a tar header"):
        sources.TarShards(str(shard)).open()


def test_a_shard_replaced_with_the_same_size_and_mtime_is_scanned_again(
    image_folder: Path, tmp_path: Path
) -> None:
    (shard,) = write_tar_shards(image_folder, tmp_path / "a", per_shard=24)
    (other,) = write_tar_shards(image_folder, tmp_path / "b", per_shard=24, label_as="json")
    before = sources.TarShards(str(shard)).open()
    # The same size, other labels: rewrite the .cls digits, then give back the old mtime (cp -p).
    data = bytearray(shard.read_bytes())
    with tarfile.open(shard) as tf:
        for member in tf.getmembers():
            if member.name.endswith(".cls"):
                data[member.offset_data] = ord("7")
    stat = shard.stat()
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert shard.stat().st_size == stat.st_size and shard.stat().st_mtime_ns == stat.st_mtime_ns
    after = sources.TarShards(str(shard)).open()
    assert not np.array_equal(before.labels, after.labels)
    assert (after.labels == 7).all()
    assert other.exists()


def test_a_shard_replaced_under_a_running_loader_is_a_dataset_error(
    image_folder: Path, tmp_path: Path
) -> None:
    (shard,) = write_tar_shards(image_folder, tmp_path / "a", per_shard=24)
    (other,) = write_tar_shards(image_folder, tmp_path / "b", per_shard=24, label_as="json")
    source = sources.TarShards(str(shard))
    with FastLoader(source, batch_size=4, num_workers=0, transform=AUGMENT) as loader:
        os.replace(other, shard)  # rsync's way: a new inode under the same name
        with pytest.raises(DatasetError, match="changed since it was indexed") as info:
            next(iter(loader))
    assert isinstance(info.value, SampleError)
    assert "train-000000.tar" in str(info.value)


def test_json_label_documents_stay_small(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "ok.tar", [("a.jpg", b"\xff\xd8"), ("a.json", json.dumps({"label": 3}).encode())])
    assert sources.TarShards(str(shard)).open().labels.tolist() == [3]
