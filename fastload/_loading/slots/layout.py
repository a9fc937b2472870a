"""Batch layouts: where each leaf of a batch lives inside a ring slot, and how to rebuild it.

A sample is a tree (tuple/list/dict with string keys) whose leaves are fixed-shape numpy arrays,
torch tensors or numbers. Its layout lists the leaves (dtype and per-sample shape) and the tree's
shape as JSON, so it can cross a socket without pickling. A slot holds, per leaf, one contiguous
(batch_size, *shape) array, 64-byte aligned: workers write samples straight into it
(`fast_collate`), and the trainer rebuilds the tree as `default_collate` would (tuples and lists
become lists, numbers become tensors of their default dtype).

NOTE [ragged leaves]: a declared field of byte strings of any length (text, JSON, raw bytes:
`sources._indexes.field_extents`) travels in the slot too, never pickled: its tree node
`{"ragged": [bytes leaf, lengths leaf], "as": "str" | "json" | "bytes"}` names two ordinary leaves,
uint8 (capacity,) and int64 (), so each row holds one sample's member from its own place and a
batch split into row ranges (NOTE [split batches]) needs no coordination. The trainer copies
each row's bytes out (`decode_ragged`: utf-8 str, json.loads, bytes) when it hands the batch out;
those leaves never go to a GPU. The tree stays JSON: a layout crosses a daemon's socket as text.
Only a source declaring `fields=` makes ragged nodes, and a daemon that predates them refuses such
a hello by name (its tar source has no field `fields`), so the wire's version stays 1.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_ALIGN = 64

# Python numbers collate to these dtypes, as torch's default_collate does.
_NUMBER_DTYPES: dict[type, str] = {bool: "bool", int: "int64", float: "float64"}


class LayoutMismatch(Exception):
    """A sample's tree, shapes or dtypes differ from the batch layout (internal; never escapes)."""


@dataclass(frozen=True)
class Leaf:
    """One leaf of a sample: numpy dtype name and per-sample shape."""

    dtype: str
    shape: tuple[int, ...]

    @functools.cached_property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))


