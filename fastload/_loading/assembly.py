"""The parts a `FastLoader` is assembled from, built from its checked spec (`LoaderSpec`): the
source opened (its index, or a daemon session's hello), the job its workers run (with the ring
/dev/shm must hold checked before any worker is forked), the samples an `exclude=` list keeps,
the epoch plan, and each run's `Pipeline`. The facade (`loader`) holds one `Assembly` beside its
iterations (`running.iterations`) and its position (`settings.position`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastload._bad_samples import SkipAccount
from fastload._errors import ConfigError
from fastload._exclusion import ExcludeArg, kept_indices
from fastload._loading.jobs.array_job import ArrayJob
from fastload._loading.jobs.contract import Job
from fastload._loading.jobs.dataset_job import DatasetJob
from fastload._loading.jobs.image_job import ImageJob
from fastload._loading.jobs.iterable import IterableJob, IterablePlan
from fastload._loading.link.daemon_client import DaemonSession
from fastload._loading.order.mixture import MixturePlan
from fastload._loading.order.plan import BatchSampler, SamplerPlan, ShuffledPlan
from fastload._loading.order.sampling import RepeatCopies, RepeatedPlan, WeightedPlan, drawn_plan
from fastload._loading.running.engine import Engine
from fastload._loading.running.pipeline import Pipeline
from fastload._loading.settings.position import Plan, recorded_settings, source_fingerprint
from fastload._loading.settings.sanity import check_settings_sense
from fastload._loading.settings.spec import LoaderSpec
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring_plan import plan_ring
from fastload._loading.tuning.tuner import Tuner
from fastload.samplers import Sampler
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.mixed import MixIndex
from fastload.sources._indexes.sample_index import SampleIndex, declared_fields


class Assembly:
    """A loader's source, job, plan and pipelines, from its spec: opened at construction (a bad
    path, a chain the source cannot take, a ring /dev/shm cannot hold fail here), rebuilt under
    another seed (`reseed`)."""

    def __init__(self, spec: LoaderSpec, exclude: ExcludeArg) -> None:
        self._spec = spec
        self.classes: tuple[str, ...] = ()
        self._job: Job | None = None
        self._index: SampleIndex | ArrayIndex | None = None
        self._session: DaemonSession | None = None
        self._num_samples = 0
        self._keep: np.ndarray | None = None  # the samples an `exclude=` list leaves in (None: all)
        self._copies: RepeatCopies | None = None  # a RepeatedPlan's augmentation keys
        self._check_exclude(exclude)  # before a daemon session or an index is opened
        self._open_source()
        try:
            self._exclude(exclude)
            check_settings_sense(self._spec, self.classes, self._index, self._num_samples)
            sized = hasattr(self._spec.dataset, "__len__")
            total = self._num_samples or (len(self._spec.dataset) if sized else 0)
            total = total if self._keep is None else len(self._keep)
            self.skips = SkipAccount(spec.max_skipped, total) if spec.on_error == "skip" else None
            self._plan = self._make_plan()
        except BaseException:
            self.close_session()  # the one a daemon opened above, not left to the garbage collector
            raise
        self._fingerprint: dict[str, Any] | None = None  # the source's, for state_dict (computed once)
        # Kept across pipelines: each starts at the setting learned so far (NOTE [what is tuned]).
        self._tuner = Tuner(spec) if spec.tuned else None

    @property
    def spec(self) -> LoaderSpec:
        """The checked spec (for an array source, `for_arrays`'; under a resumed seed, `with_seed`'s)."""
        return self._spec

    @property
    def job(self) -> Job | None:
        """What the workers run (None attached to a daemon: its workers hold the job)."""
        return self._job

    @property
    def index(self) -> SampleIndex | ArrayIndex | None:
        """The source's opened index (None with a daemon or a Dataset)."""
        return self._index

    @property
    def num_samples(self) -> int:
        """The samples the source holds (0 for a Dataset given a sampler, or an IterableDataset)."""
        return self._num_samples

    @property
    def plan(self) -> Plan:
        """The epoch plan: which samples form which batch."""
        return self._plan

    def reseed(self, seed: int) -> None:
        """Rebuild under another base seed (`load_state_dict` of a state saved with it): the spec, a
        job of the new seed (the source's index is kept; a daemon session is opened anew by the
        next pipeline) and the plan. The caller has closed the pipeline started with the old one."""
        self.close_session()  # its hello named the old seed
        self._spec = self._spec.with_seed(seed)
        if self._spec.daemon is None:
            self._open_source()  # a job of the new seed (the source's index is kept)
        self._plan = self._make_plan()

    def pipeline(self) -> Pipeline:
        """A new pipeline running this loader's job: its workers, or a daemon's session (the one
        opened at construction, once)."""
        session = None
        if self._spec.daemon is not None:
            session, self._session = self._session or self._connect(), None
        name_of = self._index.name if self._index is not None else None
        source_of = self._index.source_of if isinstance(self._index, MixIndex) else None
        spec = self._tuner.next_spec(self._spec) if self._tuner is not None else self._spec
        pipeline = Pipeline(
            self._job, spec, session=session, name_of=name_of, source_of=source_of, skips=self.skips,
            copies=self._copies,
        )
        if isinstance(pipeline.executor, Engine):
            pipeline.tuner = self._tuner
        return pipeline

    def settings(self) -> dict[str, Any]:
        """What a state's position depends on besides the seed, batch size, rank and world size
        (`position.recorded_settings`), with the source's fingerprint computed once."""
        if self._fingerprint is None:
            self._fingerprint = source_fingerprint(self._spec, self._index, self._num_samples, self.classes)
            if isinstance(self._plan, MixturePlan):  # its shares order the epoch too
                self._fingerprint["mixture"] = self._plan.recipe()
        return recorded_settings(self._spec, self._fingerprint, self._keep)

    def close_session(self) -> None:
        """Close the daemon session opened at construction and never handed to a pipeline."""
        if self._session is not None:
            self._session.close()
            self._session = None

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
            try:
                _check_mixable(spec, self._session.welcome.layout)
            except ConfigError:
                self.close_session()
                raise
            return
        if self._index is None:
            self._index = spec.source.open()
            self.classes, self._num_samples = self._index.classes, len(self._index)
        if isinstance(self._index, ArrayIndex):  # rows as stored: no decoding, no transforms
            self._spec = spec = spec.for_arrays()
            self._job = ArrayJob(self._index, spec.seed, spec.slot_batch_size)
            assert self._job.layout is not None
            plan_ring(self._job.layout.slot_bytes, spec.num_workers, spec.prefetch).preflight()
            return
        assert spec.transforms is not None and spec.worker_transforms is not None
        if spec.transforms.batch is not None and self._index.labels.ndim != 1:
            raise ConfigError(
                f"{type(spec.transforms.batch).__name__} mixes class-index labels; this source's targets "
                "are multi-hot rows (multi_label): mix them in your training step instead"
            )
        _check_fields(self._index, spec)
        # backend="nvjpeg" decodes only in this process (`decodes_in_trainer`): its job just lays out batches.
        backend = "native" if spec.backend == "nvjpeg" else spec.backend
        job = ImageJob(
            self._index, spec.worker_transforms, backend, spec.seed, spec.slot_batch_size,
            normalize=spec.worker_normalize, on_error=spec.on_error, keep=self._keep,
        )
        assert job.layout is not None
        _check_mixable(spec, job.layout)
        if not spec.decodes_in_trainer:  # the in-process DALI executor needs no ring
            plan_ring(job.layout.slot_bytes, spec.num_workers, spec.prefetch).preflight()  # before any fork
        self._job = job

    def _check_exclude(self, exclude: ExcludeArg) -> None:
        spec = self._spec
        own_order = (
            (spec.sampler is None or isinstance(spec.sampler, Sampler)) and spec.batch_sampler is None
            and not spec.iterable
        )
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

    def _make_plan(self) -> ShuffledPlan | WeightedPlan | RepeatedPlan | SamplerPlan | IterablePlan:
        spec = self._spec
        if spec.iterable:
            assert spec.batch_size is not None
            return IterablePlan(spec.dataset, spec.batch_size, spec.drop_last, max(1, spec.num_workers))
        if spec.batch_sampler is not None:
            return SamplerPlan(spec.batch_sampler)
        assert spec.batch_size is not None
        if isinstance(self._index, MixIndex):
            return self._mixture_plan(self._index)
        if isinstance(spec.sampler, Sampler):
            return self._drawn_plan(spec.sampler, spec.batch_size)
        if spec.sampler is not None:
            return SamplerPlan(BatchSampler(spec.sampler, spec.batch_size, spec.drop_last))
        return ShuffledPlan(
            self._num_samples, spec.batch_size, shuffle=spec.shuffle, drop_last=spec.drop_last,
            seed=spec.seed, rank=spec.rank, world_size=spec.world_size,
            block=spec.shuffle_block, window=spec.shuffle_window, keep=self._keep,
        )

    def _drawn_plan(self, sampler: Sampler, batch_size: int) -> WeightedPlan | RepeatedPlan:
        """The plan of a sampler of `fastload.samplers`; under repeats, their augmentation keys
        handed to the job and to the trainer's stages (NOTE [augmentation of repeats])."""
        spec = self._spec
        targets = self._index.labels if self._index is not None else None
        plan = drawn_plan(
            sampler, num_samples=self._num_samples, targets=targets, batch_size=batch_size,
            drop_last=spec.drop_last, seed=spec.seed, rank=spec.rank, world_size=spec.world_size,
            keep=self._keep,
        )
        if isinstance(plan, RepeatedPlan):
            if spec.decodes_in_trainer:
                raise ConfigError(
                    "RepeatedAugmentation gives each repeat of a sample its own augmentation, which "
                    f"backend={spec.backend!r} on a GPU cannot yet (it keys a sample's draws by its "
                    "index alone, NOTE [augmentation of repeats]): use backend='native' or 'pil'"
                )
            self._copies = plan.copies(self._num_samples)
            if isinstance(self._job, ImageJob):
                self._job.copies = self._copies
        return plan

    def _mixture_plan(self, index: MixIndex) -> MixturePlan:
        """A Mix's own order (NOTE [a mixture's epoch]); what would replace or reorder it is refused."""
        spec = self._spec
        assert spec.batch_size is not None
        other = [
            name
            for name, given in (
                ("shuffle_block", spec.shuffle_block), ("exclude", self._keep), ("sampler", spec.sampler)
            )
            if given is not None
        ]
        if other:
            raise ConfigError(
                f"a Mix orders its own epoch from its weights and epoch_size, so {', '.join(other)} "
                "cannot apply to it: leave it out (leave excluded samples out of the Mix's sources)"
            )
        return MixturePlan(
            index.sizes, index.counts, spec.batch_size, shuffle=spec.shuffle, drop_last=spec.drop_last,
            seed=spec.seed, rank=spec.rank, world_size=spec.world_size,
        )

    def _connect(self) -> DaemonSession:
        assert self._spec.daemon is not None
        return DaemonSession(self._spec.daemon, self._spec.hello())


def _check_fields(index: SampleIndex, spec: LoaderSpec) -> None:
    """A source of declared fields (`TarShards(fields=...)`) decodes in its workers (native or
    PIL); ConfigError otherwise."""
    if declared_fields(index) is not None and (spec.decodes_in_trainer or spec.backend == "dali"):
        raise ConfigError(
            f"backend={spec.backend!r} does not load declared fields yet: use backend='native' or 'pil' "
            "with fields="
        )


def _check_mixable(spec: LoaderSpec, layout: BatchLayout) -> None:
    """MixUp/CutMix mix the batch's labels: ConfigError when its layout has none (declared fields
    without a label field), whether the job is built here or by a daemon (its welcome's layout)."""
    assert spec.transforms is not None
    if spec.transforms.batch is not None and layout.label_leaf() is None:
        raise ConfigError(
            f"{type(spec.transforms.batch).__name__} mixes labels, and fields= declares none: add a label "
            'field ({"label": "cls"}) or mix in your training step'
        )
