"""`MixIndex`: one index over the opened children of a `sources.Mix`, reads routed to each child.

Sample numbers run through the children end to end (child 0's samples first, then child 1's,
...): global number `offsets[k] + i` is sample `i` of child `k`. A read of a batch groups its
samples by child, reads each group through the child's own index (so a pack is still read by
ranges, a folder by files), and puts the bytes back in the batch's order. Targets are each
child's own (class indices are not merged: NOTE [a mix's labels] in `_formats/mix.py`).
The order of an epoch (which child's samples, how many) is the loader's `MixturePlan`
(`_loading/order/mixture.py`), from `sizes` and `counts` here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from fastload._shm import Segment
from fastload.sources._indexes.sample_index import FileRead, ReadBuffer, ReadFailure, SampleIndex


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
