"""`MixIndex`: one index over the opened children of a `sources.Mix`, reads routed to each child.

Sample numbers run through the children end to end (child 0's samples first, then child 1's,
...): global number `offsets[k] + i` is sample `i` of child `k`. A read of a batch groups its
samples by child, reads each group through the child's own index (so a pack is still read by
ranges, a folder by files), and puts the bytes back in the batch's order. Targets are each
child's own (class indices are not merged: NOTE [a mix's labels] in `_formats/mix.py`).
The order of an epoch (which child's samples, how many) is the loader's `MixturePlan`
(`_loading/order/mixture.py`), from `sizes` and `counts` here. It is `RemoteCapable` through
its remote children (NOTE [a mix's remote reads]).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from fastload._shm import Segment
from fastload.sources._indexes.sample_index import (
    FileRead,
    ReadBuffer,
    ReadFailure,
    RemoteCapable,
    SampleIndex,
    remote_reads,
)

if TYPE_CHECKING:
    from fastload.sources._storage.node_cache import NodeCache
    from fastload.sources._storage.remote_file import RemoteFile


@runtime_checkable
class _ReadsFiles(Protocol):
    """An index that can say every file it makes a worker read (the shared index types can)."""

    def files_read(self) -> Iterator[FileRead]: ...


@dataclass(frozen=True)
class MixIndex:
    """The children's indices as one (see the module docstring).

    `counts[k]`: child k's samples in each epoch (from the mix's weights and epoch size);
    `classes`: the children's common class names, or () where they differ."""

    root: str
    classes: tuple[str, ...]
    children: tuple[SampleIndex, ...]
    counts: tuple[int, ...]
    labels: np.ndarray  # every child's targets, end to end (int64 (N,) or float32 (N, K))
    offsets: np.ndarray  # int64, len(children) + 1: where each child's numbers start

    @classmethod
    def of(
        cls, root: str, classes: tuple[str, ...], children: Sequence[SampleIndex], counts: Sequence[int]
    ) -> MixIndex:
        """An index over opened `children` whose targets are of one kind (the caller checked)."""
        sizes = np.array([len(c) for c in children], dtype=np.int64)
        offsets = np.zeros(len(children) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        labels = np.concatenate([c.labels for c in children])
        return cls(root, classes, tuple(children), tuple(int(c) for c in counts), labels, offsets)

    @property
    def sizes(self) -> tuple[int, ...]:
        """Each child's sample count."""
        return tuple(int(n) for n in np.diff(self.offsets))

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def source_of(self, indices: np.ndarray) -> np.ndarray:
        """The child (its position in the mix) each of `indices` comes from, int64."""
        return np.searchsorted(self.offsets, np.asarray(indices, dtype=np.int64), side="right") - 1

    def _local(self, index: int) -> tuple[int, int]:
        k = int(self.source_of(np.array([index]))[0])
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} is not within the mix's {len(self)} samples")
        return k, index - int(self.offsets[k])

    def name(self, index: int) -> str:
        """`K:NAME`: the child's position in the mix, and the sample's name in it."""
        k, local = self._local(index)
        return f"{k}:{self.children[k].name(local)}"

    def read_sample(self, index: int) -> bytes:
        k, local = self._local(index)
        return self.children[k].read_sample(local)

    def read(self, indices: np.ndarray, into: ReadBuffer | None = None) -> list[bytes | memoryview]:
        indices = np.asarray(indices, dtype=np.int64)
        which = self.source_of(indices)
        blobs: list[bytes | memoryview | None] = [None] * len(indices)
        for k in np.unique(which).tolist():
            positions = np.flatnonzero(which == k)
            try:
                got = self.children[k].read(indices[positions] - self.offsets[k], into)
            except ReadFailure as e:  # its position among the child's group: make it the batch's
                raise ReadFailure(int(positions[e.position]), e.cause) from e.cause
            for p, blob in zip(positions.tolist(), got, strict=True):
                blobs[p] = blob
        return blobs  # type: ignore[return-value]  # every position was filled above

    def files_of(self, indices: np.ndarray) -> list[str]:
        indices = np.asarray(indices, dtype=np.int64)
        which = self.source_of(indices)
        files: list[str] = []
        for k in np.unique(which).tolist():
            files += self.children[k].files_of(indices[which == k] - self.offsets[k])
        return files

    def files_read(self) -> Iterator[FileRead]:
        """The union of the children's (each child's own description after its position, `source K: ...`)."""
        for k, child in enumerate(self.children):
            if isinstance(child, _ReadsFiles):
                for read in child.files_read():
                    yield FileRead(read.path, f"source {k}: {read.what}")

    # NOTE [a mix's remote reads]: the loader reads ahead through one node cache (`ReadAhead`) and
    # checks a full shuffle against one cache's limit. A mix is remote when any child is; its
    # remote bytes and chunks are those of the children read through the first remote child's
    # cache (a child with its own cache_dir or cache_limit is read on demand by its workers, not
    # read ahead, and left out of the check).
    def _remote_children(self) -> list[tuple[int, RemoteCapable]]:
        """(position, child) of each remote child read through the first one's node cache."""
        remote = [(k, r) for k, child in enumerate(self.children) if (r := remote_reads(child)) is not None]
        return [(k, r) for k, r in remote if r.node_cache() is remote[0][1].node_cache()]

    @property
    def remote(self) -> bool:
        return bool(self._remote_children())

    @property
    def remote_bytes(self) -> int:
        return sum(r.remote_bytes for _, r in self._remote_children())

    @property
    def remote_chunk_count(self) -> int:
        return sum(r.remote_chunk_count for _, r in self._remote_children())

    def remote_chunks(self, indices: np.ndarray) -> list[tuple[RemoteFile, int]]:
        indices = np.asarray(indices, dtype=np.int64)
        which = self.source_of(indices)
        chunks: list[tuple[RemoteFile, int]] = []
        for k, child in self._remote_children():
            mine = indices[which == k] - self.offsets[k]
            if len(mine):
                chunks += child.remote_chunks(mine)
        return chunks

    def node_cache(self) -> NodeCache:
        """The first remote child's node cache (ValueError when no child is remote)."""
        remote = self._remote_children()
        if not remote:
            raise ValueError("no source of this mix is remote: it reads through no node cache")
        return remote[0][1].node_cache()

    def close(self) -> None:
        """Let go of what each child opened in this process (an HDF5 file's handle, shard fds)."""
        for child in self.children:
            close = getattr(child, "close", None)
            if callable(close):
                close()

    def to_segment(self) -> Segment:
        raise ValueError(
            "a mix's index is not shared through a segment (its children are of several index types): "
            "a daemon does not serve sources.Mix"
        )
