"""The `fields=` declaration of a source's samples: each field a name and the member extension(s)
of a sample key it is read from (";"-separated alternatives, the first a sample has wins, as
WebDataset's `to_tuple("jpg;png", "txt")`), its kind following from the extension in one table:

| extension                                   | kind    | in a batch                                  |
|---------------------------------------------|---------|---------------------------------------------|
| an image's (jpg jpeg png ppm bmp pgm tif tiff webp) | image | decoded + augmented, as today's images |
| cls                                         | label   | an int64 tensor (B,)                        |
| txt, text                                   | str     | `list[str]` (utf-8)                         |
| json                                        | json    | a list of parsed JSON values                |
| anything else                               | bytes   | `list[bytes]`                               |

A declaration holds exactly one image field (batches are built around the decoded images; a
source without one takes the Dataset path) and at most one label. A dict gives batches as dicts
by name (with `sample_ids=True`, its `SampleIds` under "sample_ids"); a sequence of extension
specs gives lists in that order (the `SampleIds` last). Its one responsibility is
reading a declaration into `DeclaredField`s (and a file list's cells into its fields:
`column_fields`); the tar scan that follows them is `tar_scan.py`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._errors import ConfigError, DatasetError
from fastload._sizes import shown
from fastload.sources._formats.folder import IMG_EXTENSIONS
from fastload.sources._indexes.field_extents import (
    BYTES,
    IMAGE,
    JSON,
    LABEL,
    RAGGED_KINDS,
    TEXT,
    FieldExtents,
)
from fastload.sources._storage.bounds import clip, parse_label, quoted

KIND_OF_EXTENSION: dict[str, str] = {
    **{ext.lstrip("."): IMAGE for ext in IMG_EXTENSIONS},
    "cls": LABEL,
    "txt": TEXT,
    "text": TEXT,
    "json": JSON,
}  # any other extension: BYTES
_MAX_FIELDS = 64
_MAX_SPEC_CHARS = 256  # a field's name, or its extensions, at most (a daemon's peer sends them)
_BAD_EXTENSION_CHARS = frozenset("/=\0")


@dataclass(frozen=True)
class DeclaredField:
    """One field: its name, the extensions it is read from (in order of preference), its kind."""

    name: str
    extensions: tuple[str, ...]
    kind: str


def normalized_fields(fields: Any) -> tuple[str, ...] | None:
    """A `fields=` argument as a source keeps it (hashable, JSON-able): a dict's entries as
    "name=ext;ext", a sequence's as "ext;ext"; None as None. ConfigError for anything else."""
    if fields is None:
        return None
    if isinstance(fields, Mapping):
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
            raise ConfigError(f"fields= maps names to member extensions (str to str), got {shown(fields)}")
        if any("=" in name for name in fields):
            raise ConfigError(f"a field's name has no '=' in it, got {shown(list(fields))}")
        entries = tuple(f"{name}={spec}" for name, spec in fields.items())
    elif isinstance(fields, Sequence) and not isinstance(fields, (str, bytes)):
        if not all(isinstance(v, str) for v in fields):
            raise ConfigError(f"fields= is a dict or a sequence of extension strings, got {shown(fields)}")
        entries = tuple(fields)
    else:
        raise ConfigError(
            f'fields= is a dict ({{"image": "jpg;png", "text": "txt"}}) or a sequence of member '
            f'extensions (("jpg;png", "txt")), got {shown(fields)}'
        )
    parse_fields(entries)  # checked when the source is made, not when it is opened
    return entries


