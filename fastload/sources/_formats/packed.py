"""`Packed`, the source of a pack, which reads one back as an `ExtentIndex`: from a local directory
here, from object storage through `_remote_pack`. What a pack is (its files, manifest, index and
their checks) is `_pack_format.py`; a pack is made by `pack`, in `_pack_writer.py`, from any
source's encoded samples.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._base import Source, absolute
from fastload.sources._formats.pack_format import (
    INDEX_FILES,
    MANIFEST,
    check_index,
    checked_manifest,
    pack_index,
    read_manifest,
)
from fastload.sources._formats.remote_pack import open_remote_pack
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._storage.bounds import clip, identity, open_regular
from fastload.sources._storage.remote import is_url


@dataclass(frozen=True)
class Packed(Source):
    """A directory written by `fastload pack` (`pack`); a plain path to one means this."""

    kind: ClassVar[str] = "packed"
    path_fields: ClassVar[tuple[str, ...]] = ("path",)
    quiet_defaults: ClassVar[tuple[str, ...]] = ("cache_dir", "cache_limit")
    size_fields: ClassVar[tuple[str, ...]] = ("cache_limit",)
    machine_fields: ClassVar[tuple[str, ...]] = ("cache_dir", "cache_limit")
    path: str
    # A pack at a URL: the node cache its data is read through (NOTE [node cache]); None: defaults.
    cache_dir: str | None = None
    cache_limit: int | str | None = None  # bytes, or "50GiB"

    def __post_init__(self) -> None:
        self._parse_sizes()

    @property
    def where(self) -> str:
        return absolute(self.path)

    def open(self) -> ExtentIndex:
        root = self.where
        if is_url(root):
            return open_remote_pack(root, self.cache_dir, self.size("cache_limit"))
        manifest = read_manifest(root)
        if manifest is None:
            raise DatasetError(
                f"{root} is not a packed dataset: it has no {MANIFEST} (made by `fastload pack`)"
            )
        if not manifest.get("complete"):
            raise DatasetError(
                f"{root} is an incomplete pack: run the same `fastload pack SRC {root}` again to finish it "
                "(it continues where it stopped)"
            )
        count, names, classes = checked_manifest(root, manifest)
        arrays = {}
        for name in INDEX_FILES:
            try:
                arrays[name] = np.load(os.path.join(root, f"{name}.npy"), mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as e:
                raise DatasetError(f"cannot read the index of pack {root}: {clip(str(e))}") from e
        files = [os.path.join(root, f) for f in names]
        identities = []
        for f in files:
            try:
                fd, info = open_regular(f, 1 << 50, "pack data file")
            except OSError as e:
                raise DatasetError(f"pack {root}: cannot open its data file {f}: {clip(str(e))}") from e
            os.close(fd)
            identities.append(identity(info))
        check_index(root, count, arrays, [i[2] for i in identities])
        checked = np.array(identities, np.int64).reshape(len(files), 5)
        return pack_index(root, classes, files, arrays, file_identities=checked)
