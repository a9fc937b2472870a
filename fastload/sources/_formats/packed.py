"""`Packed`, the source of a pack, which reads one back as an `ExtentIndex`: from a local directory
or from object storage. What a pack is (its files, manifest, index and their checks) is
`pack_format.py` (its declared fields too: NOTE [packed fields]); a pack is made by `pack`
(`_packing/writer.py`) from any source's encoded samples, and one for a URL is packed locally and
uploaded (`_packing/upload.py`).

A pack at a URL (`s3://bucket/prefix`, `gs://`, `http(s)://`): the manifest and the index arrays
(a few bytes per sample) are downloaded whole and checked as a local pack's are; the data files
are not: their samples are read by byte ranges through the node cache (NOTE [node cache],
`_storage/node_cache.py`), in chunks, so that a loader starts at once and reads only what its
batches touch. Each data file is pinned to the version (ETag) seen at open, and every read asks
the store for that version (NOTE [conditional reads]), so a pack rewritten in place is never read
as a mix of two versions: a read of a rewritten data file fails with SourceChanged.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._base import Naming, Source, absolute
from fastload.sources._formats.pack_format import (
    MANIFEST,
    check_index,
    checked_manifest,
    checked_manifest_format,
    index_files,
    pack_index,
    packed_fields,
    read_manifest,
)
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._storage import remote
from fastload.sources._storage.bounds import clip, identity, open_regular
from fastload.sources._storage.node_cache import CHUNK_BYTES
from fastload.sources._storage.remote import is_url
from fastload.sources._storage.remote_file import remote_file

_MAX_MANIFEST_BYTES = 64 << 20
_MAX_INDEX_BYTES = 8 << 30


@dataclass(frozen=True)
class Packed(Source, kind="packed", named_by=Naming(marker=MANIFEST, any_url=True), served_by_daemon=True):
    """A directory written by `fastload pack` (`pack`); a plain path to one means this, and so
    does a URL no other kind's suffix claims (a pack's prefix)."""

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
            return _open_at_url(root, self.cache_dir, self.size("cache_limit"))
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
        for name in index_files(manifest):
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
        fields = packed_fields(root, manifest, arrays)
        return pack_index(root, classes, files, arrays, file_identities=checked, fields=fields)


def _open_at_url(root: str, cache_dir: str | None, cache_limit: int | None) -> ExtentIndex:
    """The index of the pack at URL `root` (see the module docstring)."""
    where = remote.join(root, MANIFEST)
    try:
        data = remote.read_whole(where, _MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        made = "made by `fastload pack`"
        raise DatasetError(f"{root} is not a packed dataset: it has no {MANIFEST} ({made})") from None
    except OSError as e:
        raise DatasetError(f"cannot read {where}: {clip(str(e))}") from None
    try:
        manifest = checked_manifest_format(json.loads(data.decode("utf-8")), where)
    except (ValueError, RecursionError) as e:
        raise DatasetError(f"cannot read {where}: {clip(str(e))}") from None
    if not manifest.get("complete"):
        raise DatasetError(f"{root} is an incomplete pack: finish it with the `fastload pack` that made it")
    count, names, classes = checked_manifest(root, manifest)
    arrays = {}
    for name in index_files(manifest):
        url = remote.join(root, f"{name}.npy")
        try:
            arrays[name] = np.load(io.BytesIO(remote.read_whole(url, _MAX_INDEX_BYTES)), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DatasetError(f"cannot read the index of pack {root}: {clip(str(e))}") from None
    files, sizes = [], []
    for name in names:
        url = remote.join(root, name)
        try:
            size, version = remote.size_of(url)
        except OSError as e:
            raise DatasetError(f"pack {root}: cannot reach its data file: {clip(str(e))}") from None
        files.append(remote_file(url, size, version, CHUNK_BYTES))
        sizes.append(size)
    check_index(root, count, arrays, sizes)
    fields = packed_fields(root, manifest, arrays)
    return pack_index(
        root, classes, files, arrays, cache_dir=cache_dir, cache_limit=cache_limit, fields=fields
    )
