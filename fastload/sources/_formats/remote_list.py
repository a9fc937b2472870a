"""A file list at a URL (`FileList("s3://bucket/lists/train.csv")`), opened as an index of
remote objects.

Its images are objects named by the list, relative to `root` (default: the list's own prefix)
or as full URLs. Each one is a container of one sample, read whole through the node cache
(NOTE [node cache]: one chunk the object's size, one download per node), so the index is an
`ExtentIndex` of `remote_file` entries and everything a remote pack has (read-ahead, the cache's
limit, the daemon's roots, iostat's network columns) holds for it. Sizes and versions come from
one listing of the root prefix (a request per thousand objects on S3), and a HEAD request only
for an object outside it (or for http(s)://, which cannot be listed), 16 at a time.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from fastload._errors import ConfigError, DatasetError
from fastload.sources._formats.list_rows import read_rows
from fastload.sources._indexes.extents import ExtentIndex, remote_file
from fastload.sources._indexes.sample_index import pack_strings
from fastload.sources._storage import remote as _remote
from fastload.sources._storage.bounds import MAX_LIST_BYTES, clip

HEAD_REQUESTS = 16  # objects outside the listing, sized at once


class ListAtURL(Protocol):
    """What a list at a URL is opened with: `_filelist.FileList` is one (typed here by what is
    read, so that this module does not import `_filelist`, which imports it)."""

    @property
    def where(self) -> str: ...
    @property
    def root(self) -> str | None: ...
    @property
    def delimiter(self) -> str | None: ...
    @property
    def header(self) -> bool | None: ...
    @property
    def cache_dir(self) -> str | None: ...
    def size(self, name: str) -> int | None: ...
    def _targets(
        self, list_path: str, rows: Sequence[tuple[int, str, list[str]]]
    ) -> tuple[tuple[str, ...], np.ndarray]: ...


def open_remote_list(source: ListAtURL) -> ExtentIndex:
    """The index of the objects a list at a URL names (see the module docstring)."""
    url = source.where
    root = source.root if source.root is not None else url.rsplit("/", 1)[0]
    if not _remote.is_url(root):
        raise ConfigError(
            f"the file list {url} is at a URL, so its images are objects: root must be a URL prefix "
            f"(s3://bucket/images), got {clip(root)}"
        )
    try:
        data = _remote.read_whole(url, MAX_LIST_BYTES)
        objects = _remote.listing(root)
    except OSError as e:
        raise DatasetError(f"cannot read file list {clip(str(e))}") from None

    def object_url(path: str) -> str:
        return path if _remote.is_url(path) else _remote.join(root, path.lstrip("/"))

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

    def size(u: str) -> tuple[str, tuple[int, str] | OSError]:
        try:
            return u, _remote.size_of(u)
        except OSError as e:
            return u, e

    with ThreadPoolExecutor(HEAD_REQUESTS, "fastload-list-head") as pool:
        found = dict(pool.map(size, rest))
    for (line, path, _), u in zip(rows, urls, strict=True):
        outcome = found.get(u)
        if isinstance(outcome, OSError):
            raise DatasetError(
                f"{list_url} line {line}: image {clip(path)} cannot be read ({clip(str(outcome))}); paths "
                "are relative to the list's prefix unless root= names another"
            )
    objects.update({u: v for u, v in found.items() if not isinstance(v, OSError)})
