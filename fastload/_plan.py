"""The epoch plan: which samples form which batch, from (seed, epoch) alone.

Batches are enumerated lazily (`iter_batches`) so a resumed epoch can start at any batch without
replaying the ones before it. Seeds for a sample's augmentation and a batch's global random state
are derived with numpy's SeedSequence from (seed, epoch, index): never from worker identity or
timing, which is what makes every worker count give the same batches bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

import numpy as np

_ORDER_STREAM = 0x0D
_SAMPLE_STREAM = 0x5A
_BATCH_STREAM = 0xBA


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random generator for one sample's augmentation."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, index, _SAMPLE_STREAM])))


def batch_seed(seed: int, epoch: int, batch_index: int) -> int:
    """A 63-bit seed for the global random state while a batch's samples are loaded."""
    state = np.random.SeedSequence([seed, epoch, batch_index, _BATCH_STREAM]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


class ShuffledPlan:
    """Every sample once per epoch, in batches; optionally shuffled from (seed, epoch)."""

    def __init__(
        self, num_samples: int, batch_size: int, *, shuffle: bool, drop_last: bool, seed: int
    ) -> None:
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch, _ORDER_STREAM])))
        return rng.permutation(self.num_samples).astype(np.int64, copy=False)

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        order = self.order(epoch)
        for b in range(start, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size]


class SamplerPlan:
    """Batches from a user's `sampler` or `batch_sampler`, iterated in the trainer's process.

    A resumed epoch fast-forwards the sampler by the batches already delivered, as torchdata's
    StatefulDataLoader does for samplers without a state of their own.
    """

    def __init__(self, batch_sampler: Iterable[Any]) -> None:
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        if not isinstance(self.batch_sampler, Sized):
            raise TypeError("the batch sampler has no len()")
        return len(self.batch_sampler)

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        set_epoch = getattr(self.batch_sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        for b, indices in enumerate(self.batch_sampler):
            if b >= start:
                yield np.asarray(list(indices), dtype=np.int64)


class BatchSampler:
    """Group a sampler's indices into batches (torch's BatchSampler, without importing it)."""

    def __init__(self, sampler: Iterable[int], batch_size: int, drop_last: bool) -> None:
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(int(index))
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
