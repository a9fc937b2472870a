"""A batch of declared fields in a slot (`TarShards(fields=...)`): the layout their batch takes
(`fields_layout`) and the rows an image job writes beside its images (`write_fields`).

Its one responsibility is those rows. Leaves: the image first, the label second when one is
declared (where the trainer's MixUp/CutMix find it: `BatchLayout.label_leaf`), then per ragged
field (text, JSON, bytes) a uint8 (capacity,) leaf and an int64 lengths leaf (NOTE [ragged leaves]
in `slots/layout.py`); the tree is a dict by name, or a list, in the order declared. A ragged
field's capacity per row is its largest member in the index (`FieldExtents.capacity`): the
slot holds `batch_size` of them, so no batch of any samples overflows it (a slot grows by
batch_size x that member; the ring is sized from the slot: `ring_plan.plan_ring`).

A sample without a declared member (size -1, or label -1), a caption that is not UTF-8 and a
JSON member that does not parse are `MemberFailure`s naming the field: the job raises them as
the sample's failure, or with on_error="skip" loads a stand-in (NOTE [bad samples]).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from fastload._errors import DatasetError
from fastload._loading.slots.layout import BatchLayout, Leaf
from fastload.sources._indexes.field_extents import (
    IMAGE,
    JSON,
    LABEL,
    MISSING,
    TEXT,
    FieldExtents,
)
from fastload.sources._indexes.sample_index import DeclaresFields, ReadBuffer, ReadFailure


class MemberFailure(Exception):
    """Sample `position` of a batch has no usable member for field `name` (`cause`); internal."""

    def __init__(self, position: int, name: str, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.position, self.name, self.cause = position, name, cause


def fields_layout(fields: FieldExtents, image: np.ndarray, batch_size: int) -> BatchLayout:
    """The slot layout of a batch of `fields`, its images shaped and typed as `image` (one row)."""
    leaves = [Leaf(str(image.dtype), tuple(image.shape))]
    if fields.has_label:
        leaves.append(Leaf("int64", ()))
    nodes: list[object] = []
    row = 0
    for kind in fields.kinds:
        if kind == IMAGE:
            nodes.append({"leaf": 0})
        elif kind == LABEL:
            nodes.append({"leaf": 1})
        else:
            leaves += [Leaf("uint8", (fields.capacity(row),)), Leaf("int64", ())]
            nodes.append({"ragged": [len(leaves) - 2, len(leaves) - 1], "as": kind})
            row += 1
    by_name = [[name, node] for name, node in zip(fields.names, nodes, strict=True)]
    tree = {"dict": by_name} if fields.named else {"list": nodes}
    return BatchLayout(tuple(leaves), tree, batch_size)


def write_fields(
    index: DeclaresFields, indices: np.ndarray, arrays: Sequence[np.ndarray], buffer: ReadBuffer
) -> int:
    """Write the label and ragged members of samples `indices` into their rows of the slot's
    `arrays` (laid out by `fields_layout`); return the bytes read. `MemberFailure` for a sample
    without a usable member."""
    fields = index.fields
    assert fields is not None
    n, total = len(indices), 0
    if fields.has_label:
        labels = index.labels[indices]
        _check_present(labels, fields.names[fields.kinds.index(LABEL)], index, indices, ".cls member")
        arrays[1][:n] = labels
    leaf = 2 if fields.has_label else 1
    for row, position in enumerate(fields.ragged):
        name, kind = fields.names[position], fields.kinds[position]
        _check_present(fields.sizes[row, indices], name, index, indices, "member")
        try:
            blobs = index.read_member(row, indices, buffer)
        except ReadFailure as e:
            raise MemberFailure(e.position, name, e.cause) from e.cause
        data, lengths = arrays[leaf], arrays[leaf + 1]
        for k, blob in enumerate(blobs):
            size = len(blob)
            data[k, :size] = np.frombuffer(blob, np.uint8)
            lengths[k] = size
            total += size
        if kind in (TEXT, JSON):
            _check_parses(blobs, kind, name)
        leaf += 2
    return total


def _check_present(
    values: np.ndarray, name: str, index: DeclaresFields, indices: np.ndarray, what: str
) -> None:
    missing = np.flatnonzero(values == MISSING)
    if missing.size:
        k = int(missing[0])
        problem = DatasetError(f"{index.name(int(indices[k]))} has no {what} for field {name!r}")
        raise MemberFailure(k, name, problem)


def _check_parses(blobs: Sequence[bytes | memoryview], kind: str, name: str) -> None:
    """What the trainer will decode must decode: utf-8 text, JSON (NOTE [ragged leaves])."""
    for k, blob in enumerate(blobs):
        try:
            text = bytes(blob).decode("utf-8")
            if kind == JSON:
                json.loads(text)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            what = "UTF-8 text" if isinstance(e, UnicodeDecodeError) else "JSON"
            raise MemberFailure(k, name, DatasetError(f"field {name!r} is not {what}: {e}")) from e
