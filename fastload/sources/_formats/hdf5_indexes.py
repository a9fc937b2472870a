"""The indexes of an HDF5 source: `HDF5BytesIndex` (encoded images, a `SampleIndex` a daemon
shares with its workers) and `HDF5ArrayIndex` (fixed-shape rows, an `ArrayIndex`), over what
they share — the file, the dataset, the targets, a reading handle per process (`hdf5.py` opens
the source into one of them; `hdf5_files.py` opens the files).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastload._shm import Segment
from fastload.sources._formats.hdf5_files import Reader
from fastload.sources._indexes.arrays import MappedRows, PerProcess
from fastload.sources._indexes.field_extents import FieldExtents, read_section, section_bytes, write_section
from fastload.sources._indexes.sample_index import TARGET_DTYPES, FileRead, ReadBuffer, ReadFailure
from fastload.sources._storage.beneath import Beneath

_FLOAT32 = np.dtype(np.float32)


def _failure_in(read_one: Any, indices: np.ndarray, cause: OSError) -> ReadFailure:
    """The ReadFailure of a batch whose read failed: the first position that fails alone."""
    for position, i in enumerate(indices.tolist()):
        try:
            read_one(i)
        except OSError as e:
            return ReadFailure(position, e)
    return ReadFailure(0, cause)


@dataclass(frozen=True)
class _HDF5Index:
    """What both HDF5 indexes share: the file, the dataset, targets, a handle per process."""

    root: str  # the file
    dataset: str  # the data's full name in it ("/images")
    classes: tuple[str, ...]
    labels: np.ndarray
    cache_bytes: int
    # A confined daemon's job opens its file beneath the daemon's roots (`_storage/beneath.py`); else by path.
    beneath: Beneath | None = field(default=None, repr=False, compare=False)
    external_links: bool = True  # followed on the way to the dataset (not by a daemon's workers)
    _reader: PerProcess = field(default_factory=PerProcess, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def name(self, index: int) -> str:
        return f"{self.root}:{self.dataset}[{index}]"

    def files_read(self) -> Iterator[FileRead]:
        """Its file (checked with every file HDF5 may open for it before it was opened)."""
        yield FileRead(self.root, "its file")

    def _open(self, cache_bytes: int | None = None) -> Reader:
        reader = self._reader.get()
        if reader is None:
            size = self.cache_bytes if cache_bytes is None else cache_bytes
            made = Reader(self.root, self.dataset, size, self.external_links, self.beneath)
            reader = self._reader.set(made)
        return reader  # type: ignore[no-any-return]

    def close(self) -> None:
        """Close this process's handle (a later read opens another)."""
        reader = self._reader.take()
        if reader is not None:
            reader.close()


@dataclass(frozen=True)
class HDF5BytesIndex(_HDF5Index):
    """Encoded images in an HDF5 dataset: a `SampleIndex` (see the module docstring)."""

    holder: tuple[str, str] | None = None  # (file, name there) of the data, reached without external links
    # Declared fields (`HDF5(fields=...)`): other datasets' values, read into memory when opened.
    fields: FieldExtents | None = field(default=None, repr=False)

    def read_member(
        self, row: int, indices: np.ndarray, into: ReadBuffer | None = None
    ) -> list[bytes | memoryview]:
        """The values of ragged field `row` of `indices` (views of the fields' memory)."""
        assert self.fields is not None
        return self.fields.in_memory(row, np.asarray(indices, np.int64))

    def read_sample(self, index: int) -> bytes:
        return bytes(self._open().dset[index])

    def files_of(self, indices: np.ndarray) -> list[str]:
        return [self.root]

    def files_read(self) -> Iterator[FileRead]:
        """Its file, and the file that holds its data when a link led there."""
        yield from super().files_read()
        if self.holder is not None:
            yield FileRead(self.holder[0], "the file that holds its data")

    def read(self, indices: np.ndarray, into: ReadBuffer | None = None) -> list[bytes]:
        """The batch's bytes: one sorted selection (each chunk read once), then in batch order
        (h5py reads into arrays of its own: `into` is not used)."""
        unique, inverse = np.unique(indices, return_inverse=True)
        try:
            values = self._open().dset[unique]
        except OSError as e:
            raise _failure_in(self.read_sample, indices, e) from e
        return [bytes(values[j]) for j in inverse.tolist()]

    def to_segment(self) -> Segment:
        """The targets and where the data is (file, dataset, cache size), for a daemon's workers:
        each opens the file that holds the data itself on its first read."""
        root, dataset = self.holder or (self.root, self.dataset)
        place = {"root": root, "dataset": dataset, "cache_bytes": self.cache_bytes}
        if self.fields is not None:
            place["fields"] = True  # the fields section follows the targets
        where = json.dumps(place).encode()
        labels = self.labels
        width = int(labels.shape[1]) if labels.ndim == 2 else 0
        head = (len(self), width, TARGET_DTYPES.index(labels.dtype), len(where))
        at = _BYTES_HEAD.size + len(where)
        at += -at % 8
        end = at + max(int(labels.nbytes), 1)
        extra = 0 if self.fields is None else -end % 8 + section_bytes(self.fields)
        segment = Segment.create(end + extra)
        _BYTES_HEAD.pack_into(segment.buf, 0, *head)
        segment.buf[_BYTES_HEAD.size : _BYTES_HEAD.size + len(where)] = where
        np.ndarray(labels.shape, labels.dtype, buffer=segment.buf, offset=at)[:] = labels
        if self.fields is not None:
            write_section(segment.buf, end + -end % 8, self.fields)
        return segment

    @classmethod
    def from_segment(cls, segment: Segment, root: str = "", beneath: Beneath | None = None) -> HDF5BytesIndex:
        """An index over a segment made by `to_segment` (the targets viewed, not copied), whose
        reads follow no external link (NOTE [a daemon's workers follow no external link]) and
        open its file through `beneath` when given."""
        n, width, dtype_code, where_len = _BYTES_HEAD.unpack_from(segment.buf, 0)
        where = json.loads(bytes(segment.buf[_BYTES_HEAD.size : _BYTES_HEAD.size + where_len]))
        at = _BYTES_HEAD.size + where_len
        at += -at % 8
        shape = (n, width) if width else (n,)
        labels = np.ndarray(shape, TARGET_DTYPES[dtype_code], buffer=segment.buf, offset=at)
        end = at + max(int(labels.nbytes), 1)
        fields = read_section(segment.buf, end + -end % 8, n) if where.get("fields") else None
        place = (str(where["root"]), str(where["dataset"]))
        cache_bytes = int(where["cache_bytes"])
        links = False  # NOTE [a daemon's workers follow no external link]
        return cls(
            *place, (), labels, cache_bytes, beneath, external_links=links, holder=place, fields=fields
        )


