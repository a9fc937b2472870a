"""HDF5 sources: encoded images decoded exactly as a folder's, arrays delivered exactly as stored.

Protects: batches of JPEG/PNG bytes kept in an HDF5 dataset are bit-identical to the same images
read from their folder (same order, transforms, seed) for any worker count; an array dataset's
batches are `dset[indices]` whatever its layout (contiguous, chunked, compressed, chunks that split
rows, big-endian) and whichever way it is read (memory map, decoded copy, selection); targets
(class indices or multi-hot rows), resume, errors that name the sample (`FILE.h5:/images[i]`) or
list the datasets present, and no HDF5 handle in the trainer once a loader is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fastload import ConfigError, DatasetError, FastLoader, SampleError
from fastload import transforms as T
from fastload.sources import HDF5, as_source, source_from_config
from fastload.sources._formats.folder import scan_image_folder
from fastload.sources._formats.hdf5_indexes import HDF5ArrayIndex, HDF5BytesIndex

h5py = pytest.importorskip("h5py")

ROWS, ROW_SHAPE, CLASSES = 203, (6, 5), 7
TRANSFORM = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))

# layout name -> (create_dataset keywords, stored dtype, HDF5 keywords, how its rows are read)
ARRAY_LAYOUTS: dict[str, tuple[dict[str, Any], str, dict[str, Any], str]] = {
    "contiguous": ({}, "<f4", {}, "mapped"),
    "chunked": ({"chunks": (16, *ROW_SHAPE)}, "<f4", {}, "mapped"),
    "gzip": ({"chunks": (16, *ROW_SHAPE), "compression": "gzip", "shuffle": True}, "<f4", {}, "filled"),
    "gzip-selected": (
        {"chunks": (16, *ROW_SHAPE), "compression": "gzip"},
        "<f4",
        {"cache_mb": 0},
        "selected",
    ),
    "split-rows": ({"chunks": (16, 3, 5)}, "<f4", {}, "filled"),
    "big-endian": ({}, ">f4", {}, "filled"),
    "uint8": ({"chunks": (32, *ROW_SHAPE)}, "u1", {}, "mapped"),
}


def h5_files_open() -> int:
    """HDF5 files this process has open (h5py's count of open file objects)."""
    return int(h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE))


def files_of(pid: int) -> set[str]:
    """The files process `pid` has open (its file descriptors)."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return found


def strategy(index: HDF5ArrayIndex) -> str:
    return "mapped" if index.mapped is not None else "filled" if index.fill else "selected"


@pytest.fixture(scope="module")
def rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    return rng.standard_normal((ROWS, *ROW_SHAPE)).astype(np.float32), rng.integers(0, CLASSES, ROWS)


@pytest.fixture(scope="module")
def array_files(tmp_path_factory: pytest.TempPathFactory, rows: tuple[np.ndarray, np.ndarray]) -> Path:
    """One file per layout of ARRAY_LAYOUTS: `x` (ROWS, 6, 5) and `y` (ROWS,) int16."""
    root = tmp_path_factory.mktemp("arrays")
    x, y = rows
    for name, (keywords, dtype, _, _) in ARRAY_LAYOUTS.items():
        data = (x * 40 + 128).clip(0, 255).astype(dtype) if dtype == "u1" else x.astype(dtype)
        with h5py.File(root / f"{name}.h5", "w") as f:
            f.create_dataset("x", data=data, **keywords)
            f.create_dataset("y", data=y.astype(np.int16))
    return root


@pytest.fixture(scope="module")
def folder_samples(image_folder: Path) -> tuple[list[bytes], np.ndarray]:
    """The image folder's files' bytes and labels, in the folder's sample order."""
    index = scan_image_folder(image_folder)
    return [Path(index.path(i)).read_bytes() for i in range(len(index))], index.labels


def write_encoded(path: Path, blobs: list[bytes], labels: np.ndarray, how: str = "vlen") -> Path:
    """Encoded images as a 1-D vlen uint8 dataset `images` (or fixed-length opaque values, zero
    padded), targets as `labels`."""
    with h5py.File(path, "w") as f:
        if how == "vlen":
            images = f.create_dataset("images", (len(blobs),), dtype=h5py.vlen_dtype(np.uint8), chunks=(4,))
            for i, blob in enumerate(blobs):
                images[i] = np.frombuffer(blob, np.uint8)
        else:
            width = max(len(b) for b in blobs)
            f.create_dataset("images", data=np.array([b.ljust(width, b"\0") for b in blobs], f"V{width}"))
        f.create_dataset("labels", data=labels)
    return path


