"""The epoch plan of a `sources.Mix`: how many samples of each child, which ones, in what order,
from (seed, epoch) alone.

NOTE [a mixture's epoch]: an epoch holds `counts[k]` samples of child k (the mix's exact shares,
`sources._formats.mix.shares`: the same every epoch, adding up to the epoch size). Child k's
samples are read from its own endless stream: its permutation for cycle 0, then for cycle 1, ...
(each a permutation of its `sizes[k]` samples from (seed, k, cycle), a small child's cycles
drawn ~64 Ki samples at a time; storage order without shuffle). Epoch e takes positions
[e * counts[k], (e + 1) * counts[k]) of that stream, so within a cycle no sample repeats, a
small child goes round again on a fresh permutation, and a large one is not re-read until every
sample has been drawn once (an epoch that spans the end of a cycle may hold a sample twice: once
from each cycle). The epoch's draws of all children are then interleaved: a uniform permutation
from (seed, epoch) with shuffle (any stretch of the epoch holds each child in its proportion,
within sampling error), or evenly spaced without. Every piece is a pure function of (seed,
epoch), so a resumed or re-run epoch is the same; the epoch's order is dealt to the ranks
exactly as `ShuffledPlan`'s is (DistributedSampler's rule: every rank the same samples and
batches; `order[rank::world]`), which is why `MixturePlan` is a `ShuffledPlan` (its counts,
resume checks, elastic conversion and the next epoch decoded ahead hold as they are). A state
records the mix's sizes and shares (`recipe`) in its source's fingerprint: it is not resumed
under other weights or another epoch size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from fastload._loading.order.plan import ShuffledPlan

_CHILD_STREAM = 0x31C  # a child's permutation for one cycle through it
_INTERLEAVE_STREAM = 0x31D  # the epoch's interleaving of its children's draws
_GROUP_SAMPLES = 1 << 16  # a small child's cycles are drawn this many samples at a time


class MixturePlan(ShuffledPlan):
    """Batches of a mix's epoch (NOTE [a mixture's epoch]): `sizes[k]` samples in child k,
    `counts[k]` of them per epoch; sample numbers are the mix's (child k's start at
    `sum(sizes[:k])`)."""

    def __init__(
        self,
        sizes: Sequence[int],
        counts: Sequence[int],
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        super().__init__(
            int(sum(counts)),
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            rank=rank,
            world_size=world_size,
        )
        self.sizes = tuple(int(n) for n in sizes)
        self.counts = tuple(int(c) for c in counts)
        self._starts = np.concatenate([[0], np.cumsum(self.sizes[:-1], dtype=np.int64)]).astype(np.int64)

    def recipe(self) -> str:
        """A digest of the children's sizes and shares: what a state records beside the source's
        fingerprint, so that a state is not resumed under other weights or another epoch size."""
        text = f"sizes={list(self.sizes)};counts={list(self.counts)}"
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()

    def _positions(self, epoch: int) -> np.ndarray:
        order = self.epoch_order(epoch)
        if self.world_size == 1:
            return order
        return self._all_ranks(order)[self.rank :: self.world_size]

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The whole epoch's samples (every rank's), in order."""
        draws = [self._draws(k, epoch) + self._starts[k] for k in range(len(self.sizes))]
        drawn = np.concatenate(draws) if draws else np.empty(0, np.int64)
        if self.shuffle:
            seq = np.random.SeedSequence([self.seed, epoch, _INTERLEAVE_STREAM])
            return drawn[np.random.Generator(np.random.PCG64(seq)).permutation(len(drawn))]
        # Evenly spaced: child k's j-th draw at (j + 0.5) / counts[k] of the epoch, ties to the lower k.
        at = np.concatenate([(np.arange(c) + 0.5) / c for c in self.counts if c] or [np.empty(0)])
        child = np.repeat(np.arange(len(self.counts)), self.counts)
        return drawn[np.lexsort((child, at))]

    def _draws(self, k: int, epoch: int) -> np.ndarray:
        """Child k's samples in `epoch` (its own numbers): positions [epoch * c, (epoch + 1) * c) of
        its stream of permutations."""
        n, c = self.sizes[k], self.counts[k]
        if c == 0:
            return np.empty(0, np.int64)
        first, end = epoch * c, (epoch + 1) * c
        if not self.shuffle:
            return np.arange(first, end, dtype=np.int64) % n
        per_group = max(1, _GROUP_SAMPLES // n)  # cycles whose permutations are drawn together
        groups = range(first // n // per_group, (end - 1) // n // per_group + 1)
        stream = np.concatenate([self._permutations(k, group, per_group) for group in groups])
        skip = first - groups[0] * per_group * n
        return stream[skip : skip + c]

    def _permutations(self, k: int, group: int, per_group: int) -> np.ndarray:
        """Child k's permutations for cycles [group * per_group, (group + 1) * per_group), end to
        end: one draw for many cycles of a small child (a 10-sample child with a million-sample
        share is 100,000 cycles an epoch), the same whichever epoch asks."""
        seq = np.random.SeedSequence([self.seed, k, group, _CHILD_STREAM])
        rows = np.broadcast_to(np.arange(self.sizes[k], dtype=np.int64), (per_group, self.sizes[k]))
        return np.random.Generator(np.random.PCG64(seq)).permuted(rows, axis=1).reshape(-1)