# A shared HDF5BytesIndex: (samples, target width (0: class indices), target dtype code, JSON bytes).
_BYTES_HEAD = struct.Struct("<qqqq")


@dataclass(frozen=True)
class HDF5ArrayIndex(_HDF5Index):
    """A numeric HDF5 dataset's rows: an `ArrayIndex` (see the module docstring)."""

    row_shape: tuple[int, ...] = ()
    row_dtype: np.dtype = _FLOAT32
    mapped: MappedRows | None = None  # raw in the file: gathered from a memory map
    block_rows: int = 1  # rows HDF5 reads at once (a chunk's) into the decoded copy
    fill: bool = False  # keep a decoded copy (it fits cache_bytes); else a selection per batch
    storage_ratio: float = 1.0  # stored bytes / decoded bytes (compression), for the read statistics

    @property
    def row_bytes(self) -> int:
        return int(self.row_dtype.itemsize * math.prod(self.row_shape))

    def read_into(self, indices: np.ndarray, out: np.ndarray) -> int:
        if self.mapped is not None:
            return self.mapped.read_into(indices, out)
        try:  # blocks are read whole into the decoded copy, past HDF5's chunk cache
            reader = self._open(cache_bytes=0 if self.fill else None)
        except OSError as e:
            raise ReadFailure(0, e) from e
        read = self._read_filled if self.fill else self._read_selected
        return int(read(reader, indices, out) * self.storage_ratio)

    def _read_filled(self, reader: Reader, indices: np.ndarray, out: np.ndarray) -> int:
        """Decode the blocks of the batch not decoded yet (each once, whole), then gather."""
        if reader.decoded is None or reader.have is None:
            reader.decoded = np.empty((len(self), *self.row_shape), self.row_dtype)  # pages on first write
            reader.have = np.zeros(-(-len(self) // self.block_rows), np.bool_)
        blocks = np.unique(indices // self.block_rows)
        read = 0
        for block in blocks[~reader.have[blocks]].tolist():
            rows = np.s_[block * self.block_rows : min(len(self), (block + 1) * self.block_rows)]
            try:
                reader.dset.read_direct(reader.decoded, rows, rows)
            except OSError as e:
                raise ReadFailure(int(np.flatnonzero(indices // self.block_rows == block)[0]), e) from e
            reader.have[block] = True
            read += (rows.stop - rows.start) * self.row_bytes
        np.take(reader.decoded, indices, axis=0, out=out, mode="clip")
        return read

    def _read_selected(self, reader: Reader, indices: np.ndarray, out: np.ndarray) -> int:
        """One sorted selection through HDF5's chunk cache (each chunk read once), then in batch order."""
        dset = reader.dset
        unique, inverse = np.unique(indices, return_inverse=True)
        rows = np.empty((len(unique), *self.row_shape), self.row_dtype)
        try:
            dset.read_direct(rows, unique)
        except OSError as e:
            raise _failure_in(lambda i: dset[i], indices, e) from e
        np.take(rows, inverse, axis=0, out=out, mode="clip")
        return int(rows.nbytes)

    def close(self) -> None:
        super().close()
        if self.mapped is not None:
            self.mapped.close()
