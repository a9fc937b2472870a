"""WebDataset tar shards (`sources.TarShards`) and the extent reads under them (`ExtentIndex`).

Protects: a loader over shards written from a folder (in the folder's order) gives the folder's
batches bit for bit, for any worker count, names its samples `SHARD.tar:KEY` and resumes from a
state_dict; shard patterns (brace, glob, list) expand in order, their names bounded all together
before any is made; a batch's neighbouring extents are
read with one pread, and readahead is asked only for stretches a batch reads several samples of;
a damaged sample is a SampleError naming `shard:key`, and a shard that breaks the layout
(missing label or image, compressed, not a tar) a DatasetError at construction.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import multiprocessing
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import epoch_with_ids, resumed_tail, write_tar_shards

from fastload import DatasetError, FastLoader, SampleError, sources
from fastload import transforms as T
from fastload._shm import Segment
from fastload.sources._formats import tar_scan
from fastload.sources._indexes import extent_files as _extent_files
from fastload.sources._indexes.extents import ExtentIndex

AUGMENT = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]


@pytest.fixture(scope="module")
def shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The 24-image folder as shards of 10, 10 and 4 samples."""
    return write_tar_shards(image_folder, tmp_path_factory.mktemp("shards"), per_shard=10)


@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_batches_match_the_folder(image_folder: Path, shards: list[Path], num_workers: int) -> None:
    want = epoch_with_ids(image_folder, 0, seed=7)
    got = epoch_with_ids(
        sources.TarShards(str(shards[0].parent / "train-{000000..000002}.tar")), num_workers, seed=7
    )
    assert len(got) == len(want) == 5
    for (images, labels, ids), (want_images, want_labels, want_ids) in zip(got, want, strict=True):
        assert torch.equal(ids.indices, want_ids.indices)
        assert torch.equal(images, want_images)
        assert torch.equal(labels, want_labels)
        shard_of = [f"train-{i // 10:06d}.tar" for i in ids.indices.tolist()]
        assert ids.names == tuple(
            f"{s}:s{i:05d}" for s, i in zip(shard_of, ids.indices.tolist(), strict=True)
        )


def test_resume_mid_epoch_equals_the_uninterrupted_tail(shards: list[Path]) -> None:
    source = sources.TarShards(tuple(str(s) for s in shards))
    whole = epoch_with_ids(source, 2, seed=7)  # on the CPU, as these loaders
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle": True, "transform": AUGMENT, "device": "cpu"}
    tail = resumed_tail(source, kwargs, lambda batch: (batch[0].clone(), batch[1].clone()))
    assert len(tail) == 3
    for (images, labels), (want_images, want_labels, _) in zip(tail, whole[2:], strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_patterns_expand_in_order(shards: list[Path]) -> None:
    directory = shards[0].parent
    expected = [str(s) for s in shards]
    for paths in (
        str(directory / "train-{000000..000002}.tar"),
        str(directory / "train-*.tar"),
        str(directory / "train-00000{0,1,2}.tar"),
        tuple(expected),
    ):
        assert sources.TarShards(paths).shard_paths() == expected
    assert sources.TarShards([str(shards[1])]).open().name(0) == "train-000001.tar:s00010"
    assert isinstance(sources.as_source(shards[0]), sources.TarShards)
    assert (
        sources.source_from_config(sources.TarShards(tuple(expected)).to_config()).shard_paths() == expected
    )
    with pytest.raises(DatasetError, match="does not exist"):
        sources.TarShards(str(directory / "train-{000000..000003}.tar")).open()
    with pytest.raises(DatasetError, match="no tar shards match"):
        sources.TarShards(str(directory / "valid-*.tar")).open()


def test_the_names_of_all_patterns_are_bounded_together_before_any_is_made(tmp_path: Path) -> None:
    """Issue 29: 64 patterns of a million names each passed a bound per pattern, and a daemon's
    allowlist then made and checked 64 M names. Refused when the source is made, in microseconds."""
    million = str(tmp_path / "s-{0..999999}.tar")
    assert len(sources.TarShards(million).paths) == len(million)  # one pattern: within the bound
    with pytest.raises(DatasetError, match=r"with the other 63 patterns expands to over 1,048,576"):
        sources.TarShards([million] * 64)
    with pytest.raises(DatasetError, match="over 4,096 wildcard patterns"):  # each a directory listed
        sources.TarShards(str(tmp_path / "s-{0..4096}-*.tar"))
    # Signed URLs hold a '?' but are never listed: named one by one, they are no wildcards.
    urls = [f"https://store.example/s-{k}.tar?sig=x" for k in range(5000)]
    assert len(sources.TarShards(urls).paths) == 5000


def test_json_labels(image_folder: Path, tmp_path: Path) -> None:
    write_tar_shards(image_folder, tmp_path, per_shard=24, label_as="json")
    index = sources.TarShards(str(tmp_path / "train-000000.tar")).open()
    assert index.labels.tolist() == sources.ImageFolder(str(image_folder)).open().labels.tolist()


class _PreadSpy:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[int, int]] = []
        self.advised: list[tuple[int, int, int]] = []
        real_pread, real_fadvise = os.pread, os.posix_fadvise

        def pread(fd: int, length: int, offset: int) -> bytes:
            self.calls.append((length, offset))
            return real_pread(fd, length, offset)

        def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
            self.advised.append((offset, length, advice))
            real_fadvise(fd, offset, length, advice)

        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(os, "posix_fadvise", fadvise)


