"""The packed format: what a pack is on disk, its constants, and the checks of its manifest and
index that every reader runs (`packed.Packed`, locally or at a URL) and the writer (`_packing/`:
`writer.py`, `manifest.py`) follows. It imports no reader or writer, so that they all
build on it without a cycle.

A pack is a directory:

    manifest.json          format name and version, count, classes, target dtype and shape, the
                           data files, the source it came from, and `complete`
    data-00000.bin, ...    the samples' bytes as the source stores them (re-encoded only when
                           `max_side` asks: `_packing/reencode.py`), in the pack's order, each starting
                           at a multiple of 4096 bytes (O_DIRECT reads are possible), each file
                           at most `shard_bytes` (a larger sample gets a file of its own)
    offsets.npy sizes.npy file_ids.npy labels.npy names.npy name_offsets.npy
                           the index (int64, int64, int32, int64 (N,) or float32 (N, K), a uint8
                           blob of sample names and its int64 offsets), loaded with mmap_mode="r"
                           so forked workers share its pages
    field_offsets.npy field_sizes.npy
                           only in a pack of a source with declared fields (`TarShards(fields=...)`,
                           NOTE [packed fields]): int64 (ragged fields, N) extents of each sample's
                           text, JSON and bytes members in its data file
    ray-staging/           while `pack(ray=...)` runs: ranges of samples Ray made (`_packing/ray_pack.py`)

A pack made with `max_side` (`fastload pack --max-side N --quality Q`) records `"max_side": N,
"quality": Q` in its manifest (null in a pack of the source's bytes, and absent in packs made
before the option: both read the same); nothing per sample says which were re-encoded.

NOTE [packed fields]: a pack of a source with declared fields keeps every one. A sample's ragged
members (text, JSON, bytes: `_indexes/field_extents.py`) are stored in its data file right after
its image, in the order declared (a missing member: nothing stored, size -1); `sizes.npy` is the
image's alone, and `field_offsets.npy`/`field_sizes.npy` place the members, so that the pack's
index is an `ExtentIndex` whose `FieldExtents` lie in its container files, as a tar's do (the
label field is `labels.npy`, as any label). The manifest's `fields` records the declaration:
`names`, `kinds`, `named` (dict or list batches) and each field's `extensions` as declared. Such
a pack is version 2, which a fastload that would drop its fields refuses; a pack without fields
is still written as version 1 and read exactly as before.

The alignment costs 2 KiB of zeros per sample on average: ~2% for ImageNet's ~110 KB JPEGs, much
more for tiny images (a 3 KB PNG becomes 4 KiB on disk).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._indexes.field_extents import MISSING, FieldExtents
from fastload.sources._storage.bounds import MAX_SAMPLE_BYTES, clip, open_regular, read_bounded

FORMAT = "fastload-packed"
VERSION = 2  # the newest this reads; a pack without declared fields is written as version 1
PLAIN_VERSION = 1
ALIGN = 4096
MANIFEST = "manifest.json"
INDEX_FILES = ("offsets", "sizes", "file_ids", "labels", "names", "name_offsets")
FIELD_FILES = ("field_offsets", "field_sizes")  # a pack with declared fields only
_MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists classes and data files: ImageNet-21k's is ~1 MB


def data_file_name(number: int) -> str:
    return f"data-{number:05d}.bin"


def pack_index(
    root: str, classes: Sequence[str], files: Sequence[str], arrays: dict[str, np.ndarray], **options: Any
) -> ExtentIndex:
    """The ExtentIndex of a pack's checked index arrays (`options`: ExtentIndex's keywords)."""
    return ExtentIndex(
        root,
        tuple(classes),
        tuple(files),
        arrays["file_ids"],
        arrays["offsets"],
        arrays["sizes"],
        arrays["names"],
        arrays["name_offsets"],
        arrays["labels"],
        **options,
    )


def index_files(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The index arrays a pack with this manifest has."""
    return INDEX_FILES + (FIELD_FILES if manifest.get("fields") is not None else ())


def packed_fields(root: str, manifest: dict[str, Any], arrays: dict[str, np.ndarray]) -> FieldExtents | None:
    """The declared fields of a pack (NOTE [packed fields]) from its manifest's `fields` and its
    checked field arrays; None for a pack without. DatasetError when the two do not agree."""
    declared = manifest.get("fields")
    if declared is None:
        return None
    if not isinstance(declared, dict):
        raise DatasetError(f"pack {root}: the manifest's `fields` is not a declaration, got {clip(declared)}")
    try:
        names, kinds = declared["names"], declared["kinds"]
        if not all(isinstance(v, str) for v in [*names, *kinds]) or not isinstance(declared["named"], bool):
            raise ValueError("names and kinds are lists of strings, named a boolean")
        return FieldExtents(
            tuple(names), tuple(kinds), declared["named"], arrays["field_offsets"], arrays["field_sizes"]
        )
    except (KeyError, TypeError, ValueError) as e:
        raise DatasetError(
            f"pack {root}: its fields do not match its manifest's declaration ({clip(str(e))})"
        ) from e


def checked_manifest(root: str, manifest: dict[str, Any]) -> tuple[int, list[str], list[str]]:
    """(count, data file names, classes) of a manifest, each of the type it must be; DatasetError
    naming the manifest otherwise. Data files are plain names inside the pack (no `..`, no `/`)."""
    where = os.path.join(root, MANIFEST)
    count, files, classes = manifest.get("count"), manifest.get("files"), manifest.get("classes")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise DatasetError(f"{where}: `count` must be a non-negative integer, got {clip(count)}")
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files) or not files:
        raise DatasetError(f"{where}: `files` must be a non-empty list of data file names, got {clip(files)}")
    outside = [f for f in files if f in ("", ".", "..") or os.path.basename(f) != f or "\0" in f]
    if outside:
        raise DatasetError(
            f"{where}: data file {clip(outside[0])} is not a file name inside the pack (a pack's data "
            "files are its own: no directories, no `..`); the manifest is damaged or was tampered with"
        )
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise DatasetError(f"{where}: `classes` must be a list of names, got {clip(classes)}")
    return count, files, classes


