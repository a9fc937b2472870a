"""Sources of fixed-shape arrays: rows delivered as stored, no decoding (`ArrayIndex`).

A source whose samples are rows of one numeric array (images already decoded, feature vectors)
opens into an `ArrayIndex` instead of a `SampleIndex`: the loader then runs an `ArrayJob`, which
asks the index to write a batch's rows straight into the slot (`read_into`), and delivers
`[rows, targets]`. `MappedRows` is the fastest way to do that for an array whose bytes lie raw in
a file (contiguous, or in uncompressed chunks of whole rows): a memory map of the file and one
numpy gather per batch, with no library call per row or per chunk.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from fastload.sources._indexes.sample_index import IndexBase, ReadFailure

# At most this many bytes of rows are gathered into one temporary array (rows[offsets] copies):
# a batch of large rows (decoded images) is gathered in pieces, each then copied into the slot.
_GATHER_BYTES = 4 << 20


@runtime_checkable
class ArrayIndex(IndexBase, Protocol):
    """The contract an `ArrayJob` reads a fixed-shape array source through."""

    @property
    def row_shape(self) -> tuple[int, ...]:
        """One sample's shape (the array's shape without its first axis)."""
        ...

    @property
    def row_dtype(self) -> np.dtype:
        """The rows' dtype in a batch (native byte order)."""
        ...

    def read_into(self, indices: np.ndarray, out: np.ndarray) -> int:
        """Write rows `indices` into `out` (len(indices), *row_shape) in that order; return the bytes
        read from storage. `ReadFailure` names a batch position whose row could not be read."""
        ...

    def close(self) -> None:
        """Let go of what this process opened to read (reopened on the next read)."""
        ...


class PerProcess:
    """A value that one process opened for itself (a file handle, a memory map): never used by a
    forked child, which opens its own, and never pickled (an unpickled copy starts empty)."""

    def __init__(self) -> None:
        self.pid = -1
        self.value: Any = None

    def get(self) -> Any:
        """This process's value, or None when it has opened none yet."""
        return self.value if self.pid == os.getpid() else None

    def set(self, value: Any) -> Any:
        self.pid, self.value = os.getpid(), value
        return value

    def take(self) -> Any:
        """Forget this process's value and return it (to be closed), or None."""
        value = self.get()
        self.pid, self.value = -1, None
        return value

    def __reduce__(self) -> tuple[type[PerProcess], tuple[()]]:
        return PerProcess, ()


@dataclass(frozen=True)
class MappedRows:
    """Rows lying raw (uncompressed, native byte order) in a file, in blocks of `block_rows` rows:
    block b starts at byte `block_offsets[b]` (one block: a contiguous array; one per chunk: a
    chunked one). Each process maps the file once, read-only, and gathers a batch with numpy."""

    path: str
    block_offsets: np.ndarray  # int64, one per block of `block_rows` rows
    block_rows: int
    row_bytes: int
    _map: PerProcess = field(default_factory=PerProcess, init=False, repr=False, compare=False)

    def _rows(self) -> np.ndarray:
        """The file as overlapping rows, one starting at every byte: rows[o] is the row at byte o."""
        rows = self._map.get()
        if rows is None:
            with open(self.path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            count = len(mapped) - self.row_bytes + 1
            rows = self._map.set(
                np.ndarray((count,), np.dtype((np.void, self.row_bytes)), buffer=mapped, strides=(1,))
            )
        return rows  # type: ignore[no-any-return]

    def read_into(self, indices: np.ndarray, out: np.ndarray) -> int:
        """Gather rows `indices` into `out` in batch order: one numpy gather (per few MiB)."""
        try:
            rows = self._rows()
        except OSError as e:
            raise ReadFailure(0, e) from e
        blocks = indices // self.block_rows
        offsets = self.block_offsets[blocks] + (indices - blocks * self.block_rows) * self.row_bytes
        target = out.reshape(len(out), -1).view(np.dtype((np.void, self.row_bytes)))[:, 0]
        step = max(1, _GATHER_BYTES // self.row_bytes)
        for at in range(0, len(offsets), step):
            target[at : at + step] = rows[offsets[at : at + step]]
        return len(indices) * self.row_bytes

    def close(self) -> None:
        self._map.take()  # the map is unmapped once no batch view of it is left