@pytest.fixture(scope="module")
def encoded_file(
    tmp_path_factory: pytest.TempPathFactory, folder_samples: tuple[list[bytes], np.ndarray]
) -> Path:
    return write_encoded(tmp_path_factory.mktemp("encoded") / "images.h5", *folder_samples)


def epoch(loader: FastLoader) -> list[list[Any]]:
    return [[t.clone() if isinstance(t, torch.Tensor) else t for t in batch] for batch in loader]


def array_loader(path: Path, num_workers: int, **kwargs: Any) -> FastLoader:
    options: dict[str, Any] = {
        "batch_size": 16,
        "shuffle": True,
        "seed": 7,
        "device": "cpu",
        "sample_ids": True,
    }
    options.update(kwargs)
    source = HDF5(str(path), data="x", labels="y", **options.pop("source", {}))
    return FastLoader(source, num_workers=num_workers, **options)


# Encoded images


@pytest.mark.parametrize("how", ["vlen", "opaque"])
@pytest.mark.parametrize("num_workers", [0, 1, 3])
@pytest.mark.parametrize("normalize", [None, NORMALIZE])
def test_encoded_images_match_the_folder(
    image_folder: Path,
    folder_samples: tuple[list[bytes], np.ndarray],
    tmp_path: Path,
    how: str,
    num_workers: int,
    normalize: Any,
) -> None:
    h5 = write_encoded(tmp_path / "images.h5", *folder_samples, how=how)
    options: dict[str, Any] = {
        "batch_size": 5, "shuffle": True, "seed": 3, "transform": TRANSFORM, "normalize": normalize,
        "device": "cpu", "sample_ids": True,
    }  # fmt: skip
    with FastLoader(image_folder, num_workers=num_workers, **options) as loader:
        expected = epoch(loader)
    with FastLoader(str(h5), num_workers=num_workers, **options) as loader:  # a .h5 path is an HDF5 source
        got = epoch(loader)
        classes = loader.classes
    assert len(got) == len(expected) == 5
    assert classes == ()
    for (images, labels, ids), (want_images, want_labels, want_ids) in zip(got, expected, strict=True):
        assert torch.equal(ids.indices, want_ids.indices)
        assert torch.equal(images, want_images)
        assert torch.equal(labels, want_labels)
        assert ids.names == tuple(f"{h5}:/images[{i}]" for i in ids.indices.tolist())


def test_encoded_index_reads_in_batch_order(
    encoded_file: Path, folder_samples: tuple[list[bytes], np.ndarray]
) -> None:
    blobs, labels = folder_samples
    index = HDF5(str(encoded_file)).open()
    assert isinstance(index, HDF5BytesIndex)
    order = np.array([9, 2, 17, 2, 0])  # unsorted, with a repeat
    assert index.read(order) == [blobs[i] for i in order]
    assert index.read_sample(5) == blobs[5]
    assert np.array_equal(index.labels, labels) and index.labels.dtype == np.int64
    index.close()


def test_corrupt_image_names_its_place(
    tmp_path: Path, folder_samples: tuple[list[bytes], np.ndarray]
) -> None:
    blobs, labels = folder_samples
    broken = [*blobs[:3], b"\xff\xd8\xff\xe0 not really a JPEG", *blobs[4:]]
    h5 = write_encoded(tmp_path / "bad.h5", broken, labels)
    options: dict[str, Any] = {"batch_size": 4, "transform": [T.CenterCrop(16)], "device": "cpu"}
    with (
        FastLoader(str(h5), num_workers=1, **options) as loader,
        pytest.raises(SampleError, match=r"bad\.h5:/images\[3\]") as caught,
    ):
        list(loader)
    assert caught.value.path == f"{h5}:/images[3]"
    assert caught.value.index == 3


def test_classes_from_the_labels_attribute(
    tmp_path: Path, folder_samples: tuple[list[bytes], np.ndarray]
) -> None:
    h5 = write_encoded(tmp_path / "named.h5", *folder_samples)
    with h5py.File(h5, "a") as f:
        f["labels"].attrs["classes"] = np.array([b"cat", b"dog", b"eel"])
    assert HDF5(str(h5)).open().classes == ("cat", "dog", "eel")
    assert HDF5(str(h5), classes=("a", "b", "c")).open().classes == ("a", "b", "c")
    with pytest.raises(DatasetError, match="3 classes' targets, but 2 class names"):
        HDF5(str(h5), classes=("a", "b")).open()


