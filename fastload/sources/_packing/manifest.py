"""What a pack's manifest says of how it was made, and whether a `pack` run may go on with the
pack it finds: the same source (as it was: `source_fingerprint`), order, options, shard size and
samples left out; and a source's declared fields (NOTE [packed fields]).

Besides the format's fields (`_formats/pack_format.py`), a pack's manifest records `excluded`, the names of
the samples `pack(exclude=...)` (`--exclude LIST`) left out, sorted, and, once complete,
`skipped`: [name, why] of each sample `on_error="skip"` left out, in the pack's order (names as
the source names them: what `fastload verify` writes). `count` is the samples the pack holds;
while it is being written, the samples it will hold when none is skipped.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from fastload._errors import ConfigError, DatasetError
from fastload.sources._base import Source
from fastload.sources._formats.pack_format import ALIGN, FORMAT, PLAIN_VERSION, VERSION
from fastload.sources._formats.sample_fields import parse_fields
from fastload.sources._indexes.field_extents import FieldExtents
from fastload.sources._indexes.sample_index import SampleIndex, declared_fields
from fastload.sources._packing.reencode import Reencoding


def new_manifest(
    src: Source,
    index: SampleIndex,
    count: int,
    shard_bytes: int,
    shuffle_seed: int | None,
    setting: Reencoding | None,
    excluded: list[str],
) -> dict[str, Any]:
    """The manifest of a pack of `count` of `index`'s samples (the others `excluded`), not complete."""
    labels = index.labels
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": PLAIN_VERSION,
        "complete": False,
        "count": count,
        "classes": list(index.classes),
        "target": {"dtype": str(labels.dtype), "shape": list(labels.shape[1:])},
        "alignment": ALIGN,
        "shard_bytes": shard_bytes,
        "shuffle_seed": shuffle_seed,
        "max_side": None if setting is None else setting.max_side,
        "quality": None if setting is None else setting.quality,
        "source": src.to_config(),
        "source_fingerprint": _fingerprint(index),
        "excluded": excluded,
        "files": [],
    }
    declaring = declared_fields(index)
    if declaring is not None and declaring.fields is not None:  # NOTE [packed fields]
        manifest.update(version=VERSION, fields=_declaration(src, declaring.fields))
    return manifest


def _declaration(src: Source, fields: FieldExtents) -> dict[str, Any]:
    """The declaration a pack's manifest records: names, kinds, form and each field's extensions
    as `src` declared them (the name alone where its declaration names no extension)."""
    declared = getattr(src, "fields", None)
    extensions = (
        [list(d.extensions) for d in parse_fields(declared)[0]]
        if isinstance(declared, tuple)
        else [[] for _ in fields.names]
    )
    return {**fields.declaration(), "extensions": extensions}


def left_out(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, why) of every sample of the source a pack does not hold: excluded, then skipped."""
    excluded = [(str(name), "excluded (--exclude)") for name in manifest.get("excluded") or ()]
    skipped = [(str(item[0]), str(item[1])) for item in manifest.get("skipped") or ()]
    return excluded + skipped


def _fingerprint(index: SampleIndex) -> str:
    """A hash of the source's index as opened: every sample's name and target, and for extent
    sources each extent. A pack resumed from a source that changed with the same count (files
    swapped, relabelled, a shard rewritten) would otherwise mix two sources' samples and labels."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(index.labels).tobytes())
    for field in ("offsets", "sizes", "file_ids"):
        array = getattr(index, field, None)
        if isinstance(array, np.ndarray):
            digest.update(np.ascontiguousarray(array).tobytes())
    declaring = declared_fields(index)
    if declaring is not None and declaring.fields is not None:  # every member's extent, a list's cells
        for array in (declaring.fields.offsets, declaring.fields.sizes, declaring.fields.blob):
            if array is not None:
                digest.update(np.ascontiguousarray(array).tobytes())
    for i in range(len(index)):
        digest.update(index.name(i).encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def check_same(root: str, manifest: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse to go on with a pack of another source, or of this one as it was before it changed,
    or made with other options or other samples left out."""
    if manifest.get("source") != wanted["source"]:
        raise DatasetError(
            f"{root} holds a pack of another source ({json.dumps(manifest.get('source'))}), not of "
            f"{json.dumps(wanted['source'])}: pack into a new directory, or remove {root}"
        )
    if manifest.get("shuffle_seed") != wanted["shuffle_seed"]:
        raise DatasetError(
            f"{root} is a pack in the order of shuffle seed {manifest.get('shuffle_seed')}, not "
            f"{wanted['shuffle_seed']}: use that seed, or pack into a new directory"
        )
    stored = (manifest.get("max_side"), manifest.get("quality"))
    if stored != (wanted["max_side"], wanted["quality"]):
        raise ConfigError(
            f"{root} is a pack {_describe(*stored)}, not {_describe(wanted['max_side'], wanted['quality'])}: "
            f"{'use' if manifest.get('complete') else 'finish it with'} those options, or pack into a new "
            "directory"
        )
    excluded = manifest.get("excluded") or []  # absent in packs made before it: none
    if excluded != wanted["excluded"]:
        raise ConfigError(
            f"{root} is a pack {_excluding(len(excluded))}, not {_excluding(len(wanted['excluded']))}: "
            f"{'use' if manifest.get('complete') else 'finish it with'} the same --exclude list, or pack "
            "into a new directory"
        )
    planned = manifest.get("count")
    if isinstance(planned, int) and manifest.get("complete"):
        planned += len(manifest.get("skipped") or ())  # those on_error="skip" left out
    if planned != wanted["count"]:
        raise DatasetError(
            f"the source changed since {root} was packed from it (it had {json.dumps(planned)} samples to "
            f"pack, has {wanted['count']}): remove {root} and pack again"
        )
    for field in ("classes", "target"):
        if manifest.get(field) != wanted[field]:
            raise DatasetError(
                f"the source changed since {root} was packed from it (its {field} was "
                f"{json.dumps(manifest.get(field))}, is {json.dumps(wanted[field])}): remove {root} and "
                "pack again"
            )
    kept = manifest.get("source_fingerprint")
    if kept is not None and kept != wanted["source_fingerprint"]:  # absent in packs made before it
        raise DatasetError(
            f"the source changed since {root} was packed from it (the same count, but other samples, "
            f"names or labels): resuming would mix the two; remove {root} and pack again"
        )
    if not manifest.get("complete") and manifest.get("shard_bytes") != wanted["shard_bytes"]:
        raise DatasetError(
            f"{root} is a pack started with shard size {manifest.get('shard_bytes')} bytes: finish it with "
            f"that size, or remove {root} to start over with {wanted['shard_bytes']}"
        )


def _describe(max_side: int | None, quality: int | None) -> str:
    if max_side is None:
        return "of the source's bytes (no --max-side)"
    return f"with --max-side {max_side} --quality {quality}"


def _excluding(count: int) -> str:
    if count:
        return f"leaving out {count} samples of the source (--exclude)"
    return "of every sample (no --exclude)"
