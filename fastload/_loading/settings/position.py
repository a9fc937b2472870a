"""A loader's position, and the state that `FastLoader.state_dict` saves of it and
`load_state_dict` restores it from.

`Position` keeps which epoch (and first batch) the next iteration runs, and the batch after which
a state resumes (NOTE [drawn epochs]). `recorded_settings` is what a state's position depends
on, `state_of` the state itself, `resume_point` where a saved state resumes under this loader's
layout; the checks and the conversion rules are `resume`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastload._exclusion import digest as exclusion_digest
from fastload._loading.jobs.iterable import IterablePlan
from fastload._loading.order.plan import OwnOrder, SamplerPlan
from fastload._loading.settings.resume import STATE_VERSION, check_state, convert, fingerprint, plain
from fastload._loading.settings.spec import LoaderSpec
from fastload.samplers import Sampler
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.sample_index import SampleIndex
from fastload.transforms import to_config

Plan = OwnOrder | SamplerPlan | IterablePlan


class Position:
    """Where a loader stands: the epoch its next iteration runs (`epoch`) and that iteration's first
    batch (`resume_at`, after `load_state_dict`), and the (epoch, batches yielded in it) a
    `state_dict` saves (`current`)."""

    def __init__(self) -> None:
        self.epoch = 0  # the epoch the next iteration runs
        self.current = (0, 0)  # (epoch, batches yielded in it), for state_dict
        self.resume_at = 0
        self._undrawn: tuple[int, int] | None = None  # (epoch, resume_at) before an iteration's first batch

    def set_epoch(self, epoch: int, plan: Plan) -> None:
        """Make the next iteration run `epoch` (a checked one); resuming within it only if it is the
        epoch being resumed. A user's sampler that has `set_epoch` gets it (`SamplerPlan`)."""
        if epoch != self.epoch:
            self.resume_at = 0
        self.epoch = epoch
        if isinstance(plan, SamplerPlan):
            plan.set_epoch(epoch)

    def next_iteration(self, plan: Plan) -> tuple[int, int]:
        """(epoch, first batch) of the next iteration. A user's sampler that holds an epoch names
        it: one set on the sampler itself (`sampler.set_epoch(5)`) wins over the loader's count,
        and a resume position applies to its own epoch only."""
        epoch, start = self.epoch, self.resume_at
        if isinstance(plan, SamplerPlan):
            sampler_epoch = plan.sampler_epoch()
            if sampler_epoch is not None and sampler_epoch != epoch:
                return sampler_epoch, 0
        return epoch, start

    def started(self, epoch: int, start: int) -> None:
        """An iteration of (`epoch`, from batch `start`) was made; it uses up its epoch when drawn from."""
        self._undrawn = (self.epoch, self.resume_at)
        self.current = (epoch, start)

    def yielded(self, epoch: int, yielded: int) -> None:
        """The iteration of `epoch` has yielded `yielded` batches."""
        self.current = (epoch, yielded)
        if self._undrawn is not None:
            # NOTE [drawn epochs]: the iteration's first batch puts its epoch under way, so the next
            # iteration runs the next one (unless set_epoch named one meanwhile). An iterator never
            # drawn from, such as the iter() Lightning makes to check that a loader is iterable,
            # uses up no epoch and no resume position.
            if (self.epoch, self.resume_at) == self._undrawn:
                self.epoch, self.resume_at = epoch + 1, 0
            self._undrawn = None

    def resume(self, state: dict[str, Any], yielded: int, epoch_over: bool, plan: Plan) -> None:
        """Make the next iteration resume after batch `yielded` (`resume_point`) of the epoch
        of a checked `state`; the next epoch, from its start, where that one was over."""
        epoch = state["epoch"]
        if isinstance(plan, IterablePlan):
            plan.resume_from(epoch, state["stream_batches"])
        elif epoch_over:
            epoch, yielded = epoch + 1, 0  # the saved epoch was over: the next starts afresh in any layout
        else:
            batches = epoch_batches(plan)
            if batches is not None and yielded >= batches:
                epoch, yielded = epoch + 1, 0
        self.epoch, self.resume_at = epoch, yielded
        self.current = (epoch, yielded)
        if isinstance(plan, SamplerPlan):
            plan.set_epoch(epoch)