# Arrays


@pytest.mark.parametrize("layout", list(ARRAY_LAYOUTS))
@pytest.mark.parametrize("num_workers", [0, 1, 3])
def test_array_batches_are_the_stored_rows(array_files: Path, layout: str, num_workers: int) -> None:
    path = array_files / f"{layout}.h5"
    _, dtype, source_options, how = ARRAY_LAYOUTS[layout]
    index = HDF5(str(path), data="x", labels="y", **source_options).open()
    assert isinstance(index, HDF5ArrayIndex) and strategy(index) == how
    with h5py.File(path, "r") as f:
        x, y = f["x"][()], f["y"][()]
    seen: list[int] = []
    with array_loader(path, num_workers, source=source_options) as loader:
        assert len(loader) == -(-ROWS // 16)
        for data, labels, ids in loader:
            indices = ids.indices.numpy()
            assert data.dtype == torch.from_numpy(x[:1].astype(np.dtype(dtype).newbyteorder("="))).dtype
            assert np.array_equal(data.numpy(), x[indices])
            assert labels.dtype == torch.int64 and np.array_equal(labels.numpy(), y[indices])
            seen.extend(indices.tolist())
        stats = loader.stats()
    assert sorted(seen) == list(range(ROWS)) and seen != sorted(seen)  # shuffled, each row once
    assert stats is not None and stats.read_s > 0 and stats.bytes_read > 0


@pytest.mark.parametrize("layout", list(ARRAY_LAYOUTS))
def test_array_index_reads_any_order(array_files: Path, layout: str) -> None:
    _, _, source_options, _ = ARRAY_LAYOUTS[layout]
    index = HDF5(str(array_files / f"{layout}.h5"), data="x", labels="y", **source_options).open()
    assert isinstance(index, HDF5ArrayIndex)
    with h5py.File(array_files / f"{layout}.h5", "r") as f:
        x = f["x"][()]
    order = np.array([150, 3, 202, 3, 0, 47, 48, 49])  # unsorted, a repeat, a run, both ends
    out = np.full((len(order), *ROW_SHAPE), 99, index.row_dtype)
    assert index.read_into(order, out) > 0
    assert np.array_equal(out, x[order])
    index.close()


def test_arrays_behind_an_external_link_are_read_from_the_linked_file(tmp_path: Path) -> None:
    """Raw rows are mapped from the file that holds them, not the file whose link leads there."""
    rows = np.arange(4 * 256, dtype=np.float32).reshape(4, 256)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = rows
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["pad"] = np.full((64, 256), -1, np.float32)  # a.h5 is long enough to map at b's offsets
        f["x"] = h5py.ExternalLink("b.h5", "/x")
        f["y"] = np.arange(4)
    index = HDF5(str(tmp_path / "a.h5"), data="x", labels="y").open()
    assert isinstance(index, HDF5ArrayIndex)
    try:
        out = np.empty_like(rows)
        index.read_into(np.arange(4), out)
        assert np.array_equal(out, rows)
    finally:
        index.close()


def test_batches_do_not_depend_on_workers(array_files: Path) -> None:
    runs = []
    for num_workers in (0, 1, 3):
        with array_loader(array_files / "gzip.h5", num_workers) as loader:
            runs.append(epoch(loader))
    for run in runs[1:]:
        for batch, reference in zip(run, runs[0], strict=True):
            assert torch.equal(batch[0], reference[0]) and torch.equal(batch[1], reference[1])
            assert torch.equal(batch[2].indices, reference[2].indices)


def test_multi_label_targets(tmp_path: Path, rows: tuple[np.ndarray, np.ndarray]) -> None:
    x, _ = rows
    hot = (np.random.default_rng(2).random((ROWS, 4)) < 0.3).astype(np.uint8)
    with h5py.File(tmp_path / "multi.h5", "w") as f:
        f.create_dataset("x", data=x, chunks=(16, *ROW_SHAPE))
        f.create_dataset("y", data=hot)
    with array_loader(tmp_path / "multi.h5", 2) as loader:
        for data, labels, ids in loader:
            assert labels.dtype == torch.float32
            assert np.array_equal(labels.numpy(), hot[ids.indices.numpy()].astype(np.float32))
            assert np.array_equal(data.numpy(), x[ids.indices.numpy()])
        assert loader.targets == hot.astype(np.float32).tolist()  # multi-hot rows, every source alike


def test_no_labels(tmp_path: Path, rows: tuple[np.ndarray, np.ndarray]) -> None:
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f.create_dataset("features", data=rows[0])
    with FastLoader(HDF5(str(tmp_path / "plain.h5"), data="features", labels=None), batch_size=50,
                    num_workers=0, device="cpu") as loader:  # fmt: skip
        data, labels = next(iter(loader))
        targets = loader.targets
    assert np.array_equal(data.numpy(), rows[0][:50]) and (labels == -1).all()
    assert targets == [-1] * len(rows[0])  # an array source too: -1, no label, as its batches carry


def test_scalar_rows(tmp_path: Path) -> None:
    values = np.arange(100, dtype=np.int32) * 3
    with h5py.File(tmp_path / "scalars.h5", "w") as f:
        f.create_dataset("v", data=values, chunks=(10,))
        f.create_dataset("labels", data=np.arange(100) % 5)
    with FastLoader(HDF5(str(tmp_path / "scalars.h5"), data="v"), batch_size=7, shuffle=True, seed=1,
                    num_workers=2, device="cpu", sample_ids=True) as loader:  # fmt: skip
        for data, labels, ids in loader:
            assert data.shape == (len(ids),) and data.dtype == torch.int32
            assert np.array_equal(data.numpy(), values[ids.indices.numpy()])
            assert np.array_equal(labels.numpy(), ids.indices.numpy() % 5)


def test_spawned_workers_open_the_file_themselves(array_files: Path, tmp_path: Path) -> None:
    """Under spawn the index is pickled: it carries no handle, and the worker opens its own. (Run
    in a process of its own: spawn's resource tracker outlives the test, as in test_dali_backend.)"""
    script = tmp_path / "spawned.py"
    script.write_text(_SPAWNED.format(path=str(array_files / "gzip.h5")))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["same"]


_SPAWNED = textwrap.dedent(
    """
    import torch
    from fastload import FastLoader
    from fastload.sources import HDF5

    if __name__ == "__main__":
        source = HDF5({path!r}, data="x", labels="y")
        kwargs = dict(batch_size=16, shuffle=True, seed=7, device="cpu")
        with FastLoader(source, num_workers=0, **kwargs) as loader:
            local = [[t.clone() for t in batch] for batch in loader]
        with FastLoader(source, num_workers=1, multiprocessing_context="spawn", **kwargs) as loader:
            spawned = [[t.clone() for t in batch] for batch in loader]
        assert len(spawned) == len(local)
        assert all(torch.equal(a, b) for x, y in zip(spawned, local) for a, b in zip(x, y))
        print("same")
    """
)


@pytest.mark.parametrize(("layout", "num_workers"), [("chunked", 2), ("gzip", 0), ("gzip-selected", 3)])
def test_resume_mid_epoch(array_files: Path, layout: str, num_workers: int) -> None:
    source = ARRAY_LAYOUTS[layout][2]
    with array_loader(array_files / f"{layout}.h5", num_workers, source=source) as loader:
        full = epoch(loader)
    with array_loader(array_files / f"{layout}.h5", num_workers, source=source) as saver:
        it = iter(saver)
        for _ in range(5):
            next(it)
        state = saver.state_dict()
    with array_loader(array_files / f"{layout}.h5", num_workers, source=source) as restored:
        restored.load_state_dict(state)
        rest = epoch(restored)
    assert len(rest) == len(full) - 5
    for batch, reference in zip(rest, full[5:], strict=True):
        assert torch.equal(batch[0], reference[0]) and torch.equal(batch[1], reference[1])


def test_resume_encoded(encoded_file: Path) -> None:
    options: dict[str, Any] = {
        "batch_size": 4,
        "shuffle": True,
        "seed": 1,
        "transform": TRANSFORM,
        "device": "cpu",
    }
    with FastLoader(str(encoded_file), num_workers=2, **options) as loader:
        full = epoch(loader)
    with FastLoader(str(encoded_file), num_workers=2, **options) as saver:
        it = iter(saver)
        next(it), next(it)
        state = saver.state_dict()
    with FastLoader(str(encoded_file), num_workers=2, **options) as restored:
        restored.load_state_dict(state)
        rest = epoch(restored)
    assert [
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, full[2:], strict=True)
    ] == [True] * (len(full) - 2)