def test_a_run_of_neighbours_is_one_read(
    image_folder: Path, shards: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    index = sources.TarShards(tuple(str(s) for s in shards)).open()
    folder = sources.ImageFolder(str(image_folder)).open()
    spy = _PreadSpy(monkeypatch)
    run = np.array([7, 3, 5, 2, 4, 6], np.int64)  # consecutive samples of one shard, shuffled
    blobs = index.read(run)
    assert len(spy.calls) == 1
    assert [bytes(b) for b in blobs] == [Path(folder.path(int(i))).read_bytes() for i in run]
    # Two shards: one read each; no coalescing (gap 0): one read a sample.
    spy.calls.clear()
    index.read(np.array([12, 1, 11, 0], np.int64))
    assert len(spy.calls) == 2
    spy.calls.clear()
    dataclasses.replace(index, gap=0).read(run)
    assert len(spy.calls) == len(run)


def test_readahead_only_for_several_samples_of_a_stretch(
    shards: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = sources.TarShards(tuple(str(s) for s in shards)).open()
    spy = _PreadSpy(monkeypatch)

    def asked(batch: list[int], readahead: int = 4) -> list[tuple[int, int]]:
        spy.advised.clear()
        dataclasses.replace(opened, readahead=readahead).read(np.array(batch, np.int64))  # fresh memory
        return [(o, n) for o, n, advice in spy.advised if advice == os.POSIX_FADV_WILLNEED]

    def extent(first: int, last: int) -> tuple[int, int]:
        start = int(opened.offsets[first])
        return start, int(opened.offsets[last] + opened.sizes[last]) - start

    assert asked([0, 2, 3]) == [extent(0, 7)]  # three within 4 of each other: through 3 + 4
    assert asked([0, 9, 15]) == []  # lone samples (a full shuffle): no readahead
    assert asked([7, 8, 9]) == [extent(7, 9)]  # the stretch ends with its shard
    assert asked([0, 2, 3, 11, 12, 13]) == [extent(0, 7), extent(11, 17)]  # one per stretch
    assert asked([0, 1, 2], readahead=0) == []


def test_readahead_is_not_asked_twice(shards: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_extent_files, "_CHUNK", 4096)
    index = dataclasses.replace(sources.TarShards(tuple(str(s) for s in shards)).open(), readahead=4)
    spy = _PreadSpy(monkeypatch)
    index.read(np.array([0, 2, 3], np.int64))  # samples 0..7 asked for
    index.read(np.array([1, 2, 3], np.int64))  # within chunks already asked for: nothing
    index.read(np.array([5, 6, 7], np.int64))  # on through sample 9: from the chunk after 0..7's last
    willneed = [(o, n) for o, n, advice in spy.advised if advice == os.POSIX_FADV_WILLNEED]
    end7, end9 = (int(index.offsets[i] + index.sizes[i]) for i in (7, 9))
    first_new = (end7 - 1) // 4096 * 4096 + 4096
    assert willneed == [(int(index.offsets[0]), end7 - int(index.offsets[0])), (first_new, end9 - first_new)]
    # What was asked for a while ago (the page cache may have dropped it since) is asked for again.
    monkeypatch.setattr(_extent_files, "_ADVISED_S", -1.0)
    spy.advised.clear()
    index.read(np.array([1, 2, 3], np.int64))
    again = [a[:2] for a in spy.advised if a[2] == os.POSIX_FADV_WILLNEED]
    assert again == [(int(index.offsets[1]), end7 - int(index.offsets[1]))]


def _child_reads(index: ExtentIndex, parent_fd: int, results: Any) -> None:
    blob = bytes(index.read(np.array([1], np.int64))[0])
    results.put((index._handles.pid == os.getpid(), index._handles.fds[0] != parent_fd, blob))


def test_a_forked_process_opens_its_own_descriptors(shards: list[Path]) -> None:
    index = sources.TarShards(str(shards[0])).open()
    want = bytes(index.read(np.array([1], np.int64))[0])
    parent_fd = index._handles.fds[0]
    context = multiprocessing.get_context("fork")
    results = context.SimpleQueue()
    child = context.Process(target=_child_reads, args=(index, parent_fd, results))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert results.get() == (True, True, want)
    assert index._handles.fds[0] == parent_fd  # the parent's is untouched
    index.close()
    assert not index._handles.fds


def test_segment_round_trip(shards: list[Path]) -> None:
    index = sources.TarShards(tuple(str(s) for s in shards)).open()
    segment = index.to_segment()
    try:
        copy = ExtentIndex.from_segment(segment)
        assert copy.files == index.files and len(copy) == len(index)
        assert [copy.name(i) for i in range(len(copy))] == [index.name(i) for i in range(len(index))]
        order = np.arange(len(index))[::-1].copy()
        assert [bytes(b) for b in copy.read(order)] == [bytes(b) for b in index.read(order)]
        assert np.array_equal(copy.labels, index.labels)
        copy.close()
        del copy
    finally:
        segment.close()
    with pytest.raises(ValueError, match="ExtentIndex"):
        other = Segment.create(4096)
        try:
            ExtentIndex.from_segment(other)
        finally:
            other.close()


def test_a_corrupt_image_is_a_sample_error_naming_shard_and_key(image_folder: Path, tmp_path: Path) -> None:
    (shard,) = write_tar_shards(image_folder, tmp_path, per_shard=24)
    index = sources.TarShards(str(shard)).open()
    # Overwrite sample 6's JPEG in place with garbage of the same length.
    with open(shard, "r+b") as f:
        f.seek(int(index.offsets[6]))
        f.write(b"\0not a jpeg" * (int(index.sizes[6]) // 11))
    with FastLoader(sources.TarShards(str(shard)), batch_size=4, num_workers=1, transform=AUGMENT) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(SampleError) as info:
            next(it)
    assert info.value.path == "train-000000.tar:s00006"
    assert "train-000000.tar:s00006" in str(info.value)


def test_a_shard_truncated_after_indexing_is_a_sample_error(image_folder: Path, tmp_path: Path) -> None:
    (shard,) = write_tar_shards(image_folder, tmp_path, per_shard=24)
    source = sources.TarShards(str(shard))
    with FastLoader(source, batch_size=24, num_workers=0, transform=AUGMENT) as loader:
        index = source.open()
        os.truncate(shard, int(index.offsets[20]) + 10)
        with pytest.raises(SampleError, match="truncated") as info:
            next(iter(loader))
    assert info.value.path == "train-000000.tar:s00020"


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    return path


JPEG = b"\xff\xd8\xff" + b"\0" * 100


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([("a.jpg", JPEG), ("a.cls", b"1"), ("b.jpg", JPEG)], "b has an image but no label"),
        ([("a.jpg", JPEG), ("a.cls", b"1"), ("b.cls", b"2")], "b has no image member"),
        ([("a.jpg", JPEG), ("a.json", b'{"caption": "x"}')], "expected an integer label"),
        ([("a.jpg", JPEG), ("a.cls", b"cat")], "cannot read a label"),
        ([("a.jpg", JPEG), ("a.png", JPEG), ("a.cls", b"0")], "several images"),
        ([("notes.txt", b"x")], "notes has no image member"),
    ],
)
def test_layout_errors_name_shard_and_key(
    tmp_path: Path, members: list[tuple[str, bytes]], message: str
) -> None:
    shard = _tar(tmp_path / "bad.tar", members)
    with pytest.raises(DatasetError, match=message) as info:
        FastLoader(sources.TarShards(str(shard)), num_workers=0)
    assert str(shard) in str(info.value)


def test_compressed_and_foreign_files_are_refused(tmp_path: Path) -> None:
    plain = _tar(tmp_path / "plain.tar", [("a.jpg", JPEG), ("a.cls", b"0")])
    compressed = tmp_path / "packed.tar"
    compressed.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(DatasetError, match="gzip-compressed"):
        sources.TarShards(str(compressed)).open()
    foreign = tmp_path / "notes.tar"
    foreign.write_bytes(b"just some text, " * 100)
    with pytest.raises(DatasetError, match="is not a tar file"):
        sources.TarShards(str(foreign)).open()
    assert sources.TarShards(str(plain)).open().labels.tolist() == [0]


COMPRESSED_NAMES = [("train.tar.zst", "zstd"), ("t.tzst", "zstd")]


@pytest.mark.parametrize(("name", "compressor"), COMPRESSED_NAMES)
def test_a_compressed_tar_path_says_what_it_is_and_what_to_do(
    tmp_path: Path, name: str, compressor: str
) -> None:
    """Given as a path (as a folder or a .tar is), a compressed tar fastload does not decompress
    (zstd) is named as one, with the command that makes it readable, never called "not a
    directory"; an object's, before any read. Gzip, xz and bzip2 shards load
    (tests/test_sources_tar_compressed.py)."""
    plain = _tar(tmp_path / "plain.tar", [("a.jpg", JPEG), ("a.cls", b"0")])
    shard = tmp_path / name
    shard.write_bytes(gzip.compress(plain.read_bytes()))
    for given in (str(shard), f"s3://bucket/{name}"):
        with pytest.raises(DatasetError) as info:
            FastLoader(given, batch_size=1, num_workers=0, device="cpu")
        message = str(info.value)
        assert f"{given} is a {compressor}-compressed tar" in message, message
        assert f"`{compressor} -d`" in message and "not a directory" not in message


def _same_index(a: ExtentIndex, b: ExtentIndex) -> bool:
    fields = ("file_ids", "offsets", "sizes", "labels", "key_blob", "key_offsets")
    return all(np.array_equal(getattr(a, name), getattr(b, name)) for name in fields)


def test_a_shards_scan_is_cached_until_it_changes(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE [shard index cache]: opened again, the shards are not scanned; a rewritten shard is.
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    written = write_tar_shards(image_folder, tmp_path / "shards", per_shard=10)
    source = sources.TarShards([str(p) for p in written])
    scans: list[str] = []
    real = tar_scan._scan_shard

    def counted(shard: str, *args: Any) -> int:
        scans.append(os.path.basename(shard))
        return real(shard, *args)

    monkeypatch.setattr(tar_scan, "_scan_shard", counted)
    first = source.open()
    assert len(scans) == 3
    again = source.open()
    assert len(scans) == 3  # all three from the cache
    assert _same_index(first, again)
    os.utime(written[1], ns=(1, 1))  # the same bytes, another modification time: scanned again
    source.open()
    assert scans[3:] == [written[1].name]
    kept_dir = tmp_path / "cache" / f"tar-index-{os.geteuid()}"
    for kept in kept_dir.iterdir():  # a damaged cache file is ignored
        kept.write_bytes(b"not an npz")
    assert _same_index(first, source.open())
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", "")  # off: scanned every time, nothing written
    before = len(scans)
    source.open()
    assert len(scans) == before + 3
