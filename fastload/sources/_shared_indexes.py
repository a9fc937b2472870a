"""The index types a daemon's workers attach from shared memory, declared in one table.

A daemon opens a source once and shares its index with its workers (and its sessions) through a
segment; a worker rebuilds it with `SHARED_INDEX_TYPES[name].from_segment(...)`, by the name
`ImageJob.to_config` sends. Each type here offers `to_segment`/`from_segment` and `files_read`
(every file it makes a worker read, which a confined daemon checks against its roots:
`_daemon/confine.check_index`). The table is written out, not filled by imports as a side
effect: a source kind a daemon serves opens into one of these (a plugin's kind too).
"""

from __future__ import annotations

from typing import Any

from fastload.sources._formats.hdf5_indexes import HDF5BytesIndex
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._indexes.sample_index import FieldsPathIndex, PathIndex

# `shared_name` takes the first type an index is an instance of: a subclass before its base.
SHARED_INDEX_TYPES: dict[str, Any] = {
    "paths_fields": FieldsPathIndex,
    "paths": PathIndex,
    "extents": ExtentIndex,
    "hdf5_bytes": HDF5BytesIndex,
}


def shared_name(index: object) -> str:
    """The name of `index`'s shared type (ValueError for an index a daemon cannot share)."""
    for name, index_type in SHARED_INDEX_TYPES.items():
        if isinstance(index, index_type):
            return name
    raise ValueError(f"{type(index).__name__} is not an index type a daemon's workers can attach")
