"""`LoaderSpec`: what a FastLoader was asked for, checked once (as DataLoader checks its arguments)
and frozen. Everything below the loader reads it (the pipeline, the jobs, the plan) instead of
keeping copies of its own, and the daemon's hello is derived from it; a new seed
(`load_state_dict`) is a new spec. Its fields and what follows from them are here; `build`
checks the arguments and resolves their defaults into one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any

import torch

from fastload._augment.registry import check_kernels
from fastload._bad_samples import DEFAULT_MAX_SKIPPED
from fastload._errors import ConfigError
from fastload._loading.slots.delivery import ImageOutput
from fastload.samplers import RepeatedAugmentation, Sampler
from fastload.sources import ImageFolder, Source
from fastload.transforms import Transform, TransformPlan, compile_transforms, to_config


@dataclass(frozen=True)
class LoaderSpec:
    """One loader's validated configuration (see `FastLoader` for what each argument means)."""

    # What to load: a source of encoded images (a folder, a file list, ...: its transforms and
    # backend) or a Dataset.
    source: Source | None
    dataset: Any  # the Dataset; None for a source
    transform: tuple[Transform, ...] | None  # as given; compiled by `transforms`
    backend: str
    collate_fn: Callable[[list[Any]], Any] | None
    # Which samples form which batch.
    batch_size: int | None  # as given (None with a batch_sampler)
    slot_batch_size: int  # the largest batch: what a ring slot holds
    shuffle: bool
    shuffle_block: int | None  # a block shuffle's run length (NOTE [block shuffle] in `plan`)
    shuffle_window: int  # batches a block shuffle mixes together
    drop_last: bool
    sampler: Iterable[int] | Sampler | None  # a torch sampler, or a plan's description (`samplers`)
    batch_sampler: Iterable[Sequence[int]] | None
    seed: int
    rank: int
    world_size: int
    # Who loads them.
    num_workers: int  # as asked, or where a tuner starts (`tune_workers`)
    prefetch: int | None  # in flight as asked; None: `ring_plan` derives it (NOTE [what "prefetch" names])
    persistent_workers: bool
    timeout_s: float
    hang_timeout_s: float | None
    mp_context: str | BaseContext | None
    worker_init_fn: Callable[[int], Any] | None
    daemon: str | None  # a daemon's address (sources of encoded images only)
    # Where they go.
    device: torch.device
    pin_memory: bool
    images: ImageOutput | None  # a source's image output (dtype, normalization, memory format)
    summary: bool
    sample_ids: bool  # each batch ends with its SampleIds
    # A testing aid: FASTLOAD_DALI_IN_TRAINER=1 runs backend="dali" (or "nvjpeg") on the CPU in the
    # trainer's process, as with CUDA (`decodes_in_trainer`), so that path is tested where no GPU is.
    dali_in_trainer: bool = False
    # NOTE [bad samples] in `_bad_samples`: what a sample that cannot be loaded does.
    on_error: str = "raise"
    max_skipped: float | int = DEFAULT_MAX_SKIPPED
    # Where this loader serves Prometheus metrics (`_diagnostics.metrics`): None, not at all.
    metrics: tuple[str, int] | None = None
    # Whether `seed` is the shared default of several ranks given no seed (NOTE [one order for
    # every rank]): `sanity` says so once.
    seed_defaulted: bool = False
    # NOTE [what is tuned] in `settings.build`: whether a tuner (`_loading.tuning`) moves the worker
    # count and the batches in flight while the loader runs; a daemon session's `priority` (its
    # weight in the daemon's shares).
    tune_workers: bool = False
    tune_in_flight: bool = False
    priority: float = 1.0

    @property
    def tuned(self) -> bool:
        """Whether anything of this loader is tuned as it runs."""
        return self.tune_workers or self.tune_in_flight

    @property
    def iterable(self) -> bool:
        """Whether the dataset is an IterableDataset (NOTE [iterable streams] in `iterable`)."""
        return isinstance(self.dataset, torch.utils.data.IterableDataset)

    @functools.cached_property
    def transforms(self) -> TransformPlan | None:
        """The source's transform chain, compiled (ConfigError when it cannot give a fixed size,
        when a transform's kernel is not registered, or when it needs normalized images and has
        none). The loader compiles it right after indexing the source, so a bad path is reported
        first."""
        if self.source is None or self.images is None:  # a Dataset, or an array source (`for_arrays`)
            return None
        plan = compile_transforms(self.transform)
        check_kernels(plan.transforms)  # here, in the trainer's process, not later in a worker
        if plan.views and self.backend in ("dali", "nvjpeg"):
            raise ConfigError(
                f"Views decodes each view on the CPU (backend 'native' or 'pil'); backend={self.backend!r} "
                "decodes one crop per image: use backend='native'"
            )
        needs_floats = [t for v in plan.each_view for t in (*v.tensor, v.batch) if t is not None]
        late = ", ".join(dict.fromkeys(type(t).__name__ for t in needs_floats))  # every view's
        if late and (self.images is None or self.images.mean is None):
            raise ConfigError(
                f"{late} run on normalized float images, as in torchvision's recipes (after ToTensor "
                "and Normalize): pass normalize=(mean, std) (normalize=((0, 0, 0), (1, 1, 1)) for "
                "pixels scaled to [0, 1])"
            )
        return plan

    @property
    def pixels_in_workers(self) -> bool:
        """Whether the workers run the pixel stage (NOTE [transform stages]): yes when batches stay
        on the CPU; batches going to a GPU get it there, batched, after the copy."""
        return self.device.type == "cpu"

    @property
    def normalize_in_workers(self) -> bool:
        """Whether the workers normalize their rows into float32 slots and run the tensor stage
        there (NOTE [float slots] in `_loading.jobs`): CPU batches with `normalize`, loaded by this
        loader's own workers. A daemon's sessions keep uint8 slots (the trainer normalizes), and so
        do batches going to a GPU (a quarter of the bytes to copy; the GPU normalizes)."""
        return (
            self.device.type == "cpu"
            and self.images is not None
            and self.images.mean is not None
            and self.daemon is None
            and not self.decodes_in_trainer
        )

    @property
    def decodes_in_trainer(self) -> bool:
        """Whether the source's batches are decoded on the GPU in the trainer's process
        (`dali_executor`): backend="dali" or "nvjpeg" with CUDA, unless a daemon serves them (its
        workers decode on the CPU); with `dali_in_trainer`, on the CPU too (a testing aid)."""
        return (
            self.source is not None
            and self.backend in ("dali", "nvjpeg")
            and self.daemon is None
            and (self.device.type == "cuda" or self.dali_in_trainer)
        )

    @functools.cached_property
    def worker_transforms(self) -> TransformPlan | None:
        """The part of the chain the workers (local, or a daemon's) run."""
        plan = self.transforms
        if plan is None:
            return None
        return plan.for_workers(self.pixels_in_workers, self.normalize_in_workers)

    @property
    def worker_normalize(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """The (mean, std) the workers normalize with, when they do (`normalize_in_workers`)."""
        if not self.normalize_in_workers:
            return None
        assert self.images is not None and self.images.mean is not None and self.images.std is not None
        return self.images.mean, self.images.std

    @property
    def label(self) -> str:
        """What `fastload iostat` calls this loader: the source's path, or the Dataset's class."""
        return self.source.where if self.source is not None else type(self.dataset).__name__

    def for_arrays(self) -> LoaderSpec:
        """This spec for a source of arrays (rows delivered as stored): no image output, and a
        ConfigError for what only encoded images take."""
        if self.transform is not None or (self.images is not None and self.images.mean is not None):
            raise ConfigError(
                f"{self.label} holds arrays, delivered as stored: transform and normalize apply to encoded "
                "images; apply transforms to the batch in your training step, or store encoded images"
            )
        if self.backend != "native":
            raise ConfigError(f"backend={self.backend!r} decodes images; {self.label} holds arrays")
        return dataclasses.replace(self, images=None)

    def with_seed(self, seed: int) -> LoaderSpec:
        """This spec with another base seed (`load_state_dict` of a state saved with it)."""
        return dataclasses.replace(self, seed=seed)

    def hello(self) -> dict[str, Any]:
        """The daemon `hello` for this spec (`daemon_link`); prefetch 0: the daemon sizes the ring."""
        assert self.source is not None and self.transforms is not None and self.batch_size is not None
        return {
            "dataset": self.source.where,
            "transforms": to_config(self.worker_transforms.transforms),  # type: ignore[union-attr]
            "backend": self.backend,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "prefetch": self.prefetch or 0,
            "pid": os.getpid(),
            "rank": self.rank,
            "world_size": self.world_size,
            # A folder is its path alone (what every daemon understands); other sources describe themselves.
            **({} if _plain_folder(self.source) else {"source": self.source.resolved().to_json()}),
            **({"on_error": self.on_error} if self.on_error != "raise" else {}),  # what older daemons know
            **({"repeats": self.sampler.repeats} if isinstance(self.sampler, RepeatedAugmentation) else {}),
            **({"priority": self.priority} if self.priority != 1.0 else {}),  # NOTE [need reports]
        }


def _plain_folder(source: object) -> bool:
    """A folder a hello names by its path alone: one that keeps empty classes describes itself."""
    return isinstance(source, ImageFolder) and not source.allow_empty
