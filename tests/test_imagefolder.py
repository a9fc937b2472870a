"""Image folders: the same classes, files, order and labels as torchvision's ImageFolder.

Protects label correctness (a model trained on fastload batches must see torchvision's label for
each image): sorted class folders, a recursive sorted walk following links, the extension filter
(case-insensitive, so ImageNet's `.JPEG` counts) and non-images ignored; every label the loader
delivers is the class folder of that very image; and a clear DatasetError for a bad root.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import write_image

from fastload import DatasetError, FastLoader
from fastload import transforms as T
from fastload._loading.decoding.pil import decode_into
from fastload.sources import ImageFolder
from fastload.sources._formats.folder import scan_image_folder

# torchvision.datasets.folder.IMG_EXTENSIONS
TV_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def torchvision_rules(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """ImageFolder's find_classes + make_dataset, written out independently of fastload."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    samples = []
    for label, name in enumerate(classes):
        for dirpath, _, filenames in sorted(os.walk(root / name, followlinks=True)):
            for filename in sorted(filenames):
                path = os.path.join(dirpath, filename)
                if path.lower().endswith(TV_EXTENSIONS):
                    samples.append((path, label))
    return classes, samples


@pytest.fixture(scope="module")
def tricky_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Unsorted creation order, mixed-case names and suffixes, nesting, links and non-images."""
    root = tmp_path_factory.mktemp("tricky")
    seed = iter(range(100))
    for rel in [
        "zebra/b.jpg",
        "zebra/A.JPEG",
        "zebra/nested/deeper/c.Jpg",
        "zebra/nested/a.png",
        "Apple/x.jpeg",
        "Apple/y.JPG",
        "apple/1.jpg",
        "apple/10.jpg",
        "apple/2.jpg",
        "mango/only.bmp",  # JPEG bytes: the filter goes by suffix, the decoder by content
    ]:
        write_image(root / rel, 64, 80, seed=next(seed))
    (root / "zebra" / "notes.txt").write_text("not an image")
    (root / "zebra" / "nested" / "README").write_text("no suffix")
    (root / "zebra" / "b.jpg.bak").write_bytes(b"backup")
    (root / "apple" / ".DS_Store").write_bytes(b"\0")
    (root / "loose_file.jpg").write_bytes((root / "apple" / "1.jpg").read_bytes())  # not in a class
    (root / "empty_class").mkdir()
    os.symlink(root / "Apple", root / "mango" / "linked")  # followed, as os.walk(followlinks=True)
    return root


def test_index_follows_torchvision_rules(tricky_folder: Path) -> None:
    classes, samples = torchvision_rules(tricky_folder)
    # empty_class is kept only with allow_empty=True, as torchvision's ImageFolder(allow_empty=True).
    index = scan_image_folder(tricky_folder, allow_empty=True)
    assert list(index.classes) == classes == ["Apple", "apple", "empty_class", "mango", "zebra"]
    got = [(index.path(i), int(index.labels[i])) for i in range(len(index))]
    assert got == samples
    names = [os.path.relpath(p, tricky_folder) for p, _ in got]
    assert "zebra/A.JPEG" in names and "zebra/nested/deeper/c.Jpg" in names
    assert "mango/linked/x.jpeg" in names
    assert not any(n.endswith((".txt", "README", ".bak", ".DS_Store")) for n in names)
    assert "loose_file.jpg" not in names
    assert names.index("apple/10.jpg") < names.index("apple/2.jpg")  # string order, as sorted()


def test_loader_classes_match(tricky_folder: Path) -> None:
    with FastLoader(
        ImageFolder(str(tricky_folder), allow_empty=True),
        batch_size=4,
        num_workers=0,
        transform=[T.Resize((16, 16))],
        device="cpu",
    ) as loader:
        assert loader.classes == tuple(torchvision_rules(tricky_folder)[0])
        assert len(loader) == -(-len(torchvision_rules(tricky_folder)[1]) // 4)


def test_loader_offers_imagefolders_class_to_idx_and_targets(tricky_folder: Path) -> None:
    """`classes`, `class_to_idx` and `targets` as torchvision's ImageFolder gives them (its rules
    written out above), `targets` built on first access and kept."""
    classes, samples = torchvision_rules(tricky_folder)
    source = ImageFolder(str(tricky_folder), allow_empty=True)
    resize = [T.Resize((16, 16))]
    with FastLoader(source, batch_size=4, num_workers=0, transform=resize, device="cpu") as loader:
        assert list(loader.classes) == classes
        assert loader.class_to_idx == {name: i for i, name in enumerate(classes)}
        assert "targets" not in vars(loader), "targets were built before anyone asked"
        assert loader.targets == [label for _, label in samples]
        assert loader.targets is loader.targets


def test_loader_attributes_equal_torchvisions_imagefolder(image_folder: Path) -> None:
    """The same three attributes from torchvision's own ImageFolder on the same folder."""
    datasets = pytest.importorskip("torchvision.datasets")
    theirs = datasets.ImageFolder(str(image_folder))
    resize = [T.Resize((16, 16))]
    with FastLoader(image_folder, batch_size=4, num_workers=0, transform=resize, device="cpu") as loader:
        assert list(loader.classes) == theirs.classes
        assert loader.class_to_idx == theirs.class_to_idx
        assert loader.targets == theirs.targets


