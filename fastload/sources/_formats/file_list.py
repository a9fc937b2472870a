"""File lists: a source whose samples are whole image files named by a list (`PathIndex`).

`FileList` is a CSV/TSV/text file of `path, label` lines: labels are integers or class names (one
or the other for the whole file), or with `multi_label` several per line, giving float32
multi-hot targets. The label type and shape are declared once, by the source, never per sample.
A flat folder with a label file is a `FileList` whose `root` is that folder.

A file list at a URL (`FileList("s3://bucket/lists/train.csv")`) opens as an index of remote
objects: its images are objects named by the list, relative to `root` (default: the list's own
prefix) or as full URLs. Each one is a container of one sample, read whole through the node cache
(NOTE [node cache]: one chunk the object's size, one download per node), so the index is an
`ExtentIndex` of `remote_file` entries and everything a remote pack has (read-ahead, the cache's
limit, the daemon's roots, iostat's network columns) holds for it. Sizes and versions come from
one listing of the root prefix (a request per thousand objects on S3), and a HEAD request only
for an object outside it (or for http(s)://, which cannot be listed), `remote.HEAD_REQUESTS` at a
time; the reads themselves are storage's (`_storage/remote.py`, `_storage/node_cache.py`).
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastload._errors import ConfigError, DatasetError
from fastload.sources._base import Naming, Source
from fastload.sources._formats.list_rows import ListRows, delimiter_name, describe, read_rows
from fastload.sources._formats.sample_fields import column_fields, normalized_fields
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._indexes.sample_index import FieldsPathIndex, PathIndex, pack_strings
from fastload.sources._storage import remote
from fastload.sources._storage.bounds import (
    MAX_LIST_BYTES,
    MAX_TARGET_BYTES,
    clip,
    is_int_text,
    parse_label,
    quoted,
)
from fastload.sources._storage.remote import is_url
from fastload.sources._storage.remote_file import remote_file

_MULTI_SEPARATORS = re.compile(r"[\s;|]+")
LIST_SUFFIXES = (".csv", ".tsv", ".txt")


@dataclass(frozen=True)
class FileList(
    Source, kind="file_list", named_by=Naming(LIST_SUFFIXES, at_urls=True), served_by_daemon=True
):
    """Images named by a list file, one `path<separator>label` line each.

    - `path`: the list. Its separator is `delimiter`, or by suffix: ',' for .csv, tab for .tsv,
      any whitespace for other files, unless the first line splits in two only at a tab, ',', ';'
      or whitespace (a tab-separated file named .csv), which is then used.
    - `header`: None (auto) skips a first line that is clearly column names: its path column
      reads like one ("path", "img_path", "filename", "image", ...), or its label is not an
      integer while every other line's are and it names no file (`img_path,class_id`). True
      always skips the first line, False never does (`_formats/list_rows.py`).
    - `root`: the folder image paths are relative to (default: the list file's folder); absolute
      paths are kept. A flat folder of images with a label file is `FileList(labels, root=folder)`.
    - labels: all integers (class indices, used as they are) or all class names (indexed in
      `classes` order if given, else sorted, as ImageFolder does). With `multi_label`, a line's
      label column holds any number of labels separated by spaces, ';' or '|' (with whitespace
      separated lists: every column after the path), and targets are float32 multi-hot rows of
      `num_classes` (default: len(classes), or the largest integer label + 1), when they fit
      `MAX_TARGET_BYTES` (NOTE [source bounds]).
    - `fields`: the columns as declared fields (`_formats/sample_fields.py`, as `TarShards`'), in
      column order, the image's path first: `{"image": "jpg", "text": "txt", "label": "cls"}`
      reads `path,caption,label` lines into dict batches (a sequence: lists); each cell is the
      member (a caption's text, a JSON value, a .cls label); every line has one column per
      field. Local lists only (not yet at a URL).
    - At a URL (`s3://bucket/lists/train.csv`): its images are objects under `root` (default:
      the list's prefix; a URL prefix) or full URLs, each read whole through the node cache
      (`cache_dir`, `cache_limit` as for a remote pack; see the module docstring).

    The list must be a regular file of at most `MAX_LIST_BYTES`; integer labels are ASCII
    decimal, in [0, 2^63).
    """

    path_fields: ClassVar[tuple[str, ...]] = ("path", "root")
    quiet_defaults: ClassVar[tuple[str, ...]] = ("delimiter", "header", "cache_dir", "cache_limit", "fields")
    size_fields: ClassVar[tuple[str, ...]] = ("cache_limit",)
    machine_fields: ClassVar[tuple[str, ...]] = ("cache_dir", "cache_limit")
    path: str
    root: str | None = None
    classes: tuple[str, ...] | None = None
    multi_label: bool = False
    num_classes: int | None = None
    delimiter: str | None = None
    header: bool | None = None
    cache_dir: str | None = None
    cache_limit: int | str | None = None
    fields: Mapping[str, str] | tuple[str, ...] | None = None  # as `normalized_fields` keeps it

    def __post_init__(self) -> None:
        self._parse_sizes()
        object.__setattr__(self, "fields", normalized_fields(self.fields))
        if self.fields is not None and (is_url(self.path) or self.multi_label):
            raise ConfigError(
                "fields= reads a local file list's columns (not one at a URL, nor with multi_label)"
            )
        k = self.num_classes
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ConfigError(f"num_classes must be a positive integer, got {clip(self.num_classes)}")
        if self.header not in (None, True, False):
            raise ConfigError(f"header must be True, False or None (auto), got {clip(self.header)}")
        d = self.delimiter
        if d is not None and (not isinstance(d, str) or len(d) != 1 or d in "\r\n\"'"):
            raise ConfigError(
                f"delimiter must be one character (',', '\\t', ';', ' '), or None for the suffix's, "
                f"got {clip(d)}"
            )

    @property
    def where(self) -> str:
        return self.path if is_url(self.path) else os.path.abspath(self.path)

    def open(self) -> PathIndex | ExtentIndex:
        list_path = self.where
        if is_url(list_path):  # its images are objects (see the module docstring)
            return _open_at_url(self)
        root = os.path.abspath(self.root) if self.root is not None else os.path.dirname(list_path)
        try:
            read = read_rows(list_path, root, self.delimiter, self.header)
        except OSError as e:
            raise DatasetError(f"cannot read file list {clip(list_path)}: {clip(str(e))}") from e
        except csv.Error as e:
            raise DatasetError(f"file list {clip(list_path)} is not valid CSV: {clip(str(e))}") from e
        rows = read.rows
        if not rows:
            raise DatasetError(f"file list {list_path} lists no images (expected `path,label` lines)")
        paths = [os.path.join(root, p).encode("utf-8", "surrogateescape") for _, p, _ in rows]
        first = paths[0].decode("utf-8", "surrogateescape")
        if not os.path.exists(first):
            raise DatasetError(_missing_first_image(list_path, first, read, paths, self.root is None))
        if isinstance(self.fields, tuple):
            labels, fields = column_fields(list_path, rows, self.fields)
            return FieldsPathIndex.from_paths(list_path, (), paths, labels, fields)
        classes, labels = self._targets(list_path, rows)
        return PathIndex.from_paths(list_path, classes, paths, labels)

    def _targets(
        self, list_path: str, rows: Sequence[tuple[int, str, list[str]]]
    ) -> tuple[tuple[str, ...], np.ndarray]:
        """The class names and the targets: int64 (N,) or float32 multi-hot (N, K)."""
        per_row: list[list[str]] = []
        for number, _, fields in rows:
            if self.multi_label:
                values = [v for field in fields for v in _MULTI_SEPARATORS.split(field) if v]
            elif len(fields) != 1 or not fields[0]:
                raise DatasetError(
                    f"{clip(list_path)} line {number}: expected a path and one label, got {len(fields)} "
                    "label columns (several labels per image need multi_label=True)"
                )
            else:
                values = fields
            per_row.append(values)
        every = [v for values in per_row for v in values]
        kinds = {is_int_text(v) for v in every}
        if len(kinds) > 1:
            example = next(v for v in every if not is_int_text(v))
            raise DatasetError(
                f"{list_path}: mixes integer and class-name labels (e.g. {quoted(example)}); use one kind"
            )
        numeric = kinds != {False}
        if numeric:
            classes = tuple(self.classes or ())
            parsed = [[parse_label(v) for v in values] for values in per_row]
            for (number, _, _), values, row in zip(rows, per_row, parsed, strict=True):
                for text, value in zip(values, row, strict=True):
                    if value is None:
                        raise DatasetError(
                            f"{list_path} line {number}: label {quoted(text)} is not a class index "
                            "(an ASCII decimal integer, >= 0 and < 2^63)"
                        )
            codes: list[list[int]] = parsed  # type: ignore[assignment]  # no None left
            largest = max((c for values in codes for c in values), default=-1)
            if classes and largest >= len(classes):
                raise DatasetError(f"{list_path}: label {largest} is out of range for {len(classes)} classes")
        else:
            names = sorted(set(every)) if self.classes is None else list(self.classes)
            lookup = {name: i for i, name in enumerate(names)}
            unknown = [v for v in every if v not in lookup]
            if unknown:
                raise DatasetError(
                    f"{list_path}: label {quoted(unknown[0])} is not one of the {len(names)} classes given"
                )
            classes = tuple(names)
            codes = [[lookup[v] for v in values] for values in per_row]
            largest = len(classes) - 1
        if not self.multi_label:
            return classes, np.array([c[0] for c in codes], dtype=np.int64)
        width = self.num_classes or len(classes) or largest + 1
        if largest >= width:
            raise DatasetError(f"{list_path}: label {largest} does not fit num_classes={width}")
        if len(codes) * width * 4 > MAX_TARGET_BYTES:
            raise DatasetError(
                f"{list_path}: {len(codes):,} multi-hot rows of {width:,} classes would take "
                f"{len(codes) * width * 4:,} bytes, over the {MAX_TARGET_BYTES:,}-byte budget of targets "
                "(NOTE [source bounds]): check the largest label and num_classes, or split the list"
            )
        targets = np.zeros((len(codes), width), dtype=np.float32)
        rows_at = np.repeat(np.arange(len(codes)), [len(c) for c in codes])
        targets[rows_at, [c for values in codes for c in values]] = 1.0
        return classes, targets


def _missing_first_image(
    list_path: str, first: str, read: ListRows, paths: Sequence[bytes], default_root: bool
) -> str:
    """What to say when the first image a list names does not exist: what was parsed, and which
    of root, delimiter and header to set (as `FileList(...)` and `fastload pack` spell them)."""
    row = read.rows[0]
    parsed = f"{describe(row)}, {read.how}"
    if read.header is not None:
        parsed += f"; {describe(read.header)} was skipped as a header"
    second = paths[1].decode("utf-8", "surrogateescape") if len(paths) > 1 else ""
    if second and os.path.exists(second):
        advice = (
            f"the next line's image exists: if line {row[0]} is column names, pass header=True "
            "(fastload pack: --header)"
        )
    elif not row[2] or any(c in row[1] for c in "\t,;") or (read.delimiter is None and " " in row[1]):
        advice = (
            f"the line was not split into a path and a label at {delimiter_name(read.delimiter)}: pass "
            "delimiter= (fastload pack: --delimiter), e.g. '\\t' or ','"
        )
    else:
        fix = "pass root=" if default_root else "check root="
        advice = (
            f"paths in a file list are relative to {'its folder' if default_root else 'root'}: {fix} "
            "(fastload pack: --root), the folder they are relative to; a header line is set with "
            "header= (--header), the separator with delimiter= (--delimiter)"
        )
    return f"{clip(first)}, the first image {clip(list_path)} names, does not exist ({parsed}): {advice}"


def _open_at_url(source: FileList) -> ExtentIndex:
    """The index of the objects a list at a URL names (see the module docstring)."""
    url = source.where
    root = source.root if source.root is not None else url.rsplit("/", 1)[0]
    if not remote.is_url(root):
        raise ConfigError(
            f"the file list {url} is at a URL, so its images are objects: root must be a URL prefix "
            f"(s3://bucket/images), got {clip(root)}"
        )
    try:
        data = remote.read_whole(url, MAX_LIST_BYTES)
        objects = remote.listing(root)
    except OSError as e:
        raise DatasetError(f"cannot read file list {clip(str(e))}") from None

    def object_url(path: str) -> str:
        return path if remote.is_url(path) else remote.join(root, path.lstrip("/"))

    try:
        listed = lambda path: object_url(path) in objects  # noqa: E731
        read = read_rows(url, root, source.delimiter, source.header, data=data, names_file=listed)
    except csv.Error as e:
        raise DatasetError(f"file list {url} is not valid CSV: {clip(str(e))}") from e
    rows = read.rows
    if not rows:
        raise DatasetError(f"file list {url} lists no images (expected `path,label` lines)")
    urls = [object_url(path) for _, path, _ in rows]
    _size_the_rest(url, rows, urls, objects)
    classes, labels = source._targets(url, rows)
    unique = list(dict.fromkeys(urls))
    number = {u: k for k, u in enumerate(unique)}
    sizes = np.array([objects[u][0] for u in urls], np.int64)
    keys, key_offsets = pack_strings([path.encode("utf-8", "surrogateescape") for _, path, _ in rows])
    files = tuple(remote_file(u, objects[u][0], objects[u][1], max(objects[u][0], 1)) for u in unique)
    return ExtentIndex(
        url,
        classes,
        files,
        np.array([number[u] for u in urls], np.int32),
        np.zeros(len(urls), np.int64),
        sizes,
        keys,
        key_offsets,
        labels,
        file_identities=np.array([(-1, -1, objects[u][0], -1, -1) for u in unique], np.int64).reshape(-1, 5),
        cache_dir=source.cache_dir,
        cache_limit=source.size("cache_limit"),
    )


def _size_the_rest(
    list_url: str,
    rows: list[tuple[int, str, list[str]]],
    urls: list[str],
    objects: dict[str, tuple[int, str]],
) -> None:
    """Size (HEAD) the objects the root's listing did not hold; DatasetError naming the first
    line whose image does not exist."""
    rest = [u for u in dict.fromkeys(urls) if u not in objects]
    if not rest:
        return
    found = remote.sizes_of(rest)
    for (line, path, _), u in zip(rows, urls, strict=True):
        outcome = found.get(u)
        if isinstance(outcome, OSError):
            raise DatasetError(
                f"{list_url} line {line}: image {clip(path)} cannot be read ({clip(str(outcome))}); paths "
                "are relative to the list's prefix unless root= names another"
            )
    objects.update({u: v for u, v in found.items() if not isinstance(v, OSError)})
