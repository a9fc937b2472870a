"""The block shuffle (`ShuffledPlan(..., block=R, window=W)`, NOTE [block shuffle] in plan.py).

Protects its contract: each sample once per epoch, deterministic from (seed, epoch), other
epochs and seeds other orders; runs of R consecutive samples stay together (a batch, or a
window of batches, touches few runs, most of them whole) while the window shuffle mixes the
runs of a window across its batches; ranks get contiguous pieces of the run order, the same
sample and batch counts as without `block`, and together every sample; a resumed epoch
continues with the very batches; bad arguments are ConfigErrors. The plan without `block` is
tested by tests/test_distributed.py and tests/test_determinism.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from fastload import ConfigError
from fastload._loading.order.plan import ShuffledPlan


def plan(n: int, batch_size: int, block: int, window: int = 8, **kwargs: Any) -> ShuffledPlan:
    kwargs.setdefault("drop_last", False)
    kwargs.setdefault("seed", 7)
    return ShuffledPlan(n, batch_size, shuffle=True, block=block, window=window, **kwargs)


def runs_touched(indices: np.ndarray, block: int, n: int) -> tuple[int, int]:
    """(how many runs `indices` touch, how many of those they hold only in part)."""
    runs = Counter((indices // block).tolist())
    partial = sum(count != min(block, n - run * block) for run, count in runs.items())
    return len(runs), partial


@pytest.mark.parametrize(
    ("n", "batch_size", "block", "window"),
    [(100, 10, 4, 2), (101, 8, 7, 3), (1000, 32, 16, 8), (37, 5, 1, 1), (37, 64, 5, 8), (50, 4, 50, 1)],
)
def test_each_sample_once_per_epoch(n: int, batch_size: int, block: int, window: int) -> None:
    p = plan(n, batch_size, block, window)
    for epoch in range(3):
        order = p.order(epoch)
        assert order.dtype == np.int64
        assert sorted(order.tolist()) == list(range(n))
        batches = list(p.iter_batches(epoch))
        assert len(batches) == len(p) == -(-n // batch_size)
        assert np.array_equal(np.concatenate(batches), order)


def test_drop_last_drops_only_the_last_partial_batch() -> None:
    p = plan(101, 8, 7, 3, drop_last=True)
    batches = list(p.iter_batches(0))
    assert len(batches) == len(p) == 12 and all(len(b) == 8 for b in batches)
    assert len(set(np.concatenate(batches).tolist())) == 96


def test_deterministic_from_seed_and_epoch() -> None:
    a, b = plan(500, 16, 8, 4), plan(500, 16, 8, 4)
    for epoch in range(3):
        assert np.array_equal(a.order(epoch), b.order(epoch))
    assert not np.array_equal(a.order(0), a.order(1))
    assert not np.array_equal(a.order(0), plan(500, 16, 8, 4, seed=8).order(0))
    # each part is random from the epoch: the run order (with window=1, which runs form each
    # batch, whatever the order within it) and the window's mixing
    runs = plan(512, 16, 8, 1)
    batches_of = [[sorted(b.tolist()) for b in runs.iter_batches(epoch)] for epoch in (0, 1)]
    assert batches_of[0] != batches_of[1]
    one_run = plan(64, 16, 64, 4)  # a single run: only the window shuffle moves anything
    assert not np.array_equal(one_run.order(0), one_run.order(1))
    assert not np.array_equal(one_run.order(0), np.arange(64))


def test_run_order_uses_its_own_stream() -> None:
    """block=1, window=1, batch_size=1 is the shuffled run order itself: not the full shuffle's."""
    full = ShuffledPlan(200, 1, shuffle=True, drop_last=False, seed=3)
    runs = ShuffledPlan(200, 1, shuffle=True, drop_last=False, seed=3, block=1, window=1)
    assert sorted(runs.order(0).tolist()) == list(range(200))
    assert not np.array_equal(full.order(0), runs.order(0))


def test_window_one_batches_are_whole_runs() -> None:
    """With R dividing the batch size and N, and window=1, a batch is batch_size / R whole runs."""
    n, batch_size, block = 480, 24, 8
    p = plan(n, batch_size, block, window=1)
    for epoch in range(2):
        unsorted = 0
        for batch in p.iter_batches(epoch):
            pieces = np.sort(batch).reshape(-1, block)
            assert np.all(pieces[:, 0] % block == 0)
            assert np.all(np.diff(pieces, axis=1) == 1)
            unsorted += not np.all(np.diff(batch) > 0)
        assert unsorted > len(p) // 2, "the samples of a batch are not mixed"
        # the batches' runs, in order, are not storage order: the runs are shuffled
        firsts = [int(np.min(batch)) for batch in p.iter_batches(epoch)]
        assert firsts != sorted(firsts)


