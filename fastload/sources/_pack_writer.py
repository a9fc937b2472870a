"""Writing a pack (the format: `_packed.py`): `pack` copies any source's encoded samples, in the
source's order or one shuffled once, re-encoded when `max_side` asks (`_reencode.py`, or Ray
tasks: `_ray_pack.py`), into aligned data files, then writes the index and the manifest.

`pack` is resumable: every few thousand samples it fsyncs the data and then a checkpoint (the
sizes of the samples written so far, `pack-checkpoint.npy`), and the same command run again
after a kill truncates what came after the checkpoint and goes on, when the source's index is
still the one it started from (`source_fingerprint` in the manifest: names, targets, extents);
an error from the source's side (a sample unreadable, a Ray task failed) checkpoints first. The
layout depends only on the samples' sizes, and re-encoding is deterministic, so the result is
byte-identical to an uninterrupted run (a pack is finished only with the `max_side` and
`quality` it was started with).
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Any, TextIO

import numpy as np

from fastload._errors import ConfigError, DatasetError, FastloadError
from fastload._progress import ProgressLine
from fastload._sizes import parse_size
from fastload.sources._arrays import ArrayIndex
from fastload.sources._base import Source, as_source
from fastload.sources._index import ReadFailure, SampleIndex, pack_strings
from fastload.sources._packed import (
    ALIGN,
    FORMAT,
    INDEX_FILES,
    MANIFEST,
    VERSION,
    Packed,
    data_file_name,
    read_manifest,
)
from fastload.sources._reencode import DEFAULT_QUALITY, Blob, Reencoding, check_encoders, reencoded_batches
from fastload.sources._remote import is_url

_PACK_ORDER_STREAM = 0x9AC  # the stream of `pack(shuffle_seed=...)`'s order
CHECKPOINT = "pack-checkpoint.npy"
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
) -> Packed:
    """Copy `source`'s samples (anything `as_source` takes) into a pack at `dst` (see the module
    docstring) and return it as a source. Run again on the same `dst`, it finishes an interrupted
    pack, or says the pack is complete and does nothing; a `dst` holding anything else (another
    source's pack, other files) is refused. `shard_bytes`: the largest data file (an int, or
    "512MiB", "1GiB": `_sizes.parse_size`). `progress`: report on stderr. `shuffle_seed`: store
    the samples in an order shuffled once from this seed instead of the source's (a folder's is
    sorted by class), so that a block shuffle's runs hold mixed labels and it mixes batches as a
    full shuffle does (docs/BENCHMARKS.md); names keep saying where each sample came from.
    `max_side`: re-encode images whose longer side exceeds it, resized to it (`_reencode.py`),
    as JPEG at `quality` (default 90); smaller ones are stored as they are. `workers`: processes
    that re-encode (default: the CPUs this process may use); the pack's bytes do not depend on it.
    `ray`: read (and re-encode) the samples in Ray tasks (`_ray_pack.py`, `pip install
    'fastload[ray]'`): True for a local Ray of `workers` CPUs (or the cluster `RAY_ADDRESS` names,
    or the one this process is connected to), or a cluster's address; the same bytes again.
    A `dst` at a URL (`s3://bucket/prefix`) is packed in a local staging directory first (resumed
    there when run again), then uploaded, its manifest last (`_remote_pack.pack_to_url`)."""
    shard_bytes = parse_size(shard_bytes, "shard_bytes (--shard-size)", minimum=ALIGN)
    if is_url(os.fspath(dst)):  # packed on local disk next to the cache, then uploaded
        from fastload.sources._remote_pack import pack_to_url

        options: dict[str, Any] = {"shuffle_seed": shuffle_seed, "max_side": max_side, "quality": quality}
        options.update(workers=workers, ray=ray)
        return pack_to_url(source, os.fspath(dst), shard_bytes=shard_bytes, progress=progress, **options)
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
    wanted = _manifest(src, index, shard_bytes, shuffle_seed, setting)
    order = (
        np.arange(len(index), dtype=np.int64)
        if shuffle_seed is None
        else np.random.default_rng(np.random.SeedSequence([int(shuffle_seed), _PACK_ORDER_STREAM]))
        .permutation(len(index))
        .astype(np.int64)
    )
    manifest = read_manifest(root) if os.path.isdir(root) else None
    say = sys.stderr.write if progress else None
    if manifest is not None:
        _check_same(root, manifest, wanted)
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
        os.makedirs(root, exist_ok=True)
        _write_json(os.path.join(root, MANIFEST), wanted)
    writer = _Writer(root, shard_bytes, _load_checkpoint(root))
    start = len(writer.sizes)
    if ray is not False:
        from fastload.sources._ray_pack import ray_batches

        address = None if ray is True else ray
        staging = os.path.join(root, STAGING)
        batches = ray_batches(index, order, start, setting, address, workers, staging, say)
    elif setting is None:
        batches = _read_batches(index, order, start)
    else:
        batches = reencoded_batches(index, order, start, setting, _worker_count(workers))
    try:
        _copy(batches, len(index), writer, _Progress(len(index), where, sys.stderr) if progress else None)
    finally:
        batches.close()  # stops the re-encoding pool, after an error too
        writer.out.close()  # after an error too (what came after the checkpoint is cut when resumed)
    _finish(root, index, order, src, writer, wanted)
    return Packed(root)


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


def _manifest(
    src: Source, index: SampleIndex, shard_bytes: int, shuffle_seed: int | None, setting: Reencoding | None
) -> dict[str, Any]:
    labels = index.labels
    return {
        "format": FORMAT,
        "version": VERSION,
        "complete": False,
        "count": len(index),
        "classes": list(index.classes),
        "target": {"dtype": str(labels.dtype), "shape": list(labels.shape[1:])},
        "alignment": ALIGN,
        "shard_bytes": shard_bytes,
        "shuffle_seed": shuffle_seed,
        "max_side": None if setting is None else setting.max_side,
        "quality": None if setting is None else setting.quality,
        "source": src.to_config(),
        "source_fingerprint": _fingerprint(index),
        "files": [],
    }


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
    for i in range(len(index)):
        digest.update(index.name(i).encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def _check_same(root: str, manifest: dict[str, Any], wanted: dict[str, Any]) -> None:
    """Refuse to go on with a pack of another source, or of this one as it was before it changed."""
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
    for field in ("count", "classes", "target"):
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


class _Writer:
    """Appends samples to the data files at aligned offsets; knows each one's place."""

    def __init__(self, root: str, shard_bytes: int, done: np.ndarray) -> None:
        self.root = root
        self.shard_bytes = shard_bytes
        self.sizes = array.array("q")
        self.offsets = array.array("q")
        self.file_ids = array.array("i")
        self.file = 0
        self.length = 0  # of the current data file
        for size in done.tolist():  # replay the checkpoint's layout (it depends on sizes alone)
            self._place(size)
        self._truncate()
        self.unsynced = 0  # samples written since the last checkpoint
        self.unsynced_bytes = 0
        path = os.path.join(root, data_file_name(self.file))
        self.out = open(path, "r+b" if os.path.exists(path) else "wb")  # noqa: SIM115  # closed by finish
        self.out.seek(self.length)

    def _place(self, size: int) -> int:
        """Record a sample of `size` bytes; return its padding (the zeros before it)."""
        start = -(-self.length // ALIGN) * ALIGN
        if self.length > 0 and start + size > self.shard_bytes:
            self.file, self.length, start = self.file + 1, 0, 0
        padding = start - self.length
        self.sizes.append(size)
        self.offsets.append(start)
        self.file_ids.append(self.file)
        self.length = start + size
        return padding

    def _truncate(self) -> None:
        """Cut what came after the checkpoint: the current file's tail, and any later file."""
        for name in os.listdir(self.root):
            if name.startswith("data-") and name.endswith(".bin") and name > data_file_name(self.file):
                os.unlink(os.path.join(self.root, name))
        expected = [0] * (self.file + 1)
        for file_id, offset, size in zip(self.file_ids, self.offsets, self.sizes, strict=True):
            expected[file_id] = offset + size
        for number, length in enumerate(expected):
            path = os.path.join(self.root, data_file_name(number))
            have = os.path.getsize(path) if os.path.exists(path) else 0
            if have < length:
                raise DatasetError(
                    f"{path} is shorter ({have} bytes) than the checkpoint says ({length}): the pack is "
                    f"damaged; remove {self.root} and pack again"
                )
            if number == self.file and have > length:
                os.truncate(path, length)

    def write(self, blob: Blob) -> None:
        file = self.file
        padding = self._place(len(blob))
        if self.file != file:
            self._sync()
            self.out.close()
            self.out = open(os.path.join(self.root, data_file_name(self.file)), "wb")  # noqa: SIM115
        elif padding:
            self.out.write(bytes(padding))
        self.out.write(blob)
        self.unsynced += 1
        self.unsynced_bytes += len(blob) + padding

    def _sync(self) -> None:
        self.out.flush()
        os.fsync(self.out.fileno())

    def checkpoint(self) -> None:
        """Make what was written durable, then record it."""
        self._sync()
        _save_durably(os.path.join(self.root, CHECKPOINT), np.frombuffer(self.sizes, np.int64))
        self.unsynced = self.unsynced_bytes = 0

    def close(self) -> None:
        self._sync()
        self.out.close()


def _load_checkpoint(root: str) -> np.ndarray:
    try:
        return np.asarray(np.load(os.path.join(root, CHECKPOINT)), np.int64)
    except FileNotFoundError:
        return np.empty(0, np.int64)
    except (OSError, ValueError) as e:
        raise DatasetError(f"cannot read {root}'s checkpoint ({e}): remove {root} and pack again") from e


def _read_batches(index: SampleIndex, order: np.ndarray, start: int) -> Generator[Sequence[Blob], None, None]:
    """The samples `order[start:]` as the source stores them, `BATCH_SAMPLES` at a time."""
    for first in range(start, len(order), BATCH_SAMPLES):
        indices = order[first : first + BATCH_SAMPLES]
        try:
            yield index.read(indices)
        except ReadFailure as e:
            name = index.name(int(indices[e.position]))
            raise DatasetError(f"cannot read {name}: {e.cause} (run the same command again to go on)") from e


def _copy(batches: Iterator[Sequence[Blob]], total: int, writer: _Writer, progress: _Progress | None) -> None:
    """Write `batches` (the samples from the writer's position on, in order), checkpointing as it
    goes, until all `total` samples are written."""
    done = len(writer.sizes)
    if progress is not None:
        progress.begin(done)
    for blobs in _checkpointed_on_error(batches, writer):
        for blob in blobs:
            writer.write(blob)
            if writer.unsynced >= CHECKPOINT_SAMPLES or writer.unsynced_bytes >= CHECKPOINT_BYTES:
                writer.checkpoint()
        done += len(blobs)
        if progress is not None:
            progress.update(done, sum(len(b) for b in blobs))
    if done != total:
        raise DatasetError(f"the source gave {done} samples, its index says {total}: pack again")
    writer.close()
    if progress is not None:
        progress.end()


def _checkpointed_on_error(
    batches: Iterator[Sequence[Blob]], writer: _Writer
) -> Generator[Sequence[Blob], None, None]:
    """`batches`; when one cannot be made (a sample unreadable, a Ray task failed), what the writer
    holds is whole samples: checkpointed, so that the same command run again goes on after them."""
    try:
        yield from batches
    except FastloadError:
        writer.checkpoint()
        raise


def _finish(
    root: str, index: SampleIndex, order: np.ndarray, src: Source, writer: _Writer, manifest: dict[str, Any]
) -> None:
    """Write the index (in the pack's `order` of the source's samples), then the manifest marked
    complete, then drop the checkpoint."""
    names, name_offsets = pack_strings(_names(index, order, src))
    arrays: dict[str, np.ndarray] = {
        "offsets": np.frombuffer(writer.offsets, np.int64),
        "sizes": np.frombuffer(writer.sizes, np.int64),
        "file_ids": np.frombuffer(writer.file_ids, np.int32),
        "labels": np.ascontiguousarray(index.labels[order]),
        "names": names,
        "name_offsets": name_offsets,
    }
    for name in INDEX_FILES:
        _save_durably(os.path.join(root, f"{name}.npy"), arrays[name])
    files = [data_file_name(k) for k in range(writer.file + 1)]
    _write_json(os.path.join(root, MANIFEST), {**manifest, "complete": True, "files": files})
    _drop_leftovers(root)


def _drop_leftovers(root: str) -> None:
    """Remove what only an unfinished pack needs: the checkpoint and `pack(ray=...)`'s staging."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, CHECKPOINT))
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


def _save_durably(path: str, values: np.ndarray) -> None:
    """np.save to `path` through a temporary file, synced, then renamed over it."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, values, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(os.path.dirname(path))


def _write_json(path: str, value: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(os.path.dirname(path))


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Progress:
    """The pack's progress on stderr: samples, MB/s and time left (NOTE [progress lines])."""

    def __init__(self, total: int, where: str, stream: TextIO) -> None:
        self.total = total
        self.where = where
        self.line = ProgressLine(stream)
        self.started = time.monotonic()
        self.first = 0
        self.done = 0
        self.bytes = 0

    def begin(self, done: int) -> None:
        self.first = self.done = done
        if done:
            self.line.done(f"fastload pack: resuming {self.where} at sample {done:,} of {self.total:,}")

    def update(self, done: int, nbytes: int) -> None:
        self.done = done
        self.bytes += nbytes
        if self.line.due():
            self.line.update(self._line(time.monotonic()))

    def end(self) -> None:
        self.line.done(self._line(time.monotonic()))

    def _line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = (self.done - self.first) / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
        return (
            f"fastload pack: {self.done:,}/{self.total:,} samples, {self.bytes / elapsed / 1e6:.1f} MB/s, "
            f"ETA {eta_text}"
        )
