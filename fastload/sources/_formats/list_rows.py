"""A file list's lines as rows: which delimiter splits them, and whether the first is a header.

Its one responsibility is reading a list file into `(line number, path, label fields)` rows and
saying how it read them (`ListRows.how`), so that an error about the list can show what was
parsed. `FileList` (`_formats/file_list.py`) turns the rows into an index.

- Delimiter: `delimiter=` when given; else by suffix (',' for .csv, tab for .tsv, any whitespace
  for other files), unless the first line does not split in two that way but does with a tab,
  ',', ';' or whitespace (a tab-separated file named .csv): that one is used, and `how` says it
  was sniffed.
- Header (`header=None`, auto): the first row is skipped when its path column reads like a column
  name ("path", "img_path", "file", "image", ...), or when its label is not an integer while every
  other row's are and it names no file (`img_path,class_id` over integer labels). `header=True`
  always skips it, `header=False` never does.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastload.sources._storage.bounds import MAX_LIST_BYTES, clip, is_int_text, open_regular, read_bounded

Row = tuple[int, str, list[str]]  # (line number, path, label fields)

# A path column that is one of these words, alone or after a prefix ("img_path", "image_file"),
# is a column name, not a file.
_HEADER_WORD = re.compile(r"(?:\w+_)?(?:path|file|filename|file_name|filepath|image|img|name|fname)s?")
_BY_SUFFIX = {".csv": ",", ".tsv": "\t"}
_CANDIDATES: tuple[str | None, ...] = ("\t", ",", ";", None)  # None: any whitespace


@dataclass(frozen=True)
class ListRows:
    """A list's rows (the header, if one was skipped, apart) and how they were read."""

    rows: list[Row]
    delimiter: str | None  # None: any whitespace
    sniffed: bool  # the delimiter was not given nor the suffix's, but found in the first line
    header: Row | None  # the first row, when it was skipped as a header

    @property
    def how(self) -> str:
        """E.g. "split at ',' (the .csv default)", for messages."""
        name = delimiter_name(self.delimiter)
        return f"split at {name} (sniffed from its first line)" if self.sniffed else f"split at {name}"


def delimiter_name(delimiter: str | None) -> str:
    """How a message names a delimiter."""
    return {None: "whitespace", "\t": "tabs", ",": "','", ";": "';'", " ": "spaces"}.get(
        delimiter, repr(delimiter)
    )


def describe(row: Row) -> str:
    """A parsed row as a message shows it: `line 1: path='img_path', label='class_id'`."""
    number, path, fields = row
    labels = ", ".join(repr(f) for f in fields) or "none"
    return clip(f"line {number}: path={path!r}, label={labels}")


def read_rows(
    list_path: str,
    root: str,
    delimiter: str | None,
    header: bool | None,
    data: bytes | None = None,
    names_file: Callable[[str], bool] | None = None,
) -> ListRows:
    """The list's rows (paths relative to `root`); OSError when it cannot be read, csv.Error
    when it is not valid CSV. `data`: the list's bytes, already read (a list at a URL);
    `names_file`: whether a path of the list names a file (default: one under `root` exists)."""
    if data is None:
        # A regular file, bounded (never /dev/zero or a FIFO: NOTE [source bounds]), read whole.
        fd, _ = open_regular(list_path, MAX_LIST_BYTES, "file list")
        try:
            data = read_bounded(fd, MAX_LIST_BYTES, list_path, "file list")
        finally:
            os.close(fd)
    # utf-8-sig: a byte-order mark (a spreadsheet's CSV) is skipped.
    text = data.decode("utf-8-sig", errors="surrogateescape")
    sniffed = False
    if delimiter is None:
        delimiter, sniffed = _sniff(text, _BY_SUFFIX.get(os.path.splitext(list_path)[1].lower()))
    rows = _split(text, delimiter)
    first: Row | None = None
    if names_file is None:

        def names_file(path: str) -> bool:
            return os.path.exists(os.path.join(root, path))

    if rows and (header or (header is None and _looks_like_header(rows, names_file))):
        first, rows = rows[0], rows[1:]
    return ListRows(rows, delimiter, sniffed, first)


def _split(text: str, delimiter: str | None) -> list[Row]:
    rows: list[Row] = []
    if delimiter is None:  # whitespace-separated text
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if fields:
                rows.append((number, fields[0], fields[1:]))
        return rows
    for number, fields in enumerate(csv.reader(io.StringIO(text, newline=""), delimiter=delimiter), 1):
        if fields and any(field.strip() for field in fields):
            rows.append((number, fields[0].strip(), [field.strip() for field in fields[1:]]))
    return rows


def _columns(line: str, delimiter: str | None) -> int:
    if delimiter is None:
        return len(line.split())
    try:
        return len(next(csv.reader([line], delimiter=delimiter), []))
    except csv.Error:
        return 0


def _sniff(text: str, default: str | None) -> tuple[str | None, bool]:
    """The suffix's delimiter, unless the first line splits in two only with another one."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    if not first or _columns(first, default) >= 2:
        return default, False
    for candidate in _CANDIDATES:
        if candidate != default and _columns(first, candidate) >= 2:
            return candidate, True
    return default, False


def _looks_like_header(rows: Sequence[Row], names_file: Callable[[str], bool]) -> bool:
    """Whether the first row is clearly column names (see the module docstring)."""
    _, path, fields = rows[0]
    if _HEADER_WORD.fullmatch(path.strip().lower()):
        return True
    rest = rows[1:]
    if not rest or not fields or all(is_int_text(f) for f in fields):
        return False
    if not all(f and is_int_text(f) for _, _, others in rest[:1000] for f in others):
        return False
    return not names_file(path)
