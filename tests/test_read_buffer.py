"""A task's files read into one reused buffer (NOTE [read buffer]) are the files' bytes, and the
buffer neither hands out overlapping memory within a task nor keeps an outlier's size for good."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._indexes.sample_index import PathIndex, ReadBuffer, ReadFailure, read_file


def _files(tmp_path: Path, sizes: list[int]) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"f{i}.bin"
        path.write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        paths.append(path)
    return paths


def test_reads_into_the_buffer_are_the_files_and_survive_its_growth(tmp_path: Path) -> None:
    # Large enough that the 1 MiB first allocation grows twice within the task.
    paths = _files(tmp_path, [700_000, 0, 900_000, 1, 2_500_000, 300])
    encoded = [str(p).encode() for p in paths]
    index = PathIndex.from_paths(str(tmp_path), (), encoded, np.zeros(len(paths), np.int64))
    buffer = ReadBuffer()
    buffer.start()
    blobs = index.read(np.arange(len(paths)), buffer)
    assert [bytes(b) for b in blobs] == [p.read_bytes() for p in paths]  # the earlier views too
    assert isinstance(blobs[0], memoryview)
    again = index.read(np.array([5, 0]), None)  # no buffer: bytes of their own
    assert again == [paths[5].read_bytes(), paths[0].read_bytes()] and isinstance(again[0], bytes)


def test_a_new_task_reuses_the_memory_and_lets_an_outliers_size_go(tmp_path: Path) -> None:
    small, huge = _files(tmp_path, [100_000, 20_000_000])
    buffer = ReadBuffer()
    first = read_file(str(small), buffer)
    buffer.start()
    second = read_file(str(small), buffer)
    assert isinstance(first, memoryview) and isinstance(second, memoryview)
    assert first.obj is second.obj  # the same memory, from its beginning
    buffer.start()
    assert bytes(read_file(str(huge), buffer)) == huge.read_bytes()
    buffer.start()  # the huge task's memory is kept for the next task...
    read_file(str(small), buffer)
    buffer.start()  # ...but a task that needed far less lets it go
    assert len(buffer.take(10)) == 10 and len(buffer._memory) < 20_000_000


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    # NOTE [source bounds]: a sample must be a regular file; a FIFO with no writer used to block.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for into in (ReadBuffer(), None):
        with pytest.raises(OSError, match="not a regular file"):
            read_file(str(fifo), into)


def test_a_missing_file_is_the_read_failure_of_its_position(tmp_path: Path) -> None:
    paths = _files(tmp_path, [10, 10])
    paths[1].unlink()
    index = PathIndex.from_paths(str(tmp_path), (), [str(p).encode() for p in paths], np.zeros(2, np.int64))
    with pytest.raises(ReadFailure) as info:
        index.read(np.array([0, 1]), ReadBuffer())
    assert info.value.position == 1 and isinstance(info.value.cause, FileNotFoundError)


def test_packed_extents_read_into_the_buffer_are_the_samples(tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    (tmp_path / "pack.bin").write_bytes(data)
    offsets = np.array([0, 4096, 30_000, 45_000], np.int64)
    sizes = np.array([1000, 20_000, 15_000, 5_000], np.int64)
    keys = np.zeros(5, np.int64)
    index = ExtentIndex(
        str(tmp_path), (), (str(tmp_path / "pack.bin"),), np.zeros(4, np.int32), offsets, sizes,
        np.zeros(0, np.uint8), keys, np.zeros(4, np.int64),
    )
    buffer = ReadBuffer()
    buffer.start()
    blobs = index.read(np.array([3, 0, 2, 1]), buffer)
    expected = [data[o : o + s] for o, s in zip(offsets[[3, 0, 2, 1]], sizes[[3, 0, 2, 1]], strict=True)]
    assert [bytes(b) for b in blobs] == expected
