"""Writing a pack (the format: `_formats/pack_format.py`): `pack` copies any source's encoded
samples, in the source's order or one shuffled once, checked and re-encoded when `max_side` asks
(`reencode.py`, or Ray tasks: `ray_pack.py`), into aligned data files, then writes the index and
the manifest (`manifest.py`); a source's declared fields are kept beside its images
(`members.py`, NOTE [packed fields]).

`pack` is resumable (NOTE [pack checkpoints] in `data_files.py`).

NOTE [broken bytes]: a pack never stores a sample that is not a whole image as if it were good.
Every sample stored as the source's bytes is checked without decoding (`image_bytes.py`: empty, no
image's magic, a JPEG without its end marker, ...); one re-encoded is decoded anyway. Such a
sample (or one that cannot be read) stops the run with `on_error="raise"` (the default, as
FastLoader's), naming it and how to go on, with what was packed checkpointed; `on_error="skip"`
(the same command run again with `--on-error skip` goes on from there) leaves it out and lists
it, with why, in the manifest's `skipped`. `exclude=` (`fastload verify`'s list) leaves samples
out from the start. The check costs a few µs a sample, under 2% of a plain pack's 310 µs a
sample from the page cache (400 photo-like JPEGs of ImageNet's sizes, 49 KB on average, one core).
Measured: a first check (JPEG magic, an end marker anywhere after the first scan marker) took
1.2 µs; the one now (`_encoded_bytes`: a walk over the header segments to the image's own scan,
so an EXIF thumbnail's end marker does not count) 10.7 µs against that one's 2.6 µs in one run
beside two CPU burners (64 JPEGs of 47 KB): about 5 µs on an idle core.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import numpy as np

from fastload._bad_samples import ON_ERROR
from fastload._errors import ConfigError, DatasetError, FastloadError
from fastload._exclusion import ExcludeArg, kept_indices
from fastload._sizes import parse_size
from fastload.sources._base import Source, as_source
from fastload.sources._formats.pack_format import (
    ALIGN,
    MANIFEST,
    data_file_name,
    index_files,
    read_manifest,
)
from fastload.sources._formats.packed import Packed
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.sample_index import SampleIndex, declared_fields, pack_strings
from fastload.sources._packing import data_files
from fastload.sources._packing.data_files import DataFiles, drop_checkpoint, load_checkpoint
from fastload.sources._packing.manifest import check_same, new_manifest
from fastload.sources._packing.members import (
    Parts,
    field_arrays,
    refuse_with_fields,
    with_members,
)
from fastload.sources._packing.progress import Progress
from fastload.sources._packing.reencode import (
    DEFAULT_QUALITY,
    Made,
    Reencoding,
    Skipped,
    check_encoders,
    made_batches,
)
from fastload.sources._packing.upload import staging_for, upload_staged
from fastload.sources._storage.remote import is_url

_PACK_ORDER_STREAM = 0x9AC  # the stream of `pack(shuffle_seed=...)`'s order
STAGING = "ray-staging"
DEFAULT_SHARD_BYTES = 1 << 30
# Samples read from the source at a time, and written between two checkpoints (or bytes, whichever
# comes first); tests make them small.
BATCH_SAMPLES = 256
CHECKPOINT_SAMPLES = 4096
CHECKPOINT_BYTES = 512 << 20


def pack(
    source: str | os.PathLike[str] | Source,
    dst: str | os.PathLike[str],
    *,
    shard_bytes: int | str = DEFAULT_SHARD_BYTES,
    progress: bool = True,
    shuffle_seed: int | None = None,
    max_side: int | None = None,
    quality: int | None = None,
    workers: int | None = None,
    ray: bool | str = False,
    exclude: ExcludeArg = None,
    on_error: str = "raise",
) -> Packed:
    """Copy `source`'s samples (anything `as_source` takes) into a pack at `dst` (see the module
    docstring) and return it as a source. Run again on the same `dst`, it finishes an interrupted
    pack, or says the pack is complete and does nothing; a `dst` holding anything else (another
    source's pack, other files) is refused. `shard_bytes`: the largest data file (an int, or
    "512MiB", "1GiB": `_sizes.parse_size`). `progress`: report on stderr. `shuffle_seed`: store
    the samples in an order shuffled once from this seed instead of the source's (a folder's is
    sorted by class), so that a block shuffle's runs hold mixed labels and it mixes batches as a
    full shuffle does (docs/BENCHMARKS.md); names keep saying where each sample came from.
    `max_side`: re-encode images whose longer side exceeds it, resized to it (`_packing/reencode.py`),
    as JPEG at `quality` (default 90); smaller ones are stored as they are. `workers`: processes
    that re-encode (default: the CPUs this process may use); the pack's bytes do not depend on it.
    `ray`: read (and re-encode) the samples in Ray tasks (`_packing/ray_pack.py`, `pip install
    'fastload[ray]'`): True for a local Ray of `workers` CPUs (or the cluster `RAY_ADDRESS` names,
    or the one this process is connected to), or a cluster's address; the same bytes again.
    `exclude`: samples to leave out, as `FastLoader(exclude=...)` takes them (the path of the
    list `fastload verify` writes, names, indices); the manifest records them. `on_error`: what
    a sample that cannot be read or is not a whole image does (NOTE [broken bytes]): "raise" (a
    DatasetError naming it; the samples packed so far are kept) or "skip" (left out, listed in
    the manifest's `skipped`, and reported at the end).
    A `dst` at a URL (`s3://bucket/prefix`) is packed in a local staging directory first (resumed
    there when run again), then uploaded, its manifest last (`_packing/upload.py`)."""
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r}: it takes 'raise' (the default) or 'skip'")
    shard_bytes = parse_size(shard_bytes, "shard_bytes (--shard-size)", minimum=ALIGN)
    if ray is not False:
        from fastload.sources._packing.ray_pack import import_ray

        import_ray()  # before any work: what to install
    if is_url(os.fspath(dst)):  # packed on local disk next to the cache, then uploaded (`_packing/upload.py`)
        url = os.fspath(dst)
        staging = staging_for(url)
        options: dict[str, Any] = {"shuffle_seed": shuffle_seed, "max_side": max_side, "quality": quality}
        options.update(workers=workers, ray=ray, exclude=exclude, on_error=on_error)
        pack(source, staging, shard_bytes=shard_bytes, progress=progress, **options)
        upload_staged(staging, url, progress)
        return Packed(url)
    src = as_source(source)
    setting = _reencoding(max_side, quality, workers)
    root = os.path.abspath(os.fspath(dst))
    if not isinstance(ray, bool | str) or ray == "":
        raise ConfigError(f"ray must be True or a Ray cluster's address, got {ray!r}")
    where = src.where
    if os.path.isdir(where) and (root == where or root.startswith(where.rstrip(os.sep) + os.sep)):
        raise ConfigError(f"the pack {root} must not be inside the dataset it packs ({where})")
    index = src.open()
    if isinstance(index, ArrayIndex):
        raise ConfigError(f"{where} holds arrays: a pack holds encoded samples (images) only")
    declaring = declared_fields(index)
    fields = None if declaring is None else declaring.fields
    if fields is not None and ray is not False:
        refuse_with_fields(where, fields, "pack(ray=...) (--ray)")
    order = (
        np.arange(len(index), dtype=np.int64)
        if shuffle_seed is None
        else np.random.default_rng(np.random.SeedSequence([int(shuffle_seed), _PACK_ORDER_STREAM]))
        .permutation(len(index))
        .astype(np.int64)
    )
    keep = kept_indices(exclude, len(index), index.name)
    excluded: list[str] = []
    if keep is not None:
        order = order[np.isin(order, keep)]  # the same order, less the samples left out
        left = np.setdiff1d(np.arange(len(index), dtype=np.int64), keep)
        excluded = sorted(index.name(int(i)) for i in left)
    wanted = new_manifest(src, index, len(order), shard_bytes, shuffle_seed, setting, excluded)
    manifest = read_manifest(root) if os.path.isdir(root) else None
    say = sys.stderr.write if progress else None
    if manifest is not None:
        check_same(root, manifest, wanted)
        if manifest.get("complete"):
            _drop_leftovers(root)  # left by a kill after the manifest was written
            if say is not None:
                size = manifest.get("shard_bytes")
                other = (
                    f" (its shard size is {size} bytes: remove it to pack again)"
                    if size != shard_bytes
                    else ""
                )
                say(f"fastload pack: {root} is already a complete pack of {where}: nothing to do{other}\n")
            return Packed(root)
    elif os.path.isdir(root) and os.listdir(root):
        raise DatasetError(
            f"{root} is not empty and holds no fastload pack: pack into a new or empty directory"
        )
    else:
        _create(root, wanted)
    writer = DataFiles(root, shard_bytes, *load_checkpoint(root))
    start = len(writer.sizes)
    skip = on_error == "skip"
    if ray is not False:
        from fastload.sources._packing.ray_pack import ray_batches

        address = None if ray is True else ray
        staging = os.path.join(root, STAGING)
        batches = ray_batches(index, order, start, setting, address, workers, staging, say, skip)
    else:
        step = BATCH_SAMPLES if setting is None else None
        batches = made_batches(index, order, start, setting, _worker_count(workers), skip, step)
    made = batches if declaring is None else with_members(batches, declaring, order, start)
    try:
        _copy(made, len(order), writer, Progress(len(order), where, sys.stderr) if progress else None)
    finally:
        batches.close()  # stops the re-encoding pool, after an error too
        writer.out.close()  # after an error too (what came after the checkpoint is cut when resumed)
    _finish(root, index, order, src, writer, wanted)
    if writer.skipped:
        _report_skipped(root, index, order, writer.skipped, say)
    return Packed(root)


def _create(root: str, manifest: dict[str, Any]) -> None:
    """Make the pack's directory and its first manifest; DatasetError saying what to do when the
    place cannot be written (before any sample is read)."""
    try:
        os.makedirs(root, exist_ok=True)
        data_files.write_json(os.path.join(root, MANIFEST), manifest)
    except OSError as e:
        raise DatasetError(
            f"cannot write the pack at {root} ({e.strerror or e}): pack into a directory you can write"
        ) from None


def _report_skipped(
    root: str, index: SampleIndex, order: np.ndarray, skipped: dict[int, str], say: Any
) -> None:
    """Say, at the end, how many samples `on_error="skip"` left out, and where they are listed."""
    first, why = min(skipped.items())
    text = (
        f"fastload pack: left out {len(skipped)} samples that could not be read or are not whole images "
        f"(on_error='skip'), e.g. {index.name(int(order[first]))}: {why}; each is listed, with why, in "
        f"{os.path.join(root, MANIFEST)} (\"skipped\")"
    )
    if say is not None:
        say(text + "\n")
    else:
        warnings.warn(text, stacklevel=3)


def _reencoding(max_side: int | None, quality: int | None, workers: int | None) -> Reencoding | None:
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers must be a positive integer, got {workers!r}")
    if max_side is None:
        if quality is not None:
            raise ConfigError("quality applies to re-encoded images: give max_side too")
        return None
    setting = Reencoding(max_side, DEFAULT_QUALITY if quality is None else quality)
    check_encoders()
    return setting


def _worker_count(workers: int | None) -> int:
    return workers if workers is not None else len(os.sched_getaffinity(0))


def _copy(
    batches: Iterator[Sequence[Made | Parts]], total: int, writer: DataFiles, progress: Progress | None
) -> None:
    """Write `batches` (the samples from the writer's position on, in order), checkpointing as it
    goes, until all `total` samples are written or left out."""
    done = len(writer.sizes)
    if progress is not None:
        progress.begin(done)
    for made in _checkpointed_on_error(batches, writer):
        nbytes = 0
        for item in made:
            if isinstance(item, Skipped):
                writer.skip(item.reason)
            else:
                parts = item if isinstance(item, tuple) else (item,)
                writer.write(*parts)
                nbytes += sum(len(part) for part in parts)
            if writer.unsynced >= CHECKPOINT_SAMPLES or writer.unsynced_bytes >= CHECKPOINT_BYTES:
                writer.checkpoint()
        done += len(made)
        if progress is not None:
            progress.update(done, nbytes)
    if done != total:
        raise DatasetError(f"the source gave {done} samples, its index says {total}: pack again")
    writer.close()
    if progress is not None:
        progress.end()


def _checkpointed_on_error(
    batches: Iterator[Sequence[Made | Parts]], writer: DataFiles
) -> Generator[Sequence[Made | Parts], None, None]:
    """`batches`; when one cannot be made (a sample unreadable, a Ray task failed), what the writer
    holds is whole samples: checkpointed, so that the same command run again goes on after them."""
    try:
        yield from batches
    except FastloadError:
        writer.checkpoint()
        raise


def _finish(
    root: str, index: SampleIndex, order: np.ndarray, src: Source, writer: DataFiles, manifest: dict[str, Any]
) -> None:
    """Write the index (in the pack's `order` of the source's samples, less those left out), then
    the manifest marked complete, then drop the checkpoint."""
    held = order[np.frombuffer(writer.sizes, np.int64) >= 0]
    names, name_offsets = pack_strings(_names(index, held, src))
    arrays: dict[str, np.ndarray] = {
        "offsets": np.frombuffer(writer.offsets, np.int64),
        "sizes": np.frombuffer(writer.lengths, np.int64),
        "file_ids": np.frombuffer(writer.file_ids, np.int32),
        "labels": np.ascontiguousarray(index.labels[held]),
        "names": names,
        "name_offsets": name_offsets,
    }
    declaring = declared_fields(index)
    if declaring is not None and declaring.fields is not None:  # NOTE [packed fields]
        images, field_offsets, field_sizes = field_arrays(
            declaring.fields, held, arrays["offsets"], arrays["sizes"]
        )
        arrays.update(sizes=images, field_offsets=field_offsets, field_sizes=field_sizes)
    for name in index_files(manifest):
        data_files.save_durably(os.path.join(root, f"{name}.npy"), arrays[name])
    files = [data_file_name(k) for k in range(writer.file + 1)]
    skipped = [[index.name(int(order[k])), why] for k, why in sorted(writer.skipped.items())]
    done = {**manifest, "complete": True, "files": files, "count": len(held), "skipped": skipped}
    data_files.write_json(os.path.join(root, MANIFEST), done)
    _drop_leftovers(root)


def _drop_leftovers(root: str) -> None:
    """Remove what only an unfinished pack needs: the checkpoint and `pack(ray=...)`'s staging."""
    drop_checkpoint(root)
    shutil.rmtree(os.path.join(root, STAGING), ignore_errors=True)


def _names(index: SampleIndex, order: np.ndarray, src: Source) -> list[bytes]:
    """Each sample's name in the pack: its source name, relative to the source's folder if inside it."""
    base = src.where if os.path.isdir(src.where) else os.path.dirname(src.where)
    prefix = base.rstrip(os.sep) + os.sep
    names = []
    for i in order.tolist():
        name = index.name(i)
        names.append(
            (name[len(prefix) :] if name.startswith(prefix) else name).encode("utf-8", "surrogateescape")
        )
    return names
