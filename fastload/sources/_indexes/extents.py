"""Samples that are byte ranges inside container files (tar shards, packed data files): `ExtentIndex`.

Its one responsibility is reading a batch's ranges cheaply. A batch's extents are sorted by (file,
offset) and neighbours closer than `gap` bytes are read with one `os.pread`; each sample is then
a zero-copy `memoryview` of that read, handed back in the batch's order (every decoder takes a
bytes-like object). Files are opened lazily, once per process (a forked worker opens its own: a
descriptor's readahead state is shared with the process it came from), with
`POSIX_FADV_SEQUENTIAL`.

Readahead (NOTE [extent readahead]): a block-shuffled batch takes a few samples of each of a few
runs, and the next batches of its window take the rest. When a batch touches several samples of
one stretch of a file, the index asks the kernel (`POSIX_FADV_WILLNEED`) to read that stretch
through the next `readahead` samples in the background, so the later batches find it cached.

Identity (NOTE [extent file identity]): an index may carry each file's identity as it was when
indexed (device, inode, size, mtime and ctime in ns). A process opening a file compares it (one
fstat per open, not per read) and refuses one that is not a regular file or is not the file
indexed: a shard replaced under a running loader (even with its size and mtime kept) fails the
batch with a DatasetError naming the file, instead of being read at the old scan's offsets with
the old scan's labels. Descriptors already open keep reading the file they opened (its old
inode, when it was replaced by a rename).

Remote containers (`RemoteFile` entries of `files`) are read through the node cache, and the index
implements `RemoteCapable` (`sample_index.py`) for the read-ahead of their chunks. A process's
descriptors and positioned reads are `extent_files.py`'s; the shared-memory layout is
`extent_layout.py`'s.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from fastload._errors import DatasetError, SourceChanged
from fastload._shm import Segment
from fastload.sources._indexes.extent_files import MAX_OPEN_FILES, Handles, pread_all, short_read
from fastload.sources._indexes.extent_layout import (
    IDENTITY_FIELDS,
    SharedExtents,
    read_segment,
    write_segment,
)
from fastload.sources._indexes.field_extents import FieldExtents
from fastload.sources._indexes.sample_index import TARGET_DTYPES, FileRead, ReadBuffer, ReadFailure
from fastload.sources._storage.beneath import Beneath, open_file
from fastload.sources._storage.bounds import check_regular, clip, identity
from fastload.sources._storage.remote_file import RemoteFile

if TYPE_CHECKING:
    from fastload.sources._storage.node_cache import NodeCache

DEFAULT_GAP = 64 << 10  # bytes between two extents still read as one
DEFAULT_READAHEAD = 32  # samples past a touched stretch to ask the kernel for
DEFAULT_READAHEAD_BYTES = 4 << 20  # ... but no more bytes than this past its last touched sample

# NOTE [extent readahead]: a full shuffle over a large file must not read ahead (every sample it
# touches is alone: 32 samples read for one would be a 32x read amplification), while a block
# shuffle's batch touches ~R / window samples of each of its runs. So readahead is asked only
# for a cluster of at least `_CLUSTER` samples of the batch lying within `readahead` samples of
# each other in the same file: from the cluster's first sample through `readahead` samples past
# its last one (at most `readahead_bytes` past it). Under a full shuffle of N samples, three of a
# batch of B within 2 x readahead of each other is rare (~B^3 (2 x 32 / N)^2 / 6: 7 batches in a
# thousand for ImageNet's 1.28 M and B = 256, each then asking for ~32 samples more).
#
# What a process asked for lately is remembered, so as not to ask again: `extent_files.py`.
_CLUSTER = 3

_MAX_FILE_BYTES = 1 << 50  # a container file may be any size; only its samples are bounded

_fork_lock = threading.Lock()


def _new_lock_in_child() -> None:
    global _fork_lock
    _fork_lock = threading.Lock()  # a lock held by another thread at fork would stay held here


os.register_at_fork(after_in_child=_new_lock_in_child)


@dataclass(eq=False)
class ExtentIndex:
    """Samples stored as (file, offset, size) extents, with their keys and targets, in numpy
    arrays (never a Python object per sample): `files` the container paths, `file_ids` int32,
    `offsets` and `sizes` int64, `key_blob` + `key_offsets` each sample's key inside its file
    (a tar member's name without its extension), `labels` int64 (N,) or float32 (N, K).

    Reads coalesce extents closer than `gap` bytes; `readahead` samples (at most
    `readahead_bytes` bytes) past a stretch a batch reads several samples of are requested from
    the kernel ahead of time (0: never); see the module docstring.
    """

    root: str
    classes: tuple[str, ...]
    files: tuple[str, ...]
    file_ids: np.ndarray = field(repr=False)
    offsets: np.ndarray = field(repr=False)
    sizes: np.ndarray = field(repr=False)
    key_blob: np.ndarray = field(repr=False)
    key_offsets: np.ndarray = field(repr=False)
    labels: np.ndarray = field(repr=False)
    _: KW_ONLY
    gap: int = DEFAULT_GAP
    readahead: int = DEFAULT_READAHEAD
    readahead_bytes: int = DEFAULT_READAHEAD_BYTES
    # int64 (files, 5): each file's identity when indexed (NOTE [extent file identity]); None:
    # not checked
    file_identities: np.ndarray | None = field(default=None, repr=False)
    # Remote files (`remote_file` entries of `files`) are read through this node cache
    # (NOTE [node cache]): its directory (None: the default) and limit in bytes (None: the default).
    cache_dir: str | None = None
    cache_limit: int | None = None
    # A confined daemon's job opens its files beneath the daemon's roots (`_storage/beneath`); else by path.
    beneath: Beneath | None = field(default=None, repr=False, compare=False)
    # The declared fields (`TarShards(fields=...)`) and their ragged members' extents; None: (image, label).
    fields: FieldExtents | None = field(default=None, repr=False)

    def files_read(self) -> Iterator[FileRead]:
        """Its container files: shards, or a pack's data files (each also held to its recorded
        identity: `file_identities`, NOTE [extent file identity])."""
        return (FileRead(file, f"data file {k}") for k, file in enumerate(self.files))

    def __post_init__(self) -> None:
        n = int(self.labels.shape[0])
        expected = {
            "file_ids": (self.file_ids, np.int32, (n,)),
            "offsets": (self.offsets, np.int64, (n,)),
            "sizes": (self.sizes, np.int64, (n,)),
            "key_offsets": (self.key_offsets, np.int64, (n + 1,)),
            "key_blob": (self.key_blob, np.uint8, self.key_blob.shape),
        }
        for what, (array, dtype, shape) in expected.items():
            if array.dtype != dtype or array.shape != shape:
                raise ValueError(f"{what} must be {np.dtype(dtype)} {shape}, got {array.dtype} {array.shape}")
        if self.labels.dtype not in TARGET_DTYPES or self.labels.ndim not in (1, 2):
            raise ValueError(
                f"labels must be int64 (N,) or float32 (N, K), got {self.labels.dtype} {self.labels.shape}"
            )
        self.classes, self.files = tuple(self.classes), tuple(self.files)
        if self.fields is not None and self.fields.sizes.shape[1] != n:
            raise ValueError(f"fields hold {self.fields.sizes.shape[1]} samples' members, the index {n}")
        ids = self.file_identities
        if ids is not None and (ids.dtype != np.int64 or ids.shape != (len(self.files), IDENTITY_FIELDS)):
            got = f"{ids.dtype} {ids.shape}"
            raise ValueError(f"file_identities must be int64 ({len(self.files)}, 5), got {got}")
        self._remote = tuple(RemoteFile.of(f) for f in self.files)
        paths = [r.url if r is not None else f for f, r in zip(self.files, self._remote, strict=True)]
        self._basenames = tuple(os.path.basename(p) for p in paths)
        # Readahead needs storage order: each file's samples consecutive, at increasing offsets.
        # `_file_end[f]`: one past the last sample of file f.
        self._file_end: np.ndarray | None = None
        local = all(r is None for r in self._remote)  # the kernel reads ahead local files only
        if self.readahead > 0 and n and local and self._in_storage_order():
            self._file_end = np.searchsorted(self.file_ids, np.arange(len(self.files)), side="right")
        self._handles = Handles()

    def _in_storage_order(self) -> bool:
        ids, offsets = self.file_ids, self.offsets
        same = ids[1:] == ids[:-1]
        return bool(np.all(ids[1:] >= ids[:-1]) and np.all(offsets[1:][same] >= offsets[:-1][same]))

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_handles"] = None  # descriptors stay in their process
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._handles = Handles()

    def __del__(self) -> None:
        handles = getattr(self, "_handles", None)
        if handles is not None:
            handles.close()

    def close(self) -> None:
        """Close this process's descriptors (they are opened again when next read)."""
        with _fork_lock:
            self._handles.close()

    def key(self, index: int) -> str:
        start, end = int(self.key_offsets[index]), int(self.key_offsets[index + 1])
        return self.key_blob[start:end].tobytes().decode("utf-8", "surrogateescape")

    def name(self, index: int) -> str:
        """`FILE:KEY`, FILE the container's base name (`train-000003.tar:n01440764_10026`); KEY
        alone where it names its container already (a file list's object: `n00/img_000.JPEG`)."""
        key, base = self.key(index), self._basenames[int(self.file_ids[index])]
        return key if key == base or key.endswith("/" + base) else f"{base}:{key}"

    def _fd(self, file_id: int) -> int:
        handles = self._handles
        if handles.pid != os.getpid():  # forked: open our own (NOTE in the module docstring)
            with _fork_lock:
                if self._handles.pid != os.getpid():
                    self._handles.close()
                    self._handles = Handles()
            handles = self._handles
        fd = handles.fds.pop(file_id, None)
        if fd is None:
            with _fork_lock:
                while len(handles.fds) >= MAX_OPEN_FILES:
                    os.close(handles.fds.pop(next(iter(handles.fds))))
                fd = self._open_checked(file_id)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        handles.fds[file_id] = fd  # now the most recently used
        return fd

    def _open_checked(self, file_id: int) -> int:
        """A descriptor of file `file_id`, when it is a regular file and the one indexed (NOTE
        [extent file identity]): OSError when it cannot be opened, DatasetError when it changed."""
        path = self.files[file_id]
        fd = open_file(path, self.beneath)  # non-blocking: a FIFO does not wait
        try:
            info = os.fstat(fd)
            check_regular(path, info, _MAX_FILE_BYTES, "container file")
            ids = self.file_identities
            if ids is not None and ids[file_id, 0] != -1 and tuple(ids[file_id].tolist()) != identity(info):
                was = int(ids[file_id, 2])
                how = (
                    f"truncated: {info.st_size:,} bytes, was {was:,}"
                    if info.st_size < was
                    else "another file, or rewritten: its inode, size or times differ"
                )
                raise SourceChanged(
                    f"{clip(path)} changed since it was indexed ({how}): its samples' places and labels "
                    "are not this file's; make the loader again to index it as it is now",
                    info.st_size,
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def files_of(self, indices: np.ndarray) -> list[str]:
        return [self.files[int(f)] for f in np.unique(self.file_ids[np.asarray(indices, np.int64)])]

    def read_sample(self, index: int) -> bytes:
        """One sample's bytes, through a descriptor of its own (safe from any thread)."""
        i = int(index)
        size, offset = int(self.sizes[i]), int(self.offsets[i])
        remote = self._remote[int(self.file_ids[i])]
        if remote is not None:
            return self._read_remote(remote, offset, offset + size)
        fd = self._open_checked(int(self.file_ids[i]))
        try:
            data = pread_all(fd, size, offset)
        finally:
            os.close(fd)
        if len(data) < size:
            raise short_read(self.files[int(self.file_ids[i])], offset, size, len(data))
        return bytes(data)

    def read(self, indices: np.ndarray, into: ReadBuffer | None = None) -> list[bytes | memoryview]:
        """The encoded bytes of `indices` in that order, as views of a few coalesced reads (into
        `into`'s memory when given)."""
        idx = np.asarray(indices, dtype=np.int64)
        if len(idx) and self._file_end is not None:
            self._advise(np.unique(idx))
        return self._read_extents(idx, self.offsets[idx], self.sizes[idx], into)

    def read_member(
        self, row: int, indices: np.ndarray, into: ReadBuffer | None = None
    ) -> list[bytes | memoryview]:
        """The members of ragged field `row` (`fields.ragged`) of `indices`, read as `read` reads
        images (a missing member, size -1, is read as empty: the caller checks `fields.sizes`)."""
        assert self.fields is not None
        idx = np.asarray(indices, dtype=np.int64)
        sizes = np.maximum(self.fields.sizes[row, idx], 0)
        return self._read_extents(idx, self.fields.offsets[row, idx], sizes, into)

    def _read_extents(
        self, idx: np.ndarray, starts: np.ndarray, sizes: np.ndarray, into: ReadBuffer | None
    ) -> list[bytes | memoryview]:
        """The bytes at (`starts`, `sizes`) of the files of samples `idx`, in that order."""
        n = len(idx)
        out: list[bytes | memoryview] = [b""] * n
        if n == 0:
            return out
        ids = self.file_ids[idx]
        ends = starts + sizes
        order = np.lexsort((starts, ids)).tolist()
        ids_l, starts_l, ends_l = ids.tolist(), starts.tolist(), ends.tolist()
        k = 0
        while k < n:
            first = order[k]
            file_id, lo, hi = ids_l[first], starts_l[first], ends_l[first]
            j = k + 1
            while j < n and ids_l[order[j]] == file_id and starts_l[order[j]] <= hi + self.gap:
                hi = max(hi, ends_l[order[j]])
                j += 1
            group = order[k:j]
            try:
                remote = self._remote[file_id]
                data: bytes | memoryview = (
                    self._read_remote(remote, lo, hi)
                    if remote is not None
                    else pread_all(self._fd(file_id), hi - lo, lo, into)
                )
            except SourceChanged as e:  # name a sample now past its end, if the file was cut
                past = [p for p in group if ends_l[p] > e.size]
                raise ReadFailure(min(past or group), e) from e
            except OSError as e:
                raise ReadFailure(min(group), e) from e
            view = memoryview(data)
            for p in group:
                if ends_l[p] - lo > len(data):
                    size, got = ends_l[p] - starts_l[p], len(data) + lo - starts_l[p]
                    raise ReadFailure(p, short_read(self.files[file_id], starts_l[p], size, got))
                out[p] = view[starts_l[p] - lo : ends_l[p] - lo]
            k = j
        return out

    @property
    def remote(self) -> bool:
        """Whether any of its containers is a remote object (read through the node cache)."""
        return any(r is not None for r in self._remote)

    @property
    def remote_bytes(self) -> int:
        """The bytes of its remote containers (0 when all are local)."""
        return sum(r.size for r in self._remote if r is not None)

    @property
    def remote_chunk_count(self) -> int:
        """The chunks its remote containers are cut into (NOTE [node cache])."""
        return sum(r.chunks for r in self._remote if r is not None)

    def remote_chunks(self, indices: np.ndarray) -> list[tuple[RemoteFile, int]]:
        """The chunks of remote containers (NOTE [node cache]) these samples lie in, in the order
        of the samples' containers: (`RemoteFile`, chunk number) each."""
        idx = np.asarray(indices, dtype=np.int64)
        found: list[tuple[RemoteFile, int]] = []
        for file_id in np.unique(self.file_ids[idx]).tolist():
            remote = self._remote[file_id]
            if remote is None:
                continue
            chunk_bytes = remote.chunk_bytes
            mine = idx[self.file_ids[idx] == file_id]
            starts, ends = self.offsets[mine], self.offsets[mine] + self.sizes[mine]
            chunks: set[int] = set()
            firsts, lasts = (starts // chunk_bytes).tolist(), ((ends - 1) // chunk_bytes).tolist()
            for lo, hi in zip(firsts, lasts, strict=True):
                chunks.update(range(lo, hi + 1))
            found.extend((remote, c) for c in sorted(chunks))
        return found

    def node_cache(self) -> NodeCache:
        """The node cache its remote containers are read through (`node_cache.NodeCache`)."""
        from fastload.sources._storage.node_cache import node_cache

        return node_cache(self.cache_dir, self.cache_limit)

    def _read_remote(self, remote: RemoteFile, start: int, end: int) -> bytes:
        from fastload.sources._storage.node_cache import node_cache

        url, size, version, chunk_bytes = remote
        return node_cache(self.cache_dir, self.cache_limit).read(url, version, size, start, end, chunk_bytes)

    def _advise(self, touched: np.ndarray) -> None:
        """WILLNEED for the stretches a batch reads several samples of (NOTE [extent readahead])."""
        assert self._file_end is not None
        ids = self.file_ids[touched]
        # Clusters: sorted touched samples, split where the file changes or the next is too far.
        cut = np.flatnonzero((np.diff(touched) > self.readahead) | (ids[1:] != ids[:-1])) + 1
        bounds = np.concatenate(([0], cut, [len(touched)]))
        big = np.flatnonzero(np.diff(bounds) >= _CLUSTER)
        for c in big.tolist():
            first, last = int(touched[bounds[c]]), int(touched[bounds[c + 1] - 1])
            file_id = int(ids[bounds[c]])
            through = min(last + self.readahead, int(self._file_end[file_id]) - 1)
            start = int(self.offsets[first])
            end = int(self.offsets[through] + self.sizes[through])
            end = min(end, int(self.offsets[last] + self.sizes[last]) + self.readahead_bytes)
            try:
                fd = self._fd(file_id)
                stretch = self._handles.not_yet_advised(file_id, start, end)
                if stretch is not None:
                    os.posix_fadvise(fd, stretch[0], stretch[1] - stretch[0], os.POSIX_FADV_WILLNEED)
            except (OSError, DatasetError):
                return  # advice only: the read that follows reports what is wrong

    def to_segment(self) -> Segment:
        """Copy the index (file list included) into a new shared-memory segment."""
        shared = SharedExtents(
            self.files,
            self.file_ids,
            self.offsets,
            self.sizes,
            self.key_blob,
            self.key_offsets,
            self.labels,
            self.file_identities,
            (self.gap, self.readahead, self.readahead_bytes),
            self.fields,
        )
        return write_segment(shared)

    @classmethod
    def from_segment(cls, segment: Segment, root: str = "", beneath: Beneath | None = None) -> ExtentIndex:
        """An index over a segment made by `to_segment` (views, no copy; the file list decoded),
        opening its files through `beneath` when given. It reads remote files through the
        attaching process's default node cache (a daemon's: NOTE [the daemon's cache] in
        `_daemon/sessions.py`); `cache_dir` and `cache_limit` do not travel."""
        shared = read_segment(segment)
        gap, readahead, readahead_bytes = shared.tuning
        return cls(
            root,
            (),
            shared.files,
            shared.file_ids,
            shared.offsets,
            shared.sizes,
            shared.key_blob,
            shared.key_offsets,
            shared.labels,
            gap=gap,
            readahead=readahead,
            readahead_bytes=readahead_bytes,
            file_identities=shared.file_identities,
            beneath=beneath,
            fields=shared.fields,
        )


