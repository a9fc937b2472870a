"""A pack that lies in object storage (`s3://bucket/prefix`, `gs://`, `http(s)://`), opened (one
is written by packing locally and uploading: `_pack_upload.py`).

The manifest and the index arrays (a few bytes per sample) are downloaded whole and checked as a
local pack's are; the data files are not: their samples are read by byte ranges through the
node cache (NOTE [node cache]), in chunks, so that a loader starts at once and reads only what
its batches touch. Each data file is pinned to the version (ETag) seen at open, and every read
asks the store for that version (NOTE [conditional reads]), so a pack rewritten in place is
never read as a mix of two versions: a read of a rewritten data file fails with SourceChanged.
"""

from __future__ import annotations

import io
import json

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._formats.pack_format import (
    INDEX_FILES,
    MANIFEST,
    check_index,
    checked_manifest,
    checked_manifest_format,
    pack_index,
)
from fastload.sources._indexes.extents import ExtentIndex, remote_file
from fastload.sources._storage import remote as _remote
from fastload.sources._storage.bounds import clip
from fastload.sources._storage.node_cache import CHUNK_BYTES

_MAX_MANIFEST_BYTES = 64 << 20
_MAX_INDEX_BYTES = 8 << 30


def open_remote_pack(root: str, cache_dir: str | None = None, cache_limit: int | None = None) -> ExtentIndex:
    """The index of the pack at URL `root` (see the module docstring)."""
    where = _remote.join(root, MANIFEST)
    try:
        data = _remote.read_whole(where, _MAX_MANIFEST_BYTES)
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
    for name in INDEX_FILES:
        url = _remote.join(root, f"{name}.npy")
        try:
            arrays[name] = np.load(io.BytesIO(_remote.read_whole(url, _MAX_INDEX_BYTES)), allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DatasetError(f"cannot read the index of pack {root}: {clip(str(e))}") from None
    files, sizes = [], []
    for name in names:
        url = _remote.join(root, name)
        try:
            size, version = _remote.size_of(url)
        except OSError as e:
            raise DatasetError(f"pack {root}: cannot reach its data file: {clip(str(e))}") from None
        files.append(remote_file(url, size, version, CHUNK_BYTES))
        sizes.append(size)
    check_index(root, count, arrays, sizes)
    return pack_index(root, classes, files, arrays, cache_dir=cache_dir, cache_limit=cache_limit)
