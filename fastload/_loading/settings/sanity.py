"""Settings that run but would train wrong, said at construction (`check_settings_sense`).

Its one responsibility: given a loader's resolved settings (`LoaderSpec`) and what its source
holds, refuse what cannot train right and warn about what probably is not meant:

- MixUp / CutMix `num_classes` against the source's classes: smaller than a label present is a
  ConfigError (one-hot targets would index out of range); any other mismatch (larger, or classes no
  sample has) a `SettingsWarning` (a head of that many outputs, some never a target).
- `drop_last=True` with `batch_size` larger than one rank's samples: a `SettingsWarning` (no
  batches; DataLoader gives that empty epoch too, so a drop-in does, and says so).
- `num_workers` above the CPU cores this process may use: a `SettingsWarning` with both numbers
  (the workers share the cores; more of them only add memory and switching).
- Several ranks and no `seed=`: a `SettingsWarning`, once, that every rank takes the shared
  default seed 0 (NOTE [one order for every rank] in `build`; the order used to differ per rank).
- A map-style Dataset without a sampler in a run of several processes: a `SettingsWarning` that
  every rank loads all of it (as under DataLoader), with the DistributedSampler that shards it.
- A full shuffle of remote data larger than its node cache: a `SettingsWarning` naming the block
  shuffle that fits (every sample of a batch lies in another chunk, and a chunk is evicted before
  its other samples come up: each epoch downloads the data many times over).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from fastload._errors import ConfigError, SettingsWarning
from fastload._loading.order.plan import GeneratorShuffle
from fastload._loading.order.ranks import processes_around
from fastload._loading.settings.spec import LoaderSpec
from fastload._sizes import format_size
from fastload.sources._indexes.sample_index import remote_reads
from fastload.transforms import CutMix, MixUp, RandomChoice

__all__ = ["check_settings_sense"]


def check_settings_sense(spec: LoaderSpec, classes: tuple[str, ...], index: Any, num_samples: int) -> None:
    """Refuse (ConfigError) or warn (SettingsWarning) as the module docstring says; `index` is the
    source's opened index (None with a daemon or a Dataset), `num_samples` the samples it holds."""
    _check_mixing(spec, classes, index)
    _check_batches(spec, num_samples)
    _check_workers(spec)
    _check_remote_shuffle(spec, index)
    _check_ranks(spec)


def _check_ranks(spec: LoaderSpec) -> None:
    if spec.seed_defaulted:
        warnings.warn(
            f"world_size={spec.world_size} and no seed=: every rank orders its epochs with seed="
            f"{spec.seed}, as DistributedSampler does by default, so that the ranks' shards do not "
            "overlap (each rank used to draw its own from torch's RNG); pass the same seed= on every rank "
            "to choose another",
            SettingsWarning,
            stacklevel=4,
        )
    users_sampler = spec.sampler is not None and not isinstance(spec.sampler, GeneratorShuffle)
    if spec.dataset is None or spec.iterable or users_sampler or spec.batch_sampler is not None:
        return
    processes = processes_around()
    if processes > 1:
        warnings.warn(
            f"a Dataset without a sampler in a run of {processes} processes: every rank loads "
            f"{_all_samples(spec.dataset)}, as under DataLoader (a DistributedSampler shards them): "
            "pass sampler=torch.utils.data.DistributedSampler(dataset) (and call set_epoch), or give "
            "FastLoader a folder or another source, which it shards by rank itself",
            SettingsWarning,
            stacklevel=4,
        )


def _all_samples(dataset: Any) -> str:
    try:
        return f"all {len(dataset)} samples"
    except TypeError:
        return "all its samples"


def _mixing(spec: LoaderSpec) -> tuple[str, int] | None:
    """The mixing transform's name and num_classes, None without one."""
    for t in spec.transform or ():
        if isinstance(t, (MixUp, CutMix, RandomChoice)):
            return type(t).__name__, int(t.num_classes)
    return None


def _check_mixing(spec: LoaderSpec, classes: tuple[str, ...], index: Any) -> None:
    mixing = _mixing(spec)
    if mixing is None or spec.source is None:
        return
    name, wanted = mixing
    labels = getattr(index, "labels", None)
    largest = -1
    if isinstance(labels, np.ndarray) and labels.ndim == 1 and labels.size:
        largest = int(labels.max())
    elif classes:
        largest = len(classes) - 1  # through a daemon: the labels are not here; each class counts
    if largest < 0:
        return
    count = len(classes) if classes else largest + 1
    what = f"{len(classes)} classes" if classes else f"integer labels up to {largest}"
    if largest >= wanted:
        raise ConfigError(
            f"{name}(num_classes={wanted}) over {spec.source.where}, which has {what}: label {largest} is "
            f"out of range of its targets; pass num_classes={count}"
        )
    if wanted != count:
        warnings.warn(
            f"{name}(num_classes={wanted}) over {spec.source.where}, which has {what}: targets get "
            f"{wanted - count} columns no sample has (a head sized {wanted} trains dead outputs); "
            f"pass num_classes={count} unless that is meant",
            SettingsWarning,
            stacklevel=4,
        )


def _check_batches(spec: LoaderSpec, num_samples: int) -> None:
    size = spec.batch_size
    if not spec.drop_last or size is None or spec.iterable or num_samples <= 0:
        return
    if spec.sampler is not None or spec.batch_sampler is not None:
        return
    per_rank = num_samples // spec.world_size
    if size > per_rank:
        where = f"rank {spec.rank} of {spec.world_size} gets {per_rank}" if spec.world_size > 1 else ""
        held = f"the dataset holds {num_samples} samples" + (f" ({where})" if where else "")
        warnings.warn(  # DataLoader gives no batch here without a word: a training loop that never runs
            f"batch_size={size} with drop_last=True gives no batches: {held}, fewer than one batch; "
            f"use batch_size <= {per_rank} or drop_last=False",
            SettingsWarning,
            stacklevel=4,
        )


def _check_remote_shuffle(spec: LoaderSpec, index: Any) -> None:
    remote = remote_reads(index)
    if remote is None or not spec.shuffle or spec.shuffle_block is not None or spec.sampler is not None:
        return
    remote_bytes, limit = remote.remote_bytes, remote.node_cache().limit
    if remote_bytes <= limit:
        return  # the first epoch downloads each chunk once; the others read the cache
    chunks = remote.remote_chunk_count
    per_chunk = max(1, round(len(index) / max(chunks, 1)))
    warnings.warn(
        f"a full shuffle of {spec.source.where if spec.source else 'remote data'} "
        f"({format_size(remote_bytes)}) through a node cache of {format_size(limit)}: a batch's "
        "samples lie in as many chunks, evicted before their other samples come up, so every epoch "
        f"downloads the data many times over; pass shuffle_block={per_chunk} (the samples of one of "
        f"its {chunks} chunks) or raise cache_limit above the data",
        SettingsWarning,
        stacklevel=4,
    )


def _check_workers(spec: LoaderSpec) -> None:
    if spec.daemon is not None or spec.num_workers <= 0:
        return
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 0
    if cores and spec.num_workers > cores:
        warnings.warn(
            f"num_workers={spec.num_workers}, but this process may use {cores} CPU cores "
            f"(os.sched_getaffinity): the workers share them, and more than {cores} only add memory and "
            f"switching; use num_workers={cores} or fewer",
            SettingsWarning,
            stacklevel=4,
        )
