"""`fastload iostat --probe`: how fast a dataset can be read and decoded here, without training.

A probe reads a fixed sample of the dataset's files twice (cold, after dropping them from the page
cache, then warm), times one core decoding and augmenting them with fastload's default backend,
and turns the figures into the worker count a target rate needs and advice on what limits it.
Rates are in iostat's MB (2**20 bytes); file sizes in KB (2**10 bytes).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._diagnostics.sysinfo import MB, BlockDevice, device_for_path, memory
from fastload._errors import ConfigError, DatasetError
from fastload._machine import usable_cores
from fastload._sizes import format_size
from fastload.sources import Source, as_source
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.sample_index import SampleIndex

KB = 1 << 10
CROP = 224
LARGE_IMAGE_BYTES = 400 * KB  # ImageNet's JPEGs average ~110 KB; far above that, pre-resizing pays
_MAX_FAILURES_KEPT = 3


@dataclass(frozen=True)
class ProbeResult:
    """What a probe measured, and what it concludes."""

    path: str
    images: int  # in the whole dataset
    classes: int
    sampled: int  # files read and decoded
    mean_file_bytes: float
    cold_mb_per_s: float  # reading the sample after dropping it from the page cache
    warm_mb_per_s: float  # reading it again, from the page cache
    evicted: bool  # whether the sample could be dropped from the page cache before the cold read
    eviction_note: str
    backend: str  # "native" (libjpeg-turbo) or "pil"
    decode_images_per_s: float  # decode + the chain (`chain`) on one core
    decode_failures: tuple[str, ...]  # "path: error" for the first sampled files that failed
    device: BlockDevice
    cores: int  # CPUs this process may run on
    memory_available_bytes: int
    workers: int | None  # the worker count asked about, if any
    target: float | None  # the images/s asked about, if any
    advice: tuple[str, ...] = ()
    chain: str = f"RandomResizedCrop({CROP}) + flip"  # what was timed with the decode

    @property
    def dataset_bytes(self) -> float:
        """The dataset's size, estimated from the sample's mean file size."""
        return self.mean_file_bytes * self.images

    @property
    def fits_in_memory(self) -> bool:
        """Whether the page cache could hold the whole dataset (so epochs after the first read warm)."""
        return self.dataset_bytes < self.memory_available_bytes

    @property
    def storage_images_per_s(self) -> float:
        """The rate cold storage can feed, whatever the workers."""
        return images_per_s_from_storage(self.cold_mb_per_s, self.mean_file_bytes)

    @property
    def cached_images_per_s(self) -> float:
        """The rate the page cache can feed once the files are in it."""
        return images_per_s_from_storage(self.warm_mb_per_s, self.mean_file_bytes)

    @property
    def planned_workers(self) -> int:
        """The worker count the estimate is for: the one asked about, else one per core."""
        return self.workers if self.workers is not None else self.cores

    @property
    def workers_needed(self) -> int | None:
        """Workers the target needs at the measured per-core decode rate (None without a target)."""
        if self.target is None:
            return None
        return workers_needed(self.target, self.decode_images_per_s)

    @property
    def estimated_images_per_s(self) -> float:
        """Expected loading rate at `planned_workers`: decode capacity, capped by cold storage."""
        return min(self.planned_workers * self.decode_images_per_s, self.storage_images_per_s)


def workers_needed(target: float, per_core_images_per_s: float) -> int:
    """Worker processes needed to decode `target` images/s when one decodes `per_core_images_per_s`."""
    if target <= 0 or per_core_images_per_s <= 0:
        raise ConfigError(
            f"workers_needed needs positive rates, got target {target} and per-core {per_core_images_per_s}"
        )
    return max(1, math.ceil(target / per_core_images_per_s))


def images_per_s_from_storage(mb_per_s: float, mean_file_bytes: float) -> float:
    """Images per second that `mb_per_s` of reads can deliver at `mean_file_bytes` per image."""
    return mb_per_s * MB / mean_file_bytes if mean_file_bytes > 0 else 0.0


# Measuring


def probe(
    path: str | os.PathLike[str] | Source,
    workers: int | None = None,
    target: float | None = None,
    sample: int = 200,
    seconds: float = 2.0,
    transform: Sequence[Any] | None = None,
) -> ProbeResult:
    """Measure the dataset at `path` (a folder, a file list, tar shards, a pack, HDF5 images: what
    `sources.as_source` takes); `seconds` bounds the decode timing, which times `transform` (your
    training chain: fastload's transforms or a torchvision pipeline; RandomResizedCrop(224) + flip
    when None) with the decode, its colour and policy stage included.

    Raises:
        DatasetError: the dataset cannot be opened or holds arrays (nothing to decode), a sampled
            sample cannot be read, or no sampled sample decodes.
        ConfigError: a non-positive `workers`, `target`, `sample` or `seconds`.
    """
    _check_arguments(workers, target, sample, seconds)
    source = as_source(path)
    index = source.open()
    if isinstance(index, ArrayIndex):
        raise DatasetError(f"{source.where} holds arrays, delivered as stored: there is nothing to decode")
    picks = sample_indices(len(index), sample)
    names = [index.name(int(i)) for i in picks]
    device = device_for_path(source.where)
    evicted, note = evict(index.files_of(picks), device)
    cold_blobs, cold_s = read_samples(index, picks)
    blobs, warm_s = read_samples(index, picks)
    total = sum(len(b) for b in cold_blobs)
    del cold_blobs
    chain = _chain(transform)
    backend, rate, failures = decode_rate(blobs, names, seconds, chain)
    result = ProbeResult(
        path=source.where,
        images=len(index),
        classes=len(index.classes) or _distinct_labels(index.labels),
        sampled=len(picks),
        mean_file_bytes=total / len(picks),
        cold_mb_per_s=total / MB / cold_s,
        warm_mb_per_s=total / MB / warm_s,
        evicted=evicted,
        eviction_note=note,
        backend=backend,
        decode_images_per_s=rate,
        decode_failures=failures,
        device=device,
        cores=usable_cores(),
        memory_available_bytes=memory().available_bytes,
        workers=workers,
        target=target,
        chain=" + ".join(type(t).__name__ for t in chain.transforms),
    )
    return dataclasses.replace(result, advice=tuple(advice_for(result)))


def _distinct_labels(labels: np.ndarray) -> int:
    """Classes of a source that names none (tar shards' `.cls`): its distinct class labels."""
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        return 0
    return int(np.unique(labels[labels >= 0]).size)


def _chain(transform: Sequence[Any] | None) -> Any:
    """The compiled chain the probe times (ConfigError for one fastload cannot run)."""
    from fastload.transforms import (
        RandomHorizontalFlip,
        RandomResizedCrop,
        compile_transforms,
        from_torchvision,
    )

    if transform is None:
        return compile_transforms([RandomResizedCrop(CROP), RandomHorizontalFlip()])
    chain, _ = from_torchvision(transform)  # its Normalize is the loader's business, not timed here
    return compile_transforms(chain)


def _check_arguments(workers: int | None, target: float | None, sample: int, seconds: float) -> None:
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if target is not None and not target > 0:
        raise ConfigError(f"--target must be a positive number of images per second, got {target}")
    if sample < 1:
        raise ConfigError(f"the probe needs a sample of at least 1 file, got {sample}")
    if not seconds > 0:
        raise ConfigError(f"the probe needs a positive decode time, got {seconds} s")


def sample_indices(count: int, sample: int) -> np.ndarray:
    """`sample` of `count` samples (all when there are fewer), the same ones on every run,
    shuffled as a training epoch reads them."""
    return np.random.default_rng(0).choice(count, size=min(sample, count), replace=False).astype(np.int64)


def evict(paths: Sequence[str], device: BlockDevice) -> tuple[bool, str]:
    """Drop `paths` from the page cache; (whether that was possible, what it means for "cold")."""
    if device.kind == "memory":
        return False, f"the files are on {device.fs_type}, in memory: cold and warm reads are both RAM"
    if not hasattr(os, "posix_fadvise"):
        return False, "os.posix_fadvise is not available here: cold reads may come from the page cache"
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError as e:
            return False, f"posix_fadvise failed on {p} ({e}): cold reads may come from the page cache"
    if device.kind == "network":
        return True, "dropped from this machine's page cache; the file server may still cache them"
    return True, "dropped from the page cache with posix_fadvise(DONTNEED) before reading"


def read_samples(index: SampleIndex, picks: np.ndarray) -> tuple[list[bytes], float]:
    """Read every sampled sample whole, one at a time, in order; (their bytes, seconds taken,
    opening included)."""
    blobs = []
    start = time.perf_counter()
    for i in picks.tolist():
        try:
            blobs.append(index.read_sample(i))
        except OSError as e:
            raise DatasetError(
                f"cannot read {index.name(i)}: {e}; check the file's permissions and the mount"
            ) from e
    return blobs, max(time.perf_counter() - start, 1e-9)


def decode_rate(
    blobs: Sequence[bytes], paths: Sequence[str], seconds: float, plan: Any
) -> tuple[str, float, tuple[str, ...]]:
    """(backend name, images/s on this core, failures) decoding `blobs` round-robin for `seconds`
    through `plan` (a compiled chain: its decode-time crops, then its pixel stage; every view's,
    for a Views)."""
    from fastload._augment.program import SampleProgram
    from fastload._loading.decoding.backend import SampleFailure, make_backend
    from fastload._sample_random import PIXELS_STREAM, sample_randoms

    views = [  # each view of a Views (NOTE [views] in transforms), else the chain alone
        (
            make_backend("native", v),
            SampleProgram(v.pixels, PIXELS_STREAM),
            np.empty((1, v.out_height, v.out_width, 3), np.uint8),
            seed,
        )
        for v, seed in plan.view_plans(0)
    ]
    good = list(range(len(blobs)))
    failures: list[str] = []

    def decode(i: int) -> bool:
        try:
            for backend, pixels, out, seed in views:
                backend.decode_batch([blobs[i]], sample_randoms(seed, 0, np.array([i])), out)
                if pixels:
                    pixels.run_in_slot(out, seed, 0, np.array([i], np.int64))
        except SampleFailure as e:
            failures.append(f"{paths[i]}: {e}")
            good.remove(i)
            return False
        return True

    while good and not decode(good[0]):  # warm-up, untimed: the first call loads the decoder
        pass
    done, turn = 0, 0
    start = time.perf_counter()
    while good and (done == 0 or time.perf_counter() - start < seconds):
        if decode(good[turn % len(good)]):
            done, turn = done + 1, turn + 1
    elapsed = time.perf_counter() - start
    if done == 0:
        raise DatasetError(
            f"none of the {len(blobs)} sampled files could be decoded (first: {failures[0]}); "
            "is this an image dataset?"
        )
    return views[0][0].name, done / elapsed, tuple(failures[:_MAX_FAILURES_KEPT])


# Conclusions


def advice_for(r: ProbeResult) -> list[str]:
    """What limits loading, and what to do about it, one sentence a line."""
    lines = _measurement_caveats(r)
    lines += _storage_advice(r)
    lines += _decode_advice(r)
    if r.mean_file_bytes > LARGE_IMAGE_BYTES:
        lines.append(
            f"images average {r.mean_file_bytes / KB:,.0f} KB: for {CROP}-pixel training, pre-resizing "
            "them to a shorter side of ~256-320 px cuts both reading and decoding time"
        )
    return lines


def _measurement_caveats(r: ProbeResult) -> list[str]:
    lines = []
    if not r.evicted and r.device.kind != "memory":
        lines.append(
            f"the cold read may have been served from memory ({r.eviction_note}): "
            f"treat {r.cold_mb_per_s:,.0f} MB/s as an upper bound"
        )
    if r.backend != "native":
        lines.append(
            f"decoding used the {r.backend} backend because fastload's libjpeg-turbo extension is not "
            "built: reinstall fastload with libjpeg-turbo's headers present for faster JPEG decoding"
        )
    if r.decode_failures:
        lines.append(
            f"some sampled files did not decode (first: {r.decode_failures[0]}): loading them "
            "raises SampleError; remove or re-encode them"
        )
    return lines


def _storage_advice(r: ProbeResult) -> list[str]:
    demand = r.target if r.target is not None else r.planned_workers * r.decode_images_per_s
    cap = r.storage_images_per_s
    if cap >= demand:
        return []
    lines = [
        f"storage reads {r.cold_mb_per_s:,.0f} MB/s cold: at {r.mean_file_bytes / KB:,.0f} KB per image "
        f"that caps loading at ~{cap:,.0f} images/s whatever the workers; {_storage_remedy(r.device)}"
    ]
    if r.fits_in_memory and r.cached_images_per_s > cap:
        lines.append(
            f"the dataset (~{format_size(r.dataset_bytes)}) fits in available memory "
            f"({format_size(r.memory_available_bytes)}): after the first epoch reads come from the page "
            f"cache, which feeds ~{r.cached_images_per_s:,.0f} images/s"
        )
    return lines


def _storage_remedy(device: BlockDevice) -> str:
    if device.kind in ("nvme", "ssd", "memory"):
        return "pack the files into shards so that reads are large and sequential"
    return "copy the data to local NVMe or pack it into shards"


def _decode_advice(r: ProbeResult) -> list[str]:
    per_core = r.decode_images_per_s
    if r.target is None or r.workers_needed is None:
        return [
            f"at {_count(r.planned_workers, 'worker')} expect ~{r.estimated_images_per_s:,.0f} images/s "
            f"({per_core:,.0f} per core); pass --target IMAGES_PER_S for the workers a rate needs"
        ]
    needed, target = r.workers_needed, r.target
    if needed > r.cores:
        return [
            f"{target:,.0f} images/s needs {needed} workers at {per_core:,.0f} images/s per core, but "
            f"this process may use {_count(r.cores, 'core')} (~{r.cores * per_core:,.0f} images/s at most): "
            "pre-resize the images or use a machine with more cores"
        ]
    if r.workers is not None and r.workers < needed:
        return [
            f"--workers {r.workers} decodes ~{r.workers * per_core:,.0f} images/s, short of "
            f"{target:,.0f}: use --workers {needed}"
        ]
    spare = " (every core: none is left for the training process)" if needed == r.cores else ""
    return [f"{target:,.0f} images/s needs {needed} of {r.cores} cores{spare}"]


# Output


def format_probe(r: ProbeResult) -> str:
    """The result as a block of lines for a terminal."""
    lines = [
        f"probe of {r.path}",
        f"  dataset   {r.images:,} images in {_count(r.classes, 'class')}, ~{format_size(r.dataset_bytes)}; "
        f"mean file {r.mean_file_bytes / KB:,.0f} KB ({r.sampled} sampled)",
        f"  storage   {r.device.describe()}",
        f"  reads     cold {r.cold_mb_per_s:,.1f} MB/s, warm {r.warm_mb_per_s:,.1f} MB/s: "
        f"~{r.storage_images_per_s:,.0f} images/s cold, ~{r.cached_images_per_s:,.0f} warm",
        f"            {r.eviction_note}",
        f"  decode    {r.decode_images_per_s:,.0f} images/s on one core "
        f"({r.backend} backend, {r.chain})",
        f"  estimate  ~{r.estimated_images_per_s:,.0f} images/s at {_count(r.planned_workers, 'worker')} "
        f"({_count(r.cores, 'core')} available)",
    ]
    if r.target is not None:
        keeps_up = "keeps up" if r.storage_images_per_s >= r.target else "does not keep up"
        lines.append(
            f"  target    {r.target:,.0f} images/s needs {_count(r.workers_needed or 0, 'worker')}; "
            f"cold storage {keeps_up}"
        )
    if r.advice:
        lines.append("advice")
        lines += [f"  - {line}" for line in r.advice]
    return "\n".join(lines)


def _count(n: int, word: str) -> str:
    plural = word + ("es" if word.endswith("s") else "s")
    return f"{n:,} {word if n == 1 else plural}"


def probe_to_json(r: ProbeResult) -> dict[str, Any]:
    """The result as JSON-ready data: the measured fields, the derived figures and the advice."""
    data = dataclasses.asdict(r)
    data["device"]["description"] = r.device.describe()
    data["decode_failures"] = list(r.decode_failures)
    data["advice"] = list(r.advice)
    for name in (
        "dataset_bytes",
        "fits_in_memory",
        "storage_images_per_s",
        "cached_images_per_s",
        "planned_workers",
        "workers_needed",
        "estimated_images_per_s",
    ):
        data[name] = getattr(r, name)
    return data
