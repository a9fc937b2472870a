"""A pack that lies in object storage (`s3://bucket/prefix`, `gs://`, `http(s)://`): opened, and
written (`pack_to_url`).

The manifest and the index arrays (a few bytes per sample) are downloaded whole and checked as a
local pack's are; the data files are not: their samples are read by byte ranges through the
node cache (NOTE [node cache]), in chunks, so that a loader starts at once and reads only what
its batches touch. Each data file is pinned to the version (ETag) seen at open, and every read
asks the store for that version (NOTE [conditional reads]), so a pack rewritten in place is
never read as a mix of two versions: a read of a rewritten data file fails with SourceChanged.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from fastload._errors import DatasetError
from fastload._progress import ProgressLine
from fastload.sources import _remote
from fastload.sources._bounds import clip
from fastload.sources._extents import ExtentIndex, remote_file
from fastload.sources._node_cache import CHUNK_BYTES

if TYPE_CHECKING:
    from fastload.sources._packed import Packed

_MAX_MANIFEST_BYTES = 64 << 20
_MAX_INDEX_BYTES = 8 << 30


def open_remote_pack(root: str, cache_dir: str | None = None, cache_limit: int | None = None) -> ExtentIndex:
    """The index of the pack at URL `root` (see the module docstring)."""
    from fastload.sources._packed import (
        INDEX_FILES,
        MANIFEST,
        _check_index,
        _checked_manifest,
        checked_manifest_format,
        pack_index,
    )

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
    count, names, classes = _checked_manifest(root, manifest)
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
    _check_index(root, count, arrays, sizes)
    return pack_index(root, classes, files, arrays, cache_dir=cache_dir, cache_limit=cache_limit)


# NOTE [staging]: a pack for a URL is made whole on this machine first, in
# `<node cache>/pack-staging/<hash of the URL>` (`~/.cache/fastload/remote-UID/...`, under
# FASTLOAD_CACHE_DIR when set; it needs room for the whole pack), then uploaded. The store is asked
# once before any work (its package importable, the credentials and endpoint answering), so that
# a missing s3fs or a wrong endpoint is said at once, not after hours of packing; an upload that
# fails says where the staging copy is, and the same command run again uploads only what the
# store does not hold yet (the pack in staging is complete: nothing is packed again). The staging
# copy is removed once uploaded.


def pack_to_url(source: Any, dst: str, *, shard_bytes: int, progress: bool, **options: Any) -> Packed:
    """Pack `source` into a staging directory on this machine (NOTE [staging]: run again, it
    resumes there), then upload its files that the store does not hold yet at their size, the
    manifest last, so that a reader never sees a manifest before its data. Returns the pack at
    `dst` as a source."""
    from fastload.sources._node_cache import NodeCache
    from fastload.sources._pack_writer import pack
    from fastload.sources._packed import MANIFEST, Packed

    try:  # before any work: what to install, or that the store does not answer (NOTE [staging])
        _remote.check_reachable(_remote.join(dst, MANIFEST))
    except OSError as e:
        raise DatasetError(f"cannot pack to {dst}: {clip(str(e))} (nothing was packed)") from None
    cache = NodeCache()
    staging = os.path.join(cache.directory, "pack-staging", hashlib.sha256(dst.encode()).hexdigest()[:24])
    os.makedirs(staging, mode=0o700, exist_ok=True)
    pack(source, staging, shard_bytes=shard_bytes, progress=progress, **options)
    names = [*sorted(n for n in os.listdir(staging) if n != MANIFEST), MANIFEST]
    line = ProgressLine(sys.stderr) if progress else None
    for number, name in enumerate(names, 1):
        local, url = os.path.join(staging, name), _remote.join(dst, name)
        size = os.path.getsize(local)
        try:
            there = _remote.size_of(url)[0] if name != MANIFEST else -1
        except FileNotFoundError:
            there = -1
        try:
            if there != size:
                _remote.upload(local, url)
        except OSError as e:
            raise DatasetError(
                f"uploading the pack to {dst} failed ({clip(str(e))}); the whole pack is kept in {staging}: "
                "run the same command again to upload what is missing (nothing is packed again), or remove "
                f"{staging} to give up"
            ) from None
        if line is not None:
            said = f"upload {number}/{len(names)} files to {dst}"
            if number == len(names):
                line.done(said)
            else:
                line.update(said)
    shutil.rmtree(staging, ignore_errors=True)  # kept only while an upload is unfinished
    return Packed(dst)
