"""`FastLoader`: the drop-in replacement for `torch.utils.data.DataLoader` (a facade only).

Its arguments become a `LoaderSpec` (`spec`: checked as DataLoader checks them); it opens the
source (opens its index, or says hello to a daemon), chooses the epoch plan, and delegates the
work to a `Pipeline`; it keeps the position (epoch, batches yielded) that `state_dict` saves.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np
import torch

from fastload._bad_samples import DEFAULT_MAX_SKIPPED, SkipAccount
from fastload._errors import ConfigError
from fastload._exclusion import ExcludeArg, kept_indices
from fastload._exclusion import digest as exclusion_digest
from fastload._loading.arguments import check_epoch
from fastload._loading.array_job import ArrayJob
from fastload._loading.daemon_client import DaemonSession
from fastload._loading.epoch import EpochIterator
from fastload._loading.iterable import IterableJob, IterablePlan
from fastload._loading.jobs import DatasetJob, ImageJob, Job
from fastload._loading.pipeline import Pipeline
from fastload._loading.plan import BatchSampler, SamplerPlan, ShuffledPlan
from fastload._loading.read_ahead import ReadAhead, read_ahead
from fastload._loading.resume import STATE_VERSION, check_state, convert, fingerprint, plain
from fastload._loading.ring import EXTRA_SLOTS
from fastload._loading.sanity import check_settings_sense
from fastload._loading.spec import build_spec
from fastload._loading.stats import LoaderStats, format_summary
from fastload._metrics_seam import export_loader
from fastload._shm import preflight
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.sample_index import SampleIndex
from fastload.transforms import Transform, to_config


class FastLoader:
    """Load batches with worker processes, a shared-memory ring and (on CUDA) async copies.

    `dataset` is either a source fastload reads itself (`fastload.sources`: an ImageNet-layout
    folder, whose labels index the sorted class names as torchvision's ImageFolder does, a file
    list, ...; a plain path means what `sources.as_source` says) or a map-style
    `torch.utils.data.Dataset`.
    Every DataLoader argument means what it means there; the keyword-only ones after `*` are
    fastload's own.

    Source mode yields `[images, labels]`: images (B, 3, H, W) on `device`, uint8 unless
    `normalize=(mean, std)` (torchvision units, [0, 1]) is given, then `dtype`; channels_last
    memory format unless `memory_format=torch.contiguous_format`; labels int64 (B,), or with
    MixUp/CutMix soft targets float (B, num_classes), or a multi-label source's float32 multi-hot
    rows. With `sample_ids=True` a third element, `SampleIds`, says which samples the batch holds
    (their indices, and file names). `transform` is a list of
    `fastload.transforms` (crops, colour, policies, RandomErasing, MixUp/CutMix: each runs where it
    is cheapest, NOTE [transform stages]) or a torchvision pipeline of the ones fastload has
    (`transforms.from_torchvision`), whose Normalize becomes `normalize`.
    Dataset mode yields what `default_collate` would. Samples whose leaves are fixed-shape arrays,
    tensors or numbers are written straight into shared memory; anything else (strings, ragged
    shapes, or any `collate_fn`) is collated in the worker and pickled over the local socket,
    which is slower, as DataLoader is.

    Batches depend only on (seed, epoch): the same for every `num_workers`. Once an iteration
    yields its first batch, the next one runs the next epoch, unless `set_epoch` says which (an
    `iter()` never drawn from, like the one Lightning makes to check a loader, uses up none).

    A `sampler` or `batch_sampler` of your own keeps its own epoch, as under DataLoader: the loader
    never calls its `set_epoch`, so call it each epoch (DistributedSampler asks for that), or call
    `loader.set_epoch`, which forwards to the batch_sampler, or else to its sampler, whichever has
    `set_epoch`. `loader.sampler` and `loader.batch_sampler` are the ones you gave (else None), where
    Lightning finds them to set their epoch. A sampler with an integer `epoch` attribute
    (DistributedSampler's) also names the epoch whose random seeds the batches get.

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
        sampler: Iterable[int] | None = None,
        batch_sampler: Iterable[Sequence[int]] | None = None,
        num_workers: int | None = None,
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
        prefetch: int | None = None,
        transform: Sequence[Transform] | Callable[..., Any] | None = None,
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
    ) -> None:
        del pin_memory_device, in_order  # batches are always delivered in order
        self._spec = build_spec(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
            timeout=timeout, worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            generator=generator, prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            seed=seed, prefetch=prefetch, transform=transform, device=device, normalize=normalize,
            dtype=dtype, memory_format=memory_format, backend=backend, daemon=daemon, rank=rank,
            world_size=world_size, summary=summary, hang_timeout=hang_timeout, sample_ids=sample_ids,
            shuffle_block=shuffle_block, shuffle_window=shuffle_window, on_error=on_error,
            max_skipped=max_skipped, metrics=metrics,
        )
        self.dataset = dataset
        self.classes: tuple[str, ...] = ()
        self._job: Job | None = None
        self._index: SampleIndex | ArrayIndex | None = None
        self._session: DaemonSession | None = None
        self._num_samples = 0
        self._keep: np.ndarray | None = None  # the samples an `exclude=` list leaves in (None: all)
        self._read_ahead: ReadAhead | None = None  # of a remote source's epoch (`read_ahead`)
        self._check_exclude(exclude)  # before a daemon session or an index is opened
        self._open_source()
        self._exclude(exclude)
        check_settings_sense(self._spec, self.classes, self._index, self._num_samples)
        sized = hasattr(self._spec.dataset, "__len__")
        total = self._num_samples or (len(self._spec.dataset) if sized else 0)
        total = total if self._keep is None else len(self._keep)
        self._skips = SkipAccount(max_skipped, total) if on_error == "skip" else None
        self._plan = self._make_plan()
        self._last_stats: LoaderStats | None = None
        self._pipeline: Pipeline | None = None
        self._iterator: EpochIterator | None = None
        self._epoch = 0  # the epoch the next iteration runs
        self._position = (0, 0)  # (epoch, batches yielded in it), for state_dict
        self._resume_at = 0
        self._undrawn: tuple[int, int] | None = None  # (epoch, resume_at) before an iteration's first batch
        self._fingerprint: dict[str, Any] | None = None  # the source's, for state_dict (computed once)
        self._closed = False
        self._metrics = export_loader(self, self._spec.metrics, self._spec.rank)  # NOTE [the exporter seam]

    # DataLoader's attributes, read from the spec.
    @property
    def seed(self) -> int:
        """The base seed of every epoch's order and augmentations."""
        return self._spec.seed

    @property
    def batch_size(self) -> int | None:
        """Samples per batch (None with a batch_sampler)."""
        return self._spec.batch_size

    @property
    def drop_last(self) -> bool:
        return self._spec.drop_last

    @property
    def num_workers(self) -> int:
        return self._spec.num_workers

    @property
    def persistent_workers(self) -> bool:
        return self._spec.persistent_workers

    @property
    def device(self) -> torch.device:
        """Where batches are delivered."""
        return self._spec.device

    def _open_source(self) -> None:
        """Open the source's index (or, attached to a daemon, say hello) and build the job; before any
        worker is forked, a ring /dev/shm cannot hold fails here."""
        spec = self._spec
        if spec.iterable:
            self._job = IterableJob(
                spec.dataset, spec.collate_fn, spec.seed, spec.slot_batch_size, spec.drop_last
            )
            return
        if spec.source is None:
            self._job = DatasetJob(
                spec.dataset, spec.collate_fn, spec.seed, spec.slot_batch_size, on_error=spec.on_error,
                keep=self._keep,
            )
            if spec.sampler is None and spec.batch_sampler is None:  # a sampler may stand for __len__
                self._num_samples = len(spec.dataset)
            return
        if spec.daemon is not None:
            assert spec.transforms is not None  # compiled here: a chain the daemon cannot run fails first
            self._session = self._connect()
            self.classes, self._num_samples = self._session.welcome.classes, self._session.welcome.num_samples
            return
        if self._index is None:
            self._index = spec.source.open()
            self.classes, self._num_samples = self._index.classes, len(self._index)
        if isinstance(self._index, ArrayIndex):  # rows as stored: no decoding, no transforms
            self._spec = spec = spec.for_arrays()
            self._job = ArrayJob(self._index, spec.seed, spec.slot_batch_size)
            assert self._job.layout is not None
            slot_bytes = self._job.layout.slot_bytes
            preflight(slot_bytes * (spec.ring_prefetch(spec.num_workers, slot_bytes) + EXTRA_SLOTS))
            return
        assert spec.transforms is not None and spec.worker_transforms is not None
        if spec.transforms.batch is not None and self._index.labels.ndim != 1:
            raise ConfigError(
                f"{type(spec.transforms.batch).__name__} mixes class-index labels; this source's targets "
                "are multi-hot rows (multi_label): mix them in your training step instead"
            )
        # backend="nvjpeg" decodes only in this process (`decodes_in_trainer`): its job just lays out batches.
        backend = "native" if spec.backend == "nvjpeg" else spec.backend
        job = ImageJob(
            self._index, spec.worker_transforms, backend, spec.seed, spec.slot_batch_size,
            normalize=spec.worker_normalize, on_error=spec.on_error, keep=self._keep,
        )
        assert job.layout is not None
        if not spec.decodes_in_trainer:  # the in-process DALI executor needs no ring
            prefetch = spec.ring_prefetch(spec.num_workers, job.layout.slot_bytes)
            preflight(job.layout.slot_bytes * (prefetch + EXTRA_SLOTS))  # before any worker is forked
        self._job = job

    def _check_exclude(self, exclude: ExcludeArg) -> None:
        spec = self._spec
        own_order = spec.sampler is None and spec.batch_sampler is None and not spec.iterable
        if exclude is not None and (spec.daemon is not None or not own_order):
            raise ConfigError(
                "exclude= works on a loader's own order over a local source or a map-style Dataset: "
                "not with daemon=, a sampler or batch_sampler (leave the samples out there), or an "
                "IterableDataset"
            )

    def _exclude(self, exclude: ExcludeArg) -> None:
        """Resolve `exclude=` against the source (or Dataset) into the samples kept."""
        if exclude is None:
            return
        name_of = self._index.name if self._index is not None else None
        self._keep = kept_indices(exclude, self._num_samples, name_of)
        if self._keep is not None and isinstance(self._job, (ImageJob, DatasetJob)):
            self._job.keep = self._keep  # stand-ins for broken samples are drawn from those kept

    def _make_plan(self) -> ShuffledPlan | SamplerPlan | IterablePlan:
        spec = self._spec
        if spec.iterable:
            assert spec.batch_size is not None
            return IterablePlan(spec.dataset, spec.batch_size, spec.drop_last, max(1, spec.num_workers))
        if spec.batch_sampler is not None:
            return SamplerPlan(spec.batch_sampler)
        assert spec.batch_size is not None
        if spec.sampler is not None:
            return SamplerPlan(BatchSampler(spec.sampler, spec.batch_size, spec.drop_last))
        return ShuffledPlan(
            self._num_samples, spec.batch_size, shuffle=spec.shuffle, drop_last=spec.drop_last,
            seed=spec.seed, rank=spec.rank, world_size=spec.world_size,
            block=spec.shuffle_block, window=spec.shuffle_window, keep=self._keep,
        )

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self._plan)

    @property
    def sampler(self) -> Iterable[int] | None:
        """The `sampler` this loader was given, or None (DataLoader's attribute: frameworks such
        as Lightning call its `set_epoch`)."""
        return self._plan.user_sampler if isinstance(self._plan, SamplerPlan) else None

    @property
    def batch_sampler(self) -> Iterable[Sequence[int]] | None:
        """The `batch_sampler` this loader was given, or None."""
        return self._plan.user_batch_sampler if isinstance(self._plan, SamplerPlan) else None

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run `epoch` (its order and augmentations).

        A user's batch_sampler, or else its sampler, that has `set_epoch` gets it too, as under a
        DataLoader that Accelerate prepared. After `load_state_dict`, naming the epoch being
        resumed keeps the position in it; naming another starts that one at its first batch.
        """
        epoch = check_epoch(epoch)
        if epoch != self._epoch:
            self._resume_at = 0
        self._epoch = epoch
        if isinstance(self._plan, SamplerPlan):
            self._plan.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise ConfigError("this FastLoader is closed")
        epoch, start = self._next_position()
        carried = None
        if self._iterator is not None:
            # Its next() now says why it ended (never a silent stop); what it decoded ahead for
            # this epoch is taken over (NOTE [no drain] in `epoch`).
            carried = self._iterator.hand_over(epoch, start)
        if self._pipeline is not None and self._pipeline.closed:
            self._pipeline, carried = None, None  # its ring could not be made: it closed itself
        if self._pipeline is not None and not self.persistent_workers:
            # DataLoader without persistent_workers starts fresh workers every epoch, so changes
            # made to the dataset in the trainer's process reach the next epoch's workers.
            self._pipeline.close()
            self._pipeline, carried = None, None
        if self._pipeline is None:
            session = None
            if self._spec.daemon is not None:
                session, self._session = self._session or self._connect(), None
            name_of = self._index.name if self._index is not None else None
            self._pipeline = Pipeline(
                self._job, self._spec, session=session, name_of=name_of, skips=self._skips
            )
        self._undrawn = (self._epoch, self._resume_at)  # an iteration uses up its epoch when drawn from
        self._position = (epoch, start)
        if self._read_ahead is not None:
            self._read_ahead.stop()
        self._read_ahead = read_ahead(self._index, self._plan.iter_batches(epoch, start))
        self._iterator = EpochIterator(
            self._pipeline, self._plan.iter_batches(epoch, start), epoch, start, self._on_yield,
            following=self._following(epoch), carried=carried,
            on_empty=self._plan.ended if isinstance(self._plan, IterablePlan) else None,
        )
        return self._iterator

    def _following(self, epoch: int) -> tuple[int, Callable[[], Iterator[np.ndarray]]] | None:
        """The epoch the iteration after this one will most likely run, and its batches: decoded
        ahead while this epoch's tail is consumed. Only a plan of fastload's own (a user's sampler
        may not be iterated ahead of time) with workers that outlive the epoch: this process's
        pool, or a daemon session's window of slots (a draining daemon fails only the tasks it
        refuses, so the epoch under way still ends whole)."""
        if not isinstance(self._plan, ShuffledPlan) or not self.persistent_workers:
            return None
        return epoch + 1, functools.partial(self._plan.iter_batches, epoch + 1, 0)

    def _next_position(self) -> tuple[int, int]:
        """(epoch, first batch) of the next iteration. A user's sampler that holds an epoch names
        it: one set on the sampler itself (`sampler.set_epoch(5)`) wins over the loader's count,
        and a resume position applies to its own epoch only."""
        epoch, start = self._epoch, self._resume_at
        if isinstance(self._plan, SamplerPlan):
            sampler_epoch = self._plan.sampler_epoch()
            if sampler_epoch is not None and sampler_epoch != epoch:
                return sampler_epoch, 0
        return epoch, start

    def _on_yield(self, epoch: int, yielded: int, batch: np.ndarray | None) -> None:
        self._position = (epoch, yielded)
        if self._read_ahead is not None:
            fetched = self._read_ahead.delivered()
            if fetched and self._pipeline is not None:
                self._pipeline.stats.add("net_bytes", fetched)
        if isinstance(self._plan, IterablePlan) and batch is not None:
            self._plan.delivered(epoch, batch)
        if self._undrawn is not None:
            # NOTE [drawn epochs]: the iteration's first batch puts its epoch under way, so the next
            # iteration runs the next one (unless set_epoch named one meanwhile). An iterator never
            # drawn from, such as the iter() Lightning makes to check that a loader is iterable,
            # uses up no epoch and no resume position.
            if (self._epoch, self._resume_at) == self._undrawn:
                self._epoch, self._resume_at = epoch + 1, 0
            self._undrawn = None

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: after the last batch this loader yielded, with what that
        position depends on (batch size, rank and world size, seed, shuffle settings, the source's
        fingerprint, the transform chain) and the position counted in samples (`_loading.resume`)."""
        epoch, yielded = self._position
        state: dict[str, Any] = {
            "version": STATE_VERSION, "seed": self.seed, "epoch": epoch, "batches_yielded": yielded
        }
        if isinstance(self._plan, IterablePlan):  # how far each worker's stream got
            state["stream_batches"] = self._plan.state(epoch)
        else:
            state["epoch_batches"] = self._epoch_batches()
            state["samples_yielded"] = self._samples_yielded(yielded)
        state.update(self._settings())
        state.update(batch_size=self.batch_size, rank=self._spec.rank, world_size=self._spec.world_size)
        return state

    def _epoch_batches(self) -> int | None:
        try:
            return len(self._plan)
        except TypeError:  # a sampler without len()
            return None

    def _samples_yielded(self, yielded: int) -> int | None:
        """This rank's samples delivered in the epoch after `yielded` batches (None when a
        user's batch_sampler makes the batches)."""
        if isinstance(self._plan, ShuffledPlan):
            return min(yielded * self._plan.batch_size, self._plan.samples_per_rank)
        if isinstance(self._plan, SamplerPlan) and self.batch_size is not None:
            return yielded * self.batch_size
        return None

    def _settings(self) -> dict[str, Any]:
        """What a state's position depends on besides the seed, batch size, rank and world size."""
        spec = self._spec
        if self._fingerprint is None:
            if self._index is not None:
                self._fingerprint = fingerprint(len(self._index), self._index.labels, self.classes)
            elif spec.iterable:
                self._fingerprint = {}
            else:  # a Dataset, or a daemon's source: its length and classes
                self._fingerprint = fingerprint(self._num_samples, None, self.classes)
        transforms = None if spec.transform is None else plain(to_config(spec.transform))
        return {
            "shuffle": spec.shuffle, "shuffle_block": spec.shuffle_block,
            "shuffle_window": spec.shuffle_window, "drop_last": spec.drop_last,
            "source": self._fingerprint, "transforms": transforms, "excluded": exclusion_digest(self._keep),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume exactly after the batch `state` was taken at.

        A state is checked against this loader (NOTE [elastic resume] in `_loading.resume`): a
        changed shuffle, shuffle_block, shuffle_window, drop_last or source is a ConfigError naming
        it (at an epoch's end only another source is: the next epoch starts afresh); the transform
        chain may change (it moves no sample: progressive resizing resumes); a mid-epoch position
        under another batch size or world size is
        converted where it falls on a batch boundary of the new layout (an unblocked order), and
        refused otherwise. The state's seed wins over this loader's: the seed given to a loader is
        where a fresh run starts, and a resumed run goes on with the run it came from (its order and
        augmentations), as a StatefulDataLoader restores its generator's state. Every field of a
        state is checked first, and a state no loader could have saved is a ConfigError naming the
        field, with the loader left as it was (NOTE [checked states]); version 1 states' settings
        are not checked, as before (they hold none).

        A user's sampler with `set_epoch` is set to the epoch resumed: its order is replayed up to
        the position, so it must be that epoch's."""
        epoch_over = check_state(state, self._plan, self._settings())
        epoch, yielded = state["epoch"], state["batches_yielded"]
        streams = isinstance(self._plan, IterablePlan)
        if not streams and not epoch_over and state["version"] == STATE_VERSION:
            yielded = convert(  # a ConfigError here too leaves the loader as it was
                state, batch_size=self.batch_size, world_size=self._spec.world_size,
                convertible=self._not_convertible(),
            )
        if state["seed"] != self.seed:
            # Workers (or a daemon session) were started with the old seed: start afresh.
            self._close_pipeline()
            self._spec = self._spec.with_seed(state["seed"])
            if self._spec.daemon is None:
                self._open_source()  # a job of the new seed (the source's index is kept)
            self._plan = self._make_plan()
        if isinstance(self._plan, IterablePlan):
            self._plan.resume_from(epoch, state["stream_batches"])
        elif epoch_over:
            epoch, yielded = epoch + 1, 0  # the saved epoch was over: the next starts afresh in any layout
        else:
            batches = self._epoch_batches()
            if batches is not None and yielded >= batches:
                epoch, yielded = epoch + 1, 0
        self._epoch, self._resume_at = epoch, yielded
        self._position = (epoch, yielded)
        if isinstance(self._plan, SamplerPlan):
            self._plan.set_epoch(epoch)

    def _not_convertible(self) -> str | None:
        """Why this loader's plan cannot take a position from another batch size or world size
        (NOTE [elastic resume]), or None."""
        plan = self._plan
        if isinstance(plan, ShuffledPlan):
            if plan.block is not None:
                return "a block shuffle's order depends on both (windows of window x batch_size, per rank)"
            return None
        if isinstance(plan, SamplerPlan) and plan.user_sampler is not None:
            return None if self._spec.world_size == 1 else "a sampler's order is its own"
        return "a batch_sampler's batches are not counted in samples"

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (empty before the first iteration)."""
        return self._pipeline.worker_pids if self._pipeline is not None else []

    def close(self) -> None:
        """Stop the workers and free shared memory. Batches already delivered stay valid."""
        self._closed = True
        self._close_pipeline()
        if self._metrics is not None:
            self._metrics.close()

    def stats(self) -> LoaderStats | None:
        """This loader's counters and stage timings (what `fastload iostat` shows), or None
        before the first iteration. Cumulative since the workers started."""
        if self._pipeline is not None and not self._pipeline.closed:
            return self._pipeline.stats.snapshot()
        return self._last_stats

    def skipped(self) -> list[tuple[str, str]]:
        """The broken samples `on_error="skip"` replaced so far, each once: (its file or key, why)."""
        records = self._skips.samples.values() if self._skips is not None else ()
        return [(r.name or str(r.index), r.reason) for r in records]

    def _close_pipeline(self) -> None:
        if self._read_ahead is not None:
            self._read_ahead.stop()
            self._read_ahead = None
        if self._iterator is not None:
            self._iterator.stop()
        if self._pipeline is not None and not self._pipeline.closed:
            self._last_stats = self._pipeline.stats.snapshot()
            if self._spec.summary:
                sys.stderr.write(format_summary(self._last_stats))
            self._pipeline.close()
            self._pipeline = None
        if self._session is not None:
            self._session.close()
            self._session = None

    def _connect(self) -> DaemonSession:
        assert self._spec.daemon is not None
        return DaemonSession(self._spec.daemon, self._spec.hello())

    def __enter__(self) -> FastLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
