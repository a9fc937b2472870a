"""Samplers as plans (`fastload.samplers`, `_loading/order/sampling.py`).

Protects what a user of `sampler=samplers.X(...)` on a source relies on: Weighted's frequencies
(chi-square, with replacement; without, each sample at most once and the first draw distributed
as the weights say), ClassBalanced's equal classes, DeiT's repeated augmentation (each drawn
index `repeats` times, on different ranks, each repeat with its own crop), every rank its
strided equal share; the same batches for any worker count and through a daemon; an exact
resume mid-epoch; and refusals that say what to do.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from daemon_helpers import DaemonProcess, RawClient, hello_fields, hello_reply
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload import ConfigError, FastLoader, samplers
from fastload import transforms as T
from fastload._augment.program import TrainerStages
from fastload._loading.order.sampling import RepeatCopies, RepeatedPlan, WeightedPlan, drawn_plan

# chi-square's 0.1% critical values by degrees of freedom (a fixed seed: these are regression
# checks that would catch a wrong distribution, not flaky draws)
CHI2_999 = {2: 13.816, 4: 18.467, 9: 27.877}
CROP = [T.RandomResizedCrop(24), T.RandomHorizontalFlip()]
N = 24  # the session's image_folder: 3 classes x 8


def plan(sampler: samplers.Sampler, n: int, **kwargs: Any) -> WeightedPlan | RepeatedPlan:
    kwargs.setdefault("batch_size", 8)
    kwargs.setdefault("drop_last", False)
    kwargs.setdefault("seed", 3)
    kwargs.setdefault("rank", 0)
    kwargs.setdefault("world_size", 1)
    kwargs.setdefault("keep", None)
    kwargs.setdefault("targets", None)
    return drawn_plan(sampler, num_samples=n, **kwargs)


def chi2(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def test_weighted_with_replacement_draws_as_the_weights_say() -> None:
    weights = np.arange(1, 11, dtype=np.float64) * 7.5  # need not sum to 1
    p = plan(samplers.Weighted(weights, num_samples=50_000), 10)
    order = p.order(0)
    assert len(order) == 50_000 and order.dtype == np.int64
    counts = np.bincount(order, minlength=10)
    assert chi2(counts, 50_000 * weights / weights.sum()) < CHI2_999[9]


@pytest.mark.parametrize("replacement", [True, False])
def test_a_sample_of_weight_zero_is_never_drawn(replacement: bool) -> None:
    weights = np.array([0, 1, 2, 0, 3, 1, 0, 5], dtype=np.float64)
    p = plan(samplers.Weighted(weights, num_samples=5, replacement=replacement), 8)
    for epoch in range(50):
        assert not set(p.order(epoch).tolist()) & {0, 3, 6}


def test_weighted_without_replacement_draws_each_sample_at_most_once() -> None:
    weights = np.random.default_rng(0).uniform(0.1, 5.0, 50)
    p = plan(samplers.Weighted(weights, num_samples=30, replacement=False), 50)
    for epoch in range(20):
        order = p.order(epoch).tolist()
        assert len(order) == 30 == len(set(order))
    full = plan(samplers.Weighted(weights, replacement=False), 50)
    assert sorted(full.order(0).tolist()) == list(range(50))  # num_samples = all: a permutation


def test_weighted_without_replacement_first_draw_follows_the_weights() -> None:
    # Gumbel top-k: the first of the order is one categorical draw, as torch's first draw is.
    weights = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    p = plan(samplers.Weighted(weights, num_samples=3, replacement=False), 5)
    firsts = np.bincount([int(p.order(epoch)[0]) for epoch in range(3000)], minlength=5)
    assert chi2(firsts, 3000 * weights / weights.sum()) < CHI2_999[4]


def test_class_balanced_draws_classes_equally() -> None:
    targets = np.array([0] * 80 + [1] * 15 + [2] * 5)
    p = plan(samplers.ClassBalanced(num_samples=30_000), 100, targets=targets)
    classes = np.bincount(targets[p.order(0)], minlength=3)
    assert chi2(classes, np.full(3, 10_000.0)) < CHI2_999[2]
    weights = samplers.class_balanced_weights(targets)
    assert np.allclose(weights[:80], 1 / 80) and np.allclose(weights[-5:], 1 / 5)


def test_ranks_take_equal_strided_shares_of_one_sequence() -> None:
    weights = np.random.default_rng(1).uniform(0.5, 2.0, 101)
    one = plan(samplers.Weighted(weights), 101).order(4)
    ranks = [plan(samplers.Weighted(weights), 101, rank=r, world_size=4).order(4) for r in range(4)]
    assert {len(r) for r in ranks} == {26}  # ceil(101 / 4) each
    sequence = np.stack(ranks, axis=1).reshape(-1)  # rank r holds positions r, r + 4, ...
    assert np.array_equal(sequence[:101], one)
    assert np.array_equal(sequence[101:], sequence[:3])  # padded from the start, as DistributedSampler
    dropped = [plan(samplers.Weighted(weights), 101, rank=r, world_size=4, drop_last=True) for r in range(4)]
    assert {p.samples_per_rank for p in dropped} == {25}


def test_repeated_augmentation_puts_each_repeat_on_another_rank() -> None:
    n, world, repeats = 300, 3, 3
    ranks = [plan(samplers.RepeatedAugmentation(repeats), n, rank=r, world_size=world) for r in range(world)]
    per_rank = n // 256 * 256 // world  # DeiT's RASampler count
    orders = [p.order(2) for p in ranks]
    assert all(len(o) == per_rank for o in orders)
    counts = Counter(i for o in orders for i in o.tolist())
    assert set(counts.values()) == {repeats}  # 85 x 3 positions: every drawn index whole
    for i in counts:
        assert all(i in set(o.tolist()) for o in orders)  # once on every rank
    assert len(set(orders[0].tolist())) == per_rank


def test_repeats_on_one_rank_get_distinct_augmentation_keys() -> None:
    p = plan(samplers.RepeatedAugmentation(3, num_samples=30), 40, batch_size=6)
    assert isinstance(p, RepeatedPlan)
    copies = p.copies(40)
    keys = np.concatenate([copies.keys(b, 0, batch) for b, batch in enumerate(p.iter_batches(0))])
    order = p.order(0)
    assert len(set(keys.tolist())) == len(keys)  # every repeat its own key
    assert np.array_equal(keys % 40, order) and np.array_equal(keys[::3], order[::3])  # copy 0: the index
    # a batch split across workers keys its rows as the whole batch does
    whole = copies.keys(2, 0, order[12:18])
    parts = [copies.keys(2, 0, order[12:15]), copies.keys(2, 3, order[15:18])]
    assert np.array_equal(np.concatenate(parts), whole)
    assert RepeatCopies(3, 1, 3, 6, 40).keys(0, 0, np.array([5]))[0] == 5 + 40  # rank 1's first: copy 1


@pytest.mark.parametrize(
    "sampler",
    [samplers.Weighted(np.linspace(1, 2, 64)), samplers.Weighted(np.linspace(1, 2, 64), replacement=False),
     samplers.ClassBalanced(), samplers.RepeatedAugmentation(3)],
    ids=["weighted", "without-replacement", "class-balanced", "repeated"],
)
def test_orders_are_pure_functions_of_seed_and_epoch(sampler: samplers.Sampler) -> None:
    targets = np.arange(64) % 4
    a, b = plan(sampler, 64, targets=targets), plan(sampler, 64, targets=targets)
    assert np.array_equal(a.order(1), b.order(1))
    assert not np.array_equal(a.order(1), a.order(2))
    assert not np.array_equal(a.order(1), plan(sampler, 64, targets=targets, seed=4).order(1))
    batches = list(a.iter_batches(1))
    assert len(batches) == len(a)
    assert [x.tolist() for x in a.iter_batches(1, 3)] == [x.tolist() for x in batches[3:]]


def test_refusals_say_what_to_do() -> None:
    with pytest.raises(ConfigError, match="one weight per sample"):
        plan(samplers.Weighted([1.0, 2.0]), 5)
    with pytest.raises(ConfigError, match="at most once"):
        plan(samplers.Weighted([1.0, 0.0, 1.0], num_samples=3, replacement=False), 3)
    with pytest.raises(ConfigError, match="daemon keeps"):
        plan(samplers.ClassBalanced(), 5, targets=None)
    with pytest.raises(ConfigError, match="multi-hot"):
        plan(samplers.ClassBalanced(), 4, targets=np.eye(4, dtype=np.float32))
    with pytest.raises(ConfigError, match="exclude="):
        plan(samplers.ClassBalanced(), 3, targets=np.array([0, -1, 1]))
    with pytest.raises(ConfigError, match="num_samples <= 30"):
        plan(samplers.RepeatedAugmentation(3, num_samples=31), 10)
    for bad in ([], [1.0, -1.0], [0.0, 0.0], [1.0, float("nan")]):
        with pytest.raises(ConfigError, match="weights"):
            samplers.Weighted(bad)
    with pytest.raises(ConfigError, match="repeats"):
        samplers.RepeatedAugmentation(0)
    with pytest.raises(ConfigError, match="num_samples"):
        samplers.ClassBalanced(num_samples=0)


# -- through the loader ---------------------------------------------------------------------------

SAMPLERS = {
    "weighted": samplers.Weighted(np.linspace(1.0, 3.0, N)),
    "class-balanced": samplers.ClassBalanced(num_samples=20, replacement=False),
    "repeated": samplers.RepeatedAugmentation(3),
}


def run(root: Path, sampler: samplers.Sampler, epochs: int = 2, **kwargs: Any) -> list[list[Any]]:
    kwargs.setdefault("num_workers", 0)
    kwargs.setdefault("transform", CROP)
    with FastLoader(
        root, batch_size=5, sampler=sampler, seed=11, device="cpu", sample_ids=True, **kwargs
    ) as loader:
        return [[(x.clone(), y.clone(), ids.indices.clone()) for x, y, ids in loader] for _ in range(epochs)]


def assert_same(a: list[list[Any]], b: list[list[Any]]) -> None:
    assert len(a) == len(b)
    for epoch_a, epoch_b in zip(a, b, strict=True):
        assert len(epoch_a) == len(epoch_b) > 0
        for batch_a, batch_b in zip(epoch_a, epoch_b, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(batch_a, batch_b, strict=True))


@pytest.fixture(scope="module")
def local_runs(image_folder: Path) -> dict[str, list[list[Any]]]:
    return {name: run(image_folder, sampler) for name, sampler in SAMPLERS.items()}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_same_batches_for_any_worker_count(image_folder: Path, local_runs: dict[str, Any], name: str) -> None:
    assert_same(local_runs[name], run(image_folder, SAMPLERS[name], num_workers=2))
    epoch0 = torch.cat([ids for _, _, ids in local_runs[name][0]]).tolist()
    epoch1 = torch.cat([ids for _, _, ids in local_runs[name][1]]).tolist()
    assert epoch0 != epoch1  # the next epoch draws anew


def test_loader_takes_the_plans_order(image_folder: Path, local_runs: dict[str, Any]) -> None:
    expected = plan(SAMPLERS["weighted"], N, batch_size=5, seed=11)
    got = torch.cat([ids for _, _, ids in local_runs["weighted"][1]]).numpy()
    assert np.array_equal(got, expected.order(1))
    balanced = torch.cat([ids for *_, ids in local_runs["class-balanced"][0]]).tolist()
    assert len(balanced) == 20 == len(set(balanced))  # without replacement: each at most once


def _rows_by_index(batches: list[Any]) -> dict[int, list[torch.Tensor]]:
    rows: dict[int, list[torch.Tensor]] = {}
    for x, _, ids in batches:
        for image, i in zip(x, ids.tolist(), strict=True):
            rows.setdefault(i, []).append(image)
    return rows


def _all_differ(images: list[torch.Tensor]) -> bool:
    return all(not torch.equal(a, b) for k, a in enumerate(images) for b in images[k + 1 :])


def test_repeats_get_their_own_crops_on_one_rank(local_runs: dict[str, Any]) -> None:
    rows = _rows_by_index(local_runs["repeated"][0])
    assert {len(r) for r in rows.values()} <= {1, 2, 3} and any(len(r) == 3 for r in rows.values())
    assert all(_all_differ(r) for r in rows.values())


def test_repeats_get_their_own_crops_across_ranks(image_folder: Path) -> None:
    ra = samplers.RepeatedAugmentation(3, num_samples=N)
    per_rank = [run(image_folder, ra, epochs=1, rank=r, world_size=3)[0] for r in range(3)]
    rows = [_rows_by_index(batches) for batches in per_rank]
    assert set(rows[0]) == set(rows[1]) == set(rows[2])  # every drawn index on every rank
    for i in rows[0]:
        assert _all_differ([rows[r][i][0] for r in range(3)])


@pytest.mark.parametrize(("name", "workers"), [("weighted", 0), ("repeated", 2), ("class-balanced", 0)])
def test_exact_resume_mid_epoch(
    image_folder: Path, local_runs: dict[str, Any], name: str, workers: int
) -> None:
    with FastLoader(
        image_folder, batch_size=5, sampler=SAMPLERS[name], seed=11, device="cpu", transform=CROP,
        sample_ids=True, num_workers=workers,
    ) as first:
        for _ in first:
            break
        it = iter(first)  # epoch 1
        next(it), next(it)
        state = first.state_dict()
    assert state["sampler"] == SAMPLERS[name].to_config()
    with FastLoader(
        image_folder, batch_size=5, sampler=SAMPLERS[name], seed=11, device="cpu", transform=CROP,
        sample_ids=True, num_workers=workers,
    ) as resumed:
        resumed.load_state_dict(state)
        rest = [(x, y, ids.indices) for x, y, ids in resumed]
    assert_same([local_runs[name][1][2:]], [rest])


def test_a_state_of_another_sampler_is_refused(image_folder: Path) -> None:
    common: dict[str, Any] = dict(batch_size=5, seed=11, device="cpu", num_workers=0, transform=CROP)
    with FastLoader(image_folder, sampler=SAMPLERS["weighted"], **common) as weighted:
        next(iter(weighted))
        state = weighted.state_dict()
    with FastLoader(image_folder, shuffle=True, **common) as shuffled:
        with pytest.raises(ConfigError, match="sampler"):
            shuffled.load_state_dict(state)
        next(iter(shuffled))
        plain_state = shuffled.state_dict()
    assert "sampler" not in plain_state  # states without a plan keep their keys
    with FastLoader(image_folder, sampler=SAMPLERS["weighted"], **common) as weighted:
        for damaged in ("Weighted", {"kind": ["Weighted"]}, {1: 2}):
            with pytest.raises(ConfigError, match="sampler"):
                weighted.load_state_dict({**state, "sampler": damaged})
    other = samplers.Weighted(np.linspace(3.0, 1.0, N))
    with FastLoader(image_folder, sampler=other, **common) as weighted:
        with pytest.raises(ConfigError, match="sampler"):
            weighted.load_state_dict(state)  # other weights: another order
        with pytest.raises(ConfigError, match="sampler"):
            weighted.load_state_dict(plain_state)


def test_exclude_leaves_samples_out_of_the_draws(image_folder: Path) -> None:
    with FastLoader(
        image_folder, batch_size=6, sampler=samplers.Weighted(np.ones(N), num_samples=200), seed=2,
        device="cpu", exclude=[0, 5, 23], sample_ids=True, num_workers=0, transform=CROP,
    ) as loader:
        drawn = torch.cat([ids.indices for _, _, ids in loader]).tolist()
    assert len(drawn) == 200 and not set(drawn) & {0, 5, 23} and len(set(drawn)) == N - 3


def test_loader_refusals(image_folder: Path) -> None:
    dataset = torch.utils.data.TensorDataset(torch.zeros(4, 2))
    with pytest.raises(ConfigError, match="torch sampler"):
        FastLoader(dataset, sampler=samplers.Weighted(np.ones(4)))
    with pytest.raises(ConfigError, match="one weight per sample"):
        FastLoader(image_folder, sampler=samplers.Weighted(np.ones(N + 1)), transform=CROP, num_workers=0)
    with pytest.raises(ConfigError, match="mutually exclusive"):
        FastLoader(image_folder, sampler=samplers.ClassBalanced(), shuffle=True, transform=CROP)


@pytest.mark.parametrize("name", ["weighted", "repeated"])
def test_a_daemon_gives_the_local_batches(
    shared_daemon: DaemonProcess, image_folder: Path, local_runs: dict[str, Any], name: str
) -> None:
    # The trainer sends its plan's tasks; a daemon's workers key repeats as local ones do (the
    # hello's `repeats`, NOTE [augmentation of repeats]).
    served = run(image_folder, SAMPLERS[name], num_workers=1, daemon=shared_daemon.address)
    assert_same(local_runs[name], served)


def test_a_daemon_session_keys_repeats_in_the_trainers_stages_too(
    shared_daemon: DaemonProcess, image_folder: Path
) -> None:
    # Local CPU batches with normalize run RandomErasing in the workers; a daemon's session keeps
    # uint8 slots and runs it in the trainer (`Pipeline.deliver`, keyed by `RepeatCopies`).
    chain = [*CROP, T.ColorJitter(0.3, 0.3), T.RandomErasing(p=1.0)]
    kwargs: dict[str, Any] = dict(epochs=1, transform=chain, normalize=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)))
    local = run(image_folder, SAMPLERS["repeated"], **kwargs)
    assert_same(local, run(image_folder, SAMPLERS["repeated"], daemon=shared_daemon.address, **kwargs))
    assert all(_all_differ(r) for r in _rows_by_index(local[0]).values())


def test_class_balanced_through_a_daemon_says_where_the_targets_are(
    shared_daemon: DaemonProcess, image_folder: Path
) -> None:
    with pytest.raises(ConfigError, match="class_balanced_weights"):
        FastLoader(
            image_folder, sampler=samplers.ClassBalanced(), transform=CROP, daemon=shared_daemon.address
        )  # the session its hello opened is closed, not left to the garbage collector


@pytest.mark.parametrize("repeats", [0, samplers.MAX_REPEATS + 1])
def test_a_daemon_refuses_a_hello_of_repeats_out_of_range(
    shared_daemon: DaemonProcess, image_folder: Path, repeats: int
) -> None:
    with RawClient(shared_daemon.address) as client:
        op, fields = hello_reply(client, hello_fields(image_folder, repeats=repeats))
    assert op == "error" and "repeats must be 1..1024" in fields["message"]


def test_the_trainers_stages_key_repeats_as_the_workers_do(image_folder: Path) -> None:
    # Batches going to a GPU get their pixel stage in the trainer (`Pipeline.deliver`, keys from
    # `RepeatCopies` and the batch's index); run here on the CPU, the same keys must give the
    # pixels the workers give when they run the stage themselves.
    ra, pixels = samplers.RepeatedAugmentation(3), [T.ColorJitter(0.4, 0.4, 0.4, 0.1)]
    in_workers = run(image_folder, ra, epochs=1, transform=[*CROP, *pixels])[0]
    geometry_only = run(image_folder, ra, epochs=1)[0]
    p = plan(ra, N, batch_size=5, seed=11)
    assert isinstance(p, RepeatedPlan)
    copies = p.copies(N)
    stages = TrainerStages(T.compile_transforms([*CROP, *pixels]), seed=11, pixels_here=True)
    pairs, keyed_alike = zip(in_workers, geometry_only, strict=True), 0
    for b, ((x_workers, _, ids), (x_plain, _, same_ids)) in enumerate(pairs):
        assert torch.equal(ids, same_ids)
        x = stages.before_normalize(x_plain.clone(), 0, copies.keys(b, 0, ids.numpy()))
        assert torch.equal(x, x_workers) and not torch.equal(x, x_plain)
        by_index = stages.before_normalize(x_plain.clone(), 0, ids.numpy())
        keyed_alike += int(torch.equal(by_index, x_workers))
    assert keyed_alike == 0  # every batch holds a repeat whose key is not its index


def test_a_position_converts_to_another_batch_size_and_world_size(image_folder: Path) -> None:
    # The draws are one sequence dealt strided (NOTE [elastic resume]): 2 batches of 6 on one rank
    # are the sequence's first 12, which 2 ranks of batch 3 resume after, at their batch 2.
    weighted = SAMPLERS["weighted"]
    common: dict[str, Any] = dict(seed=11, device="cpu", num_workers=0, transform=CROP, sample_ids=True)
    with FastLoader(image_folder, batch_size=6, sampler=weighted, **common) as first:
        it = iter(first)
        next(it), next(it)
        state = first.state_dict()
    rest = []
    for rank in range(2):
        ranked = dict(common, rank=rank, world_size=2)
        with FastLoader(image_folder, batch_size=3, sampler=weighted, **ranked) as loader:
            loader.load_state_dict(state)
            rest.append(torch.cat([ids.indices for *_, ids in loader]).numpy())
    sequence = plan(weighted, N, seed=11).order(0)
    assert np.array_equal(np.stack(rest, axis=1).reshape(-1), sequence[12:])


def test_class_balanced_counts_the_classes_an_exclusion_leaves() -> None:
    targets = np.array([0] * 10 + [1] * 10 + [2] * 10)
    keep = np.concatenate([np.arange(2), np.arange(10, 30)])  # class 0 keeps 2 samples of its 10
    p = plan(samplers.ClassBalanced(num_samples=9000), 30, targets=targets, keep=keep)
    drawn = p.order(0)
    assert set(drawn.tolist()) <= set(keep.tolist())
    assert chi2(np.bincount(targets[drawn], minlength=3), np.full(3, 3000.0)) < CHI2_999[2]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300), world=st.integers(1, 6), batch_size=st.integers(1, 40), repeats=st.integers(1, 4),
    drop_last=st.booleans(), replacement=st.booleans(), epoch=st.integers(0, 3),
)
def test_every_rank_its_equal_share_of_one_sequence(
    n: int, world: int, batch_size: int, repeats: int, drop_last: bool, replacement: bool, epoch: int
) -> None:
    weights = np.linspace(0.5, 1.5, n)
    both = (samplers.Weighted(weights, replacement=replacement), samplers.RepeatedAugmentation(repeats))
    for sampler in both:
        if isinstance(sampler, samplers.RepeatedAugmentation) and (n // 256 * 256 or n) < world:
            continue  # refused: fewer samples an epoch than ranks
        ranks = [
            plan(sampler, n, batch_size=batch_size, drop_last=drop_last, rank=r, world_size=world)
            for r in range(world)
        ]
        orders = [p.order(epoch) for p in ranks]
        per = ranks[0].samples_per_rank
        assert all(len(o) == per for o in orders) and all(len(p) == len(ranks[0]) for p in ranks)
        assert all(o.min() >= 0 and o.max() < n for o in orders if len(o))
        one = plan(sampler, n, batch_size=batch_size, drop_last=drop_last).order(epoch)
        dealt = np.stack(orders, axis=1).reshape(-1)
        shared = min(len(dealt), len(one))
        assert np.array_equal(dealt[:shared], one[:shared])  # one sequence, dealt strided
        for p, o in zip(ranks, orders, strict=True):
            batches = list(p.iter_batches(epoch))
            assert len(batches) == len(p)
            if batches:
                assert np.array_equal(np.concatenate(batches), o[: sum(map(len, batches))])


def test_weighted_draws_are_numpys_choice() -> None:
    # The plan looks the draws up in sorted order (faster); they are numpy's choice(p=...) draws.
    weights = np.random.default_rng(5).uniform(0.0, 1.0, 3000)
    weights[::7] = 0.0
    p = plan(samplers.Weighted(weights, num_samples=9000), 3000, seed=4)
    generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence([4, 2, 0x3E])))
    assert np.array_equal(p.order(2), generator.choice(3000, size=9000, p=weights / weights.sum()))