# Errors


def test_missing_dataset_lists_the_datasets(array_files: Path) -> None:
    with pytest.raises(
        DatasetError, match=r"no dataset 'images'.*datasets present: /x \(203, 6, 5\) float32, /y"
    ):
        HDF5(str(array_files / "contiguous.h5")).open()
    with pytest.raises(DatasetError, match=r"no dataset 'targets' \(the labels"):
        HDF5(str(array_files / "contiguous.h5"), data="x", labels="targets").open()


def test_missing_or_not_hdf5_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        FastLoader(HDF5(str(tmp_path / "absent.h5")), batch_size=2, num_workers=0)
    (tmp_path / "text.h5").write_text("not HDF5")
    with pytest.raises(DatasetError, match=r"cannot open .* as an HDF5 file"):
        HDF5(str(tmp_path / "text.h5")).open()


def test_unsupported_data(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "odd.h5", "w") as f:
        f.create_dataset("images", data=np.array([b"a", b"b"], dtype=h5py.string_dtype()))
        f.create_dataset("labels", data=np.zeros(2, np.float64))
        f.create_dataset("x", data=np.zeros((2, 3)))
    with pytest.raises(DatasetError, match="fastload reads encoded images"):
        HDF5(str(tmp_path / "odd.h5")).open()
    with pytest.raises(DatasetError, match="targets are a 1-D integer dataset"):
        HDF5(str(tmp_path / "odd.h5"), data="x").open()