@dataclass(frozen=True)
class BatchLayout:
    """The leaves of a batch, the tree they form, and their offsets within a slot."""

    leaves: tuple[Leaf, ...]
    tree: Any  # JSON: {"leaf": i} | {"list": [...]} | {"dict": [[key, subtree], ...]}
    batch_size: int

    @functools.cached_property  # read on every batch the trainer takes: worked out once
    def offsets(self) -> tuple[int, ...]:
        offsets, pos = [], 0
        for leaf in self.leaves:
            offsets.append(pos)
            pos += (leaf.nbytes * self.batch_size + _ALIGN - 1) // _ALIGN * _ALIGN
        return tuple(offsets)

    @functools.cached_property
    def slot_bytes(self) -> int:
        last = self.leaves[-1]
        return max(_ALIGN, self.offsets[-1] + last.nbytes * self.batch_size)

    def arrays(self, buf: Any, count: int | None = None) -> list[np.ndarray]:
        """Return one (count, *shape) numpy view per leaf over a slot's buffer."""
        n = self.batch_size if count is None else count
        views = []
        for leaf, offset in zip(self.leaves, self.offsets, strict=True):
            views.append(np.ndarray((n, *leaf.shape), dtype=np.dtype(leaf.dtype), buffer=buf, offset=offset))
        return views

    @functools.cached_property
    def ragged(self) -> dict[int, tuple[int, str]]:
        """Each ragged node's bytes leaf -> (its lengths leaf, what it decodes as) (NOTE [ragged leaves])."""
        found: dict[int, tuple[int, str]] = {}
        _ragged_nodes(self.tree, found)
        return found

    @functools.cached_property
    def host_leaves(self) -> frozenset[int]:
        """The leaves that stay in the trainer's process (a ragged node's two): never pinned or copied."""
        return frozenset(i for data, (lengths, _) in self.ragged.items() for i in (data, lengths))

    def label_leaf(self, image_leaves: int = 1) -> int | None:
        """The leaf of an image batch's labels: the one after its `image_leaves` image leaves (a
        `Views`' views, else one), unless that is a ragged field's; or None."""
        i = image_leaves
        return i if len(self.leaves) > i and i not in self.host_leaves else None

    def decode_ragged(self, arrays: Sequence[np.ndarray]) -> dict[int, list[Any]]:
        """Each ragged node's values, copied out of the slot: bytes leaf -> its list (NOTE [ragged
        leaves])."""
        ragged = self.ragged.items()
        return {data: decoded(arrays[data], arrays[length], kind) for data, (length, kind) in ragged}

    def to_json(self) -> str:
        return json.dumps(
            {
                "leaves": [[leaf.dtype, list(leaf.shape)] for leaf in self.leaves],
                "tree": self.tree,
                "batch_size": self.batch_size,
            }
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> BatchLayout:
        raw = json.loads(text)
        leaves = tuple(Leaf(str(np.dtype(d)), tuple(int(s) for s in shape)) for d, shape in raw["leaves"])
        return cls(leaves, raw["tree"], int(raw["batch_size"]))

    @classmethod
    def infer(cls, sample: Any, batch_size: int) -> BatchLayout | None:
        """Return the layout of `sample`, or None when it cannot be written into a slot."""
        leaves: list[Leaf] = []
        try:
            tree = _describe(sample, leaves)
        except LayoutMismatch:
            return None
        if not leaves:
            return None
        return cls(tuple(leaves), tree, batch_size)

    def write(self, sample: Any, arrays: Sequence[np.ndarray], row: int) -> None:
        """Write one sample into row `row` of the per-leaf arrays; LayoutMismatch if it differs."""
        _write(sample, self.tree, self.leaves, arrays, row)

    def build(self, tensors: Sequence[torch.Tensor], ragged: Mapping[int, list[Any]] | None = None) -> Any:
        """Rebuild the batch tree from per-leaf batch tensors (and `decode_ragged`'s lists)."""
        return _build(self.tree, tensors, ragged or {})


def decoded(data: np.ndarray, lengths: np.ndarray, kind: str) -> list[Any]:
    """The rows of a ragged leaf as Python values: `kind` "str" (utf-8), "json" (parsed) or "bytes"."""
    raw = [data[row, :size].tobytes() for row, size in enumerate(lengths.tolist())]
    if kind == "str":
        return [b.decode("utf-8") for b in raw]
    if kind == "json":
        return [json.loads(b) for b in raw]
    return raw


def _ragged_nodes(tree: Any, found: dict[int, tuple[int, str]]) -> None:
    if "ragged" in tree:
        data, lengths = tree["ragged"]
        found[int(data)] = (int(lengths), str(tree["as"]))
    elif "dict" in tree:
        for _, sub in tree["dict"]:
            _ragged_nodes(sub, found)
    elif "list" in tree:
        for sub in tree["list"]:
            _ragged_nodes(sub, found)


def _leaf_of(value: Any) -> Leaf | None:
    if isinstance(value, torch.Tensor):
        try:
            dtype = torch.empty(0, dtype=value.dtype).numpy().dtype
        except TypeError:  # bfloat16 and friends have no numpy twin
            return None
        return Leaf(str(dtype), tuple(value.shape))
    if isinstance(value, np.ndarray):
        return None if value.dtype.hasobject else Leaf(str(value.dtype), tuple(value.shape))
    if isinstance(value, np.generic) and not isinstance(value, (np.object_, np.str_, np.bytes_)):
        return Leaf(str(value.dtype), ())
    number_dtype = _NUMBER_DTYPES.get(type(value))
    return Leaf(number_dtype, ()) if number_dtype else None


def _describe(value: Any, leaves: list[Leaf]) -> Any:
    leaf = _leaf_of(value)
    if leaf is not None:
        leaves.append(leaf)
        return {"leaf": len(leaves) - 1}
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {"dict": [[k, _describe(v, leaves)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return {"list": [_describe(v, leaves) for v in value]}
    raise LayoutMismatch(f"{type(value).__name__} leaves are not written into the ring")


def _write(value: Any, tree: Any, leaves: Sequence[Leaf], arrays: Sequence[np.ndarray], row: int) -> None:
    if "leaf" in tree:
        i = tree["leaf"]
        target = arrays[i][row]
        if isinstance(value, torch.Tensor):
            value = value.numpy(force=True)
        elif not isinstance(value, (np.ndarray, np.generic, bool, int, float)):
            raise LayoutMismatch(f"expected an array or number, got {type(value).__name__}")
        if np.shape(value) != leaves[i].shape:
            raise LayoutMismatch(f"shape {np.shape(value)} differs from {leaves[i].shape}")
        if isinstance(value, np.ndarray) and value.dtype != target.dtype:
            raise LayoutMismatch(f"dtype {value.dtype} differs from {target.dtype}")
        if target.ndim == 0:
            arrays[i][row] = value
        else:
            np.copyto(target, value, casting="no")
        return
    if "dict" in tree:
        if not isinstance(value, Mapping) or list(value.keys()) != [k for k, _ in tree["dict"]]:
            raise LayoutMismatch("dict keys differ from the first sample's")
        for key, sub in tree["dict"]:
            _write(value[key], sub, leaves, arrays, row)
        return
    items = tree["list"]
    if not isinstance(value, (list, tuple)) or len(value) != len(items):
        raise LayoutMismatch("sequence length differs from the first sample's")
    for v, sub in zip(value, items, strict=True):
        _write(v, sub, leaves, arrays, row)


def _build(tree: Any, tensors: Sequence[torch.Tensor], ragged: Mapping[int, list[Any]]) -> Any:
    if "leaf" in tree:
        return tensors[tree["leaf"]]
    if "ragged" in tree:
        return ragged[tree["ragged"][0]]
    if "dict" in tree:
        return {key: _build(sub, tensors, ragged) for key, sub in tree["dict"]}
    return [_build(sub, tensors, ragged) for sub in tree["list"]]
