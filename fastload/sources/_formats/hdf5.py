"""HDF5 files: encoded images (decoded like a folder's) or fixed-shape arrays (delivered as stored).

`HDF5(path, data="images", labels="labels")` reads one dataset of samples and one of targets.
What the `data` dataset holds decides how it is loaded:

- a 1-D dataset of variable-length uint8 (`h5py.vlen_dtype(np.uint8)`), or of fixed-length opaque
  or bytes values, holds encoded images (JPEG, PNG, ...): `HDF5BytesIndex`, a `SampleIndex` that
  the image job decodes, crops and augments exactly as it does a folder's files;
- a numeric dataset (N, ...) holds arrays (decoded images, feature rows): `HDF5ArrayIndex`, an
  `ArrayIndex` whose rows go into the batch as stored, without transforms.

Targets are a 1-D integer dataset (int64 class indices) or a 2-D one (N, K) (float32, multi-hot),
read into memory when the source is opened; class names come from `classes`, or else from a
`classes` attribute of the targets' (or the data's) dataset.

NOTE [HDF5 handles and fork]: an HDF5 file handle must not cross a fork (the library's state,
caches and locks would be shared by accident). The trainer opens the file to read its metadata
and targets and closes it before any worker exists; each process that reads samples opens its own
handle on first use (`PerProcess`, keyed by pid), and a pickled index carries none. Arrays whose
bytes lie raw in the file (contiguous, or uncompressed chunks of whole rows) are not read through
HDF5 at all: their block offsets are found at open, and workers map the file (`MappedRows`).
Compressed or otherwise transformed arrays are read through HDF5 a block (chunk) at a time into a
decoded copy in each process, while it fits `cache_mb`; larger ones by one sorted selection per
batch through HDF5's chunk cache, sized to `cache_mb`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fastload._errors import ConfigError, DatasetError
from fastload.sources._base import FileToOpen, Naming, Source, UnboundedFiles
from fastload.sources._formats.hdf5_files import _h5py, located
from fastload.sources._formats.hdf5_indexes import HDF5ArrayIndex, HDF5BytesIndex
from fastload.sources._formats.hdf5_reach import files_reached
from fastload.sources._formats.sample_fields import fields_in_memory, normalized_fields, parse_fields
from fastload.sources._indexes.arrays import MappedRows
from fastload.sources._indexes.field_extents import IMAGE, LABEL, RAGGED_KINDS
from fastload.sources._storage.bounds import MAX_LABEL, MAX_TARGET_BYTES

# Rows per block read at once from a dataset that is not chunked (e.g. contiguous, big-endian).
_BLOCK_BYTES = 1 << 20
# Datasets named in a "no such dataset" message, at most.
_LISTED = 20


_LOCAL_ONLY = (
    "HDF5 files are read from local disk only; from object storage, read a pack "
    "(`fastload pack SRC s3://bucket/prefix`), tar shards or a file list"
)


@dataclass(frozen=True)
class HDF5(
    Source, kind="hdf5", named_by=Naming((".h5", ".hdf5"), url_refusal=_LOCAL_ONLY), served_by_daemon=True
):
    """Samples in an HDF5 file: the `data` dataset, targets in the `labels` dataset.

    - `data`: encoded images (1-D variable-length uint8, or fixed-length opaque/bytes), decoded,
      transformed and normalized as a folder's images are; or a numeric array (N, ...) whose rows
      are delivered as stored, `[rows, targets]` (no `transform` or `normalize`).
    - `labels`: a 1-D integer dataset (int64 targets) or a 2-D one (N, K) (float32 multi-hot
      targets); None: no targets (every label is -1).
    - `classes`: class names (default: the `classes` attribute of the labels' or data's dataset).
    - `cache_mb`: memory each reading process may keep of a compressed array decoded (and HDF5's
      chunk cache size).
    - `fields`: datasets as declared fields (`_formats/sample_fields.py`), by name, each name a
      dataset and its value the kind by the fields' table: `{"images": "jpg", "captions": "txt",
      "meta": "json", "labels": "cls"}` gives dict batches of those four (the image field's
      dataset replaces `data`, the label field's `labels`; without one, labels are -1). Text,
      JSON and bytes datasets (1-D, N strings or byte strings) are read into memory when opened,
      within the budget of targets.
    Needs h5py (`pip install fastload[hdf5]`).
    """

    path_fields: ClassVar[tuple[str, ...]] = ("path",)
    quiet_defaults: ClassVar[tuple[str, ...]] = ("fields",)
    path: str
    data: str = "images"
    labels: str | None = "labels"
    classes: tuple[str, ...] | None = None
    cache_mb: int = 256
    fields: Mapping[str, str] | tuple[str, ...] | None = None  # as `normalized_fields` keeps it

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", normalized_fields(self.fields))
        if self.fields is not None and not all("=" in entry for entry in self.fields):
            raise ConfigError(
                'an HDF5 source\'s fields= name their datasets: a dict ({"images": "jpg", ...})'
            )
        if self.classes is not None:
            object.__setattr__(self, "classes", tuple(str(c) for c in self.classes))

    @property
    def where(self) -> str:
        return os.path.abspath(self.path)

    def files_before_open(self) -> Iterator[FileToOpen]:
        """Its path, then every file HDF5 may open for it, recursively (`_hdf5_reach`), each a
        regular file where there is one; a file is walked once the one before has passed."""
        yield from super().files_before_open()
        try:
            for candidate in files_reached(str(self.path)):
                yield FileToOpen(
                    candidate.path, candidate.what, regular=True,
                    passes_while_missing=candidate.in_working_dir,
                )
        except DatasetError as e:  # names only the file and its objects, each checked before
            raise UnboundedFiles(str(e)) from e

    def open(self) -> HDF5BytesIndex | HDF5ArrayIndex:
        if isinstance(self.fields, tuple):
            return self._open_fields(self.fields)
        h5py = _h5py()
        path = self.where
        if not os.path.isfile(path):
            what = "is not a file" if os.path.exists(path) else "does not exist"
            raise DatasetError(f"HDF5 file {path} {what}")
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise DatasetError(f"cannot open {path} as an HDF5 file: {e}") from e
        with f:  # closed before any worker is forked (NOTE [HDF5 handles and fork])
            dset = _dataset(f, path, self.data, "data")
            if dset.ndim == 0 or dset.shape[0] == 0:
                raise DatasetError(f"{path}:{dset.name} holds no samples (shape {dset.shape})")
            encoded = _holds_encoded(h5py, dset, path)
            classes, labels = self._targets(f, path, dset)
            cache_bytes = int(self.cache_mb) << 20
            if encoded:  # (a daemon's workers read it where it lies: NOTE [a daemon's workers ...])
                return HDF5BytesIndex(path, dset.name, classes, labels, cache_bytes, holder=located(dset))
            return _array_index(dset, path, classes, labels, cache_bytes)

    def _open_fields(self, entries: tuple[str, ...]) -> HDF5BytesIndex:
        """The index of declared fields: the image field's dataset as `data`, the label field's as
        `labels`, the ragged fields' datasets read into memory."""
        declared, named = parse_fields(entries)
        image = next(d.name for d in declared if d.kind == IMAGE)
        label = next((d.name for d in declared if d.kind == LABEL), None)
        plain = dataclasses.replace(self, data=image, labels=label, fields=None).open()
        if not isinstance(plain, HDF5BytesIndex):
            raise DatasetError(f"{self.where}:{image} holds arrays, not encoded images: fields= needs images")
        cells: list[list[bytes]] = []
        with _h5py().File(self.where, "r") as f:  # closed before any worker is forked
            for d in declared:
                if d.kind in RAGGED_KINDS:
                    dset = _dataset(f, self.where, d.name, f"field {d.name!r}")
                    cells.append(_values(dset, self.where, len(plain)))
        fields = fields_in_memory(declared, named, cells, len(plain))
        return dataclasses.replace(plain, fields=fields)

    def _targets(self, f: Any, path: str, dset: Any) -> tuple[tuple[str, ...], np.ndarray]:
        """(class names, targets): int64 (N,) or float32 (N, K), read into memory."""
        n = int(dset.shape[0])
        if n * 8 > MAX_TARGET_BYTES:
            raise DatasetError(
                f"{path}:{dset.name} declares {n:,} samples: their targets would take over the "
                f"{MAX_TARGET_BYTES:,}-byte budget of targets (NOTE [source bounds])"
            )
        named = _class_names(dset.attrs.get("classes"))
        if self.labels is None:
            return self.classes or named, np.full(n, -1, np.int64)
        source = _dataset(f, path, self.labels, "labels")
        where = f"{path}:{source.name}"
        declared = tuple(int(d) for d in source.shape or ())
        if not declared or declared[0] != n:
            raise DatasetError(f"{where} declares shape {declared} for the {n} samples of {dset.name}")
        if math.prod(declared) * max(source.dtype.itemsize, 4) > MAX_TARGET_BYTES:
            raise DatasetError(
                f"{where} declares shape {declared}: its targets would take over the "
                f"{MAX_TARGET_BYTES:,}-byte budget of targets (NOTE [source bounds])"
            )
        raw = source[()]
        if raw.ndim == 1 and np.issubdtype(raw.dtype, np.integer):
            if raw.size and (int(raw.min()) < 0 or int(raw.max()) > MAX_LABEL):
                bad = int(raw.min()) if int(raw.min()) < 0 else int(raw.max())
                raise DatasetError(f"{where}: class indices must be >= 0 and < 2^63, got {bad}")
            labels = raw.astype(np.int64)
        elif raw.ndim == 2 and (np.issubdtype(raw.dtype, np.number) or raw.dtype == np.bool_):
            labels = raw.astype(np.float32)
        else:
            raise DatasetError(
                f"{where} has shape {raw.shape} and dtype {raw.dtype}: targets are a 1-D integer dataset "
                "(class indices) or a 2-D (samples, classes) one (multi-hot)"
            )
        if labels.shape[0] != n:
            raise DatasetError(f"{where} holds {labels.shape[0]} targets for the {n} samples of {dset.name}")
        classes = self.classes or _class_names(source.attrs.get("classes")) or named
        width = labels.shape[1] if labels.ndim == 2 else int(labels.max()) + 1
        if classes and width > len(classes):
            raise DatasetError(f"{where}: {width} classes' targets, but {len(classes)} class names")
        return classes, labels


def _dataset(f: Any, path: str, name: str, what: str) -> Any:
    """The dataset `name`, or a DatasetError listing the datasets the file holds."""
    h5py = _h5py()
    found = f.get(name)
    if isinstance(found, h5py.Dataset):
        return found
    present: list[str] = []

    def note(key: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and len(present) <= _LISTED:
            present.append(f"/{key} {obj.shape} {_describe_dtype(h5py, obj.dtype)}")

    f.visititems(note)
    listing = ", ".join(present[:_LISTED]) + (", ..." if len(present) > _LISTED else "")
    problem = "no dataset" if found is None else "a group, not a dataset, at"
    raise DatasetError(
        f"{path} has {problem} {name!r} (the {what}: pass {what}=NAME); datasets present: {listing or 'none'}"
    )


def _describe_dtype(h5py: Any, dtype: np.dtype) -> str:
    base = h5py.check_vlen_dtype(dtype)
    return f"vlen {base}" if base is not None else str(dtype)


def _class_names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in np.atleast_1d(value).tolist())


def _holds_encoded(h5py: Any, dset: Any, path: str) -> bool:
    """True for encoded samples (variable-length uint8, opaque or bytes), False for a numeric
    array; DatasetError for anything else."""
    dtype = dset.dtype
    base = h5py.check_vlen_dtype(dtype)
    encoded = base in (np.dtype(np.uint8), np.dtype(np.int8)) or (
        base is None and dtype.kind in "VS" and dtype.names is None
    )
    if encoded and dset.ndim == 1:
        return True
    if base is None and dtype.kind in "biufc" and dtype.names is None:
        return False
    raise DatasetError(
        f"{path}:{dset.name} has shape {dset.shape} and dtype {_describe_dtype(h5py, dtype)}: fastload reads "
        "encoded images (a 1-D dataset of h5py.vlen_dtype(np.uint8), or opaque/bytes values) or numeric "
        "arrays (samples, ...)"
    )


def _array_index(
    dset: Any, path: str, classes: tuple[str, ...], labels: np.ndarray, cache_bytes: int
) -> HDF5ArrayIndex:
    """The index of a numeric dataset, with the way its rows are read (the module docstring)."""
    row_shape = tuple(int(s) for s in dset.shape[1:])
    row_dtype = dset.dtype.newbyteorder("=")
    if math.prod(row_shape) == 0:
        raise DatasetError(f"{path}:{dset.name} has empty rows (shape {dset.shape})")
    row_bytes = row_dtype.itemsize * math.prod(row_shape)
    decoded_bytes = row_bytes * len(labels)
    stored = int(dset.id.get_storage_size())
    return HDF5ArrayIndex(
        path,
        dset.name,
        classes,
        labels,
        cache_bytes,
        row_shape=row_shape,
        row_dtype=row_dtype,
        mapped=_mapped_rows(dset, os.path.abspath(dset.file.filename)),  # the file holding it (links)
        block_rows=int(dset.chunks[0]) if dset.chunks else max(1, _BLOCK_BYTES // row_bytes),
        fill=decoded_bytes <= cache_bytes,
        storage_ratio=stored / decoded_bytes if stored else 1.0,
    )


def _mapped_rows(dset: Any, path: str) -> MappedRows | None:
    """Where a dataset's rows lie raw in the file, when they all do: contiguous, or chunked in
    whole rows with no filter, every chunk written, native byte order; else None."""
    if (
        dset.is_virtual
        or dset.external
        or dset.file.driver != "sec2"
        or dset.dtype != dset.dtype.newbyteorder("=")
        or dset.id.get_create_plist().get_nfilters()
    ):
        return None
    n = int(dset.shape[0])
    row_bytes = dset.dtype.itemsize * math.prod(dset.shape[1:])
    if dset.chunks is None:
        offset = dset.id.get_offset()
        if offset is None:  # never written: every row is the fill value
            return None
        block_rows, offsets = n, np.array([offset], np.int64)
    else:
        if tuple(dset.chunks[1:]) != tuple(dset.shape[1:]):
            return None  # chunks split rows: a row's bytes are not in one place
        block_rows = int(dset.chunks[0])
        offsets = np.full(-(-n // block_rows), -1, np.int64)

        def note(info: Any) -> None:
            offsets[info.chunk_offset[0] // block_rows] = info.byte_offset

        if hasattr(dset.id, "chunk_iter"):
            dset.id.chunk_iter(note)
        else:  # HDF5 < 1.12.3
            for i in range(dset.id.get_num_chunks()):
                note(dset.id.get_chunk_info(i))
        if (offsets < 0).any():
            return None  # chunks never written read as the fill value
    if int(offsets.max()) + block_rows * row_bytes > os.path.getsize(path):
        return None
    return MappedRows(path, offsets, block_rows, row_bytes)


def _values(dset: Any, path: str, n: int) -> list[bytes]:
    """A 1-D dataset of N strings or byte strings (variable or fixed length, or vlen uint8) as bytes,
    within the budget of targets."""
    where = f"{path}:{dset.name}"
    if dset.ndim != 1 or dset.shape[0] != n:
        problem = f"a field's dataset holds one value per sample ({n})"
        raise DatasetError(f"{where} has shape {dset.shape}: {problem}")
    values, total = [], 0
    for value in dset[()].tolist():
        data = value.tobytes() if isinstance(value, np.ndarray) else value
        data = data.encode() if isinstance(data, str) else data
        if not isinstance(data, bytes):
            kind = type(value).__name__
            raise DatasetError(f"{where} holds {kind} values: a field's dataset holds strings or bytes")
        total += len(data)
        if total > MAX_TARGET_BYTES:
            budget = f"{MAX_TARGET_BYTES:,}-byte budget of targets"
            raise DatasetError(f"{where}: its values take over the {budget}")
        values.append(data)
    return values
