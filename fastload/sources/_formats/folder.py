"""`ImageFolder`, an ImageNet-layout folder (ROOT/<class>/<image>), scanned into a `PathIndex`.

Class and file order match torchvision's `ImageFolder` exactly (sorted class folders, recursive
walk following links, sorted file names, the same extensions), so labels match too. Unlike
torchvision the walk skips directory loops (a link back to a directory it is inside, which
os.walk would follow until the path grows too long) and can be bounded and cancelled, since the
daemon scans on a background thread: see `scan_image_folder`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._base import Naming, OpenBounds, Source
from fastload.sources._indexes.sample_index import PathIndex

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# What one indexed file costs the index beyond its encoded path: an int64 offset and an int64 label.
INDEX_BYTES_PER_FILE = 16
_CHECK_EVERY = 4096  # directory entries between two cancel/deadline checks
_ADVICE = (
    "point the loader at the dataset folder itself (ROOT/<class name>/<image file>), "
    "not a parent such as /usr, or raise the daemon's index limits"
)
_log = logging.getLogger("fastload")


def scan_image_folder(
    root: str | os.PathLike[str],
    *,
    max_files: int | None = None,
    max_bytes: int | None = None,
    deadline: float | None = None,
    cancel: threading.Event | None = None,
    allow_empty: bool = False,
) -> PathIndex:
    """Index `root`; raise DatasetError (saying what is wrong) when it holds no images, or when a
    class folder holds none and not `allow_empty` (as torchvision's ImageFolder: a model head sized
    from the class count would get a class no sample has).

    Bounds (None: unbounded): `max_files` image files indexed (it also bounds the directories
    walked, so a tree of empty folders stops too), `max_bytes` of index memory (each file's
    encoded path plus its 16 bytes of offset and label), `deadline` a `time.monotonic()` value,
    and `cancel`, checked at every directory and every few thousand entries. Exceeding a bound
    or a set `cancel` raises DatasetError. Directory loops (a link back to a directory the walk
    is inside) are skipped with a warning on the "fastload" logger.
    """
    root_str = os.path.abspath(os.fspath(root))
    walk = _Walk(root_str, max_files, max_bytes, deadline, cancel)
    walk.check()
    if not os.path.isdir(root_str):
        what = "is not a directory" if os.path.exists(root_str) else "does not exist"
        raise DatasetError(f"dataset folder {root_str} {what}")
    try:
        classes = sorted(walk.class_names())
    except OSError as e:
        raise DatasetError(f"cannot list dataset folder {root_str}: {e}") from e
    if not classes:
        raise DatasetError(
            f"{root_str} has no class subfolders: expected the ImageNet layout "
            "ROOT/<class name>/<image file>"
        )
    # Per class, the directories holding images, each with its images' encoded paths (sorted).
    found = [walk.walk_class(os.path.join(root_str, name)) for name in classes]
    if walk.files == 0:
        raise DatasetError(
            f"no images under {root_str} (looked for {', '.join(IMG_EXTENSIONS)} "
            f"in {len(classes)} class folders)"
        )
    if not allow_empty:
        _refuse_empty_classes(root_str, classes, found)
    # torchvision's order: sorted(os.walk(...)) orders a class's directories by path string.
    for dirs in found:
        dirs.sort(key=lambda item: item[0])
    paths = [p for dirs in found for _, names in dirs for p in names]
    per_class = [sum(len(names) for _, names in dirs) for dirs in found]
    labels = np.repeat(np.arange(len(classes), dtype=np.int64), per_class)
    return PathIndex.from_paths(root_str, classes, paths, labels)


def _refuse_empty_classes(root: str, classes: list[str], found: list[list[tuple[str, list[bytes]]]]) -> None:
    empty = [name for name, dirs in zip(classes, found, strict=True) if not dirs]
    if empty:
        shown = ", ".join(repr(name) for name in empty[:10])
        if len(empty) > 10:
            shown += f" and {len(empty) - 10} more"
        raise DatasetError(
            f"{root}: {len(empty)} of {len(classes)} class folders hold no images ({shown}; looked for "
            f"{', '.join(IMG_EXTENSIONS)}): remove them, or pass allow_empty=True to keep them as classes "
            "with no samples (torchvision's ImageFolder refuses them too)"
        )


class _Walk:
    """One bounded, cancellable scan: its limits, how far it got, and the loops it reported."""

    def __init__(
        self,
        root: str,
        max_files: int | None,
        max_bytes: int | None,
        deadline: float | None,
        cancel: threading.Event | None,
    ) -> None:
        self.root = root
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.deadline = deadline
        self.cancel = cancel
        self.started = time.monotonic()
        self.files = 0  # image files indexed
        self.dirs = 0  # directories listed
        self.bytes = 0  # index memory so far: encoded paths + INDEX_BYTES_PER_FILE each
        self.entries = 0  # directory entries seen (images or not)
        self.loops_reported: set[tuple[int, int] | str] = set()

    def _progress(self) -> str:
        return f"after {self.files} image files in {self.dirs} directories"

    def check(self) -> None:
        """Raise DatasetError when the scan was cancelled or ran past its deadline."""
        if self.cancel is not None and self.cancel.is_set():
            raise DatasetError(f"indexing {self.root} was cancelled {self._progress()}")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            allowed = max(0.0, self.deadline - self.started)
            raise DatasetError(
                f"indexing {self.root} exceeded its time limit (deadline: {allowed:.1f} s "
                f"after the scan started) {self._progress()}; {_ADVICE}"
            )

    def _too_many_files(self, count: int) -> DatasetError:
        return DatasetError(
            f"indexing {self.root} exceeded max_files={self.max_files}: found more than "
            f"{self.max_files} image files (reached {count} image files in {self.dirs} "
            f"directories); {_ADVICE}"
        )

    def _entry_seen(self) -> None:
        self.entries += 1
        if self.entries % _CHECK_EVERY == 0:
            self.check()

    def class_names(self) -> Iterator[str]:
        """Names of the root's subdirectories (following links), checking bounds as it goes."""
        with os.scandir(self.root) as entries:
            for entry in entries:
                self._entry_seen()
                if entry.is_dir():
                    yield entry.name

    def _list(self, path: str) -> tuple[list[str], list[str]] | None:
        """(subdirectory names, image file names), or None when `path` cannot be listed.

        As os.walk: an entry counts as a directory when is_dir() (following links) says so,
        anything else (a broken link too) as a file; an unreadable directory is skipped.
        """
        self.check()
        self.dirs += 1
        if self.max_files is not None and self.dirs > self.max_files:
            raise DatasetError(
                f"indexing {self.root} exceeded max_files={self.max_files}: walked more than "
                f"{self.max_files} directories (max_files bounds directories too) "
                f"{self._progress()}; {_ADVICE}"
            )
        subdirs: list[str] = []
        images: list[str] = []
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    self._entry_seen()
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    if is_dir:
                        subdirs.append(entry.name)
                    elif entry.name.lower().endswith(IMG_EXTENSIONS):
                        images.append(entry.name)
                        if self.max_files is not None and self.files + len(images) > self.max_files:
                            raise self._too_many_files(self.files + len(images))
        except OSError:
            return None
        subdirs.sort(reverse=True)  # popped from the end: visited in name order
        images.sort()
        return subdirs, images

    def _add(self, dirpath: str, images: list[str]) -> list[bytes]:
        paths = []
        for name in images:
            path = os.path.join(dirpath, name).encode("utf-8", "surrogateescape")
            need = self.bytes + len(path) + INDEX_BYTES_PER_FILE
            if self.max_bytes is not None and need > self.max_bytes:
                raise DatasetError(
                    f"indexing {self.root} exceeded max_bytes={self.max_bytes}: the index would "
                    f"need more than {self.max_bytes} bytes ({need} with the next file) "
                    f"{self._progress()}; {_ADVICE}"
                )
            self.files += 1
            self.bytes = need
            paths.append(path)
        return paths

    def _report_loop(self, path: str, target: str) -> None:
        try:
            link = os.lstat(path)
            seen: tuple[int, int] | str = (link.st_dev, link.st_ino)
        except OSError:
            seen = path
        if seen in self.loops_reported:  # the same link reached again through another path
            return
        self.loops_reported.add(seen)
        _log.warning(
            "indexing %s: skipped %s as a directory loop (it leads back to %s, a directory "
            "it is inside); the files there are indexed once, not again under this link",
            self.root,
            path,
            target,
        )

    def walk_class(self, class_dir: str) -> list[tuple[str, list[bytes]]]:
        """Each directory under `class_dir` (itself included) holding images: (dirpath, paths).

        The directories are those os.walk(class_dir, followlinks=True) yields, minus loops: a
        directory whose (st_dev, st_ino) is one the walk is inside (an ancestor on the current
        path, or one of the class folder's own ancestors) is skipped, and reported once.
        """
        found: list[tuple[str, list[bytes]]] = []
        try:
            st = os.stat(class_dir)
        except OSError:
            return found
        # The class folder's real ancestors: a link to any of them would lead back here too.
        above: dict[tuple[int, int], str] = {}
        parent = os.path.realpath(class_dir)
        while True:
            parent, child = os.path.dirname(parent), parent
            if parent == child:
                break
            try:
                pst = os.stat(parent)
            except OSError:
                continue
            above.setdefault((pst.st_dev, pst.st_ino), parent)
        listing = self._list(class_dir)
        if listing is None:
            return found
        key = (st.st_dev, st.st_ino)
        inside: dict[tuple[int, int], str] = {**above, key: class_dir}  # the current path
        subdirs, images = listing
        if images:
            found.append((class_dir, self._add(class_dir, images)))
        stack: list[tuple[str, tuple[int, int], list[str]]] = [(class_dir, key, subdirs)]
        while stack:
            dirpath, key, pending = stack[-1]
            if not pending:
                stack.pop()
                del inside[key]
                continue
            path = os.path.join(dirpath, pending.pop())
            try:
                st = os.stat(path)
            except OSError:
                continue  # gone, or a link that no longer resolves: os.walk could not list it either
            sub_key = (st.st_dev, st.st_ino)
            if sub_key in inside:
                self._report_loop(path, inside[sub_key])
                continue
            listing = self._list(path)
            if listing is None:
                continue
            subdirs, images = listing
            if images:
                found.append((path, self._add(path, images)))
            inside[sub_key] = path
            stack.append((path, sub_key, subdirs))
        return found


@dataclass(frozen=True)
class ImageFolder(Source, kind="folder", named_by=Naming(any_local=True), served_by_daemon=True):
    """An ImageNet-layout folder: ROOT/<class name>/<image file>; labels index the sorted class
    names, as torchvision's ImageFolder (a plain path to a folder means this). A class folder
    with no images is refused (DatasetError naming it), as torchvision does, unless
    `allow_empty`: then it stays a class that no sample has."""

    path_fields: ClassVar[tuple[str, ...]] = ("root",)
    quiet_defaults: ClassVar[tuple[str, ...]] = ("allow_empty",)
    root: str
    allow_empty: bool = False

    @property
    def where(self) -> str:
        return os.path.abspath(self.root)

    def open(self) -> PathIndex:
        return scan_image_folder(self.root, allow_empty=self.allow_empty)

    def open_bounded(self, bounds: OpenBounds) -> PathIndex:
        return scan_image_folder(
            self.root, max_files=bounds.max_files, max_bytes=bounds.max_bytes, deadline=bounds.deadline,
            allow_empty=self.allow_empty,
        )
