"""Per-sample random numbers for augmentation, made a task at a time: a counter-based generator.

A sample's augmentation must depend on (seed, epoch, sample index) alone — never on which
worker, which task or which part of a split batch drew it — so that every worker count, local or
daemon, gives the same pixels. A numpy Generator per sample did that at ~8 µs each (SeedSequence
hashing and object set-up), a tenth of a worker's time beside a 0.6 ms decode. Here one vectorized
pass hashes (seed, epoch, index, draw number) with SplitMix64's finalizer into `DRAWS` uniform
doubles per sample for the whole task; `SampleRandom` hands them out with the three Generator
methods the transforms use (`random`, `uniform`, `integers`). A chain that needs more draws than
that (a RandomResizedCrop retrying often, on top of many random transforms) continues from a
numpy Generator seeded the same way: slower, never different between workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

__all__ = [
    "BATCH_STREAM",
    "DRAWS",
    "GEOMETRY_STREAM",
    "PIXELS_STREAM",
    "SPLITMIX_GAMMA",
    "TENSOR_STREAM",
    "SampleDraws",
    "SampleRandom",
    "sample_randoms",
    "sample_uniforms",
    "splitmix64",
    "uniform_integers",
    "view_seed",
]

DRAWS = 48  # per sample: RandomResizedCrop's 10 tries x 2 draws + 2 for its place, a flip, and room
_STREAM = 0x5A5A_0000_0000_005A
SPLITMIX_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_U53 = 2.0**-53


def splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, element-wise (uint64 arithmetic wraps, as it must)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    mixed: np.ndarray = z ^ (z >> np.uint64(31))
    return mixed


def _key(seed: int, epoch: int, stream: int) -> np.ndarray:
    """(seed, epoch, stream) hashed to one 64-bit key (a 1-element array: array arithmetic wraps quietly)."""
    words = np.array([seed & (2**64 - 1), epoch & (2**64 - 1), stream], dtype=np.uint64) + SPLITMIX_GAMMA
    key = np.zeros(1, np.uint64)
    for k in range(len(words)):
        key = splitmix64(key ^ words[k : k + 1])
    return key


GEOMETRY_STREAM = _STREAM
PIXELS_STREAM = _STREAM + 1  # the pixel stage's draws (fastload._augment), apart from the geometry's
TENSOR_STREAM = _STREAM + 2  # RandomErasing's
BATCH_STREAM = _STREAM + 3  # a batch's MixUp/CutMix draws, keyed by its first sample


def sample_uniforms(
    seed: int, epoch: int, indices: np.ndarray, draws: int = DRAWS, stream: int = GEOMETRY_STREAM
) -> np.ndarray:
    """(len(indices), draws) uniform doubles in [0, 1): row i is sample `indices[i]`'s, from `stream`
    (one independent sequence per stage)."""
    counters = indices.astype(np.uint64)[:, None] * np.uint64(draws) + np.arange(draws, dtype=np.uint64)
    bits = splitmix64(_key(seed, epoch, stream) + (counters + np.uint64(1)) * SPLITMIX_GAMMA)
    return (bits >> np.uint64(11)).astype(np.float64) * _U53


def uniform_integers(u: np.ndarray | float, high: int | np.ndarray) -> np.ndarray:
    """Integers in [0, high) from uniforms in [0, 1), torch.randint's distribution: floor(u * high),
    at most high - 1 (u * high may round up to high). The one mapping the batched draws use;
    `SampleRandom.integers` is its per-sample twin, for the geometry's per-sample walk."""
    return np.minimum((np.asarray(u, dtype=np.float64) * high).astype(np.int64), high - 1)


class SampleRandom:
    """One sample's random numbers, drawn in order (Generator's `random`, `uniform`, `integers`)."""

    __slots__ = ("_draws", "_epoch", "_index", "_more", "_next", "_seed")

    def __init__(self, draws: list[float], seed: int, epoch: int, index: int) -> None:
        self._draws, self._next = draws, 0
        self._seed, self._epoch, self._index = seed, epoch, index
        self._more: np.random.Generator | None = None

    def random(self) -> float:
        """A float in [0, 1)."""
        i = self._next
        if i < len(self._draws):
            self._next = i + 1
            return self._draws[i]
        if self._more is None:  # a long chain: go on deterministically, as slowly as before
            entropy = [self._seed, self._epoch, self._index, 0x5A]
            self._more = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
        return float(self._more.random())

    def uniform(self, low: float = 0.0, high: float = 1.0) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int) -> int:
        """An integer in [low, high)."""
        return low + min(int(self.random() * (high - low)), high - low - 1)


class SampleDraws(Sequence[SampleRandom]):
    """A task's geometry draws: `uniforms` (n, DRAWS), row i sample `indices[i]`'s, for code that
    takes them a batch at a time (`transforms._batch_geometry`), and sample i's `SampleRandom`
    over the same row as `draws[i]`, made when asked for."""

    def __init__(self, seed: int, epoch: int, indices: np.ndarray) -> None:
        self.seed, self.epoch = seed, epoch
        self.indices = np.asarray(indices, dtype=np.int64)
        self.uniforms = sample_uniforms(seed, epoch, self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, i: int) -> SampleRandom: ...
    @overload
    def __getitem__(self, i: slice) -> list[SampleRandom]: ...
    def __getitem__(self, i: int | slice) -> SampleRandom | list[SampleRandom]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        row = self.uniforms[i].tolist()
        return SampleRandom(row, self.seed, self.epoch, int(self.indices[i]))


def sample_randoms(seed: int, epoch: int, indices: np.ndarray) -> SampleDraws:
    """The geometry draws of each sample of a task, in one vectorized pass."""
    return SampleDraws(seed, epoch, indices)


_VIEW_STREAM = np.uint64(0x5649_4557_5345_4544)  # "VIEWSEED": view seeds apart from every draw stream


def view_seed(seed: int, view: int) -> int:
    """The seed view `view` of a `transforms.Views` draws from, for a loader of base `seed`: all its
    random choices (crop, flip, colour, erasing) are its chain's, run alone under this seed, so a
    view equals `FastLoader(transform=chain, seed=view_seed(seed, view))`'s image (NOTE [views] in
    `transforms._views`). A 63-bit non-negative integer, a pure function of (seed, view)."""
    words = np.array([seed & (2**64 - 1), seed >> 64 & (2**64 - 1), view & (2**64 - 1)], np.uint64)
    key = np.array([_VIEW_STREAM], np.uint64)
    for k in range(len(words)):
        key = splitmix64(key ^ (words[k : k + 1] + SPLITMIX_GAMMA))
    return int(key[0] >> np.uint64(1))
