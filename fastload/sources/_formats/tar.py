"""WebDataset tar shards as a source: `TarShards` names shards (paths, globs, brace patterns, URLs)
and opens them into an `ExtentIndex` of their samples, each shard scanned by `tar_scan.py`.

Its one responsibility is turning shards into an index. Layout (WebDataset): uncompressed `.tar`
files whose members are grouped by key, the member name up to the first dot of its base name:
`KEY.jpg` (or .jpeg, .png, .webp, ... one image per key) with `KEY.cls` (an integer, as text) or
`KEY.json` (an object whose "label", else "cls", is an integer). Samples are numbered in shard
order, then member order, which is storage order: a block shuffle reads them sequentially.
Only the headers and the small label members are read; the images are read by offset when loaded.
With `fields=` (`_formats/sample_fields.py`), samples are the members it declares instead: one
image, an optional .cls label, and text, JSON or bytes members read by offset beside the image
(NOTE [declared fields' scans] in `tar_scan.py`); shards without labels load when none is declared.
Local paths, or URLs read whole through the node cache (NOTE [node cache]). Reads go to byte
offsets, so a `.tar.gz`/`.tgz`, `.tar.xz`/`.txz` or `.tar.bz2`/`.tbz2` (local or at a URL) is
decompressed once into the user's cache and the copy is what the index names and workers read
(NOTE [decompressed shards] in `_storage/decompressed.py`); a zstd one is refused by name before
anything is read, and a compressed file under a `.tar` name by its first bytes.

Each shard's identity is kept in the index, and a worker that opens a shard compares it
(`ExtentIndex`): a shard replaced under a running loader is a DatasetError, never read with the
old scan's labels and offsets.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._base import FileToOpen, Naming, Source, absolute
from fastload.sources._formats.sample_fields import DeclaredField, normalized_fields, parse_fields
from fastload.sources._formats.shard_names import (
    TAR_SUFFIXES,
    check_shard_patterns,
    expand_braces,
    files_named,
)
from fastload.sources._formats.tar_scan import (
    EXPECTED,
    cached_scan,
    compressed,
    compressed_by_name,
    copy_scan,
    open_cache,
    remote_scan,
)
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._indexes.field_extents import FieldExtents
from fastload.sources._storage.bounds import MAX_SHARDS, clip
from fastload.sources._storage.decompressed import (
    DECOMPRESSORS,
    copies_dir,
    decompressed_copy,
    remote_decompressed_copy,
)
from fastload.sources._storage.node_cache import node_cache
from fastload.sources._storage.remote import is_url
from fastload.sources._storage.remote import size_of as _remote_size
from fastload.sources._storage.remote_file import remote_file
from fastload.sources._storage.scan_cache import Identity, Scan

# How a daemon's refusal names the directory of the decompressed copies (never by its path).
_COPIES = (
    "the cache directory its compressed shards are decompressed into (set the daemon's FASTLOAD_CACHE_DIR "
    "under a root, or decompress the shards under a root and name the .tar files)"
)


@dataclass(frozen=True)
class TarShards(Source, kind="tar", named_by=Naming(TAR_SUFFIXES, at_urls=True), served_by_daemon=True):
    """WebDataset tar shards (see the module docstring): `paths` one path, a list of paths, a
    glob (`shards/*.tar`) or brace notation (`train-{000000..000099}.tar`, `{a,b}.tar`), each
    pattern's matches sorted. Labels are class indices; `classes` is empty.

    `fields`: what each sample's batch row carries, by member extension (`sample_fields.py`):
    `{"image": "jpg;png", "text": "txt", "meta": "json"}` gives dict batches, `("jpg;png", "txt")`
    lists in that order; None (the default) today's (image, label) from KEY.cls or KEY.json.
    Without a label field the shards need no label members (their `labels` are -1)."""

    path_fields: ClassVar[tuple[str, ...]] = ("paths",)
    quiet_defaults: ClassVar[tuple[str, ...]] = ("cache_dir", "cache_limit", "fields")
    size_fields: ClassVar[tuple[str, ...]] = ("cache_limit",)
    machine_fields: ClassVar[tuple[str, ...]] = ("cache_dir", "cache_limit")
    paths: str | tuple[str, ...]
    # Shards at URLs: the node cache they are kept in (NOTE [node cache]); None: the defaults.
    cache_dir: str | None = None
    cache_limit: int | str | None = None
    # Kept as `normalized_fields` makes it: a dict's entries as "name=ext;ext", a sequence's as "ext;ext".
    fields: Mapping[str, str] | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self._parse_sizes()
        object.__setattr__(self, "fields", normalized_fields(self.fields))
        if not isinstance(self.paths, str):
            object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))
        # Bounded before anything is expanded or walked, here and wherever a daemon is sent it.
        check_shard_patterns([self.paths] if isinstance(self.paths, str) else list(self.paths))

    @property
    def where(self) -> str:
        first = self.paths if isinstance(self.paths, str) else (self.paths[0] if self.paths else "")
        return absolute(first)

    def files_before_open(self) -> Iterator[FileToOpen]:
        """Each shard (a glob's directory before its matches), and after the first compressed one
        the directory its copy is decompressed into, which workers read (NOTE [decompressed shards])."""
        copies = None
        for file in files_named([self.paths] if isinstance(self.paths, str) else list(self.paths)):
            yield file
            if copies is None and compressed_by_name(file.path) in DECOMPRESSORS:
                copies = copies_dir()
                if copies is not None:
                    yield FileToOpen(copies, _COPIES)

    def shard_paths(self) -> list[str]:
        """Every shard, absolute, in order; DatasetError when a pattern matches nothing."""
        patterns = [self.paths] if isinstance(self.paths, str) else list(self.paths)
        if not patterns:
            raise DatasetError("TarShards needs at least one shard path")
        check_shard_patterns(patterns)
        shards: list[str] = []
        for pattern in patterns:
            for expanded in expand_braces(pattern):
                compressor = compressed_by_name(expanded)
                if compressor is not None and compressor not in DECOMPRESSORS:
                    raise compressed(expanded, compressor)
                if is_url(expanded):  # objects: named one by one (braces), never listed
                    shards.append(expanded)
                elif glob.has_magic(expanded):
                    matches = sorted(glob.glob(expanded))
                    if not matches:
                        raise DatasetError(f"no tar shards match {clip(expanded)}")
                    shards.extend(matches)
                elif not os.path.isfile(expanded):
                    what = "is not a file" if os.path.exists(expanded) else "does not exist"
                    raise DatasetError(f"tar shard {clip(os.path.abspath(expanded))} {what}")
                else:
                    shards.append(expanded)
                if len(shards) > MAX_SHARDS:
                    raise DatasetError(f"{clip(pattern)} names over {MAX_SHARDS:,} shards (the limit)")
        return [absolute(s) for s in shards]

    def open(self) -> ExtentIndex:
        shards = self.shard_paths()
        declared, named = parse_fields(self.fields) if isinstance(self.fields, tuple) else ((), False)
        fields = declared or None
        file_ids: list[np.ndarray] = []
        offsets: list[np.ndarray] = []
        sizes: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        key_blobs: list[np.ndarray] = []
        key_lengths: list[np.ndarray] = []
        identities: list[Identity] = []
        files = list(shards)
        with open_cache() as cache:
            scans = []
            for number, shard in enumerate(shards):
                compressor = compressed_by_name(shard)
                if is_url(shard):  # NOTE [node cache]: a shard is one chunk, downloaded whole, scanned there
                    try:
                        size, version = _remote_size(shard)
                        node = node_cache(self.cache_dir, self.size("cache_limit"))
                        if compressor is not None:  # NOTE [decompressed shards]: a local copy is read
                            copy = remote_decompressed_copy(shard, compressor, size, version, node)
                            files[number], scanned = copy_scan(shard, copy, cache, identities, fields)
                            scans.append(scanned)
                            continue
                        scans.append(remote_scan(shard, size, version, node, cache, fields))
                    except OSError as e:
                        raise DatasetError(f"cannot read tar shard {clip(str(e))}") from None
                    identities.append((-1, -1, size, -1, -1))  # read through the cache: not checked by inode
                    files[number] = remote_file(shard, size, version, max(size, 1))
                elif compressor is not None:
                    # NOTE [decompressed shards]: the copy is the file the index names and workers read.
                    copy = decompressed_copy(shard, compressor)
                    files[number], scanned = copy_scan(shard, copy, cache, identities, fields)
                    scans.append(scanned)
                else:
                    scans.append(cached_scan(shard, cache, identities, fields=fields))
        for file_id, (shard, scanned) in enumerate(zip(shards, scans, strict=True)):
            count = len(scanned["labels"])
            if count == 0:
                raise DatasetError(f"tar shard {shard} holds no samples: {EXPECTED}")
            file_ids.append(np.full(count, file_id, np.int32))
            offsets.append(scanned["offsets"])
            sizes.append(scanned["sizes"])
            labels.append(scanned["labels"])
            key_blobs.append(scanned["key_blob"])
            key_lengths.append(np.diff(scanned["key_offsets"]))
        key_blob = np.concatenate(key_blobs)
        key_offsets = np.zeros(sum(len(k) for k in key_lengths) + 1, np.int64)
        np.cumsum(np.concatenate(key_lengths), out=key_offsets[1:])
        if isinstance(self.paths, str) or len(shards) == 1:
            root = self.where
        else:
            root = f"{shards[0]} and {len(shards) - 1} more shards"
        return ExtentIndex(
            root,
            (),
            tuple(files),
            np.concatenate(file_ids),
            np.concatenate(offsets),
            np.concatenate(sizes),
            key_blob,
            key_offsets,
            np.concatenate(labels),
            file_identities=np.array(identities, np.int64).reshape(len(shards), 5),
            cache_dir=self.cache_dir,
            cache_limit=self.size("cache_limit"),
            fields=_field_extents(declared, named, scans),
        )


def _field_extents(
    declared: tuple[DeclaredField, ...], named: bool, scans: list[Scan]
) -> FieldExtents | None:
    """The declared fields with their ragged members' extents over every shard (None: no `fields=`)."""
    if not declared:
        return None
    offsets = np.concatenate([s["field_offsets"] for s in scans], axis=1)
    sizes = np.concatenate([s["field_sizes"] for s in scans], axis=1)
    names, kinds = tuple(d.name for d in declared), tuple(d.kind for d in declared)
    return FieldExtents(names, kinds, named, offsets, sizes)


