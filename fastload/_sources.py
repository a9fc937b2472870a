"""Where samples come from: an ImageNet-layout folder indexed into numpy arrays.

The index (every file's path and label) lives in three numpy arrays, one bytes blob plus offsets
and the labels, never in Python lists: forked workers share those pages untouched, so worker memory
does not grow with reads (DataLoader's copy-on-read problem with lists of paths).
Class and file order match torchvision's `ImageFolder` exactly (sorted class folders, recursive
walk following links, sorted file names, the same extensions), so labels match too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from fastload._errors import DatasetError

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class ImageFolderIndex:
    """Paths and labels of an ImageNet-layout folder (class subfolders of images)."""

    root: str
    classes: tuple[str, ...]
    path_blob: np.ndarray  # uint8: every path, UTF-8, concatenated
    path_offsets: np.ndarray  # int64, len(self) + 1
    labels: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def path(self, index: int) -> str:
        start, end = int(self.path_offsets[index]), int(self.path_offsets[index + 1])
        return self.path_blob[start:end].tobytes().decode("utf-8", "surrogateescape")

    @classmethod
    def scan(cls, root: str | os.PathLike[str]) -> ImageFolderIndex:
        """Index `root`; raise DatasetError (saying what is wrong) when it holds no images."""
        root_str = os.path.abspath(os.fspath(root))
        if not os.path.isdir(root_str):
            what = "is not a directory" if os.path.exists(root_str) else "does not exist"
            raise DatasetError(f"dataset folder {root_str} {what}")
        try:
            classes = sorted(e.name for e in os.scandir(root_str) if e.is_dir())
        except OSError as e:
            raise DatasetError(f"cannot list dataset folder {root_str}: {e}") from e
        if not classes:
            raise DatasetError(
                f"{root_str} has no class subfolders: expected the ImageNet layout "
                "ROOT/<class name>/<image file>"
            )
        encoded: list[bytes] = []
        labels: list[int] = []
        for label, name in enumerate(classes):
            class_dir = os.path.join(root_str, name)
            for dirpath, _, filenames in sorted(os.walk(class_dir, followlinks=True)):
                for filename in sorted(filenames):
                    if filename.lower().endswith(IMG_EXTENSIONS):
                        encoded.append(os.path.join(dirpath, filename).encode("utf-8", "surrogateescape"))
                        labels.append(label)
        if not encoded:
            raise DatasetError(
                f"no images under {root_str} (looked for {', '.join(IMG_EXTENSIONS)} "
                f"in {len(classes)} class folders)"
            )
        lengths = np.fromiter((len(p) for p in encoded), dtype=np.int64, count=len(encoded))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        return cls(root_str, tuple(classes), blob, offsets, np.asarray(labels, dtype=np.int64))
