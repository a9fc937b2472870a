"""Sources beyond class folders (file lists), what a plain path means, sample identity, and the
block shuffle through a FastLoader."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import write_image

from fastload import ConfigError, DatasetError, FastLoader, SampleError, SampleIds, sources
from fastload import transforms as T
from fastload.sources import FileList, ImageFolder, as_source, source_from_config
from fastload.sources._formats.folder import scan_image_folder

TF = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]


def _files(folder: Path) -> list[tuple[str, str]]:
    """(path relative to folder, class name) of every image, in ImageFolder's order."""
    index = scan_image_folder(folder)
    return [
        (os.path.relpath(index.path(i), folder), index.classes[int(index.labels[i])])
        for i in range(len(index))
    ]


def _batches(loader: FastLoader) -> list[list[torch.Tensor]]:
    with loader:
        return [[t.clone() for t in batch[:2]] for batch in loader]


def _loader(dataset: object, workers: int = 0, **kw: object) -> FastLoader:
    options: dict[str, object] = {
        "batch_size": 5,
        "shuffle": True,
        "seed": 7,
        "device": "cpu",
        "transform": TF,
    }
    options.update(kw)
    return FastLoader(dataset, num_workers=workers, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("suffix", "sep"), [(".csv", ","), (".tsv", "\t"), (".txt", " ")])
