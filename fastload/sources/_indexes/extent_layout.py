"""The shared-memory layout of an `ExtentIndex` (`extents.py`): what `to_segment` writes and
`from_segment` attaches, so that a daemon's workers read the trainer's index without a copy.

Its one responsibility is that layout: magic, then (count, files, files blob bytes, key blob
bytes, target width (0: class indices), target dtype code, gap, readahead, readahead bytes), then
int64 offsets[n], sizes[n], key_offsets[n + 1], file_offsets[files + 1], targets, int32
file_ids[n], the files blob, the key blob, int64 file identities[files, 5] (all -1: not
checked); every array at a multiple of 8 bytes. Its bytes are held by tests/test_same_batches.py
and a daemon of one version attaches what a trainer of the same version wrote.

An index with declared fields (`FieldExtents`) is written under another magic, `FLEXTNT3`, the
same layout followed by the fields section (`field_extents.write_section`); one without is byte
for byte as before.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass

import numpy as np

from fastload._shm import Segment
from fastload.sources._indexes.field_extents import FieldExtents, read_section, section_bytes, write_section
from fastload.sources._indexes.sample_index import TARGET_DTYPES, pack_strings

IDENTITY_FIELDS = 5  # device, inode, size, mtime ns, ctime ns (NOTE [extent file identity])
_MAGIC = b"FLEXTNT2"
_MAGIC_FIELDS = b"FLEXTNT3"  # the same, followed by the declared fields (the module docstring)
_HEAD = struct.Struct("<8s9q")


@dataclass(frozen=True)
class SharedExtents:
    """What an `ExtentIndex`'s segment holds: its files (local paths or `RemoteFile` entries),
    its arrays and its read tuning (gap, readahead, readahead bytes)."""

    files: tuple[str, ...]
    file_ids: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    key_blob: np.ndarray
    key_offsets: np.ndarray
    labels: np.ndarray
    file_identities: np.ndarray | None
    tuning: tuple[int, int, int]
    fields: FieldExtents | None = None


def write_segment(shared: SharedExtents) -> Segment:
    """Copy `shared` into a new shared-memory segment."""
    files_blob, file_offsets = pack_strings([f.encode("utf-8", "surrogateescape") for f in shared.files])
    n, nfiles = int(shared.labels.shape[0]), len(shared.files)
    width = int(shared.labels.shape[1]) if shared.labels.ndim == 2 else 0
    dtype_code = TARGET_DTYPES.index(shared.labels.dtype)
    magic = _MAGIC if shared.fields is None else _MAGIC_FIELDS
    head: tuple[object, ...] = (magic, n, nfiles, len(files_blob), len(shared.key_blob), width, dtype_code)
    head += shared.tuning
    size = _HEAD.size + sum(_align8(_nbytes(shape, dtype)) for shape, dtype in _layout(head))
    if shared.fields is not None:
        size += section_bytes(shared.fields)
    segment = Segment.create(max(size, 8))
    _HEAD.pack_into(segment.buf, 0, *head)
    views = _shared_views(segment)
    arrays = (shared.offsets, shared.sizes, shared.key_offsets, file_offsets, shared.labels, shared.file_ids)
    ids = shared.file_identities
    if ids is None:
        ids = np.full((nfiles, IDENTITY_FIELDS), -1, np.int64)
    for view, source in zip(views, (*arrays, files_blob, shared.key_blob, ids), strict=True):
        view[...] = source
    if shared.fields is not None:
        at = _HEAD.size + sum(_align8(_nbytes(shape, dtype)) for shape, dtype in _layout(head))
        write_section(segment.buf, at, shared.fields)
    return segment


def read_segment(segment: Segment) -> SharedExtents:
    """What a segment made by `write_segment` holds (views, no copy; the file list decoded)."""
    head = _HEAD.unpack_from(segment.buf, 0)
    views = _shared_views(segment)
    offsets, sizes, key_offsets, file_offsets, labels, file_ids, files_blob, key_blob, ids = views
    raw = files_blob.tobytes()
    bounds = file_offsets.tolist()
    files = tuple(raw[a:b].decode("utf-8", "surrogateescape") for a, b in itertools.pairwise(bounds))
    gap, readahead, readahead_bytes = head[7:]
    at = _HEAD.size + sum(_align8(_nbytes(shape, dtype)) for shape, dtype in _layout(head))
    fields = read_section(segment.buf, at, int(head[1])) if head[0] == _MAGIC_FIELDS else None
    tuning = (gap, readahead, readahead_bytes)
    return SharedExtents(files, file_ids, offsets, sizes, key_blob, key_offsets, labels, ids, tuning, fields)


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(np.prod(shape)) * dtype.itemsize


def _layout(head: tuple[object, ...]) -> list[tuple[tuple[int, ...], np.dtype]]:
    """(shape, dtype) of each array a segment with header `head` holds, in order."""
    _, n, nfiles, files_len, keys_len, width, dtype_code = head[:7]
    assert isinstance(n, int) and isinstance(nfiles, int) and isinstance(width, int)
    assert isinstance(files_len, int) and isinstance(keys_len, int) and isinstance(dtype_code, int)
    i64, i32, u8 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.uint8)
    target_shape = (n, width) if width else (n,)
    return [
        ((n,), i64),
        ((n,), i64),
        ((n + 1,), i64),
        ((nfiles + 1,), i64),
        (target_shape, TARGET_DTYPES[dtype_code]),
        ((n,), i32),
        ((files_len,), u8),
        ((keys_len,), u8),
        ((nfiles, IDENTITY_FIELDS), i64),
    ]


def _shared_views(segment: Segment) -> list[np.ndarray]:
    head = _HEAD.unpack_from(segment.buf, 0)
    if head[0] not in (_MAGIC, _MAGIC_FIELDS):
        raise ValueError(f"segment {segment.name} does not hold an ExtentIndex")
    views, at = [], _HEAD.size
    for shape, dtype in _layout(head):
        views.append(np.ndarray(shape, dtype, buffer=segment.buf, offset=at))
        at += _align8(_nbytes(shape, dtype))
    return views