def _fingerprint(pixels: np.ndarray | torch.Tensor) -> str:
    array = pixels.numpy() if isinstance(pixels, torch.Tensor) else pixels
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_delivered_labels_are_each_images_folder(image_folder: Path, num_workers: int) -> None:
    classes, samples = torchvision_rules(image_folder)
    transform = [T.Resize((20, 20))]
    plan = T.compile_transforms(transform)
    # Decode every file on its own to learn its pixels, then find each delivered image's file.
    label_of: dict[str, int] = {}
    for path, label in samples:
        out = np.zeros((20, 20, 3), np.uint8)
        decode_into(Path(path).read_bytes(), plan, np.random.default_rng(0), out, draft=False)
        label_of[_fingerprint(out)] = label
    assert len(label_of) == len(samples) == 24
    seen = 0
    with FastLoader(
        image_folder,
        batch_size=5,
        shuffle=True,
        num_workers=num_workers,
        transform=transform,
        seed=4,
        backend="pil",  # decodes exactly as decode_into above (whole JPEGs), so pixels identify files
        device="cpu",  # the fingerprints are computed on the host
    ) as loader:
        assert loader.classes == tuple(classes)
        for images, labels in loader:
            assert labels.dtype == torch.int64
            for image, label in zip(images, labels.tolist(), strict=True):
                assert label_of[_fingerprint(image.permute(1, 2, 0).contiguous())] == label
                seen += 1
    assert seen == 24


def test_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(DatasetError, match="does not exist") as info:
        FastLoader(missing)
    assert str(missing) in str(info.value)


def test_a_file_is_not_a_folder(tmp_path: Path) -> None:
    file = write_image(tmp_path / "image.jpg", 32, 32, seed=0)
    with pytest.raises(DatasetError, match="is not a directory"):
        FastLoader(file)


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no class subfolders") as info:
        FastLoader(tmp_path)
    assert "ROOT/<class name>/<image file>" in str(info.value)


def test_a_class_folder_without_images_is_refused_unless_allowed(tricky_folder: Path) -> None:
    # torchvision: FileNotFoundError "Found no valid file for the classes empty_class"; a head
    # sized from len(classes) would get a class no sample has.
    with pytest.raises(DatasetError) as info:
        FastLoader(tricky_folder, batch_size=4, num_workers=0, device="cpu")
    message = str(info.value)
    assert "1 of 5 class folders hold no images ('empty_class'" in message and "allow_empty=True" in message
    index = ImageFolder(str(tricky_folder), allow_empty=True).open()
    assert "empty_class" in index.classes
    assert 2 not in index.labels.tolist()  # empty_class is class 2: no sample has it


def test_images_but_no_class_folders(tmp_path: Path) -> None:
    write_image(tmp_path / "a.jpg", 32, 32, seed=0)
    with pytest.raises(DatasetError, match="no class subfolders"):
        FastLoader(tmp_path)


def test_class_folders_without_images(tmp_path: Path) -> None:
    (tmp_path / "cats").mkdir()
    (tmp_path / "dogs").mkdir()
    (tmp_path / "dogs" / "notes.txt").write_text("hi")
    with pytest.raises(DatasetError, match="no images under") as info:
        FastLoader(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message and ".jpeg" in message and "2 class folders" in message