def test_a_file_list_gives_the_folders_batches(
    image_folder: Path, tmp_path: Path, suffix: str, sep: str
) -> None:
    # Class-name labels, indexed in sorted order as ImageFolder's, over the same files in the same
    # order: bit-identical batches; a header line is skipped.
    listing = tmp_path / f"train{suffix}"
    lines = [f"path{sep}label"] + [f"{p}{sep}{c}" for p, c in _files(image_folder)]
    listing.write_text("\n".join(lines) + "\n")
    expected = _batches(_loader(image_folder))
    got = _batches(_loader(FileList(str(listing), root=str(image_folder)), workers=2))
    assert len(got) == len(expected) == 5
    for (xa, ya), (xb, yb) in zip(expected, got, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_integer_labels_are_used_as_they_are(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)
    listing = tmp_path / "labels.csv"
    labels = [(7 * i) % 5 for i in range(len(files))]
    listing.write_text("".join(f"{image_folder / p},{y}\n" for (p, _), y in zip(files, labels, strict=True)))
    loader = FastLoader(
        FileList(str(listing)),
        batch_size=len(files),
        num_workers=0,
        device="cpu",
        transform=[T.Resize((16, 16))],
    )
    with loader:
        ((_, got),) = list(loader)
    assert got.tolist() == labels
    assert loader.classes == () and loader.class_to_idx == {}  # integers name no classes
    assert loader.targets == labels


def test_paths_are_relative_to_the_list_unless_root_is_given(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)[:4]
    listing = tmp_path / "list.csv"
    listing.write_text("".join(f"{p},{c}\n" for p, c in files))
    with pytest.raises(DatasetError, match=r"does not exist.*root="):
        FileList(str(listing)).open()
    index = FileList(str(listing), root=str(image_folder)).open()
    assert [index.name(i) for i in range(4)] == [str(image_folder / p) for p, _ in files]


def test_multi_label_targets_are_multi_hot_rows(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)[:6]
    listing = tmp_path / "tags.tsv"
    tags = ["cat", "cat;dog", "", "bird|dog", "dog cat", "bird"]
    listing.write_text("".join(f"{p}\t{t}\n" for (p, _), t in zip(files, tags, strict=True)))
    source = FileList(str(listing), root=str(image_folder), multi_label=True)
    loader = FastLoader(source, batch_size=6, num_workers=0, device="cpu", transform=[T.Resize((16, 16))])
    with loader:
        ((_, targets),) = list(loader)
    assert loader.classes == ("bird", "cat", "dog")
    assert targets.dtype == torch.float32 and targets.shape == (6, 3)
    expected = [[0, 1, 0], [0, 1, 1], [0, 0, 0], [1, 0, 1], [0, 1, 1], [1, 0, 0]]
    assert targets.tolist() == expected
    assert loader.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    assert loader.targets == expected  # each sample's multi-hot row, as its batch carries it


def test_multi_label_integers_with_num_classes(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)[:2]
    listing = tmp_path / "tags.txt"  # whitespace-separated: every column after the path is a label
    listing.write_text(f"{image_folder / files[0][0]} 0 3\n{image_folder / files[1][0]} 9\n")
    index = FileList(str(listing), multi_label=True, num_classes=10).open()
    assert index.labels.shape == (2, 10)
    assert np.flatnonzero(index.labels[0]).tolist() == [0, 3] and np.flatnonzero(
        index.labels[1]
    ).tolist() == [9]
    with pytest.raises(DatasetError, match="num_classes=5"):
        FileList(str(listing), multi_label=True, num_classes=5).open()


def test_mixing_needs_class_index_labels(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)[:2]
    listing = tmp_path / "tags.csv"
    listing.write_text("".join(f"{image_folder / p},{c}\n" for p, c in files))
    with pytest.raises(ConfigError, match="multi-hot"):
        FastLoader(
            FileList(str(listing), multi_label=True),
            batch_size=2,
            num_workers=0,
            device="cpu",
            transform=[T.Resize((16, 16)), T.MixUp(num_classes=3)],
            normalize=((0, 0, 0), (1, 1, 1)),
        )


@pytest.mark.parametrize(
    ("content", "options", "message"),
    [
        ("a.jpg,1\nb.jpg,cat\n", {}, "mixes integer and class-name labels"),
        ("a.jpg,1,2\n", {}, "one label.*multi_label=True"),
        ("a.jpg,-1\n", {}, ">= 0"),
        ("a.jpg,4\n", {"classes": ("x", "y")}, "out of range for 2 classes"),
        ("a.jpg,dog\n", {"classes": ("cat",)}, "'dog' is not one of the 1 classes"),
        ("path,label\n", {}, "lists no images"),
    ],
)
def test_bad_lists_say_what_is_wrong(
    tmp_path: Path, content: str, options: dict[str, object], message: str
) -> None:
    write_image(tmp_path / "a.jpg", 8, 8, seed=0)
    listing = tmp_path / "list.csv"
    listing.write_text(content)
    with pytest.raises(DatasetError, match=message):
        FileList(str(listing), **options).open()  # type: ignore[arg-type]


def test_a_missing_list_file_is_a_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cannot read file list"):
        FastLoader(tmp_path / "nope.csv", batch_size=2, num_workers=0, device="cpu")


def test_a_missing_image_fails_its_batch_naming_the_file(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)[:4]
    listing = tmp_path / "list.csv"
    listing.write_text(
        "".join(f"{image_folder / p},{c}\n" for p, c in files) + f"{tmp_path / 'gone.jpg'},n00\n"
    )
    loader = FastLoader(listing, batch_size=4, num_workers=1, device="cpu", transform=[T.Resize((16, 16))])
    with loader:
        it = iter(loader)
        next(it)
        with pytest.raises(SampleError, match=r"gone\.jpg") as caught:
            next(it)
    assert isinstance(caught.value, FileNotFoundError)


def test_a_source_field_that_is_no_path_is_named_without_a_repr() -> None:
    """Issue 28: a TypeError with the value's repr ("<...X object at 0x...>"), outside fastload's
    exception tree; now a ConfigError that names the field and the value's type."""

    class Handle:
        pass

    with pytest.raises(ConfigError, match=r"folder source field root must be a path .*got a Handle") as err:
        ImageFolder(Handle()).resolved()  # type: ignore[arg-type]
    assert "object at 0x" not in str(err.value)


def test_a_plain_path_means_what_it_looks_like(image_folder: Path, tmp_path: Path) -> None:
    assert as_source(image_folder) == ImageFolder(str(image_folder))
    assert as_source(str(tmp_path / "x.csv")) == FileList(str(tmp_path / "x.csv"))
    assert as_source(tmp_path / "x.tsv").kind == "file_list"
    source = FileList("l.csv", root="r", classes=("a", "b"), multi_label=True, num_classes=2)
    assert source_from_config(source.to_config()) == source
    with pytest.raises(ConfigError, match="unknown source kind"):
        source_from_config({"kind": "nope"})


@pytest.mark.parametrize("workers", [0, 2])
def test_sample_ids_say_which_samples_a_batch_holds(image_folder: Path, workers: int) -> None:
    plain = _batches(_loader(image_folder))
    index = scan_image_folder(image_folder)
    with _loader(image_folder, workers, sample_ids=True) as loader:
        batches = list(loader)
    order = loader._assembly.plan.order(0)  # type: ignore[union-attr]
    assert len(batches) == len(plain)
    for b, ((images, labels, ids), (want_images, want_labels)) in enumerate(zip(batches, plain, strict=True)):
        assert isinstance(ids, SampleIds) and ids.indices.dtype == torch.int64
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
        assert ids.indices.tolist() == order[b * 5 : (b + 1) * 5].tolist()
        assert ids.names == tuple(index.path(int(i)) for i in ids.indices)
        assert labels.tolist() == index.labels[ids.indices.numpy()].tolist()


def test_sample_ids_apply_to_sources_only() -> None:
    with pytest.raises(ConfigError, match="sample_ids"):
        FastLoader(torch.utils.data.TensorDataset(torch.zeros(4)), batch_size=2, sample_ids=True)


def test_a_block_shuffle_through_the_loader(image_folder: Path) -> None:
    # Every sample once, the same batches for any worker count, runs of consecutive samples.
    def ids(workers: int) -> list[list[int]]:
        with _loader(
            image_folder, workers, batch_size=4, sample_ids=True, shuffle_block=4, shuffle_window=1
        ) as loader:
            return [batch[2].indices.tolist() for batch in loader]

    inline, pooled = ids(0), ids(2)
    assert inline == pooled
    assert sorted(i for batch in inline for i in batch) == list(range(24))
    assert all(sorted(batch) == list(range(min(batch), min(batch) + 4)) for batch in inline)
    assert [b for batch in inline for b in batch] != list(range(24))  # shuffled all the same


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"shuffle_block": 0}, "shuffle_block must be an integer >= 1"),
        ({"shuffle_block": 8, "shuffle_window": 0}, "shuffle_window must be"),
        ({"shuffle_block": 8, "shuffle": False}, "needs shuffle=True"),
    ],
)
def test_block_shuffle_arguments_are_checked(
    image_folder: Path, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _loader(image_folder, **options)


def test_sources_namespace_is_curated() -> None:
    public = {n for n in dir(sources) if not n.startswith("_")}
    assert public == set(sources.__all__)


def test_a_file_lists_reads_are_counted_for_iostat(image_folder: Path, tmp_path: Path) -> None:
    files = _files(image_folder)
    listing = tmp_path / "list.csv"
    listing.write_text("".join(f"{image_folder / p},{c}\n" for p, c in files))
    sizes = [(image_folder / p).stat().st_size for p, _ in files]
    with _loader(FileList(str(listing)), workers=2, shuffle=False) as loader:
        list(loader)
        stats = loader.stats()
    assert stats is not None
    # The epoch, and what the next one decoded ahead of it (NOTE [no drain]): its first files.
    ahead = stats.samples - len(files)
    assert 0 <= ahead <= 2 * 5
    assert stats.bytes_read == sum(sizes) + sum(sizes[:ahead])
    assert stats.read_s > 0 and stats.decode_s > 0


def test_a_list_saved_by_a_spreadsheet_reads_the_same(image_folder: Path, tmp_path: Path) -> None:
    # A UTF-8 byte-order mark and CRLF line ends (Excel's CSV) change nothing.
    files = _files(image_folder)
    listing = tmp_path / "excel.csv"
    text = "path,label\r\n" + "".join(f"{p},{c}\r\n" for p, c in files)
    listing.write_bytes(b"\xef\xbb\xbf" + text.encode())
    index = FileList(str(listing), root=str(image_folder)).open()
    assert len(index) == len(files) and index.name(0) == str(image_folder / files[0][0])
    assert index.classes == scan_image_folder(image_folder).classes


def test_a_block_shuffle_shards_ranks_with_equal_batch_counts(image_folder: Path) -> None:
    # 24 samples on 3 ranks in runs of 4: each rank 8 samples (2 batches), whole runs, all covered.
    shards = []
    for rank in range(3):
        options = {"batch_size": 4, "sample_ids": True, "shuffle_block": 4, "shuffle_window": 1}
        with _loader(image_folder, 1, rank=rank, world_size=3, **options) as loader:
            shards.append([batch[2].indices.tolist() for batch in loader])
            assert len(loader) == 2
    assert [len(s) for s in shards] == [2, 2, 2]
    assert sorted(i for s in shards for batch in s for i in batch) == list(range(24))
    assert all(sorted(b) == list(range(min(b), min(b) + 4)) for s in shards for b in s)