def check_index(root: str, count: int, arrays: dict[str, np.ndarray], file_sizes: list[int]) -> None:
    """DatasetError unless the index arrays have their dtypes and lengths, and every extent lies
    inside its data file within `MAX_SAMPLE_BYTES` (checked once, vectorized, at open)."""
    expected = {"offsets": np.int64, "sizes": np.int64, "file_ids": np.int32, "name_offsets": np.int64}
    for name, dtype in expected.items():
        if arrays[name].dtype != dtype or arrays[name].ndim != 1:
            raise DatasetError(f"pack {root}: {name}.npy is not a 1-D {np.dtype(dtype)} array")
    labels = arrays["labels"]
    if not (
        (labels.dtype == np.int64 and labels.ndim == 1) or (labels.dtype == np.float32 and labels.ndim == 2)
    ):
        got = f"{labels.dtype} {labels.shape}"
        raise DatasetError(f"pack {root}: labels.npy is {got}, not int64 (N,) or float32 (N, K)")
    if arrays["names"].dtype != np.uint8 or arrays["names"].ndim != 1:
        raise DatasetError(f"pack {root}: names.npy is not a 1-D uint8 array")
    if any(len(arrays[name]) != count for name in ("offsets", "sizes", "file_ids", "labels")):
        raise DatasetError(f"pack {root}: its index does not hold the {count} samples its manifest says")
    if len(arrays["name_offsets"]) != count + 1:
        raise DatasetError(f"pack {root}: name_offsets.npy does not hold {count + 1} offsets")
    ids, offsets, sizes = arrays["file_ids"], arrays["offsets"], arrays["sizes"]
    name_offsets = arrays["name_offsets"]
    if count and (int(ids.min()) < 0 or int(ids.max()) >= len(file_sizes)):
        raise DatasetError(f"pack {root}: file_ids.npy names data files the manifest does not list")
    if count and (int(offsets.min()) < 0 or int(sizes.min()) < 0 or int(sizes.max()) > MAX_SAMPLE_BYTES):
        raise DatasetError(f"pack {root}: offsets.npy or sizes.npy holds a negative or oversized extent")
    if count and (offsets + sizes > np.asarray(file_sizes, np.int64)[ids]).any():
        raise DatasetError(f"pack {root}: an extent runs past the end of its data file (truncated, damaged)")
    ends = (int(name_offsets[0]), int(name_offsets[-1]))
    if ends != (0, len(arrays["names"])) or (np.diff(name_offsets) < 0).any():
        raise DatasetError(f"pack {root}: name_offsets.npy does not index names.npy")
    if labels.ndim == 1 and count and int(labels.min()) < -1:
        raise DatasetError(f"pack {root}: labels.npy holds a negative class index")
    if "field_sizes" in arrays:
        _check_field_extents(root, count, arrays, np.asarray(file_sizes, np.int64)[ids] if count else ids)


def _check_field_extents(root: str, count: int, arrays: dict[str, np.ndarray], file_ends: np.ndarray) -> None:
    """DatasetError unless every member's extent (NOTE [packed fields]) lies inside its sample's
    data file within `MAX_SAMPLE_BYTES`, or is missing (size -1)."""
    offsets, sizes = arrays["field_offsets"], arrays["field_sizes"]
    for name, array in (("field_offsets", offsets), ("field_sizes", sizes)):
        if array.dtype != np.int64 or array.ndim != 2 or array.shape[1] != count:
            raise DatasetError(f"pack {root}: {name}.npy is not an int64 (fields, {count}) array")
    if offsets.shape != sizes.shape:
        raise DatasetError(f"pack {root}: field_offsets.npy and field_sizes.npy differ in shape")
    if sizes.size and (
        int(sizes.min()) < MISSING or int(sizes.max()) > MAX_SAMPLE_BYTES or int(offsets.min()) < 0
    ):
        raise DatasetError(
            f"pack {root}: field_sizes.npy or field_offsets.npy holds a negative or oversized extent"
        )
    if sizes.size and (offsets + np.maximum(sizes, 0) > file_ends).any():
        raise DatasetError(
            f"pack {root}: a field's member runs past the end of its data file (truncated, damaged)"
        )


def read_manifest(root: str) -> dict[str, Any] | None:
    """The manifest of the pack at `root`, None when there is none; DatasetError when it is not a
    fastload pack's, or a newer version's."""
    path = os.path.join(root, MANIFEST)
    try:
        fd, _ = open_regular(path, _MAX_MANIFEST_BYTES, "pack manifest")
        try:
            data = read_bounded(fd, _MAX_MANIFEST_BYTES, path, "pack manifest")
        finally:
            os.close(fd)
        manifest = json.loads(data.decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        raise DatasetError(f"cannot read {path}: {clip(str(e))}") from e
    return checked_manifest_format(manifest, path)


def checked_manifest_format(manifest: Any, path: str) -> dict[str, Any]:
    """`manifest` (parsed JSON) when it is a fastload pack's of a version this reads."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DatasetError(f"{path} is not the manifest of a fastload pack (format {FORMAT!r})")
    version = manifest.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int):
        raise DatasetError(f"{path}: `version` must be an integer, got {clip(version)}")
    if version > VERSION:
        raise DatasetError(
            f"{path} is format version {manifest['version']}; this fastload reads version {VERSION} "
            "(upgrade fastload)"
        )
    return manifest
