"""One tar shard's samples as a `Scan` (keys, image extents, labels), read from its headers and
small label members, or from the scan cache when it holds the shard as it is now.

Its one responsibility is that scan; which shards, and the index made of their scans, are
`tar.py`'s (`TarShards`).

NOTE [shard index cache]: `tarfile` scans ~17k samples/s, so ImageNet's shards would take over a
minute to open every time a loader is made. Each shard's scan is kept in a cache directory
(`$FASTLOAD_CACHE_DIR`, else `$XDG_CACHE_HOME/fastload`, else `~/.cache/fastload`; an empty
`FASTLOAD_CACHE_DIR` turns it off), one entry per shard named by a hash of its real path and
identity (device, inode, size, mtime, ctime), so a changed or replaced shard is scanned again (a
remote shard's by its URL, version and size: its copy in the node cache is verified whole before
a scan reads it, NOTE [chunk verification]); in a private directory, written and read so that no
other user can plant or redirect an entry, and pruned (`_storage/scan_cache.py`, NOTE [scan cache
trust]). A cache that cannot be written or read is ignored (scanned instead).

Integrity: a shard must be a regular file; it must end with tar's end-of-archive (zero) blocks,
else it is reported as truncated (a copy cut at a sample boundary would otherwise load with fewer
samples and no word); labels are ASCII decimal integers in [0, 2^63).
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from typing import Any, BinaryIO

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._formats.folder import IMG_EXTENSIONS
from fastload.sources._formats.sample_fields import DeclaredField
from fastload.sources._formats.shard_names import COMPRESSED_TAR_SUFFIXES
from fastload.sources._indexes.field_extents import IMAGE, LABEL, MISSING, RAGGED_KINDS
from fastload.sources._indexes.sample_index import pack_strings
from fastload.sources._storage.bounds import (
    MAX_SAMPLE_BYTES,
    clip,
    identity,
    open_regular,
    parse_label,
    quoted,
)
from fastload.sources._storage.node_cache import NodeCache
from fastload.sources._storage.scan_cache import Identity, Scan, ScanCache

_IMAGE_EXTS = frozenset(ext.lstrip(".") for ext in IMG_EXTENSIONS)
_LABEL_EXTS = ("cls", "json")  # in order of preference
_MAX_LABEL_BYTES = 1 << 20
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # WebDataset's split: key, then extension
_MAX_SHARD_BYTES = 1 << 50  # a shard is any regular file
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
Fields = tuple[DeclaredField, ...]  # a `fields=` declaration, parsed (`sample_fields.parse_fields`)
EXPECTED = "expected uncompressed .tar shards in the WebDataset layout (KEY.jpg with KEY.cls or KEY.json)"


class _NoCache:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass


def open_cache() -> ScanCache | _NoCache:
    return ScanCache.open() or _NoCache()


def cached_scan(
    shard: str,
    cache: ScanCache | None,
    identities: list[Identity],
    shown: str | None = None,
    fields: Fields | None = None,
) -> Scan:
    """One shard's samples (image extents, labels, keys), from the cache when it has this shard
    as it is now, else scanned (and kept); the identity of the file scanned goes to `identities`;
    errors name it `shown` (by default its path). With `fields` (NOTE [declared fields' scans]),
    the declared members' extents too, kept as an entry of their own."""
    variant = fields_variant(fields)
    try:
        fd, info = open_regular(shard, _MAX_SHARD_BYTES, "tar shard")
    except OSError as e:
        raise DatasetError(f"cannot read tar shard {clip(shard)}: {clip(str(e))}") from e
    with os.fdopen(fd, "rb") as f:
        ident = identity(info)
        identities.append(ident)
        real = os.path.realpath(shard)
        if cache is not None:
            kept = cache.get(real, ident, variant)
            if kept is not None:
                return kept
        scanned = _scan_file(shown or shard, f, fields)
    if cache is not None and scanned["labels"].size:
        cache.put(real, ident, scanned, variant)
    return scanned


def copy_scan(
    shard: str,
    copy: tuple[str, Identity],
    cache: ScanCache | None,
    identities: list[Identity],
    fields: Fields | None = None,
) -> tuple[str, Scan]:
    """A compressed shard's uncompressed copy (its path and identity when made: NOTE [decompressed
    shards]) and its samples, the copy's identity going to `identities`; errors name the shard."""
    path, made = copy
    scanned = cached_scan(path, cache, identities, shown=shard, fields=fields)
    if identities[-1] != made:
        raise DatasetError(f"the decompressed copy of {clip(shard)} changed while it was scanned: try again")
    return path, scanned


def remote_scan(
    url: str, size: int, version: str, node: NodeCache, cache: ScanCache | None, fields: Fields | None = None
) -> Scan:
    """A remote shard's samples: from the scan cache, which keeps them by URL, version and size,
    else scanned from its copy in the node cache (verified whole before it is read: NOTE [chunk
    verification])."""
    key, ident, variant = f"{url}\0{version}", (-1, -1, size, -1, -1), fields_variant(fields)
    kept = cache.get(key, ident, variant) if cache is not None else None
    if kept is not None:
        return kept
    with node.open_whole(url, version, size) as f:
        scanned = _scan_file(url, f, fields)
    if cache is not None and scanned["labels"].size:
        cache.put(key, ident, scanned, variant)
    return scanned


def _scan_file(name: str, f: BinaryIO, fields: Fields | None = None) -> Scan:
    """The samples of the shard open as `f` (`name`: what errors call it)."""
    offsets: list[int] = []
    sizes: list[int] = []
    labels: list[int] = []
    keys: list[bytes] = []
    extents: list[list[tuple[int, int]]] = []
    _scan_shard(name, offsets, sizes, labels, keys, f, fields, extents)
    key_blob, key_offsets = pack_strings(keys)
    more: Scan = {}
    if fields is not None:
        ragged = sum(d.kind in RAGGED_KINDS for d in fields)
        both = np.array(extents, np.int64).reshape(len(keys), ragged, 2)
        more = {"field_offsets": both[:, :, 0].T.copy(), "field_sizes": both[:, :, 1].T.copy()}
    return {
        **more,
        "offsets": np.array(offsets, np.int64),
        "sizes": np.array(sizes, np.int64),
        "labels": np.array(labels, np.int64),
        "key_blob": key_blob,
        "key_offsets": key_offsets,
    }


def _check_uncompressed(shard: str, f: BinaryIO) -> None:
    try:
        f.seek(0)
        head = f.read(8)
    except OSError as e:
        raise DatasetError(f"cannot read tar shard {clip(shard)}: {clip(str(e))}") from e
    for magic, name in _COMPRESSED:
        if head.startswith(magic):
            raise compressed(shard, name)


def compressed_by_name(shard: str) -> str | None:
    """The compressor a shard's name says it went through (`COMPRESSED_TAR_SUFFIXES`), or None."""
    lower = shard.lower()
    return next((name for suffix, name in COMPRESSED_TAR_SUFFIXES.items() if lower.endswith(suffix)), None)


def compressed(shard: str, name: str) -> DatasetError:
    """The error for a `name`-compressed shard fastload does not decompress: what it is and what to
    do (NOTE [decompressed shards])."""
    return DatasetError(
        f"{clip(shard)} is a {name}-compressed tar: fastload reads samples at byte offsets, so it "
        "decompresses only shards named .tar.gz/.tgz, .tar.xz/.txz or .tar.bz2/.tbz2 (into its cache) "
        f"and reads others uncompressed; {EXPECTED}: decompress it (`{name} -d`) and pass the .tar"
    )


def _scan_shard(
    shard: str,
    offsets: list[int],
    sizes: list[int],
    labels: list[int],
    keys: list[bytes],
    f: BinaryIO | None = None,
    fields: Fields | None = None,
    extents: list[list[tuple[int, int]]] | None = None,
) -> int:
    """Append the shard's samples (image extent, label, key), read from `f` (the shard opened;
    by its path when None), and with `fields` each sample's ragged members' extents to
    `extents`; return how many."""
    if f is None:
        with open(shard, "rb") as own:
            return _scan_shard(shard, offsets, sizes, labels, keys, own, fields, extents)
    _check_uncompressed(shard, f)
    label_exts: tuple[str, ...] = _LABEL_EXTS
    bounded = _IMAGE_EXTS  # the members read into a slot, each held to a sample's limit
    if fields is not None:  # NOTE [declared fields' scans]: only a declared label member is read here
        label_exts = next((d.extensions for d in fields if d.kind == LABEL), ())
        bounded = frozenset(e for d in fields for e in d.extensions)
    # Per key, in order of first appearance: each member's extension and its (offset, size), or
    # for a label member its bytes.
    samples: dict[str, dict[str, tuple[int, int] | bytes]] = {}
    try:
        end = f.seek(0, os.SEEK_END)  # a remote shard's verified copy has no descriptor to fstat
        f.seek(0)
        with tarfile.open(fileobj=f, mode="r:") as tf:
            while (member := tf.next()) is not None:
                tf.members.clear()  # type: ignore[attr-defined]  # keep no TarInfo per member
                match = _KEY_EXT.match(member.name)
                if not member.isreg() or match is None:
                    continue  # a directory, or a name without an extension: no part of a sample
                key, ext = match.group(1), match.group(2).lower()
                if member.offset_data + member.size > end:
                    raise DatasetError(
                        f"{shard}:{clip(member.name)} runs past the end of the shard (truncated?)"
                    )
                found = samples.setdefault(key, {})
                if ext in found:
                    raise DatasetError(f"{shard}:{clip(key)} has two .{clip(ext, 40)} members")
                if ext in label_exts:
                    if member.size > _MAX_LABEL_BYTES:
                        raise DatasetError(
                            f"{shard}:{clip(member.name)} is too large for a label ({member.size} bytes)"
                        )
                    label_file = tf.extractfile(member)
                    assert label_file is not None  # a regular file
                    found[ext] = label_file.read()
                elif member.size > MAX_SAMPLE_BYTES and ext in bounded:
                    raise DatasetError(
                        f"{shard}:{clip(member.name)} is {member.size:,} bytes, over the "
                        f"{MAX_SAMPLE_BYTES:,}-byte limit of a sample"
                    )
                else:
                    found[ext] = (member.offset_data, member.size)
            _check_end(shard, f, tf.offset, end, len(samples))
    except tarfile.TarError as e:
        raise DatasetError(f"{shard} is not a tar file ({clip(str(e))}): {EXPECTED}") from e
    except OSError as e:
        raise DatasetError(f"cannot read tar shard {shard}: {clip(str(e))}") from e
    if fields is not None:
        assert extents is not None
        for key, found in samples.items():
            _declared_sample(shard, key, found, fields, offsets, sizes, labels, extents)
            keys.append(key.encode("utf-8", "surrogateescape"))
        return len(samples)
    for key, found in samples.items():
        images = [ext for ext in found if ext in _IMAGE_EXTS]
        if not images:
            raise DatasetError(
                f"{shard}:{clip(key)} has no image member (it has {clip('.' + ', .'.join(found))}; looked "
                f"for .{', .'.join(sorted(_IMAGE_EXTS))}): {EXPECTED}"
            )
        if len(images) > 1:
            several = ", .".join(images)
            raise DatasetError(f"{shard}:{clip(key)} has several images (.{several}); expected one")
        label_ext = next((ext for ext in _LABEL_EXTS if ext in found), None)
        if label_ext is None:
            raise DatasetError(
                f"{shard}:{clip(key)} has an image but no label (KEY.cls or KEY.json): {EXPECTED}"
            )
        extent, label = found[images[0]], found[label_ext]
        assert isinstance(extent, tuple) and isinstance(label, bytes)
        offsets.append(extent[0])
        sizes.append(extent[1])
        labels.append(_parse_label(shard, key, label_ext, label))
        keys.append(key.encode("utf-8", "surrogateescape"))
    return len(samples)


# NOTE [declared fields' scans]: with `fields=`, a sample's image is the first of the image field's
# extensions it has (WebDataset's "jpg;png": no error for a second), its label the label field's
# member (-1 without a label field, or when the sample lacks it: the job then fails or skips it,
# as a missing ragged member, size -1), and its ragged members are recorded as extents in the
# declared order; no member but a label's is read here. A key without the image is a
# DatasetError naming shard and key, as without fields. Such a scan is cached as an entry of its
# own, named with the declaration too (`fields_variant`; NOTE [scan cache trust]).


def fields_variant(fields: Fields | None) -> str:
    """What names a declaration's scans in the scan cache ("" without fields)."""
    if fields is None:
        return ""
    return json.dumps([[d.name, list(d.extensions), d.kind] for d in fields])


def _declared_sample(
    shard: str,
    key: str,
    found: dict[str, tuple[int, int] | bytes],
    fields: Fields,
    offsets: list[int],
    sizes: list[int],
    labels: list[int],
    extents: list[list[tuple[int, int]]],
) -> None:
    """Append one key's image extent, label and ragged members' extents, as `fields` declare them."""
    label = -1
    ragged: list[tuple[int, int]] = []
    for declared in fields:
        ext = next((e for e in declared.extensions if e in found), None)
        member = found[ext] if ext is not None else None
        if declared.kind == IMAGE:
            if not isinstance(member, tuple):
                wanted = ", .".join(declared.extensions)
                raise DatasetError(
                    f"{shard}:{clip(key)} has no image member for field {clip(declared.name)} (looked for "
                    f".{wanted}; it has {clip('.' + ', .'.join(found))})"
                )
            offsets.append(member[0])
            sizes.append(member[1])
        elif declared.kind == LABEL:
            if isinstance(member, bytes) and ext is not None:
                label = _parse_label(shard, key, ext, member)
        else:
            ragged.append(member if isinstance(member, tuple) else (0, MISSING))
    labels.append(label)
    extents.append(ragged)


def _check_end(shard: str, f: BinaryIO, at: int, end: int, samples: int) -> None:
    """DatasetError unless the archive's members end at `at` with an end-of-archive block: tarfile
    stops silently where a shard was cut at a member boundary, or where a header is garbage."""
    f.seek(at)
    block = f.read(tarfile.BLOCKSIZE)
    if len(block) == tarfile.BLOCKSIZE and block.count(0) == tarfile.BLOCKSIZE:
        return
    if at >= end:
        problem = f"ends after {samples} samples without tar's end-of-archive blocks: it is truncated"
    else:
        problem = f"holds {end - at:,} bytes after its {samples} samples that are not a tar header: damaged"
    raise DatasetError(f"{shard} {problem} (copy it again, or recreate it)")


def _parse_label(shard: str, key: str, ext: str, data: bytes) -> int:
    """A `.cls` member's integer, or a `.json` member's "label" (else "cls"): ASCII decimal, in
    [0, 2^63) (NOTE [source bounds])."""
    where = f"{shard}:{clip(key)}.{ext}"
    value: Any
    try:
        text = data.decode("utf-8").strip()
        if ext == "cls":
            value = parse_label(text)
            if value is None:
                raise DatasetError(
                    f"{where}: cannot read a label from it: expected a class index (an ASCII decimal "
                    f"integer from 0 to 2^63 - 1), got {quoted(text)}"
                )
        else:
            obj = json.loads(text)
            value = obj.get("label", obj.get("cls")) if isinstance(obj, dict) else None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DatasetError(f"{where}: cannot read a label from it ({clip(str(e))})") from e
    if not isinstance(value, int) or isinstance(value, bool):
        raise DatasetError(
            f'{where}: expected an integer label (a JSON object\'s "label" or "cls"), got {clip(value)}'
        )
    if not 0 <= value < 1 << 63:
        raise DatasetError(f"{where}: labels must be from 0 to 2^63 - 1, got {clip(value)}")
    return value
