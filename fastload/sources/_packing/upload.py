"""Packing to a URL: a pack for object storage is made whole on this machine, then uploaded
(NOTE [staging]). `pack` (`_packing/writer.py`) asks `staging_for` where to pack, packs there as it
packs any local directory, then calls `upload_staged`; reading a pack at a URL is `_formats/packed.py`'s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys

from fastload._errors import DatasetError
from fastload._progress import ProgressLine
from fastload.sources._formats.pack_format import MANIFEST
from fastload.sources._storage import remote as _remote
from fastload.sources._storage.bounds import clip
from fastload.sources._storage.node_cache import NodeCache

# NOTE [staging]: a pack for a URL is made whole on this machine first, in
# `<node cache>/pack-staging/<hash of the URL>` (`~/.cache/fastload/remote-UID/...`, under
# FASTLOAD_CACHE_DIR when set; it needs room for the whole pack), then uploaded. The store is asked
# once before any work (its package importable, the credentials and endpoint answering), so that
# a missing s3fs or a wrong endpoint is said at once, not after hours of packing; an upload that
# fails says where the staging copy is, and the same command run again uploads only what the
# store does not hold yet (the pack in staging is complete: nothing is packed again). The staging
# copy is removed once uploaded.


def staging_for(dst: str) -> str:
    """The staging directory on this machine for a pack at URL `dst` (NOTE [staging]: run again,
    it resumes there), made 0700; DatasetError, before any work, when the store does not answer
    or its package is missing."""
    try:  # before any work: what to install, or that the store does not answer (NOTE [staging])
        _remote.check_reachable(_remote.join(dst, MANIFEST))
    except OSError as e:
        raise DatasetError(f"cannot pack to {dst}: {clip(str(e))} (nothing was packed)") from None
    cache = NodeCache()
    staging = os.path.join(cache.directory, "pack-staging", hashlib.sha256(dst.encode()).hexdigest()[:24])
    os.makedirs(staging, mode=0o700, exist_ok=True)
    return staging


def upload_staged(staging: str, dst: str, progress: bool) -> None:
    """Upload the complete pack in `staging` to `dst`: its files that the store does not hold yet
    at their size, the manifest last, so that a reader never sees a manifest before its data;
    `staging` is removed once all is uploaded."""
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
