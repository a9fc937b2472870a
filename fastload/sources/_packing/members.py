"""The declared fields of a packed source (NOTE [packed fields] in `_formats/pack_format.py`):
each sample's ragged members (text, JSON, bytes) read beside its image, so that the writer stores
them right after it, and, once the pack is written, their extents in its data files (the
declaration its manifest records is `manifest.py`'s).

Its one responsibility is the members' side of a pack; where samples go is `data_files.py`'s.
Where each member lands follows from the sizes the source's index declares alone (as the layout
follows from the samples' sizes: NOTE [pack checkpoints]), so a resumed pack needs nothing more in
its checkpoint; a member read that does not hold the size its index declares stops the run.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence

import numpy as np

from fastload._errors import ConfigError, DatasetError
from fastload.sources._indexes.field_extents import FieldExtents
from fastload.sources._indexes.sample_index import DeclaresFields, ReadFailure
from fastload.sources._packing.reencode import Blob, Made, Skipped

Parts = tuple[Blob, ...]  # a sample with members: its image, then its members in the order declared


def with_members(
    batches: Iterator[Sequence[Made]], index: DeclaresFields, order: np.ndarray, start: int
) -> Generator[list[Made | Parts], None, None]:
    """`batches` (the samples `order[start:]` as made), each sample that is not `Skipped` given
    with its ragged members, read a batch at a time (a missing member: nothing)."""
    fields = index.fields
    assert fields is not None
    position = start
    for made in batches:
        kept = [k for k, item in enumerate(made) if not isinstance(item, Skipped)]
        indices = order[position + np.asarray(kept, np.int64)]
        columns = [_read(index, fields, row, indices) for row in range(len(fields.ragged))]
        out: list[Made | Parts] = list(made)
        for j, k in enumerate(kept):
            image = made[k]
            assert not isinstance(image, Skipped)
            out[k] = (image, *(column[j] for column in columns))
        position += len(made)
        yield out


def _read(index: DeclaresFields, fields: FieldExtents, row: int, indices: np.ndarray) -> list[Blob]:
    """The members of ragged field `row` of `indices`, each of the size the index declares."""
    name = fields.names[fields.ragged[row]]
    try:
        blobs = index.read_member(row, indices)
    except ReadFailure as e:
        where = index.name(int(indices[e.position]))
        raise DatasetError(
            f"cannot read {where}'s member of field {name!r}: {e.cause}. Run the same command again to go "
            "on (the samples packed so far are kept)"
        ) from e.cause
    expected = np.maximum(fields.sizes[row, indices], 0).tolist()
    for k, (blob, size) in enumerate(zip(blobs, expected, strict=True)):
        if len(blob) != size:
            raise DatasetError(
                f"{index.name(int(indices[k]))}'s member of field {name!r} holds {len(blob)} bytes, its "
                f"index says {size}: the source changed while it was packed; pack again"
            )
    return blobs


def field_arrays(
    fields: FieldExtents, held: np.ndarray, offsets: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image sizes, member offsets, member sizes) in the pack of the source's samples `held` (in
    the pack's order) written at `offsets` with `lengths` bytes each (image and members)."""
    sizes = np.ascontiguousarray(fields.sizes[:, held], np.int64)
    stored = np.maximum(sizes, 0)
    images = lengths - stored.sum(axis=0)
    before = np.cumsum(stored, axis=0) - stored  # each member's bytes after its image
    return images, np.ascontiguousarray(offsets + images + before, np.int64), sizes


def refuse_with_fields(where: str, fields: FieldExtents, how: str) -> None:
    """ConfigError: `how` (a way of packing) does not keep declared fields yet."""
    raise ConfigError(
        f"{where} declares fields ({', '.join(fields.names)}): {how} does not keep them yet; pack "
        "without it (the fields are kept), or load the source with fields= as it is"
    )
