"""`FastLoader`: the drop-in replacement for `torch.utils.data.DataLoader` (a facade only).

It checks arguments the way DataLoader does, chooses the epoch plan, and delegates the work to
a `Pipeline`; it keeps the position (epoch, batches yielded) that `state_dict` saves.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.context import BaseContext
from typing import Any

import torch

from fastload._client import DaemonSession, resolve_address
from fastload._delivery import ImageOutput
from fastload._errors import ConfigError
from fastload._jobs import DatasetJob, FolderJob
from fastload._pipeline import EpochIterator, Pipeline, PipelineConfig
from fastload._plan import BatchSampler, SamplerPlan, ShuffledPlan
from fastload._ranks import process_position
from fastload._ring import EXTRA_SLOTS, MAX_PREFETCH, default_prefetch
from fastload._shm import preflight
from fastload._sources import ImageFolderIndex
from fastload._stats import LoaderStats, format_summary
from fastload.transforms import Transform, compile_transforms, to_config

_STATE_VERSION = 1


def _default_workers() -> int:
    """The cores this process may use, shared among the ranks on this machine (torchrun's
    LOCAL_WORLD_SIZE): eight ranks on 64 cores take 8 workers each, not 64."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    try:
        local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local_ranks = 1
    return max(1, cores // local_ranks)


def _check_device(device: torch.device) -> None:
    """Refuse, at construction, a device batches cannot be delivered to."""
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {str(device)!r}")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        raise ConfigError(
            f"device={str(device)!r} but CUDA is not available to this process (torch {torch.__version__}, "
            f"{build}; no GPU visible): pass device='cpu', or run where a GPU and a CUDA build of torch are"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"device={str(device)!r} but this process sees {torch.cuda.device_count()} GPU(s) "
            "(CUDA_VISIBLE_DEVICES?): pick one of them"
        )


def _check_mp_context(context: str | BaseContext | None, num_workers: int) -> None:
    """DataLoader's rules: a start method only with workers, and only one multiprocessing knows."""
    if context is None:
        return
    if num_workers == 0:
        raise ConfigError(
            "multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
            "as in DataLoader"
        )
    if isinstance(context, BaseContext):
        return
    methods = mp.get_all_start_methods()
    if not isinstance(context, str) or context not in methods:
        raise ConfigError(f"multiprocessing_context must be one of {methods} (or a context), got {context!r}")


