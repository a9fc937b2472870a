"""`build_spec`: FastLoader's arguments checked as DataLoader checks its own, and their defaults
resolved — the worker count, the device (and nvJPEG's needs), a torchvision pipeline as fastload
transforms, the image output, the daemon's address, the rank and the base seed (NOTE [one order
for every rank]) — into a frozen `LoaderSpec`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.context import BaseContext
from typing import Any

import torch

from fastload._bad_samples import DEFAULT_MAX_SKIPPED, check_policy
from fastload._errors import ConfigError
from fastload._loading.decoding.backend import BACKENDS
from fastload._loading.link.daemon_addresses import resolve_address
from fastload._loading.order.plan import GeneratorShuffle
from fastload._loading.order.ranks import process_position
from fastload._loading.settings.arguments import (
    check_batching,
    check_block_shuffle,
    check_device,
    check_iterable,
    check_mp_context,
    check_seed,
    check_workers,
    normalize_values,
)
from fastload._loading.settings.auto import check_priority, resolve_tuning
from fastload._loading.settings.spec import LoaderSpec
from fastload._loading.slots.delivery import ImageOutput
from fastload._loading.slots.ring_plan import MAX_IN_FLIGHT
from fastload._machine import usable_cores
from fastload._metrics_seam import metrics_setting
from fastload.samplers import Sampler
from fastload.sources import Source, as_source
from fastload.transforms import Transform, from_torchvision


def build_spec(
    dataset: Any,
    *,
    batch_size: int | None,
    shuffle: bool | None,
    sampler: Iterable[int] | Sampler | None,
    batch_sampler: Iterable[Sequence[int]] | None,
    num_workers: int | str | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    pin_memory: bool,
    drop_last: bool,
    timeout: float,
    worker_init_fn: Callable[[int], Any] | None,
    multiprocessing_context: str | BaseContext | None,
    generator: torch.Generator | None,
    prefetch_factor: int | None,
    persistent_workers: bool,
    seed: int | None,
    prefetch: int | str | None,
    transform: Sequence[Transform] | Transform | Callable[..., Any] | None,
    device: str | torch.device | None,
    normalize: tuple[Sequence[float], Sequence[float]] | None,
    dtype: torch.dtype,
    memory_format: torch.memory_format,
    backend: str,
    daemon: str | None,
    rank: int | None,
    world_size: int | None,
    summary: bool,
    hang_timeout: float | None,
    sample_ids: bool = False,
    shuffle_block: int | None = None,
    shuffle_window: int = 8,
    on_error: str = "raise",
    max_skipped: float | int = DEFAULT_MAX_SKIPPED,
    metrics: str | int | None = None,
    autotune: bool | None = None,
    priority: float = 1.0,
) -> LoaderSpec:
    """Check FastLoader's arguments as DataLoader checks its own (ConfigError, a ValueError, for
    anything DataLoader refuses, and for fastload's own), and resolve their defaults."""
    is_source = isinstance(dataset, (str, os.PathLike, Source))
    if isinstance(dataset, torch.utils.data.IterableDataset):
        check_iterable(shuffle, sampler, batch_sampler, shuffle_block)
    asked_auto = num_workers == "auto"
    tuning = resolve_tuning(
        num_workers, prefetch, prefetch_factor, autotune, is_source=is_source,
        iterable=isinstance(dataset, torch.utils.data.IterableDataset),
    )
    num_workers, prefetch = tuning.num_workers, tuning.prefetch
    if num_workers is None:
        num_workers = default_workers() if is_source or asked_auto else 0
    check_workers(num_workers, timeout, hang_timeout, prefetch_factor, persistent_workers)
    check_mp_context(multiprocessing_context, num_workers)
    check_batching(batch_size, shuffle, sampler, batch_sampler, drop_last)
    check_seed(seed)
    if isinstance(sampler, Sampler) and not is_source:
        raise ConfigError(
            f"samplers.{type(sampler).__name__} plans the order of a folder or another source; a Dataset "
            "takes a torch sampler (torch.utils.data.WeightedRandomSampler, ...) as under DataLoader"
        )
    torch_sampler = sampler is not None and not isinstance(sampler, Sampler)
    if is_source and (torch_sampler or batch_sampler is not None or collate_fn is not None):
        raise ConfigError(
            "sampler (but for fastload.samplers' plans), batch_sampler and collate_fn apply to Dataset "
            "inputs, not to folders and other sources"
        )
    if check_priority(priority) != 1.0 and daemon is None:
        raise ConfigError("priority= weighs a daemon session against the daemon's others: pass daemon= too")
    if not is_source and (daemon is not None or rank is not None or world_size is not None):
        raise ConfigError("daemon, rank and world_size apply to image folders and other sources")
    if not is_source and sample_ids:
        raise ConfigError("sample_ids applies to folders and other sources; a Dataset can return its index")
    if not is_source and (transform is not None or normalize is not None):
        raise ConfigError(
            "transform and normalize apply to image folders and other sources; a Dataset transforms "
            "its own samples"
        )
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if transform is not None:
        transform, normalize = _fastload_transforms(transform, normalize)
    resolved_device = (
        torch.device(device)
        if device is not None
        else torch.device("cuda" if is_source and torch.cuda.is_available() else "cpu")
    )
    check_device(resolved_device)
    if backend == "nvjpeg":
        check_nvjpeg(resolved_device, daemon, is_source)
    # Unless told (prefetch, or DataLoader's prefetch_factor), the ring is sized from the batch's
    # bytes once they are known; a daemon sizes the rings of its sessions.
    if prefetch is None and prefetch_factor is not None:
        prefetch = prefetch_factor * max(1, num_workers)
    if prefetch is not None and not 1 <= prefetch <= MAX_IN_FLIGHT:
        raise ConfigError(f"prefetch must be 1..{MAX_IN_FLIGHT}, got {prefetch}")
    if is_source:
        rank, world_size = process_position(rank, world_size)
    images = _image_output(normalize, dtype, memory_format) if is_source else None
    check_block_shuffle(shuffle_block, shuffle_window, shuffle)
    check_policy(on_error, max_skipped)
    if on_error == "skip" and isinstance(dataset, torch.utils.data.IterableDataset):
        raise ConfigError(
            "on_error='skip' needs samples by index (a source or a map-style Dataset); an "
            "IterableDataset's stream skips its own bad samples, in its __iter__"
        )
    source = as_source(dataset) if is_source else None
    if daemon is not None:
        if source is not None:
            source.check_served_by_daemon()
        daemon = resolve_address(daemon)
    metrics_address = metrics_setting(metrics)
    if generator is not None and shuffle and not is_source and sampler is None and batch_sampler is None:
        # DataLoader's order from `generator` (NOTE [DataLoader's order from a generator]).
        if seed is None:
            seed = base_seed(None, _copy_of(generator), 1)  # DataLoader draws nothing from it at construction
        sampler = GeneratorShuffle(dataset, generator, persistent_workers and num_workers > 0)
    spec = LoaderSpec(
        source=source,
        dataset=None if is_source else dataset,
        transform=tuple(transform) if transform is not None else None,
        backend=backend,
        collate_fn=collate_fn,
        batch_size=batch_size if batch_sampler is None else None,
        slot_batch_size=batch_size if batch_sampler is None else _max_batch(batch_sampler),  # type: ignore[arg-type]
        shuffle=bool(shuffle),
        shuffle_block=None if shuffle_block is None else int(shuffle_block),
        shuffle_window=int(shuffle_window),
        drop_last=drop_last,
        sampler=sampler,
        batch_sampler=batch_sampler,
        seed=base_seed(seed, generator, world_size or 1),
        seed_defaulted=seed is None and generator is None and (world_size or 1) > 1,
        rank=rank or 0,
        world_size=world_size or 1,
        num_workers=num_workers,
        prefetch=prefetch,
        persistent_workers=persistent_workers or is_source,
        timeout_s=float(timeout),
        hang_timeout_s=hang_timeout,
        mp_context=multiprocessing_context,
        worker_init_fn=worker_init_fn,
        daemon=daemon,
        device=resolved_device,
        pin_memory=pin_memory and resolved_device.type == "cpu" and torch.cuda.is_available(),
        images=images,
        summary=summary,
        sample_ids=bool(sample_ids),
        dali_in_trainer=os.environ.get("FASTLOAD_DALI_IN_TRAINER") == "1",
        on_error=on_error,
        max_skipped=max_skipped,
        metrics=metrics_address,
        priority=float(priority),
    )
    # NOTE [what is tuned]: no workers of this loader's, no tuning.
    if num_workers > 0 and daemon is None and not spec.decodes_in_trainer:
        spec = dataclasses.replace(
            spec, tune_workers=tuning.tune_workers, tune_in_flight=tuning.tune_in_flight
        )
    if on_error == "skip" and spec.decodes_in_trainer:
        raise ConfigError(
            f"on_error='skip' is not yet supported with backend={backend!r} decoding in this process "
            "(on the GPU): use backend='native' (CPU workers), a daemon, or on_error='raise'"
        )
    return spec


