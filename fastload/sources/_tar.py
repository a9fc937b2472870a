"""WebDataset tar shards as a source: `TarShards` scans the shards' headers into an `ExtentIndex`.

Its one responsibility is turning shards into an index. Layout (WebDataset): uncompressed `.tar`
files whose members are grouped by key, the member name up to the first dot of its base name:
`KEY.jpg` (or .jpeg, .png, .webp, ... one image per key) with `KEY.cls` (an integer, as text) or
`KEY.json` (an object whose "label", else "cls", is an integer). Samples are numbered in shard
order, then member order, which is storage order: a block shuffle reads them sequentially.
Only the headers and the small label members are read; the images are read by offset when loaded.
Local paths only (no fsspec URLs, no compressed shards: reads go to byte offsets).

NOTE [shard index cache]: `tarfile` scans ~17k samples/s, so ImageNet's shards would take over a
minute to open every time a loader is made. Each shard's scan is kept in a cache directory
(`$FASTLOAD_CACHE_DIR`, else `$XDG_CACHE_HOME/fastload`, else `~/.cache/fastload`; an empty
`FASTLOAD_CACHE_DIR` turns it off), one `.npz` per shard named by a hash of its real path, size
and modification time, so a changed shard is scanned again; written atomically, read without
pickle, and a cache that cannot be written or read is ignored (scanned instead).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import itertools
import json
import os
import re
import tarfile
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._base import Source
from fastload.sources._extents import ExtentIndex
from fastload.sources._folder import IMG_EXTENSIONS
from fastload.sources._index import pack_strings

_IMAGE_EXTS = frozenset(ext.lstrip(".") for ext in IMG_EXTENSIONS)
_LABEL_EXTS = ("cls", "json")  # in order of preference
_MAX_LABEL_BYTES = 1 << 20
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # WebDataset's split: key, then extension
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
_EXPECTED = "expected uncompressed .tar shards in the WebDataset layout (KEY.jpg with KEY.cls or KEY.json)"


@dataclass(frozen=True)
class TarShards(Source):
    """WebDataset tar shards (see the module docstring): `paths` one path, a list of paths, a
    glob (`shards/*.tar`) or brace notation (`train-{000000..000099}.tar`, `{a,b}.tar`), each
    pattern's matches sorted. Labels are class indices; `classes` is empty."""

    kind: ClassVar[str] = "tar"
    path_fields: ClassVar[tuple[str, ...]] = ("paths",)
    paths: str | tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.paths, str):
            object.__setattr__(self, "paths", tuple(os.fspath(p) for p in self.paths))

    @property
    def where(self) -> str:
        first = self.paths if isinstance(self.paths, str) else (self.paths[0] if self.paths else "")
        return os.path.abspath(first)

    def shard_paths(self) -> list[str]:
        """Every shard, absolute, in order; DatasetError when a pattern matches nothing."""
        patterns = [self.paths] if isinstance(self.paths, str) else list(self.paths)
        if not patterns:
            raise DatasetError("TarShards needs at least one shard path")
        shards: list[str] = []
        for pattern in patterns:
            for expanded in expand_braces(pattern):
                if glob.has_magic(expanded):
                    matches = sorted(glob.glob(expanded))
                    if not matches:
                        raise DatasetError(f"no tar shards match {expanded}")
                    shards.extend(matches)
                elif not os.path.isfile(expanded):
                    what = "is not a file" if os.path.exists(expanded) else "does not exist"
                    raise DatasetError(f"tar shard {os.path.abspath(expanded)} {what}")
                else:
                    shards.append(expanded)
        return [os.path.abspath(s) for s in shards]

    def open(self) -> ExtentIndex:
        shards = self.shard_paths()
        file_ids: list[np.ndarray] = []
        offsets: list[np.ndarray] = []
        sizes: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        key_blobs: list[np.ndarray] = []
        key_lengths: list[np.ndarray] = []
        for file_id, shard in enumerate(shards):
            scanned = _cached_scan(shard)
            count = len(scanned["labels"])
            if count == 0:
                raise DatasetError(f"tar shard {shard} holds no samples: {_EXPECTED}")
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
            tuple(shards),
            np.concatenate(file_ids),
            np.concatenate(offsets),
            np.concatenate(sizes),
            key_blob,
            key_offsets,
            np.concatenate(labels),
        )


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's brace notation: `{000..099}` (zero-padded as written) and `{a,b,c}`, every
    brace expanded, in order."""
    parts = _BRACE.split(pattern)  # literal, brace body, literal, ...
    choices: list[list[str]] = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            choices.append([part])
            continue
        numbers = _RANGE.match(part)
        if numbers is None:
            choices.append(part.split(","))
            continue
        lo, hi = numbers.group(1), numbers.group(2)
        if int(hi) < int(lo):
            raise DatasetError(f"brace range {{{part}}} in {pattern} counts down")
        width = len(lo) if lo.startswith("0") else 0
        choices.append([str(k).zfill(width) for k in range(int(lo), int(hi) + 1)])
    return ["".join(combination) for combination in itertools.product(*choices)]


_SCAN_FIELDS = ("offsets", "sizes", "labels", "key_blob", "key_offsets")


def cache_dir() -> str | None:
    """Where shard scans are kept (NOTE [shard index cache]), or None when caching is off."""
    chosen = os.environ.get("FASTLOAD_CACHE_DIR")
    if chosen is not None:
        return chosen or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload")


def _cached_scan(shard: str) -> dict[str, np.ndarray]:
    """One shard's samples (image extents, labels, keys), from the cache when it has this shard
    as it is now, else scanned (and kept)."""
    directory = cache_dir()
    path = None
    if directory is not None:
        st = os.stat(shard)
        identity = f"{os.path.realpath(shard)}\0{st.st_size}\0{st.st_mtime_ns}".encode(
            "utf-8", "surrogateescape"
        )
        path = os.path.join(directory, "tar-index", hashlib.sha256(identity).hexdigest()[:32] + ".npz")
        with contextlib.suppress(OSError, ValueError, KeyError), np.load(path, allow_pickle=False) as kept:
            scanned = {name: np.asarray(kept[name]) for name in _SCAN_FIELDS}
            if _consistent(scanned):
                return scanned
    offsets: list[int] = []
    sizes: list[int] = []
    labels: list[int] = []
    keys: list[bytes] = []
    _scan_shard(shard, offsets, sizes, labels, keys)
    key_blob, key_offsets = pack_strings(keys)
    scanned = {
        "offsets": np.array(offsets, np.int64),
        "sizes": np.array(sizes, np.int64),
        "labels": np.array(labels, np.int64),
        "key_blob": key_blob,
        "key_offsets": key_offsets,
    }
    if path is not None and scanned["labels"].size:
        with contextlib.suppress(OSError):
            _keep(path, scanned)
    return scanned


def _consistent(scanned: dict[str, np.ndarray]) -> bool:
    n = scanned["labels"].shape
    return (
        scanned["offsets"].dtype == scanned["sizes"].dtype == scanned["labels"].dtype == np.int64
        and scanned["offsets"].shape == scanned["sizes"].shape == n
        and scanned["key_offsets"].shape == (n[0] + 1,)
        and scanned["key_blob"].dtype == np.uint8
        and int(scanned["key_offsets"][-1]) == scanned["key_blob"].shape[0]
    )


def _keep(path: str, scanned: dict[str, np.ndarray]) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                offsets=scanned["offsets"],
                sizes=scanned["sizes"],
                labels=scanned["labels"],
                key_blob=scanned["key_blob"],
                key_offsets=scanned["key_offsets"],
            )
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _check_uncompressed(shard: str) -> None:
    try:
        with open(shard, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise DatasetError(f"cannot read tar shard {shard}: {e}") from e
    for magic, name in _COMPRESSED:
        if head.startswith(magic):
            raise DatasetError(
                f"{shard} is {name}-compressed: samples are read at byte offsets, so shards must be "
                f"uncompressed; {_EXPECTED} (decompress it, e.g. `{name} -d`, or `fastload pack` it)"
            )


def _scan_shard(
    shard: str, offsets: list[int], sizes: list[int], labels: list[int], keys: list[bytes]
) -> int:
    """Append the shard's samples (image extent, label, key); return how many."""
    _check_uncompressed(shard)
    # Per key, in order of first appearance: each member's extension and its (offset, size), or
    # for a label member its bytes.
    samples: dict[str, dict[str, tuple[int, int] | bytes]] = {}
    try:
        end = os.path.getsize(shard)
        with tarfile.open(shard, mode="r:") as tf:
            while (member := tf.next()) is not None:
                tf.members.clear()  # type: ignore[attr-defined]  # keep no TarInfo per member
                match = _KEY_EXT.match(member.name)
                if not member.isreg() or match is None:
                    continue  # a directory, or a name without an extension: no part of a sample
                key, ext = match.group(1), match.group(2).lower()
                if member.offset_data + member.size > end:
                    raise DatasetError(f"{shard}:{member.name} runs past the end of the shard (truncated?)")
                found = samples.setdefault(key, {})
                if ext in found:
                    raise DatasetError(f"{shard}:{key} has two .{ext} members")
                if ext in _LABEL_EXTS:
                    if member.size > _MAX_LABEL_BYTES:
                        raise DatasetError(
                            f"{shard}:{member.name} is too large for a label ({member.size} bytes)"
                        )
                    label_file = tf.extractfile(member)
                    assert label_file is not None  # a regular file
                    found[ext] = label_file.read()
                else:
                    found[ext] = (member.offset_data, member.size)
    except tarfile.TarError as e:
        raise DatasetError(f"{shard} is not a tar file ({e}): {_EXPECTED}") from e
    except OSError as e:
        raise DatasetError(f"cannot read tar shard {shard}: {e}") from e
    for key, found in samples.items():
        images = [ext for ext in found if ext in _IMAGE_EXTS]
        if not images:
            raise DatasetError(
                f"{shard}:{key} has no image member (it has .{', .'.join(found)}; looked for "
                f".{', .'.join(sorted(_IMAGE_EXTS))}): {_EXPECTED}"
            )
        if len(images) > 1:
            raise DatasetError(f"{shard}:{key} has several images (.{', .'.join(images)}); expected one")
        label_ext = next((ext for ext in _LABEL_EXTS if ext in found), None)
        if label_ext is None:
            raise DatasetError(f"{shard}:{key} has an image but no label (KEY.cls or KEY.json): {_EXPECTED}")
        extent, label = found[images[0]], found[label_ext]
        assert isinstance(extent, tuple) and isinstance(label, bytes)
        offsets.append(extent[0])
        sizes.append(extent[1])
        labels.append(_parse_label(shard, key, label_ext, label))
        keys.append(key.encode("utf-8", "surrogateescape"))
    return len(samples)


def _parse_label(shard: str, key: str, ext: str, data: bytes) -> int:
    """A `.cls` member's integer, or a `.json` member's "label" (else "cls")."""
    where = f"{shard}:{key}.{ext}"
    value: Any
    try:
        text = data.decode("utf-8").strip()
        if ext == "cls":
            value = int(text)
        else:
            obj = json.loads(text)
            value = obj.get("label", obj.get("cls")) if isinstance(obj, dict) else None
    except (UnicodeDecodeError, ValueError) as e:
        raise DatasetError(f"{where}: cannot read a label from it ({e})") from e
    if not isinstance(value, int) or isinstance(value, bool):
        raise DatasetError(
            f'{where}: expected an integer label (a JSON object\'s "label" or "cls"), got {value!r}'
        )
    if value < 0:
        raise DatasetError(f"{where}: labels must be >= 0, got {value}")
    return value
