"""What a worker reads samples through: an index of encoded samples (their bytes' place and their
targets) held in numpy arrays, shareable through one shared-memory segment.

Every source of encoded images (a folder, a file list, tar shards, a packed file, HDF5 bytes) is
opened in the trainer into a `SampleIndex`; forked workers share its arrays' pages untouched, so
worker memory does not grow with reads (DataLoader's copy-on-read problem with lists of paths),
and a daemon's workers attach the same arrays from a segment. `PathIndex` is the index of
sources whose samples are whole files (folders, file lists).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import numpy as np

from fastload._shm import Segment
from fastload.sources._indexes.field_extents import FieldExtents, read_section, section_bytes, write_section
from fastload.sources._storage.bounds import MAX_SAMPLE_BYTES, open_regular, read_bounded

if TYPE_CHECKING:
    from fastload.sources._storage.beneath import Beneath
    from fastload.sources._storage.node_cache import NodeCache
    from fastload.sources._storage.remote_file import RemoteFile

# Targets are int64 class indices (N,) or float32 rows (N, K) (multi-label, multi-hot): one of two
# dtypes, named in the shared header by a code.
TARGET_DTYPES = (np.dtype(np.int64), np.dtype(np.float32))


class ReadFailure(Exception):
    """Reading sample `position` of a batch failed with `cause` (an OSError); internal."""

    def __init__(self, position: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.position = position
        self.cause = cause


class ReadBuffer:
    """Memory a worker reads a task's samples into, again and again (NOTE [read buffer]): each
    `start` gives back everything taken since the last, whose views must be dead by then."""

    _FIRST_BYTES = 1 << 20

    def __init__(self) -> None:
        self._memory = memoryview(bytearray(0))
        self._used = 0

    def __reduce__(self) -> tuple[type[ReadBuffer], tuple[()]]:
        return ReadBuffer, ()  # memory is per process: a copy starts empty

    def start(self) -> None:
        """A new task: reuse the memory from its beginning (let it go instead when it is far
        larger than the last task needed: one huge file must not pin its size for good)."""
        if len(self._memory) > 4 * max(self._used, self._FIRST_BYTES):
            self._memory = memoryview(bytearray(0))
        self._used = 0

    def take(self, size: int) -> memoryview:
        """`size` writable bytes, apart from everything else taken since `start`."""
        if self._used + size > len(self._memory):
            # Views already handed out keep the old memory alive until they are dropped.
            self._memory = memoryview(bytearray(max(2 * len(self._memory), size, self._FIRST_BYTES)))
            self._used = 0
        view = self._memory[self._used : self._used + size]
        self._used += size
        return view


# NOTE [read buffer]: `f.read()` gives each file a new bytes object; at ~100 KB a JPEG that memory
# is fresh pages more often than not (malloc hands large blocks back to the kernel), and the page
# faults cost as much as the copy: 49 µs to read a 48 KB page-cached JPEG into new memory against
# 17 µs into memory read into before (one core of the 2-vCPU VM). A job therefore keeps one
# `ReadBuffer` and indexes read into it (`read(indices, into=...)`), handing out views; a task's
# views live until the job's next task starts. Without a buffer, `read` returns bytes of their own.


class IndexBase(Protocol):
    """What every opened source offers, whatever its samples: its name, targets and sample names."""

    @property
    def root(self) -> str:
        """What the source is called (a folder, a list file, a shard pattern, an HDF5 file)."""
        ...

    @property
    def classes(self) -> tuple[str, ...]: ...

    @property
    def labels(self) -> np.ndarray:
        """Targets: int64 (N,) class indices, or float32 (N, K) multi-hot rows."""
        ...

    def __len__(self) -> int: ...

    def name(self, index: int) -> str:
        """The sample's file path, or where it lives inside a container (`SHARD.tar:KEY`,
        `FILE.h5:/images[7]`)."""
        ...


class SampleIndex(IndexBase, Protocol):
    """The contract a job reads an encoded-sample source through (see the module docstring)."""

    def read(self, indices: np.ndarray, into: ReadBuffer | None = None) -> Sequence[bytes | memoryview]:
        """The encoded bytes of `indices`, in that order (bytes, or views of a larger read: every
        decoder takes a bytes-like object), read into `into` where the index can (then valid
        until its next `start`); `ReadFailure` names the one that failed."""
        ...

    def read_sample(self, index: int) -> bytes:
        """One sample's bytes (OSError when it cannot be read)."""
        ...

    def files_of(self, indices: np.ndarray) -> list[str]:
        """The files these samples live in (what to evict from the page cache for a cold read)."""
        ...

    def to_segment(self) -> Segment:
        """Copy the index into a new shared-memory segment, for processes not forked from us."""
        ...


