"""Plans of the samplers in `fastload.samplers`: an epoch of draws from (seed, epoch) alone, dealt
to the ranks strided, and the augmentation keys of repeated samples (`RepeatCopies`).

Each plan makes the epoch's whole sequence of draws (every rank's) from (seed, epoch), the same
on every rank, and rank r takes positions r, r + world_size, ... of it, as DistributedSampler
deals. A longer epoch starts with a shorter one's draws (numpy's multinomial and permutation
draw their uniforms in order), so after b batches on every rank the samples delivered are the
first b * batch_size * world_size of the sequence, whatever the batch size and world size: a
position converts as a plain shuffle's does (NOTE [elastic resume] in `settings.resume`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from fastload._errors import ConfigError
from fastload._loading.order.plan import OwnOrder
from fastload.samplers import ClassBalanced, RepeatedAugmentation, Sampler, Weighted, class_balanced_weights

_WEIGHTED_STREAM = 0x3E  # a Weighted epoch's draws
_REPEATED_STREAM = 0x3F  # a RepeatedAugmentation epoch's permutation
DEIT_UNIT = 256  # DeiT's RASampler keeps a multiple of 256 samples an epoch


class DrawnPlan(OwnOrder):
    """An epoch of draws dealt to the ranks strided; subclasses make the draws (`_draws`)."""

    def __init__(
        self, *, batch_size: int, drop_last: bool, seed: int, rank: int, world_size: int,
        keep: np.ndarray | None, description: Sampler,
    ) -> None:
        self.batch_size, self.drop_last, self.seed = batch_size, drop_last, seed
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self.description = description

    def per_rank(self, world_size: int, drop_last: bool) -> int:
        """Each rank's samples an epoch under `world_size` (and `drop_last`)."""
        raise NotImplementedError

    def _draws(self, epoch: int, count: int) -> np.ndarray:
        """The epoch's first `count` draws, as positions among the samples drawn from."""
        raise NotImplementedError

    @property
    def samples_per_rank(self) -> int:
        return self.per_rank(self.world_size, self.drop_last)

    def batches_under(self, batch_size: int, world_size: int, drop_last: bool) -> int:
        """The batches an epoch of this plan has under another batch layout."""
        n = self.per_rank(world_size, drop_last)
        return n // batch_size if drop_last else -(-n // batch_size)

    def __len__(self) -> int:
        return self.batches_under(self.batch_size, self.world_size, self.drop_last)

    def layout_bound(self) -> str | None:
        """None: a position converts to another batch size or world size (see the module's docstring)."""
        return None

    def order(self, epoch: int) -> np.ndarray:
        """This rank's samples for `epoch`, in order."""
        per = self.samples_per_rank
        positions = self._draws(epoch, per * self.world_size)[self.rank :: self.world_size]
        return positions if self.keep is None else self.keep[positions]

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        order = self.order(epoch)
        for b in range(start, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size]


def _generator(seed: int, epoch: int, stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, stream])))


class WeightedPlan(DrawnPlan):
    """`samplers.Weighted` (and `ClassBalanced`, with its weights): `total` draws an epoch in all,
    ceil(total / world_size) a rank (floor with drop_last); draws past `total` (padding, as
    DistributedSampler pads) repeat the sequence's start."""

    def __init__(self, weights: np.ndarray, total: int, replacement: bool, **common: object) -> None:
        super().__init__(**common)  # type: ignore[arg-type]
        self.total, self.replacement = total, replacement
        cdf = np.cumsum(weights / weights.sum())
        self._cdf = cdf / cdf[-1]  # as numpy's choice makes it
        self._log_weights = np.log(weights, where=weights > 0, out=np.full(len(weights), -np.inf))

    def per_rank(self, world_size: int, drop_last: bool) -> int:
        return self.total // world_size if drop_last else -(-self.total // world_size)

    def _draws(self, epoch: int, count: int) -> np.ndarray:
        rng = _generator(self.seed, epoch, _WEIGHTED_STREAM)
        n = min(count, self.total)
        if self.replacement:
            # numpy's choice(p=...) draws, the same numbers: one uniform per draw, in order, through
            # the CDF; but looked up in sorted order (3x faster on ImageNet's 1.28M: no random
            # binary searches) and put back in place.
            u = rng.random(n)
            at = np.argsort(u)
            drawn = np.empty(n, np.int64)
            drawn[at] = np.searchsorted(self._cdf, u[at], side="right")
            np.minimum(drawn, len(self._cdf) - 1, out=drawn)
        else:
            # Gumbel top-k: the n largest of log(w) + Gumbel noise, largest first, are distributed
            # as n successive draws without replacement (torch's multinomial without replacement).
            keys = self._log_weights + rng.gumbel(size=len(self._log_weights))
            drawn = np.argsort(-keys, kind="stable")[:n].astype(np.int64)
        return np.resize(drawn, count) if count > n else drawn


