"""Where samples come from: an ImageNet-layout folder indexed into numpy arrays.

The index (every file's path and label) lives in three numpy arrays, one bytes blob plus offsets
and the labels, never in Python lists: forked workers share those pages untouched, so worker memory
does not grow with reads (DataLoader's copy-on-read problem with lists of paths).
Class and file order match torchvision's `ImageFolder` exactly (sorted class folders, recursive
walk following links, sorted file names, the same extensions), so labels match too.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from fastload._errors import DatasetError
from fastload._shm import Segment

# Shared layout: header (count, blob bytes), then int64 offsets[count + 1], int64 labels[count], blob.
_SHARED_HEAD = struct.Struct("<qq")

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

    def to_segment(self) -> Segment:
        """Copy the index into a new shared-memory segment, for worker processes not forked from us."""
        n, blob_len = len(self), int(self.path_blob.shape[0])
        segment = Segment.create(_SHARED_HEAD.size + 8 * (2 * n + 1) + max(blob_len, 1))
        _SHARED_HEAD.pack_into(segment.buf, 0, n, blob_len)
        offsets, labels, blob = _shared_views(segment, n, blob_len)
        offsets[:] = self.path_offsets
        labels[:] = self.labels
        blob[:] = self.path_blob
        return segment

    @classmethod
    def from_segment(cls, segment: Segment) -> ImageFolderIndex:
        """An index over a segment made by `to_segment` (views, no copy)."""
        n, blob_len = _SHARED_HEAD.unpack_from(segment.buf, 0)
        offsets, labels, blob = _shared_views(segment, n, blob_len)
        return cls("", (), blob, offsets, labels)


def _shared_views(segment: Segment, n: int, blob_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    at = _SHARED_HEAD.size
    offsets = np.ndarray((n + 1,), np.int64, buffer=segment.buf, offset=at)
    labels = np.ndarray((n,), np.int64, buffer=segment.buf, offset=at + 8 * (n + 1))
    blob = np.ndarray((blob_len,), np.uint8, buffer=segment.buf, offset=at + 8 * (2 * n + 1))
    return offsets, labels, blob

