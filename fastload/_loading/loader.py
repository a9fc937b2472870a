"""`FastLoader`: the drop-in replacement for `torch.utils.data.DataLoader` (a facade only).

Its arguments become a `LoaderSpec` (`settings.build`: checked as DataLoader checks them); an
`Assembly` (`assembly`) opens the source and builds the job, the epoch plan and the pipelines;
`Iterations` (`running.iterations`) runs them; a `Position` (`settings.position`) keeps the epoch
and batch that come next, which `state_dict` saves and `load_state_dict` restores.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.context import BaseContext
from typing import Any

import torch

from fastload._bad_samples import DEFAULT_MAX_SKIPPED
from fastload._errors import ConfigError
from fastload._exclusion import ExcludeArg
from fastload._loading.assembly import Assembly
from fastload._loading.folder_attributes import ImageFolderAttributes
from fastload._loading.order.plan import SamplerPlan
from fastload._loading.running.iterations import Iterations
from fastload._loading.running.stats import LoaderStats
from fastload._loading.settings.arguments import check_epoch
from fastload._loading.settings.build import build_spec
from fastload._loading.settings.position import Position, resume_point, state_of
from fastload._metrics_seam import export_loader
from fastload.samplers import Sampler
from fastload.transforms import Transform


class FastLoader(ImageFolderAttributes):
    """Load batches with worker processes, a shared-memory ring and (on CUDA) async copies.

    `dataset` is either a source fastload reads itself (`fastload.sources`: an ImageNet-layout
    folder, whose labels index the sorted class names as torchvision's ImageFolder does, a file
    list, ...; a plain path means what `sources.as_source` says; ImageFolder's `classes`,
    `class_to_idx` and `targets` are the loader's: `folder_attributes`) or a map-style torch `Dataset`.
    Every DataLoader argument means what it means there; the keyword-only ones after `*` are
    fastload's own.

    Source mode yields `[images, labels]`: images (B, 3, H, W) on `device`, uint8 unless
    `normalize=(mean, std)` (torchvision units, [0, 1]) is given, then `dtype`; channels_last
    memory format unless `memory_format=torch.contiguous_format`; labels int64 (B,), or with
    MixUp/CutMix soft targets float (B, num_classes), or a multi-label source's float32 multi-hot
    rows. With `sample_ids=True` a third element, `SampleIds`, says which samples the batch holds
    (their indices, and file names). `transform` is a list of `fastload.transforms` (crops, colour,
    policies, RandomErasing, MixUp/CutMix: each runs where it is cheapest, NOTE [transform stages];
    or one `Views`: several crops) or a torchvision pipeline (`from_torchvision`; Normalize: `normalize`).
    Dataset mode yields what `default_collate` would; fixed-shape arrays, tensors and numbers go
    straight into shared memory, anything else (or a `collate_fn`'s batch) is pickled, as DataLoader's.

    Tuning (NOTE [what is tuned] in `settings.auto`): given neither `num_workers` nor `prefetch`,
    a source's loader picks both as it runs (`"auto"` for one tunes that one; a number is obeyed;
    `autotune=False`: fixed defaults), adding a worker while it is decode-bound and a core is idle,
    retiring one when the trainer does not wait or processes queue for a CPU, and moving the batches
    in flight (the ring with them, within /dev/shm). Through a daemon, `priority=` weighs this session.

    Batches depend only on (seed, epoch): the same for every `num_workers`, tuned or not. Once an iteration
    yields its first batch, the next one runs the next epoch, unless `set_epoch` says which (an
    `iter()` never drawn from, like the one Lightning makes to check a loader, uses up none).

    A `sampler` of `fastload.samplers` (Weighted, ClassBalanced, RepeatedAugmentation) is a plan on a
    source: its order from (seed, epoch, rank), resumed exactly, shared out by rank. A torch sampler
    or `batch_sampler` of your own keeps its own epoch, as under DataLoader: the loader never calls
    its `set_epoch` (call it, or `loader.set_epoch`, which forwards to the batch_sampler, else to its
    sampler); `loader.sampler` and `loader.batch_sampler` are the ones you gave (else None), where
    Lightning finds them. One with an integer `epoch` (DistributedSampler's) names the epoch.

    Folder-only options: `backend` picks the decoder: "native" (libjpeg-turbo, the default; Pillow
    where the extension is not built), "pil", or "dali" (NVIDIA DALI's CPU operators, in the same
    workers with the same plan, geometry and randomness: `pip install fastload[dali]`; refused at
    construction without it; with `device="cuda"` it decodes on the GPU, nvJPEG, in this
    process, except through a daemon, whose workers decode on the CPU), or "nvjpeg"
    (torchvision's batched GPU decoder, then one kernel crops and resizes: device="cuda" only,
    no daemon; for where DALI is not installed).
    `daemon="default"` (or "ipc://PATH") attaches to a running
    `fastload serve` instead of starting workers (same batches, bit for bit). `rank` and
    `world_size` give this process its shard, DistributedSampler's: every rank the same number of
    samples, the epoch's order padded by repeating its start, or with `drop_last` truncated to a
    multiple of `world_size` (then the last partial batch is dropped too, as DataLoader's
    `drop_last` does). Either one not given comes from torch.distributed when its process group is
    initialized (`get_rank()`, `get_world_size()`), else from the launcher's environment:
    `WORLD_SIZE` and `RANK`, or without `RANK` (Lightning sets none) `LOCAL_RANK` on node 0
    (`NODE_RANK` or `GROUP_RANK` 0) or `NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK`. A world of more
    than one process whose rank cannot be found is a `ConfigError`, never rank 0.
    `shuffle_block=R` (with `shuffle=True`) shuffles runs of R consecutive samples (in the
    source's storage order) instead of single samples, and mixes `shuffle_window` batches at a
    time among themselves: reads stay sequential on tar shards, packed files and chunked HDF5
    (NOTE [block shuffle] in `plan`; its label mixing against a full shuffle is in BENCHMARKS).
    `summary=True` prints a per-stage table when the loader closes; `stats()` returns the counters
    `fastload iostat` shows.

    Faults: a worker that dies (crash, OOM, killed from outside) is replaced and its batches are
    redone. A worker whose batch runs longer than max(`hang_timeout`, 20 x the slowest recent
    per-sample time x the batch's samples) is taken as hung, killed, replaced, and the batch
    redone; `hang_timeout` defaults to 120 s and 0 turns the check off. `timeout` is DataLoader's:
    how long `next()` may wait in all. A batch that crashes or hangs three workers in a row raises
    `WorkerError` naming its samples, and the loop can go on. A sample that raises (or a file that
    cannot be read) raises `SampleError`, which keeps the original type as DataLoader does:
    `except KeyError` or `except FileNotFoundError` still catches it; that batch is lost (its other
    samples too). With `on_error="skip"` such a sample is replaced in its row by another, drawn
    from (seed, epoch, its index), so batches stay full and ranks in step (NOTE [bad samples]);
    each is named once in a warning and counted (`stats().skipped`, iostat), and more than
    `max_skipped` distinct broken samples (a float: a fraction of the source, 5% by default; an
    int: a count) raises `DatasetError`. For image sources and map-style Datasets.
    `exclude=` leaves samples out of every epoch, as if the source did not hold them: the list
    `fastload verify PATH -o LIST` writes (its path), or the samples' names (files, `shard:key`),
    or their indices (a Dataset's); `state_dict` records which, and a resume under another list
    is refused.
    `metrics=PORT` (or "HOST:PORT"; a PORT alone listens on 127.0.0.1 only) serves these counters
    to Prometheus (`pip install fastload[metrics]`), one series per rank; unset, a launcher's
    `FASTLOAD_METRICS=PORT` does it, each rank on PORT + LOCAL_RANK. `fastload.ScalarLogger`
    writes them to TensorBoard or a Lightning logger each epoch.
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str] | torch.utils.data.Dataset[Any],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Iterable[int] | Sampler | None = None,
        batch_sampler: Iterable[Sequence[int]] | None = None,
        num_workers: int | str | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: str | BaseContext | None = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        prefetch: int | str | None = None,
        transform: Sequence[Transform] | Transform | Callable[..., Any] | None = None,
        device: str | torch.device | None = None,
        normalize: tuple[Sequence[float], Sequence[float]] | None = None,
        dtype: torch.dtype = torch.float32,
        memory_format: torch.memory_format = torch.channels_last,
        backend: str = "native",
        daemon: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        summary: bool = False,
        hang_timeout: float | None = None,
        sample_ids: bool = False,
        shuffle_block: int | None = None,
        shuffle_window: int = 8,
        on_error: str = "raise",
        max_skipped: float | int = DEFAULT_MAX_SKIPPED,
        exclude: ExcludeArg = None,
        metrics: str | int | None = None,
        autotune: bool | None = None,
        priority: float = 1.0,
    ) -> None:
        del pin_memory_device, in_order  # batches are always delivered in order
        spec = build_spec(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
            timeout=timeout, worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            generator=generator, prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            seed=seed, prefetch=prefetch, transform=transform, device=device, normalize=normalize,
            dtype=dtype, memory_format=memory_format, backend=backend, daemon=daemon, rank=rank,
            world_size=world_size, summary=summary, hang_timeout=hang_timeout, sample_ids=sample_ids,
            shuffle_block=shuffle_block, shuffle_window=shuffle_window, on_error=on_error,
            max_skipped=max_skipped, metrics=metrics, autotune=autotune, priority=priority,
        )
        self.dataset = dataset
        self._assembly = Assembly(spec, exclude)
        self._runs = Iterations(spec.summary)  # the pipeline, the iteration under way, the last counters
        self._position = Position()
        self._closed = False
        self._metrics = export_loader(self, spec.metrics, spec.rank)  # NOTE [the exporter seam]

    # DataLoader's attributes, read from the spec.
    @property
    def seed(self) -> int:
        """The base seed of every epoch's order and augmentations."""
        return self._assembly.spec.seed

    @property
    def batch_size(self) -> int | None:
        """Samples per batch (None with a batch_sampler)."""
        return self._assembly.spec.batch_size

    @property
    def drop_last(self) -> bool:
        return self._assembly.spec.drop_last

    @property
    def num_workers(self) -> int:
        return self._assembly.spec.num_workers

    @property
    def persistent_workers(self) -> bool:
        return self._assembly.spec.persistent_workers

    @property
    def device(self) -> torch.device:
        """Where batches are delivered."""
        return self._assembly.spec.device

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self._assembly.plan)

    @property
    def sampler(self) -> Iterable[int] | None:
        """The `sampler` this loader was given, or None (DataLoader's attribute: frameworks such
        as Lightning call its `set_epoch`)."""
        plan = self._assembly.plan
        return plan.user_sampler if isinstance(plan, SamplerPlan) else None

    @property
    def batch_sampler(self) -> Iterable[Sequence[int]] | None:
        """The `batch_sampler` this loader was given, or None."""
        plan = self._assembly.plan
        return plan.user_batch_sampler if isinstance(plan, SamplerPlan) else None

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run `epoch` (its order and augmentations).

        A user's batch_sampler, or else its sampler, that has `set_epoch` gets it too, as under a
        DataLoader that Accelerate prepared. After `load_state_dict`, naming the epoch being
        resumed keeps the position in it; naming another starts that one at its first batch.
        """
        self._position.set_epoch(check_epoch(epoch), self._assembly.plan)

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise ConfigError("this FastLoader is closed")
        parts, persistent = self._assembly, self.persistent_workers
        epoch, start = self._position.next_iteration(parts.plan)
        carried = self._runs.prepare(epoch, start, persistent, parts.pipeline)
        self._position.started(epoch, start)  # an iteration uses up its epoch when drawn from
        on_yield = self._position.yielded
        return self._runs.iterate(parts.plan, epoch, start, parts.index, persistent, carried, on_yield)

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: after the last batch this loader yielded, with what that
        position depends on (batch size, rank and world size, seed, shuffle settings, the source's
        fingerprint, the transform chain) and the position counted in samples (`_loading.settings.resume`)."""
        parts = self._assembly
        return state_of(self._position.current, parts.plan, parts.spec, parts.settings())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume exactly after the batch `state` was taken at.

        A state is checked against this loader first, field by field, and one no loader could
        have saved, or saved under another shuffle, shuffle_block, shuffle_window, drop_last or
        source, is a ConfigError naming it, the loader left as it was (NOTE [checked states] and
        NOTE [elastic resume] in `_loading.settings.resume`: the transform chain may change; a
        mid-epoch position under another batch or world size is converted where it falls on a
        batch boundary). The state's seed wins over this loader's (a resumed run goes on with
        its order and augmentations). A user's sampler with `set_epoch` is set to the epoch
        resumed: its order is replayed up to the position, so it must be that epoch's."""
        parts = self._assembly
        epoch_over, yielded = resume_point(state, parts.plan, parts.spec, parts.settings())  # checked first
        if state["seed"] != self.seed:
            # Workers (or a daemon session) were started with the old seed: start afresh.
            self._runs.close()
            parts.reseed(state["seed"])
        self._position.resume(state, yielded, epoch_over, parts.plan)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (empty before the first iteration)."""
        return self._runs.worker_pids()

    def close(self) -> None:
        """Stop the workers and free shared memory. Batches already delivered stay valid."""
        self._closed = True
        self._runs.close()
        self._assembly.close_session()
        if self._metrics is not None:
            self._metrics.close()

    def stats(self) -> LoaderStats | None:
        """This loader's counters and stage timings (what `fastload iostat` shows), or None
        before the first iteration. Cumulative since the workers started."""
        return self._runs.stats()

    def skipped(self) -> list[tuple[str, str]]:
        """The broken samples `on_error="skip"` replaced so far, each once: (its file or key, why)."""
        skips = self._assembly.skips
        records = skips.samples.values() if skips is not None else ()
        return [(r.name or str(r.index), r.reason) for r in records]

    def __enter__(self) -> FastLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