class RepeatedPlan(DrawnPlan):
    """`samplers.RepeatedAugmentation`: DeiT's RASampler from (seed, epoch); `total // world_size`
    samples a rank, whatever drop_last."""

    def __init__(self, available: int, repeats: int, total: int, **common: object) -> None:
        super().__init__(**common)  # type: ignore[arg-type]
        self.available, self.repeats, self.total = available, repeats, total

    def per_rank(self, world_size: int, drop_last: bool) -> int:
        return self.total // world_size

    def _draws(self, epoch: int, count: int) -> np.ndarray:
        per = -(-count // self.repeats)  # the permutation's samples the count reaches
        perm = _generator(self.seed, epoch, _REPEATED_STREAM).permutation(self.available)[:per]
        return np.repeat(perm.astype(np.int64), self.repeats)[:count]

    def copies(self, num_samples: int) -> RepeatCopies:
        """The augmentation keys of this plan's repeats (NOTE [augmentation of repeats])."""
        return RepeatCopies(self.repeats, self.rank, self.world_size, self.batch_size, num_samples)


# NOTE [augmentation of repeats]: a sample's augmentation is keyed by (seed, epoch, index)
# (`_sample_random`), so the `repeats` copies of one index in one epoch would all get the same
# crop, flip and colour, on one rank or on several, which defeats repeated augmentation. The
# smallest fix that keeps every other plan's batches bit for bit: under a RepeatedPlan the key of
# a row is `index + copy * num_samples` instead of `index`, where `copy` is the row's place among
# its sample's repeats, `p % repeats` for global position p = rank + world_size * m of the
# epoch's sequence (m: the row's position in its rank's order, batch_index * batch_size + row).
# Copy 0 keeps the sample's plain key; keys of different copies never meet a real index. The key
# is computed where the draws are made, from what every task already carries (its batch index and
# first row): the workers' geometry, pixel and tensor stages (`ImageJob.copies`), and the trainer's
# stages (`Pipeline.deliver`). Nothing new crosses the task wire; a daemon learns `repeats` from
# the hello (rank, world size and batch size it has already) and hands its job the same keys.
# A GPU decoder in the trainer (backend "dali"/"nvjpeg" on CUDA) keys by index: refused there.
@dataclass(frozen=True)
class RepeatCopies:
    """The augmentation keys of a RepeatedPlan's rows (NOTE [augmentation of repeats])."""

    repeats: int
    rank: int
    world_size: int
    batch_size: int
    num_samples: int

    def keys(self, batch_index: int, row: int, indices: np.ndarray) -> np.ndarray:
        """The keys of `indices`, the rows from `row` on of batch `batch_index` of this rank."""
        m = batch_index * self.batch_size + row + np.arange(len(indices), dtype=np.int64)
        copy = (self.rank + self.world_size * m) % self.repeats
        keys: np.ndarray = np.asarray(indices, dtype=np.int64) + copy * self.num_samples
        return keys


def drawn_plan(
    sampler: Sampler, *, num_samples: int, targets: np.ndarray | None, batch_size: int, drop_last: bool,
    seed: int, rank: int, world_size: int, keep: np.ndarray | None,
) -> WeightedPlan | RepeatedPlan:
    """The plan of `sampler` over a source of `num_samples` samples (`keep`: those an `exclude=`
    leaves; `targets`: the source's, for ClassBalanced; None where the loader holds none)."""
    available = num_samples if keep is None else len(keep)
    common: dict[str, object] = dict(
        batch_size=batch_size, drop_last=drop_last, seed=seed, rank=rank, world_size=world_size,
        keep=keep, description=sampler,
    )
    if available < 1:
        raise ConfigError(f"{type(sampler).__name__} needs at least one sample to draw from; none are left")
    if isinstance(sampler, RepeatedAugmentation):
        total = sampler.num_samples
        if total is None:
            total = available // DEIT_UNIT * DEIT_UNIT or available
        if total > available * sampler.repeats:
            raise ConfigError(
                f"RepeatedAugmentation(num_samples={total}) is more than the {available} samples x "
                f"{sampler.repeats} repeats an epoch holds: use num_samples <= {available * sampler.repeats}"
            )
        if total < world_size:
            raise ConfigError(
                f"RepeatedAugmentation's {total} samples an epoch leave none for each of {world_size} ranks: "
                f"use num_samples >= {world_size}"
            )
        return RepeatedPlan(available, sampler.repeats, total, **common)
    if isinstance(sampler, Weighted):
        if len(sampler.weights) != num_samples:
            raise ConfigError(
                f"Weighted has {len(sampler.weights)} weights for a source of {num_samples} samples: "
                "give one weight per sample, in the source's order"
            )
        weights = sampler.weights if keep is None else sampler.weights[keep]
    elif isinstance(sampler, ClassBalanced):
        if targets is None:
            raise ConfigError(
                "ClassBalanced needs the source's targets, which a daemon keeps: pass "
                "samplers.Weighted(samplers.class_balanced_weights(targets)) with the targets read "
                "where the source is (sources.X(...).open().labels, or a local loader's .targets)"
            )
        weights = class_balanced_weights(targets if keep is None else targets[keep])
    else:
        raise ConfigError(f"unknown sampler description {type(sampler).__name__}")
    total = sampler.num_samples if sampler.num_samples is not None else available
    positive = int((weights > 0).sum())
    if positive == 0:
        raise ConfigError(f"{type(sampler).__name__}: every sample left to draw from has weight 0")
    if not sampler.replacement and total > positive:
        raise ConfigError(
            f"{type(sampler).__name__}(replacement=False) draws each sample at most once an epoch, but "
            f"num_samples={total} is more than the {positive} samples of weight > 0: use "
            f"num_samples <= {positive}, or replacement=True"
        )
    return WeightedPlan(weights, total, sampler.replacement, **common)
