"""A sample's declared fields as an opened index holds them: `FieldExtents`, what each field is
(its name and kind, in the order declared) and, for the fields that are byte strings of any
length (text, JSON, raw bytes), each sample's member as an (offset, size) extent in the same
container file as its image.

Its one responsibility is that record; what an extension means (the declaration's table) is
`_formats/sample_fields.py`'s, and how a batch carries the fields is `_loading/jobs/field_rows.py`'s.

Kinds: "image" (exactly one; its extents are the index's own), "label" (int64, in the index's
`labels`, -1 where a sample has none), and the ragged kinds "str" (utf-8 text), "json" (parsed)
and "bytes" (as stored), whose extents are here; a size of -1 marks a sample without that member
(its load is a bad sample: raised, or skipped with on_error="skip"). A file list's columns are
held in memory instead: `blob` holds every cell, and the extents are places in it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from mmap import mmap
from typing import Any

import numpy as np

IMAGE, LABEL, TEXT, JSON, BYTES = "image", "label", "str", "json", "bytes"
RAGGED_KINDS = (TEXT, JSON, BYTES)
KINDS = (IMAGE, LABEL, *RAGGED_KINDS)
MISSING = -1  # the size of a member a sample does not have
# A shared segment's fields section: declaration bytes, ragged fields, blob bytes (-1: no blob).
_SECTION_HEAD = struct.Struct("<3q")


@dataclass(frozen=True, eq=False)
class FieldExtents:
    """The fields of every sample: `names` and `kinds` in the order declared (`named`: batches are
    dicts by name, else lists in that order), and for the ragged fields, in their order among the
    names, int64 (fields, N) `offsets` and `sizes` of each sample's member (size -1: missing)."""

    names: tuple[str, ...]
    kinds: tuple[str, ...]
    named: bool
    offsets: np.ndarray = field(repr=False)
    sizes: np.ndarray = field(repr=False)
    # uint8: the members themselves, which `offsets` are places in (a file list's cells); None:
    # the members lie in the samples' container files.
    blob: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        ragged = len(self.ragged)
        if len(self.names) != len(self.kinds) or any(k not in KINDS for k in self.kinds):
            raise ValueError(f"fields {self.names} have kinds {self.kinds}; kinds are {KINDS}")
        if self.kinds.count(IMAGE) != 1 or self.kinds.count(LABEL) > 1:
            raise ValueError("fields hold one image and at most one label")
        n = self.sizes.shape[1] if self.sizes.ndim == 2 else -1
        for what, array in (("offsets", self.offsets), ("sizes", self.sizes)):
            if array.dtype != np.int64 or array.ndim != 2 or array.shape != (ragged, n):
                raise ValueError(f"{what} must be int64 ({ragged}, N), got {array.dtype} {array.shape}")
        blob = self.blob
        if blob is not None and (
            blob.dtype != np.uint8 or blob.ndim != 1 or (self.offsets + self.sizes > blob.shape[0]).any()
        ):
            raise ValueError("blob must be uint8 (bytes,) holding every member its extents name")

    @property
    def ragged(self) -> tuple[int, ...]:
        """The positions (among `names`) of the ragged fields, in order: row r of the extents is
        field `ragged[r]`'s."""
        return tuple(i for i, kind in enumerate(self.kinds) if kind in RAGGED_KINDS)

    @property
    def has_label(self) -> bool:
        return LABEL in self.kinds

    def capacity(self, row: int) -> int:
        """The largest member of ragged field `row` (at least 1 byte): what one sample's share
        of a slot holds, so that no batch of any samples (repeats and stand-ins too) overflows."""
        sizes = self.sizes[row]
        return max(1, int(sizes.max())) if sizes.size else 1

    def in_memory(self, row: int, indices: np.ndarray) -> list[bytes | memoryview]:
        """The members of ragged field `row` of samples `indices`, as views of `blob`."""
        assert self.blob is not None
        whole = self.blob.data
        starts, sizes = self.offsets[row, indices].tolist(), self.sizes[row, indices].tolist()
        return [whole[start : start + max(size, 0)] for start, size in zip(starts, sizes, strict=True)]

    def declaration(self) -> dict[str, Any]:
        """Names, kinds and form as JSON-able data (what a shared segment carries beside the arrays)."""
        return {"names": list(self.names), "kinds": list(self.kinds), "named": self.named}

    @classmethod
    def from_declaration(
        cls, text: str | bytes, offsets: np.ndarray, sizes: np.ndarray, blob: np.ndarray | None = None
    ) -> FieldExtents:
        raw = json.loads(text)
        names = tuple(str(n) for n in raw["names"])
        return cls(names, tuple(str(k) for k in raw["kinds"]), bool(raw["named"]), offsets, sizes, blob)


# A shared segment's fields section (`ExtentIndex`'s after its arrays, a file list's after its
# paths): the head, the declaration as JSON, int64 offsets[ragged, n] and sizes[ragged, n], the
# blob; each part at a multiple of 8 bytes.


def section_bytes(fields: FieldExtents) -> int:
    """The bytes `write_section` takes."""
    declaration = len(json.dumps(fields.declaration()).encode())
    blob = 0 if fields.blob is None else int(fields.blob.shape[0])
    return _SECTION_HEAD.size + _align8(declaration) + 2 * int(fields.sizes.nbytes) + _align8(blob)


def write_section(buf: mmap | memoryview, at: int, fields: FieldExtents) -> None:
    """Write `fields` at byte `at` (a multiple of 8) of `buf`."""
    declaration = json.dumps(fields.declaration()).encode()
    blob_len = -1 if fields.blob is None else int(fields.blob.shape[0])
    _SECTION_HEAD.pack_into(buf, at, len(declaration), int(fields.sizes.shape[0]), blob_len)
    at += _SECTION_HEAD.size
    buf[at : at + len(declaration)] = declaration
    at += _align8(len(declaration))
    offsets, sizes, blob = _section_views(buf, at, fields.sizes.shape, max(blob_len, 0))
    offsets[...], sizes[...] = fields.offsets, fields.sizes
    if fields.blob is not None:
        blob[...] = fields.blob


def read_section(buf: mmap | memoryview, at: int, samples: int) -> FieldExtents:
    """The fields `write_section` wrote at byte `at` of `buf` (views of its arrays)."""
    length, ragged, blob_len = _SECTION_HEAD.unpack_from(buf, at)
    at += _SECTION_HEAD.size
    declaration = bytes(buf[at : at + length])
    offsets, sizes, blob = _section_views(buf, at + _align8(length), (ragged, samples), max(blob_len, 0))
    return FieldExtents.from_declaration(declaration, offsets, sizes, blob if blob_len >= 0 else None)


def _section_views(
    buf: mmap | memoryview, at: int, shape: tuple[int, ...], blob_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    nbytes = 8 * int(np.prod(shape))
    offsets = np.ndarray(shape, np.int64, buffer=buf, offset=at)
    sizes = np.ndarray(shape, np.int64, buffer=buf, offset=at + nbytes)
    return offsets, sizes, np.ndarray((blob_len,), np.uint8, buffer=buf, offset=at + 2 * nbytes)


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8