def parse_fields(entries: Sequence[str]) -> tuple[tuple[DeclaredField, ...], bool]:
    """The fields of a normalized declaration and whether batches are dicts by name."""
    if not entries or len(entries) > _MAX_FIELDS:
        raise ConfigError(f"fields= names 1 to {_MAX_FIELDS} fields, got {len(entries)}")
    named = all("=" in e for e in entries)
    if not named and any("=" in e for e in entries):
        raise ConfigError(
            f"fields= entries are all 'name=extensions' or all 'extensions', got {shown(entries)}"
        )
    declared: list[DeclaredField] = []
    for entry in entries:
        name, _, spec = entry.partition("=") if named else (entry, "", entry)
        extensions = tuple(ext.strip().lower().lstrip(".") for ext in spec.split(";"))
        too_long = max(len(name), len(spec)) > _MAX_SPEC_CHARS
        if not name or too_long or any(not ext or _BAD_EXTENSION_CHARS & set(ext) for ext in extensions):
            raise ConfigError(
                f"field {shown(name)}: {shown(spec)} is not a list of member extensions ('jpg;png', 'txt')"
            )
        kinds = {KIND_OF_EXTENSION.get(ext, BYTES) for ext in extensions}
        if len(kinds) > 1:
            raise ConfigError(
                f"field {shown(name)} mixes kinds ({', '.join(sorted(kinds))}) in {shown(spec)}: "
                "its alternatives must all be images, or all text, ..."
            )
        if name == "sample_ids":
            raise ConfigError(
                '"sample_ids" is where a dict batch holds its SampleIds (sample_ids=True): name the field '
                "otherwise"
            )
        if any(d.name == name for d in declared):
            raise ConfigError(f"field {shown(name)} is declared twice")
        declared.append(DeclaredField(name, extensions, kinds.pop()))
    images = [d.name for d in declared if d.kind == IMAGE]
    if len(images) != 1:
        raise ConfigError(
            f"fields= needs exactly one image field (jpg, png, ...), got {len(images)} "
            f"({', '.join(images)}): "
            "batches are built around one decoded image per sample; for several, or none, use a Dataset"
        )
    if sum(d.kind == LABEL for d in declared) > 1:
        raise ConfigError("fields= takes at most one label field (.cls)")
    return tuple(declared), named


def column_fields(
    list_path: str, rows: Sequence[tuple[int, str, list[str]]], entries: Sequence[str]
) -> tuple[np.ndarray, FieldExtents]:
    """A file list's labels (-1 without a label field) and its declared columns (`entries`, the
    image's path first) held in memory, from its rows (line number, path, the other cells)."""
    declared, named = parse_fields(entries)
    if declared[0].kind != IMAGE:
        raise ConfigError(
            "a file list's first column is the image's path: declare its image field first, got "
            f"{declared[0].name!r}"
        )
    labels = np.full(len(rows), -1, np.int64)
    cells: list[list[bytes]] = [[] for d in declared if d.kind in RAGGED_KINDS]
    for k, (number, _, columns) in enumerate(rows):
        if len(columns) != len(declared) - 1:
            listed = ", ".join(d.name for d in declared)
            raise DatasetError(
                f"{clip(list_path)} line {number}: {len(columns) + 1} columns, expected {len(declared)} "
                f"({listed}; a caption with spaces needs a .csv or .tsv list, or delimiter=)"
            )
        row = 0
        for d, cell in zip(declared[1:], columns, strict=True):
            if d.kind == LABEL:
                value = parse_label(cell)
                if value is None:
                    problem = f"label {quoted(cell)} is not a class index"
                    raise DatasetError(f"{clip(list_path)} line {number}: {problem}")
                labels[k] = value
            else:
                cells[row].append(cell.encode("utf-8", "surrogateescape"))
                row += 1
    return labels, fields_in_memory(declared, named, cells, len(rows))


def fields_in_memory(
    declared: Sequence[DeclaredField], named: bool, cells: Sequence[Sequence[bytes]], samples: int
) -> FieldExtents:
    """The declared fields whose ragged members are `cells` (per ragged field, in order, one per
    sample), held in one blob."""
    sizes = np.array([[len(c) for c in column] for column in cells], np.int64).reshape(len(cells), samples)
    ends = np.cumsum(sizes.reshape(-1))
    starts = (ends - sizes.reshape(-1)).reshape(sizes.shape)
    blob = np.frombuffer(b"".join(c for column in cells for c in column), np.uint8)
    names, kinds = tuple(d.name for d in declared), tuple(d.kind for d in declared)
    return FieldExtents(names, kinds, named, starts, sizes, blob)