@pytest.mark.parametrize(
    ("n", "batch_size", "block", "window"), [(1003, 10, 7, 1), (1003, 10, 7, 3), (999, 16, 5, 4)]
)
def test_windows_touch_few_runs(n: int, batch_size: int, block: int, window: int) -> None:
    """A window of batches holds the runs of its positions: whole but for the two at its ends."""
    p = plan(n, batch_size, block, window)
    order = p.order(0)
    size = window * batch_size
    for at in range(0, n, size):
        touched, partial = runs_touched(order[at : at + size], block, n)
        assert touched <= -(-size // block) + 1
        assert partial <= 2


def test_the_window_mixes_runs_across_its_batches() -> None:
    """window=8 spreads a window's runs over its 8 batches: a batch touches many more runs."""
    n, batch_size, block = 4096, 32, 16
    per_batch = {
        window: np.mean(
            [runs_touched(b, block, n)[0] for b in plan(n, batch_size, block, window).iter_batches(0)]
        )
        for window in (1, 8)
    }
    assert per_batch[1] <= batch_size // block + 1
    assert per_batch[8] > 4 * per_batch[1]


def test_block_one_is_a_uniform_shuffle() -> None:
    """R=1 has no runs to keep: the mean |order[i+1] - order[i]| is a full shuffle's ~N/3."""
    n = 30_000
    gaps = np.abs(np.diff(plan(n, 64, 1, 8).order(0)))
    assert abs(gaps.mean() / (n / 3) - 1) < 0.05


SHARDS = [(n, world) for n in (1, 7, 40, 97, 100, 101) for world in (1, 2, 3, 4, 5)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("n", "world"), SHARDS)
@pytest.mark.parametrize("block", [1, 4, 9])
def test_ranks_get_equal_shares_of_everything(n: int, world: int, drop_last: bool, block: int) -> None:
    batch_size = 3
    plans = [
        plan(n, batch_size, block, 2, drop_last=drop_last, rank=r, world_size=world) for r in range(world)
    ]
    plain = ShuffledPlan(n, batch_size, shuffle=True, drop_last=drop_last, seed=7, world_size=world)
    orders = [p.order(4) for p in plans]
    for p, order in zip(plans, orders, strict=True):
        assert len(order) == plain.samples_per_rank == p.samples_per_rank
        assert len(p) == len(plain)
        assert len(list(p.iter_batches(4))) == len(plain)
    counts = Counter(np.concatenate(orders).tolist())
    assert sum(counts.values()) == plain.samples_per_rank * world
    assert set(counts) <= set(range(n))
    if drop_last:  # truncated to a multiple of world: each sample at most once
        assert max(counts.values(), default=1) == 1 and len(counts) == n - n % world
    else:  # padded by repeating the start: every sample, fewer than `world` of them twice
        assert set(counts) == set(range(n))
        assert sum(c - 1 for c in counts.values()) == plain.samples_per_rank * world - n


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_ranks_take_contiguous_pieces_of_the_run_order(world: int) -> None:
    """Runs stay on one rank, but for those at the (world - 1) rank boundaries and the padding."""
    n, block = 203, 8
    orders = [plan(n, 4, block, 2, rank=r, world_size=world).order(0) for r in range(world)]
    ranks_of_run: dict[int, set[int]] = {}
    for rank, order in enumerate(orders):
        for run in set((order // block).tolist()):
            ranks_of_run.setdefault(run, set()).add(rank)
    split = sum(len(ranks) > 1 for ranks in ranks_of_run.values())
    pad = len(orders[0]) * world - n
    assert split <= world - 1 + (pad > 0) * (-(-pad // block) + 1)
    for order in orders:
        assert runs_touched(order, block, n)[0] <= -(-len(order) // block) + 2


@pytest.mark.parametrize(("world", "drop_last"), [(1, False), (3, False), (3, True)])
def test_resume_gives_the_same_batches(world: int, drop_last: bool) -> None:
    for rank in range(world):
        p = plan(211, 6, 5, 3, drop_last=drop_last, rank=rank, world_size=world)
        again = plan(211, 6, 5, 3, drop_last=drop_last, rank=rank, world_size=world)
        whole = [b.tolist() for b in p.iter_batches(2)]
        assert len(whole) == len(p)
        for start in range(len(p) + 1):
            assert [b.tolist() for b in again.iter_batches(2, start)] == whole[start:]


def test_without_block_window_changes_nothing() -> None:
    base = ShuffledPlan(50, 4, shuffle=True, drop_last=False, seed=1, rank=1, world_size=3)
    other = ShuffledPlan(50, 4, shuffle=True, drop_last=False, seed=1, rank=1, world_size=3, window=3)
    assert np.array_equal(base.order(2), other.order(2))


def test_ten_million_samples_vectorized() -> None:
    """The order of 10M samples is built without a Python loop per sample (well under a second)."""
    order = plan(10_000_000, 256, 64, 8, rank=1, world_size=3).order(0)
    assert len(order) == 3_333_334 and order.min() >= 0 and order.max() < 10_000_000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block": 0}, "block must be an integer >= 1"),
        ({"block": -3}, "block must be an integer >= 1"),
        ({"block": 2.0}, "block must be an integer >= 1"),
        ({"block": True}, "block must be an integer >= 1"),
        ({"block": "8"}, "block must be an integer >= 1"),
        ({"block": 8, "window": 0}, "window must be an integer >= 1"),
        ({"block": 8, "window": 1.5}, "window must be an integer >= 1"),
        ({"window": -1}, "window must be an integer >= 1"),
        ({"block": 8, "shuffle": False}, "needs shuffle=True"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    kwargs = {"shuffle": True, **kwargs}
    with pytest.raises(ConfigError, match=message):
        ShuffledPlan(100, 4, drop_last=False, seed=0, **kwargs)


def test_numpy_integers_are_accepted() -> None:
    p = ShuffledPlan(100, 4, shuffle=True, drop_last=False, seed=0, block=np.int64(8), window=np.int32(2))
    assert p.block == 8 and p.window == 2 and type(p.block) is int