@pytest.mark.parametrize("layout", ["contiguous", "gzip", "gzip-selected"])
def test_a_file_gone_before_the_workers_read_it(array_files: Path, tmp_path: Path, layout: str) -> None:
    path = tmp_path / "gone.h5"
    path.write_bytes((array_files / f"{layout}.h5").read_bytes())
    source = HDF5(str(path), data="x", labels="y", **ARRAY_LAYOUTS[layout][2])
    with FastLoader(source, batch_size=8, num_workers=1, device="cpu") as loader:
        path.unlink()
        with pytest.raises(SampleError, match=r"gone\.h5:/x\[0\]") as caught:
            next(iter(loader))
    assert isinstance(caught.value, OSError)


@pytest.mark.parametrize(
    "options",
    [{"transform": [T.CenterCrop(4)]}, {"normalize": NORMALIZE}, {"backend": "pil"}],
    ids=["transform", "normalize", "backend"],
)
def test_arrays_refuse_image_options(array_files: Path, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="holds arrays"):
        array_loader(array_files / "contiguous.h5", 0, **options)


def test_without_h5py_says_what_to_install(array_files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "h5py", None)  # `import h5py` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install fastload\[hdf5\]"):
        FastLoader(str(array_files / "contiguous.h5"), batch_size=2, num_workers=0)


# Handles


@pytest.mark.parametrize(
    ("make_path", "source_options"),
    [
        (lambda files, encoded: files / "gzip.h5", {"data": "x", "labels": "y"}),
        (lambda files, encoded: encoded, {}),
    ],
    ids=["arrays", "encoded"],
)
def test_workers_open_their_own_handles(
    array_files: Path,
    encoded_file: Path,
    make_path: Callable[[Path, Path], Path],
    source_options: dict[str, Any],
) -> None:
    path = str(make_path(array_files, encoded_file))
    before = h5_files_open()
    transform = TRANSFORM if not source_options else None
    with FastLoader(
        HDF5(path, **source_options), batch_size=4, num_workers=2, device="cpu", transform=transform
    ) as loader:
        assert h5_files_open() == before  # the metadata handle is closed before workers are forked
        assert path not in files_of(os.getpid())
        for _ in loader:
            pass
        assert h5_files_open() == before and path not in files_of(os.getpid())
        # The workers that read opened the file themselves (none inherited a handle: see above).
        assert any(path in files_of(pid) for pid in loader.worker_pids)


def test_in_trainer_handle_is_closed_with_the_loader(array_files: Path) -> None:
    before = h5_files_open()
    with array_loader(array_files / "gzip-selected.h5", 0, source={"cache_mb": 0}) as loader:
        next(iter(loader))
        assert h5_files_open() == before + 1
    assert h5_files_open() == before


# The source as data


def test_config_round_trip_and_paths(tmp_path: Path) -> None:
    source = HDF5(str(tmp_path / "a.h5"), data="x", labels=None, classes=["u", "v"], cache_mb=8)  # type: ignore[arg-type]
    assert source.classes == ("u", "v")
    assert source_from_config(source.to_config()) == source
    assert as_source(str(tmp_path / "b.hdf5")) == HDF5(str(tmp_path / "b.hdf5"))