def check_nvjpeg(device: torch.device, daemon: str | None, is_source: bool) -> None:
    """backend="nvjpeg" decodes sources' images on a CUDA device in this process, with torchvision."""
    if not is_source:
        raise ConfigError("backend='nvjpeg' decodes the images of folders and other sources, not a Dataset's")
    if daemon is not None:
        raise ConfigError(
            "backend='nvjpeg' decodes on this process's GPU; a daemon's workers decode on the CPU: "
            "drop daemon=, or use backend='native' or 'dali' with the daemon"
        )
    if device.type != "cuda" and os.environ.get("FASTLOAD_DALI_IN_TRAINER") != "1":
        raise ConfigError(
            f"backend='nvjpeg' decodes on a GPU, and the batches go to {device}: pass device='cuda', "
            "or use backend='native' for CPU batches"
        )
    if device.type == "cuda":
        from fastload._loading.decoding.nvjpeg_decoder import torchvision_io

        torchvision_io()


def default_workers() -> int:
    """The cores this process may use, shared among the ranks on this machine (torchrun's
    LOCAL_WORLD_SIZE): eight ranks on 64 cores take 8 workers each, not 64."""
    try:
        local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local_ranks = 1
    return max(1, usable_cores() // local_ranks)


def _fastload_transforms(
    transform: Any, normalize: tuple[Sequence[float], Sequence[float]] | None
) -> tuple[tuple[Transform, ...], tuple[Sequence[float], Sequence[float]] | None]:
    """`transform` as fastload transforms: as given, or converted from a torchvision pipeline
    (`transforms.from_torchvision`), whose Normalize becomes `normalize`; one transform (a `Views`)
    as a chain of one."""
    if isinstance(transform, Transform):
        return (transform,), normalize
    if isinstance(transform, Sequence) and all(isinstance(t, Transform) for t in transform):
        return tuple(transform), normalize
    converted, found = from_torchvision(transform)
    if found is not None and normalize is not None and normalize_values(normalize) != found:
        raise ConfigError(
            f"the torchvision pipeline normalizes with (mean, std) = {found} and normalize= says "
            f"{tuple(tuple(v) for v in normalize)}: give the normalization once"
        )
    return converted, normalize if normalize is not None else found


def _image_output(
    normalize: tuple[Sequence[float], Sequence[float]] | None,
    dtype: torch.dtype,
    memory_format: torch.memory_format,
) -> ImageOutput:
    if normalize is None:
        return ImageOutput(memory_format=memory_format)
    mean, std = normalize_values(normalize)
    if not dtype.is_floating_point:
        raise ConfigError(f"normalize needs a floating dtype, got {dtype}")
    return ImageOutput(mean, std, dtype, memory_format)


# NOTE [one order for every rank]: the ranks of a run shard one epoch's order (`order[rank::world]`),
# so they must draw it from one seed: ranks with different seeds shard different orders, and the
# shards overlap (in a 100-image run, 26 samples on both ranks and 26 on neither, without a word).
# One process draws its seed as DataLoader does, from torch's RNG; but training scripts seed that
# RNG per rank (timm's `random_seed(seed, rank)`), so several ranks given no seed take
# DistributedSampler's default, 0, on every rank, and `sanity` says so once. A `generator` given
# with several ranks is the user's choice of order: it is drawn from, and must be seeded alike on
# every rank (the README says so); no collective checks it (a constructor that all-gathers would
# hang a loader made on one rank only, such as rank 0's validation loader).
SHARED_DEFAULT_SEED = 0


def base_seed(seed: int | None, generator: torch.Generator | None, world_size: int) -> int:
    """The base seed of a loader's orders and augmentations: `seed` when given; else, with several
    ranks, the one all ranks share (NOTE [one order for every rank]); else one drawn as DataLoader
    draws its own, from `generator` or torch's global RNG."""
    if seed is not None:
        return int(seed)
    if world_size > 1 and generator is None:
        return SHARED_DEFAULT_SEED
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) & (2**63 - 1)


def _copy_of(generator: torch.Generator) -> torch.Generator:
    """A generator in `generator`'s state, on its device: drawing from it leaves `generator` as it was."""
    copy = torch.Generator(device=generator.device)
    copy.set_state(generator.get_state())
    return copy


def _max_batch(batch_sampler: Any) -> int:
    """Slots must hold the largest batch a batch_sampler yields: its batch_size, or one pass."""
    declared = getattr(batch_sampler, "batch_size", None)
    if isinstance(declared, int) and declared > 0:
        return declared
    sizes = [len(b) for b in batch_sampler]
    if not sizes:
        raise ConfigError("the batch_sampler yields no batches")
    return max(sizes)
