"""The epoch plan: which samples form which batch, from (seed, epoch) alone.

Batches are enumerated lazily (`iter_batches`) so a resumed epoch can start at any batch without
replaying the ones before it. The global random state a Dataset's sample is loaded under is
seeded from (seed, epoch, batch index, its row in the batch) (`row_seeds`), and a sample's
augmentation from (seed, epoch, index) (`_sample_random`): never from worker identity, timing, or
which part of a split batch loads it, which is what makes every worker count give the same
batches bit for bit.

`ShuffledPlan(..., block=R)` orders an epoch by runs of R consecutive samples instead of single
samples, so that reads stay sequential on chunked storage; `window` batches at a time are then
mixed among themselves (NOTE [block shuffle]).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from numbers import Integral
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
import torch.utils.data

from fastload._errors import ConfigError
from fastload._sample_random import SPLITMIX_GAMMA, splitmix64

_ORDER_STREAM = 0x0D
_BATCH_STREAM = 0xBA
_RUNS_STREAM = 0xB1  # the order of a block shuffle's runs (NOTE [block shuffle])
_WINDOW_STREAM = 0x3D  # a block shuffle's permutation within each window of a rank's order


def batch_seed(seed: int, epoch: int, batch_index: int) -> int:
    """A 63-bit seed for the global random state while a batch's samples are loaded."""
    state = np.random.SeedSequence([seed, epoch, batch_index, _BATCH_STREAM]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


def row_seeds(seed: int, epoch: int, batch_index: int, first_row: int, count: int) -> list[int]:
    """63-bit seeds for the global random state while rows `first_row ..` of a batch are loaded,
    one per row: keyed by the row in the whole batch, so a batch split into parts across workers
    (NOTE [split batches] in `running.split_batches`) draws what one task would."""
    base = np.array([batch_seed(seed, epoch, batch_index)], dtype=np.uint64)
    rows = np.arange(first_row + 1, first_row + count + 1, dtype=np.uint64)
    mixed = splitmix64(base + rows * SPLITMIX_GAMMA) >> np.uint64(1)
    return [int(v) for v in mixed]


@runtime_checkable
class OwnOrder(Protocol):
    """An epoch plan of fastload's own (`ShuffledPlan`, the samplers' plans in `sampling`): its
    order a pure function of (seed, epoch, rank, world_size), so that it may be decoded ahead,
    resumed at any batch without replaying the ones before, and counted in samples."""

    batch_size: int

    @property
    def samples_per_rank(self) -> int: ...

    def __len__(self) -> int: ...

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]: ...

    def batches_under(self, batch_size: int, world_size: int, drop_last: bool) -> int:
        """The batches an epoch of the same samples has under another batch layout."""
        ...

    def layout_bound(self) -> str | None:
        """Why a position saved under another batch size or world size does not convert (None: it
        does, NOTE [elastic resume] in `settings.resume`)."""
        ...