@runtime_checkable
class RemoteCapable(Protocol):
    """An index that may read samples from object storage, through the node cache (NOTE [node
    cache]): what the read-ahead of remote chunks (`_loading/order/read_ahead.py`) and the check of a
    full shuffle over remote data (`_loading/settings/sanity.py`) use, and all they use. An index
    declares it by implementing every member (`ExtentIndex` does); `remote_reads` is how the
    loader asks."""

    @property
    def remote(self) -> bool:
        """Whether any of its samples lies in object storage."""
        ...

    @property
    def remote_bytes(self) -> int:
        """The bytes of its remote objects (0 when all are local)."""
        ...

    @property
    def remote_chunk_count(self) -> int:
        """The chunks its remote objects are cut into."""
        ...

    def remote_chunks(self, indices: np.ndarray) -> list[tuple[RemoteFile, int]]:
        """The chunks these samples lie in: (the object, chunk number) each, in the order of the
        samples' objects."""
        ...

    def node_cache(self) -> NodeCache:
        """The node cache its remote objects are read through."""
        ...


@runtime_checkable
class DeclaresFields(Protocol):
    """An index that may hold declared fields (`ExtentIndex`, `PathIndex`): what the image job,
    the loader's checks, `pack` and a daemon's budget ask of one, through `declared_fields`."""

    @property
    def fields(self) -> FieldExtents | None:
        """Its declared fields; None: (image, label) samples."""
        ...

    @property
    def labels(self) -> np.ndarray:
        """int64 (N,) class indices (-1: none)."""
        ...

    def name(self, index: int) -> str:
        """Where sample `index` lives (what a failure names)."""
        ...

    def read_member(
        self, row: int, indices: np.ndarray, into: ReadBuffer | None = None
    ) -> list[bytes | memoryview]:
        """The members of ragged field `row` of samples `indices`, in that order."""
        ...


def declared_fields(index: object) -> DeclaresFields | None:
    """`index` when it declares fields, else None."""
    return index if isinstance(index, DeclaresFields) and index.fields is not None else None


def remote_reads(index: object) -> RemoteCapable | None:
    """`index` as a `RemoteCapable` when it declares it and some of its samples are remote; None
    otherwise (a local index, or one that cannot be remote)."""
    return index if isinstance(index, RemoteCapable) and index.remote else None


def pack_strings(strings: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 blob, int64 offsets of len + 1) holding `strings` end to end: how every index keeps
    names and paths (one blob, never a Python list per sample). The blob is a read-only view of
    the joined bytes, not a second copy of them."""
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, strings), dtype=np.int64, count=len(strings)), out=offsets[1:])
    return np.frombuffer(b"".join(strings), dtype=np.uint8), offsets


def read_file(
    path: str, into: ReadBuffer | None = None, beneath: Beneath | None = None
) -> bytes | memoryview:
    """A sample's bytes from storage, into `into` when given (one place, so tests can stand in
    a slow disk). It must be a regular file of at most `MAX_SAMPLE_BYTES` (NOTE [source bounds]:
    OSError naming it otherwise, never a read of /dev/zero or a wait on a FIFO), and lie under
    `beneath`'s roots when given (a confined daemon's job). Its size is taken when it is opened:
    bytes appended while it is read are left out."""
    fd, info = open_regular(path, MAX_SAMPLE_BYTES, beneath=beneath)
    try:
        if info.st_size == 0:  # no size to trust (procfs): read to the end, bounded
            return read_bounded(fd, MAX_SAMPLE_BYTES, path)
        if into is None:
            parts = []
            got = 0
            while got < info.st_size and (part := os.read(fd, info.st_size - got)):
                parts.append(part)
                got += len(part)
            return b"".join(parts)
        view = into.take(info.st_size)
        got = 0
        while got < len(view):
            n = os.readv(fd, [view[got:]])
            if n == 0:  # cut short since it was opened
                return view[:got]
            got += n
        return view
    finally:
        os.close(fd)


def target_row(labels: np.ndarray) -> np.ndarray | int:
    """One sample's target as a job writes it: an int (class index) or a float32 row."""
    return 0 if labels.ndim == 1 else np.zeros(labels.shape[1:], labels.dtype)


# Shared layout: header (count, blob bytes, target width (0: class indices), target dtype code),
# then int64 offsets[count + 1], targets[count (, width)], blob.
_SHARED_HEAD = struct.Struct("<qqqq")


class FileRead(NamedTuple):
    """A file an index makes workers read, and what it is to the index ("sample 3's file", "data
    file 0"): what a confined daemon's allowlist checks (`_daemon/confine.check_index`)."""

    path: str
    what: str