def source_fingerprint(
    spec: LoaderSpec, index: SampleIndex | ArrayIndex | None, num_samples: int, classes: tuple[str, ...]
) -> dict[str, Any]:
    """The fingerprint a state records of the loader's source (`resume.fingerprint`): its index's,
    none for an IterableDataset, else (a Dataset, or a daemon's source) its length and classes."""
    if index is not None:
        return fingerprint(len(index), index.labels, classes)
    if spec.iterable:
        return {}
    return fingerprint(num_samples, None, classes)


def recorded_settings(spec: LoaderSpec, source: dict[str, Any], keep: np.ndarray | None) -> dict[str, Any]:
    """What a state's position depends on besides the seed, batch size, rank and world size."""
    transforms = None if spec.transform is None else plain(to_config(spec.transform))
    sampler = {"sampler": plain(spec.sampler.to_config())} if isinstance(spec.sampler, Sampler) else {}
    return {
        "shuffle": spec.shuffle, "shuffle_block": spec.shuffle_block,
        "shuffle_window": spec.shuffle_window, "drop_last": spec.drop_last,
        "source": source, "transforms": transforms, "excluded": exclusion_digest(keep), **sampler,
    }


def state_of(
    position: tuple[int, int], plan: Plan, spec: LoaderSpec, settings: dict[str, Any]
) -> dict[str, Any]:
    """The state `FastLoader.state_dict` returns at `position` (epoch, batches yielded in it)."""
    epoch, yielded = position
    state: dict[str, Any] = {
        "version": STATE_VERSION, "seed": spec.seed, "epoch": epoch, "batches_yielded": yielded
    }
    if isinstance(plan, IterablePlan):  # how far each worker's stream got
        state["stream_batches"] = plan.state(epoch)
    else:
        state["epoch_batches"] = epoch_batches(plan)
        state["samples_yielded"] = _samples_yielded(plan, spec.batch_size, yielded)
    state.update(settings)
    state.update(batch_size=spec.batch_size, rank=spec.rank, world_size=spec.world_size)
    return state


def resume_point(
    state: dict[str, Any], plan: Plan, spec: LoaderSpec, settings: dict[str, Any]
) -> tuple[bool, int]:
    """Whether `state`'s epoch was over when it was saved, and the batch its position resumes at
    under this loader's batch size and world size: the state checked first (`resume.check_state`),
    then converted (`resume.convert`); a ConfigError where either refuses, nothing changed yet."""
    epoch_over = check_state(state, plan, settings)
    yielded: int = state["batches_yielded"]
    if not isinstance(plan, IterablePlan) and not epoch_over and state["version"] == STATE_VERSION:
        yielded = convert(
            state, batch_size=spec.batch_size, world_size=spec.world_size,
            convertible=_not_convertible(plan, spec.world_size),
        )
    return epoch_over, yielded


def epoch_batches(plan: Plan) -> int | None:
    """The batches of an epoch of `plan`, or None for a sampler without len()."""
    try:
        return len(plan)
    except TypeError:  # a sampler without len()
        return None


def _samples_yielded(plan: Plan, batch_size: int | None, yielded: int) -> int | None:
    """This rank's samples delivered in the epoch after `yielded` batches (None when a
    user's batch_sampler makes the batches)."""
    if isinstance(plan, OwnOrder):
        return min(yielded * plan.batch_size, plan.samples_per_rank)
    if isinstance(plan, SamplerPlan) and batch_size is not None:
        return yielded * batch_size
    return None


def _not_convertible(plan: Plan, world_size: int) -> str | None:
    """Why this loader's plan cannot take a position from another batch size or world size
    (NOTE [elastic resume] in `resume`), or None."""
    if isinstance(plan, OwnOrder):
        return plan.layout_bound()
    if isinstance(plan, SamplerPlan) and plan.user_sampler is not None:
        return None if world_size == 1 else "a sampler's order is its own"
    return "a batch_sampler's batches are not counted in samples"