def _normalize_values(normalize: tuple[Sequence[float], Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """(mean, std) in torchvision's units, checked: fastload normalizes images scaled to [0, 1]."""
    mean, std = (tuple(float(v) for v in normalize[0]), tuple(float(v) for v in normalize[1]))
    if len(mean) != 3 or len(std) != 3:
        raise ConfigError("normalize takes (mean, std) with 3 values each (R, G, B)")
    if not all(0.0 <= v <= 1.0 for v in mean) or not all(0.0 < v <= 1.0 for v in std):
        scaled = max((*mean, *std)) > 1.0
        raise ConfigError(
            f"normalize=(mean={mean}, std={std}) is not in fastload's units: means in [0, 1] and stds "
            "in (0, 1], of pixels scaled to [0, 1] (torchvision's convention, e.g. mean=(0.485, 0.456, "
            "0.406), std=(0.229, 0.224, 0.225))"
            + ("; these look like 0-255 units (DALI's convention): divide them by 255" if scaled else "")
        )
    return mean, std


def _seed_from(generator: torch.Generator | None) -> int:
    """A base seed drawn as DataLoader draws its own (from `generator` or torch's global RNG)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item()) & (2**63 - 1)


class FastLoader:
    """Load batches with worker processes, a shared-memory ring and (on CUDA) async copies.

    `dataset` is either an ImageNet-layout folder (class subfolders; labels are the index of the
    sorted class names, as torchvision's ImageFolder) or a map-style `torch.utils.data.Dataset`.
    Every DataLoader argument means what it means there; the keyword-only ones after `*` are
    fastload's own.

    Folder mode yields `[images, labels]`: images (B, 3, H, W) on `device`, uint8 unless
    `normalize=(mean, std)` (torchvision units, [0, 1]) is given, then `dtype`; channels_last
    memory format unless `memory_format=torch.contiguous_format`; labels int64 (B,).
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

    Folder-only options: `daemon="default"` (or "ipc://PATH") attaches to a running
    `fastload serve` instead of starting workers (same batches, bit for bit). `rank` and
    `world_size` give this process its shard, DistributedSampler's: every rank the same number of
    samples, the epoch's order padded by repeating its start, or with `drop_last` truncated to a
    multiple of `world_size` (then the last partial batch is dropped too, as DataLoader's
    `drop_last` does). Either one not given comes from torch.distributed when its process group is
    initialized (`get_rank()`, `get_world_size()`), else from the launcher's environment:
    `WORLD_SIZE` and `RANK`, or without `RANK` (Lightning sets none) `LOCAL_RANK` on node 0
    (`NODE_RANK` or `GROUP_RANK` 0) or `NODE_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK`. A world of more
    than one process whose rank cannot be found is a `ConfigError`, never rank 0.
    `summary=True` prints a per-stage table when the loader closes; `stats()` returns the counters
    `fastload iostat` shows.

    Faults: a worker that dies (crash, OOM, killed from outside) is replaced and its batches are
    redone. A worker whose batch runs longer than max(`hang_timeout`, 20 x the slowest recent
    per-sample time x the batch's samples) is taken as hung, killed, replaced, and the batch
    redone; `hang_timeout` defaults to 120 s and 0 turns the check off. `timeout` is DataLoader's:
    how long `next()` may wait in all. A batch that crashes or hangs three workers in a row raises
    `WorkerError` naming its samples, and the loop can go on. A sample that raises (or a file that
    cannot be read) raises `SampleError`, which keeps the original type as DataLoader does:
    `except KeyError` or `except FileNotFoundError` still catches it.
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
        transform: Sequence[Transform] | None = None,
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
    ) -> None:
        del pin_memory_device, in_order  # batches are always delivered in order
        is_folder = isinstance(dataset, (str, os.PathLike))
        if isinstance(dataset, torch.utils.data.IterableDataset):
            raise ConfigError("FastLoader takes map-style datasets; IterableDataset is not supported")
        if num_workers is None:
            num_workers = _default_workers() if is_folder else 0
        if num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
        if timeout < 0:
            raise ConfigError(f"timeout must be >= 0, got {timeout}")
        if hang_timeout is not None and not 0 <= hang_timeout < float("inf"):
            raise ConfigError(f"hang_timeout must be a number of seconds >= 0 (0: off), got {hang_timeout}")
        if prefetch_factor is not None and num_workers == 0:
            raise ConfigError("prefetch_factor needs num_workers > 0, as in DataLoader")
        if persistent_workers and num_workers == 0:
            raise ConfigError("persistent_workers=True needs num_workers > 0, as in DataLoader")
        _check_mp_context(multiprocessing_context, num_workers)
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ConfigError(
                    "batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last"
                )
        elif batch_size is None:
            raise ConfigError("batch_size=None (no batching) is not supported: give a batch size")
        elif batch_size <= 0:
            raise ConfigError(f"batch_size must be positive, got {batch_size}")
        if sampler is not None and shuffle:
            raise ConfigError("sampler is mutually exclusive with shuffle")
        if is_folder and (sampler is not None or batch_sampler is not None or collate_fn is not None):
            raise ConfigError("sampler, batch_sampler and collate_fn apply to Dataset inputs, not folders")
        if not is_folder and (daemon is not None or rank is not None or world_size is not None):
            raise ConfigError("daemon, rank and world_size apply to image folders")
        if not is_folder and (transform is not None or normalize is not None):
            raise ConfigError(
                "transform and normalize apply to image folders; a Dataset transforms its own samples"
            )

        self.seed = _seed_from(generator) if seed is None else int(seed)
        self.batch_size = batch_size if batch_sampler is None else None
        self.drop_last = drop_last
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers or is_folder
        self.dataset = dataset
        self.device = (
            torch.device(device)
            if device is not None
            else torch.device("cuda" if is_folder and torch.cuda.is_available() else "cpu")
        )
        _check_device(self.device)
        self._plan: ShuffledPlan | SamplerPlan
        images: ImageOutput | None = None
        self._job: FolderJob | DatasetJob | None = None
        self._daemon_address = resolve_address(daemon) if daemon is not None else None
        self._session: DaemonSession | None = None
        # Unless told (prefetch, or DataLoader's prefetch_factor), the ring is sized from the
        # batch's bytes once they are known (`default_prefetch`); a daemon sizes its sessions.
        auto_prefetch = prefetch is None and prefetch_factor is None
        if prefetch is None:
            prefetch = (prefetch_factor or 2) * max(1, num_workers)
        if not 1 <= prefetch <= MAX_PREFETCH:
            raise ConfigError(f"prefetch must be 1..{MAX_PREFETCH}, got {prefetch}")
        if is_folder:
            assert batch_size is not None
            rank, world_size = process_position(rank, world_size)
            if self._daemon_address is not None:
                plan = compile_transforms(transform)
                self._hello = {
                    "dataset": os.path.abspath(os.fspath(dataset)),  # type: ignore[arg-type]
                    "transforms": to_config(plan.transforms), "backend": backend,
                    "batch_size": batch_size, "prefetch": 0 if auto_prefetch else prefetch,  # 0: yours
                    "pid": os.getpid(), "rank": rank, "world_size": world_size,
                }
                self._session = self._connect()
                num_samples, self.classes = self._session.welcome.num_samples, self._session.welcome.classes
                prefetch = len(self._session.welcome.slots) - EXTRA_SLOTS  # what the daemon gave
            else:
                index = ImageFolderIndex.scan(dataset)  # type: ignore[arg-type]
                num_samples, self.classes = len(index), index.classes
                self._job = FolderJob(index, compile_transforms(transform), backend, self.seed, batch_size)
                assert self._job.layout is not None
                if auto_prefetch:
                    prefetch = default_prefetch(num_workers, self._job.layout.slot_bytes)
                preflight(self._job.layout.slot_bytes * (prefetch + EXTRA_SLOTS))  # fail before any fork
            self._plan = ShuffledPlan(
                num_samples, batch_size, shuffle=bool(shuffle), drop_last=drop_last, seed=self.seed,
                rank=rank, world_size=world_size,
            )
            if normalize is not None:
                mean, std = _normalize_values(normalize)
                if not dtype.is_floating_point:
                    raise ConfigError(f"normalize needs a floating dtype, got {dtype}")
                images = ImageOutput(mean, std, dtype, memory_format)
            else:
                images = ImageOutput(memory_format=memory_format)
        else:
            self._plan = self._dataset_plan(dataset, batch_size, shuffle, sampler, batch_sampler, drop_last)
            self._job = DatasetJob(dataset, collate_fn, self.seed, 0)
        slot_batch = (
            batch_size if batch_size is not None and batch_sampler is None else _max_batch(batch_sampler)
        )
        if isinstance(self._job, DatasetJob):
            self._job.batch_size = slot_batch
        self._config = PipelineConfig(
            num_workers=num_workers,
            batch_size=slot_batch,
            prefetch=prefetch,
            timeout_s=float(timeout),
            mp_context=multiprocessing_context,
            worker_init_fn=worker_init_fn,
            device=self.device,
            pin_memory=pin_memory and self.device.type == "cpu" and torch.cuda.is_available(),
            images=images,
            dataset_label=os.path.abspath(os.fspath(dataset)) if is_folder else type(dataset).__name__,  # type: ignore[arg-type]
            hang_timeout_s=hang_timeout,
            auto_prefetch=auto_prefetch and not is_folder,
        )
        self._summary = summary
        self._last_stats: LoaderStats | None = None
        self._pipeline: Pipeline | None = None
        self._iterator: EpochIterator | None = None
        self._epoch = 0  # the epoch the next iteration runs
        self._position = (0, 0)  # (epoch, batches yielded in it), for state_dict
        self._resume_at = 0
        self._undrawn: tuple[int, int] | None = None  # (epoch, resume_at) before an iteration's first batch
        self._closed = False

    def _dataset_plan(
        self,
        dataset: Any,
        batch_size: int | None,
        shuffle: bool | None,
        sampler: Any,
        batch_sampler: Any,
        drop_last: bool,
    ) -> ShuffledPlan | SamplerPlan:
        if batch_sampler is not None:
            return SamplerPlan(batch_sampler)
        assert batch_size is not None
        if sampler is not None:
            return SamplerPlan(BatchSampler(sampler, batch_size, drop_last))
        return ShuffledPlan(
            len(dataset), batch_size, shuffle=bool(shuffle), drop_last=drop_last, seed=self.seed
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
        epoch = int(epoch)
        if epoch != self._epoch:
            self._resume_at = 0
        self._epoch = epoch
        if isinstance(self._plan, SamplerPlan):
            self._plan.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self._closed:
            raise ConfigError("this FastLoader is closed")
        if self._iterator is not None:
            self._iterator.supersede()  # its next() now says why it ended, never a silent stop
        if self._pipeline is not None and self._pipeline.closed:
            self._pipeline = None  # its ring could not be made: it closed itself; start afresh
        if self._pipeline is not None and not self.persistent_workers:
            # DataLoader without persistent_workers starts fresh workers every epoch, so changes
            # made to the dataset in the trainer's process reach the next epoch's workers.
            self._pipeline.close()
            self._pipeline = None
        if self._pipeline is None:
            session = None
            if self._daemon_address is not None:
                session, self._session = self._session or self._connect(), None
            self._pipeline = Pipeline(self._job, self._config, session=session)
        epoch, start = self._next_position()
        self._undrawn = (self._epoch, self._resume_at)  # an iteration uses up its epoch when drawn from
        self._position = (epoch, start)
        self._iterator = EpochIterator(
            self._pipeline, self._plan.iter_batches(epoch, start), epoch, start, self._on_yield
        )
        return self._iterator

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

    def _on_yield(self, epoch: int, yielded: int) -> None:
        self._position = (epoch, yielded)
        if self._undrawn is not None:
            # NOTE [drawn epochs]: the iteration's first batch puts its epoch under way, so the next
            # iteration runs the next one (unless set_epoch named one meanwhile). An iterator never
            # drawn from, such as the iter() Lightning makes to check that a loader is iterable,
            # uses up no epoch and no resume position.
            if (self._epoch, self._resume_at) == self._undrawn:
                self._epoch, self._resume_at = epoch + 1, 0
            self._undrawn = None

    def state_dict(self) -> dict[str, Any]:
        """The position to resume from: after the last batch this loader yielded."""
        epoch, yielded = self._position
        return {"version": _STATE_VERSION, "seed": self.seed, "epoch": epoch, "batches_yielded": yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration resume exactly after the batch `state` was taken at.

        A user's sampler with `set_epoch` is set to the epoch resumed: its order is replayed up to
        the position, so it must be that epoch's."""
        if state.get("version") != _STATE_VERSION:
            raise ConfigError(f"unknown FastLoader state version {state.get('version')!r}")
        seed = int(state["seed"])
        if seed != self.seed:
            # Workers (or a daemon session) were started with the old seed: start afresh.
            self._close_pipeline()
            self.seed = seed
            if isinstance(self._plan, ShuffledPlan):
                self._plan.seed = seed
            if self._job is not None:
                self._job.seed = seed
        epoch, yielded = int(state["epoch"]), int(state["batches_yielded"])
        if yielded >= len(self._plan):
            epoch, yielded = epoch + 1, 0
        self._epoch, self._resume_at = epoch, yielded
        self._position = (epoch, yielded)
        if isinstance(self._plan, SamplerPlan):
            self._plan.set_epoch(epoch)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (empty before the first iteration)."""
        return self._pipeline.worker_pids if self._pipeline is not None else []

    def close(self) -> None:
        """Stop the workers and free shared memory. Batches already delivered stay valid."""
        self._closed = True
        self._close_pipeline()

    def stats(self) -> LoaderStats | None:
        """This loader's counters and stage timings (what `fastload iostat` shows), or None
        before the first iteration. Cumulative since the workers started."""
        if self._pipeline is not None and not self._pipeline.closed:
            return self._pipeline.stats.snapshot()
        return self._last_stats

    def _close_pipeline(self) -> None:
        if self._iterator is not None:
            self._iterator.stop()
        if self._pipeline is not None and not self._pipeline.closed:
            self._last_stats = self._pipeline.stats.snapshot()
            if self._summary:
                sys.stderr.write(format_summary(self._last_stats))
            self._pipeline.close()
            self._pipeline = None
        if self._session is not None:
            self._session.close()
            self._session = None

    def _connect(self) -> DaemonSession:
        assert self._daemon_address is not None
        return DaemonSession(self._daemon_address, {**self._hello, "seed": self.seed})

    def __enter__(self) -> FastLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _max_batch(batch_sampler: Any) -> int:
    """Slots must hold the largest batch a batch_sampler yields: its batch_size, or one pass."""
    declared = getattr(batch_sampler, "batch_size", None)
    if isinstance(declared, int) and declared > 0:
        return declared
    sizes = [len(b) for b in batch_sampler]
    if not sizes:
        raise ConfigError("the batch_sampler yields no batches")
    return max(sizes)