@dataclass(frozen=True)
class PathIndex:
    """Paths and targets of samples that are whole files: one bytes blob of every path plus
    offsets, never a Python list (see the module docstring)."""

    root: str
    classes: tuple[str, ...]
    path_blob: np.ndarray  # uint8: every path, UTF-8, concatenated
    path_offsets: np.ndarray  # int64, len(self) + 1
    labels: np.ndarray  # int64 (N,) or float32 (N, K)
    # A confined daemon's job opens its files beneath the daemon's roots (`_storage/beneath`); else by path.
    beneath: Beneath | None = field(default=None, repr=False, compare=False)
    # A file list's declared columns (`FileList(fields=...)`), held in memory; None: (image, label).
    fields: FieldExtents | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @classmethod
    def from_paths(
        cls,
        root: str,
        classes: Sequence[str],
        paths: Sequence[bytes],
        labels: np.ndarray,
        fields: FieldExtents | None = None,
    ) -> PathIndex:
        """An index of encoded `paths` (bytes, UTF-8 with surrogateescape) and their targets."""
        blob, offsets = pack_strings(paths)
        return cls(root, tuple(classes), blob, offsets, labels, fields=fields)

    def read_member(
        self, row: int, indices: np.ndarray, into: ReadBuffer | None = None
    ) -> list[bytes | memoryview]:
        """The cells of ragged field `row` of `indices` (views of the fields' memory)."""
        assert self.fields is not None
        return self.fields.in_memory(row, np.asarray(indices, np.int64))

    def path(self, index: int) -> str:
        start, end = int(self.path_offsets[index]), int(self.path_offsets[index + 1])
        return self.path_blob[start:end].tobytes().decode("utf-8", "surrogateescape")

    def name(self, index: int) -> str:
        return self.path(index)

    def read_sample(self, index: int) -> bytes:
        return bytes(read_file(self.path(index), None, self.beneath))

    def files_of(self, indices: np.ndarray) -> list[str]:
        return [self.path(int(i)) for i in indices]

    def files_read(self) -> Iterator[FileRead]:
        """One file per sample."""
        return (FileRead(self.path(i), f"sample {i}'s file") for i in range(len(self)))

    def read(self, indices: np.ndarray, into: ReadBuffer | None = None) -> list[bytes | memoryview]:
        blobs = []
        for position, i in enumerate(np.asarray(indices).tolist()):
            try:
                blobs.append(read_file(self.path(i), into, self.beneath))
            except OSError as e:
                raise ReadFailure(position, e) from e
        return blobs

    def to_segment(self) -> Segment:
        if self.fields is not None:  # shared by `FieldsPathIndex`, whose name tells a worker they follow
            raise ValueError("an index with declared fields is shared as a FieldsPathIndex")
        return self._segment(0)[0]

    def _segment(self, extra: int) -> tuple[Segment, int]:
        """A new segment holding the index, with `extra` bytes after it, and where they start."""
        n, blob_len = len(self), int(self.path_blob.shape[0])
        width = int(self.labels.shape[1]) if self.labels.ndim == 2 else 0
        dtype_code = TARGET_DTYPES.index(self.labels.dtype)
        end = _SHARED_HEAD.size + 8 * (n + 1) + _align8(int(self.labels.nbytes)) + max(blob_len, 1)
        segment = Segment.create(_align8(end) + extra if extra else end)
        _SHARED_HEAD.pack_into(segment.buf, 0, n, blob_len, width, dtype_code)
        offsets, labels, blob = _shared_views(segment)
        offsets[:] = self.path_offsets
        labels[:] = self.labels
        blob[:] = self.path_blob
        return segment, _paths_end(segment)

    @classmethod
    def from_segment(cls, segment: Segment, root: str = "", beneath: Beneath | None = None) -> PathIndex:
        """An index over a segment made by `to_segment` (views, no copy), opening its files
        through `beneath` when given."""
        offsets, labels, blob = _shared_views(segment)
        return cls(root, (), blob, offsets, labels, beneath)


@dataclass(frozen=True)
class FieldsPathIndex(PathIndex):
    """A file list's index with its declared columns (`fields`, held in memory: `FileList(fields=
    ...)`), shared with them: its segment is a `PathIndex`'s followed by the fields section
    (`field_extents.write_section`)."""

    def to_segment(self) -> Segment:
        assert self.fields is not None
        segment, at = self._segment(section_bytes(self.fields))
        write_section(segment.buf, at, self.fields)
        return segment

    @classmethod
    def from_segment(
        cls, segment: Segment, root: str = "", beneath: Beneath | None = None
    ) -> FieldsPathIndex:
        offsets, labels, blob = _shared_views(segment)
        fields = read_section(segment.buf, _paths_end(segment), len(labels))
        return cls(root, (), blob, offsets, labels, beneath, fields=fields)


def _paths_end(segment: Segment) -> int:
    """Where what follows a `PathIndex`'s arrays in its segment starts (a multiple of 8)."""
    n, blob_len, width, dtype_code = _SHARED_HEAD.unpack_from(segment.buf, 0)
    target_bytes = _align8(n * max(width, 1) * TARGET_DTYPES[dtype_code].itemsize)
    return _align8(_SHARED_HEAD.size + 8 * (n + 1) + target_bytes + max(blob_len, 1))


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8


def _shared_views(segment: Segment) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, blob_len, width, dtype_code = _SHARED_HEAD.unpack_from(segment.buf, 0)
    dtype = TARGET_DTYPES[dtype_code]
    shape = (n, width) if width else (n,)
    at = _SHARED_HEAD.size
    offsets = np.ndarray((n + 1,), np.int64, buffer=segment.buf, offset=at)
    at += 8 * (n + 1)
    labels = np.ndarray(shape, dtype, buffer=segment.buf, offset=at)
    at += _align8(int(labels.nbytes))
    blob = np.ndarray((blob_len,), np.uint8, buffer=segment.buf, offset=at)
    return offsets, labels, blob