class ShuffledPlan(OwnOrder):
    """Every sample once per epoch, in batches; optionally shuffled from (seed, epoch).

    With `world_size > 1` this rank takes DistributedSampler's shard of the epoch's order: every
    rank the same number of samples (so the same number of batches), `order[rank::world_size]`
    of the order truncated to a multiple of `world_size` when `drop_last`, or padded by repeating
    its start otherwise (then a few samples appear twice in an epoch, exactly as there).
    `drop_last` applies at both levels: unshuffled, a rank's batches are exactly those of
    `DataLoader(sampler=DistributedSampler(..., shuffle=False, drop_last=drop_last),
    drop_last=drop_last)`.

    With `block=R` (and `shuffle`) the epoch is a block shuffle (NOTE [block shuffle]): the
    samples, in storage order, are cut into runs of R, the runs are shuffled from (seed, epoch),
    and rank r takes the contiguous piece `[r * samples_per_rank, (r + 1) * samples_per_rank)` of
    that order (padded or truncated as above), so that runs stay whole; then each window of
    `window * batch_size` consecutive positions of the rank's order is permuted from (seed, epoch,
    rank), so that a batch draws from its window's ~`window * batch_size / R` runs. The counts
    (samples and batches per rank) are those without `block`.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        block: int | None = None,
        window: int = 8,
        keep: np.ndarray | None = None,
    ) -> None:
        """`num_samples`: the source's; `keep`: the samples (sorted) an `exclude=` list leaves in,
        which the epoch draws from instead of all of them."""
        if block is not None:
            if not _is_positive_int(block):
                raise ConfigError(f"block must be an integer >= 1 (samples per run) or None, got {block!r}")
            if not shuffle:
                raise ConfigError("block (runs of a block shuffle) needs shuffle=True, or leave it None")
        if not _is_positive_int(window):
            raise ConfigError(f"window must be an integer >= 1 (batches mixed together), got {window!r}")
        self.keep = keep
        self.num_samples = num_samples if keep is None else len(keep)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.block = None if block is None else int(block)
        self.window = int(window)

    @property
    def samples_per_rank(self) -> int:
        n, world = self.num_samples, self.world_size
        if self.drop_last and n % world:
            return -(-(n - world) // world)
        return -(-n // world)

    def __len__(self) -> int:
        if self.drop_last:
            return self.samples_per_rank // self.batch_size
        return -(-self.samples_per_rank // self.batch_size)

    def batches_under(self, batch_size: int, world_size: int, drop_last: bool) -> int:
        layout = ShuffledPlan(
            self.num_samples, batch_size, shuffle=False, drop_last=drop_last, seed=0, world_size=world_size
        )
        return len(layout)

    def layout_bound(self) -> str | None:
        if self.block is not None:
            return "a block shuffle's order depends on both (windows of window x batch_size, per rank)"
        return None

    def order(self, epoch: int) -> np.ndarray:
        """This rank's samples for `epoch`, in order."""
        positions = self._positions(epoch)
        return positions if self.keep is None else self.keep[positions]

    def _positions(self, epoch: int) -> np.ndarray:
        """This rank's order for `epoch` as positions among the samples drawn from."""
        if self.block is not None:
            return self._block_order(epoch, self.block)
        if not self.shuffle:
            order = np.arange(self.num_samples, dtype=np.int64)
        else:
            seq = np.random.SeedSequence([self.seed, epoch, _ORDER_STREAM])
            order = np.random.Generator(np.random.PCG64(seq)).permutation(self.num_samples)
        if self.world_size == 1:
            return order
        return self._all_ranks(order)[self.rank :: self.world_size]

    def _all_ranks(self, order: np.ndarray) -> np.ndarray:
        """The epoch's `order` cut or padded to `samples_per_rank * world_size` samples."""
        total = self.samples_per_rank * self.world_size
        if total > len(order):
            return np.resize(order, total)  # repeats from the start, as DistributedSampler pads
        return order[:total]

    # NOTE [block shuffle]: a full shuffle makes every batch `batch_size` reads at random places.
    # On chunked storage (shards, record files, an object store, a spinning or network disk) a
    # random read costs about as much as reading a whole neighbourhood, and readahead is wasted.
    # A block shuffle keeps runs of R consecutive samples (storage order) together:
    #   1. the runs [0, R), [R, 2R), ... (the last may be shorter) are shuffled from (seed, epoch);
    #   2. the ranks split that order into contiguous pieces (DistributedSampler's padding and
    #      truncation, but not its interleaving `order[rank::world]`, which would cut every run
    #      into world_size strided pieces), so each rank reads whole runs;
    #   3. each window of `window * batch_size` positions of a rank's order is permuted from
    #      (seed, epoch, rank): windows start at batch boundaries, so the window's `window`
    #      batches share its ~window * batch_size / R runs, ~R / window samples of each per batch.
    # With window = 1 a batch is ~batch_size / R sequential reads instead of batch_size random
    # ones. With a larger window a batch's samples are rarely adjacent, but they stay within its
    # window's runs: storage that fetches whole chunks or reads ahead (shards, record files,
    # object-store ranges, the page cache) reads each run once for all the window's batches,
    # where a full shuffle reads `window * batch_size` places.
    # The price is mixing: neighbours in storage (often one class, as in an ImageNet folder
    # tree) land in the same few batches, always with the same run-mates, as run boundaries do
    # not move between epochs; a batch holds up to ~batch_size / R runs with window = 1, and
    # mixing approaches a full shuffle's as window grows past R. R = 1 is a full shuffle (a
    # uniform permutation, permuted again within windows). tools/bench/bench_block_shuffle.py
    # measures labels per batch and reads per batch against a full shuffle for several R and
    # windows.
    def _block_order(self, epoch: int, block: int) -> np.ndarray:
        """This rank's order under a block shuffle with runs of `block` samples."""
        n = self.num_samples
        seq = np.random.SeedSequence([self.seed, epoch, _RUNS_STREAM])
        runs = np.random.Generator(np.random.PCG64(seq)).permutation(-(-n // block))
        # The run order, one sample at a time: position p of run k (which starts at output
        # position `at`) holds sample k * block + (p - at), i.e. arange(n) shifted per run.
        starts = runs * block
        lengths = np.minimum(block, n - starts)
        at = np.cumsum(lengths) - lengths
        order = self._all_ranks(np.arange(n, dtype=np.int64) + np.repeat(starts - at, lengths))
        per = self.samples_per_rank
        mine = order[self.rank * per : (self.rank + 1) * per]  # a view of a fresh array: ours to permute
        seq = np.random.SeedSequence([self.seed, epoch, self.rank, _WINDOW_STREAM])
        rng = np.random.Generator(np.random.PCG64(seq))
        size = self.window * self.batch_size
        whole = len(mine) - len(mine) % size
        rows = mine[:whole].reshape(-1, size)
        rng.permuted(rows, axis=1, out=rows)  # each window apart, in place
        mine[whole:] = rng.permutation(mine[whole:])
        return mine

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        order = self.order(epoch)
        for b in range(start, len(self)):
            yield order[b * self.batch_size : (b + 1) * self.batch_size]


def _is_positive_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and int(value) >= 1


class SamplerPlan:
    """Batches from a user's `sampler` or `batch_sampler`, iterated in the trainer's process.

    The user's sampler keeps its own epoch, as under DataLoader: iterating never calls its
    `set_epoch`. `set_epoch` forwards an epoch given to the loader, and `sampler_epoch` reads the
    one the sampler holds (DistributedSampler's `epoch`), so that the loader can seed the epoch's
    batches from it. A resumed epoch fast-forwards the sampler by the batches already delivered,
    as torchdata's StatefulDataLoader does for samplers without a state of their own.
    """

    def __init__(self, batch_sampler: Iterable[Any]) -> None:
        self.batch_sampler = batch_sampler

    def __len__(self) -> int:
        if not isinstance(self.batch_sampler, Sized):
            raise TypeError("the batch sampler has no len()")
        return len(self.batch_sampler)

    @property
    def user_sampler(self) -> Any | None:
        """The `sampler` the user gave (fastload batches it), or None if they gave a batch_sampler."""
        return self.batch_sampler.sampler if isinstance(self.batch_sampler, BatchSampler) else None

    @property
    def user_batch_sampler(self) -> Any | None:
        """The `batch_sampler` the user gave, or None if they gave a sampler."""
        return None if isinstance(self.batch_sampler, BatchSampler) else self.batch_sampler

    def _epoch_holders(self) -> tuple[Any, ...]:
        """Where an epoch may live: the batch sampler, then the sampler it batches (`.sampler`)."""
        inner = getattr(self.batch_sampler, "sampler", None)
        return (self.batch_sampler,) if inner is None else (self.batch_sampler, inner)

    def set_epoch(self, epoch: int) -> None:
        """Call `set_epoch(epoch)` on the first of the batch sampler and its sampler that has one."""
        for holder in self._epoch_holders():
            set_epoch = getattr(holder, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
                return

    def sampler_epoch(self) -> int | None:
        """The integer `epoch` the batch sampler or its sampler holds, or None if neither has one."""
        for holder in self._epoch_holders():
            epoch = getattr(holder, "epoch", None)
            if isinstance(epoch, Integral) and not isinstance(epoch, bool):
                return int(epoch)
        return None

    def iter_batches(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """The sampler's batches from batch `start` on; the order is the sampler's own (`epoch`
        only names the epoch for the loader, which seeds the batches from it)."""
        del epoch
        for b, indices in enumerate(self.batch_sampler):
            if b >= start:
                yield np.asarray(list(indices), dtype=np.int64)


class GeneratorShuffle:
    """A map-style Dataset's shuffled order drawn from the user's `generator` exactly as
    `DataLoader(dataset, shuffle=True, generator=generator)` draws it (NOTE [DataLoader's order
    from a generator]): each epoch's iteration first takes the int64 DataLoader draws for its
    workers' base seed when it makes an iterator (every epoch; only the first with persistent
    workers, whose iterator DataLoader keeps), then torch's own `RandomSampler` on the generator."""

    def __init__(self, dataset: Sized, generator: torch.Generator, persistent: bool) -> None:
        self.dataset = dataset
        self.generator = generator
        self.persistent = persistent
        self._iterated = False

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[int]:
        if not (self.persistent and self._iterated):
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)  # DataLoader's base seed
        self._iterated = True
        return iter(torch.utils.data.RandomSampler(self.dataset, generator=self.generator))


# NOTE [DataLoader's order from a generator]: a user moving `DataLoader(ds, shuffle=True,
# generator=g)` to FastLoader expects the same order for the same `g` (a seeded run compared with
# its DataLoader twin). DataLoader shuffles with `RandomSampler(ds, generator=g)` (one
# `torch.randperm(n, generator=g)` per epoch, in every torch since `generator=` exists), and draws
# one int64 from `g` for its workers' base seed when it makes an iterator: before the sampler's
# first draw, as the sampler is lazy; every epoch, or once with persistent workers and
# num_workers > 0. `GeneratorShuffle` draws the same, in the same order, from torch's own
# RandomSampler, so the order is the installed torch's; and the loader's own seed (its batches'
# global random state) is then taken from a copy of `g`, leaving `g` where DataLoader leaves it.
# The epoch's order then follows the generator's state, as a sampler's does, not (seed, epoch).


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
