"""`sources.Mix`: several sources sampled in set proportions (NOTE [a mixture's epoch]).

The plan alone (`MixturePlan`): each child's share of an epoch exact, any stretch of the epoch
in proportion within sampling error (chi-square), each child drawn without replacement through
its own permutations across epochs, a pure function of (seed, epoch), ranks dealt equal counts
and disjoint samples. Then end to end through `FastLoader` over a folder, a pack and tar shards:
the same batches for 0 and 2 workers, exact and elastic resume, `sample_ids` naming each
sample's source, classes, reads routed to each child (and read ahead from a remote one), and
every refusal (targets of another kind, bad weights, a daemon, a block shuffle, ...).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import build_folder, write_tar_shards
from remote_helpers import range_http_server

from fastload import FastLoader
from fastload import transforms as T
from fastload._errors import ConfigError, DatasetError
from fastload._loading.order.mixture import MixturePlan
from fastload.sources import HDF5, FileList, ImageFolder, Mix, Packed, Source, TarShards, pack
from fastload.sources._formats.mix import shares
from fastload.sources._indexes.sample_index import ReadFailure, remote_reads

# chi-square critical values at p = 0.001: a deterministic seed either passes or fails for good,
# and a correct mixture fails one check in a thousand seeds.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27}


def _chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def _plan(sizes: list[int], weights: list[float], epoch_size: int, **kw: Any) -> MixturePlan:
    batch_size = kw.pop("batch_size", 10)
    options: dict[str, Any] = {"shuffle": True, "drop_last": False, "seed": 7}
    options.update(kw)
    return MixturePlan(sizes, shares(epoch_size, weights), batch_size, **options)


def _child_of(plan: MixturePlan, order: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.cumsum(plan.sizes), order, side="right")


# -- the plan --------------------------------------------------------------------------------


def test_shares_are_exact_counts_by_largest_remainder() -> None:
    assert shares(10, [0.5, 0.3, 0.2]) == (5, 3, 2)
    assert shares(10, [1, 1, 1]) == (4, 3, 3)  # the remainder to the earlier child on ties
    assert shares(7, [0.6, 0.25, 0.15]) == (4, 2, 1)  # quotas 4.2, 1.75, 1.05
    assert shares(3, [1, 0, 5]) == (1, 0, 2)  # quotas 0.5, 0, 2.5: a tie, to the earlier
    counts = shares(100_003, [0.123, 0.456, 0.421])
    assert sum(counts) == 100_003
    assert all(abs(c - 100_003 * w) < 1 for c, w in zip(counts, [0.123, 0.456, 0.421], strict=True))


def test_each_child_has_its_share_and_any_stretch_is_in_proportion() -> None:
    plan = _plan([1000, 300, 50], [0.5, 0.3, 0.2], 2000)
    weights = np.array([0.5, 0.3, 0.2])
    for epoch in range(4):
        children = _child_of(plan, plan.order(epoch))
        assert np.bincount(children, minlength=3).tolist() == [1000, 600, 400]
        for stretch in (children[:200], children[700:1300], children[-500:]):
            observed = np.bincount(stretch, minlength=3)
            assert _chi_square(observed, weights * len(stretch)) < CHI2_999[2], (epoch, observed)


def test_each_child_is_drawn_without_replacement_across_epochs() -> None:
    plan = _plan([1000, 300, 50], [0.5, 0.3, 0.2], 2000)
    starts = np.cumsum([0, 1000, 300])
    for epoch in range(3):
        order = plan.order(epoch)
        children = _child_of(plan, order)
        big, middle, small = (np.sort(order[children == k] - starts[k]) for k in range(3))
        assert big.tolist() == list(range(1000))  # a child whose share is its size: once each
        assert middle.tolist() == sorted(list(range(300)) * 2)  # cycles twice an epoch
        assert small.tolist() == sorted(list(range(50)) * 8)
    # A large child is not re-read until it is exhausted: 300 of 1000 an epoch.
    large = _plan([1000, 10], [0.5, 0.5], 600)
    epochs = [large.order(e)[large.order(e) < 1000] for e in range(4)]
    assert len(np.unique(np.concatenate(epochs[:3]))) == 900  # three epochs, no sample twice
    assert len(np.unique(np.concatenate(epochs))) == 1000  # the fourth ends the cycle, then begins the next


def test_the_order_is_a_pure_function_of_seed_and_epoch() -> None:
    plan = _plan([40, 25, 9], [0.2, 0.5, 0.3], 60)
    later_first = [plan.order(3), plan.order(0)]
    again = _plan([40, 25, 9], [0.2, 0.5, 0.3], 60)
    assert np.array_equal(later_first[0], again.order(3)) and np.array_equal(later_first[1], again.order(0))
    assert not np.array_equal(plan.order(0), plan.order(1))
    assert not np.array_equal(plan.order(0), _plan([40, 25, 9], [0.2, 0.5, 0.3], 60, seed=8).order(0))
    unshuffled = _plan([4, 2], [0.5, 0.5], 6, shuffle=False)  # storage order, evenly interleaved
    assert unshuffled.order(0).tolist() == [0, 4, 1, 5, 2, 4]
    assert unshuffled.order(1).tolist() == [3, 5, 0, 4, 1, 5]


@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_get_equal_counts_and_disjoint_samples(drop_last: bool) -> None:
    sizes, weights, epoch_size, world = [500, 300, 200], [0.4, 0.4, 0.2], 700, 3  # no child cycles
    ranks = [
        _plan(sizes, weights, epoch_size, drop_last=drop_last, rank=r, world_size=world) for r in range(world)
    ]
    one = _plan(sizes, weights, epoch_size)
    orders = [r.order(0) for r in ranks]  # epoch 0 is within every child's first cycle
    assert len({len(o) for o in orders}) == 1 and len({len(r) for r in ranks}) == 1
    assert len(orders[0]) == (233 if drop_last else 234)
    everything = np.concatenate(orders)
    if drop_last:
        assert len(np.unique(everything)) == len(everything)  # disjoint
        assert set(everything.tolist()) <= set(one.order(0).tolist())
    else:  # padded by repeating the epoch's start, as DistributedSampler does
        assert sorted(set(everything.tolist())) == sorted(one.order(0).tolist())
        assert len(everything) - len(np.unique(everything)) == 2


# -- end to end ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> list[Source]:
    """A folder (24), a pack of another folder (12) and tar shards of a third (9); one class list."""
    root = tmp_path_factory.mktemp("mix")
    folder = build_folder(root / "a", 3, 8, seed=1)
    packed = pack(build_folder(root / "b", 3, 4, seed=2), root / "b.pack", progress=False)
    shards = write_tar_shards(build_folder(root / "c", 3, 3, seed=3), root / "c.shards", per_shard=4)
    return [ImageFolder(str(folder)), packed, TarShards([str(s) for s in shards])]


def _mix(children: list[Source], **kw: Any) -> Mix:
    options: dict[str, Any] = {"weights": [0.5, 0.3, 0.2], "epoch_size": 40}
    options.update(kw)
    return Mix(children, **options)


def _loader(source: Source, workers: int, **kw: Any) -> FastLoader:
    options: dict[str, Any] = {
        "batch_size": 8,
        "shuffle": True,
        "seed": 5,
        "device": "cpu",
        "sample_ids": True,
        "transform": [T.RandomResizedCrop(16), T.RandomHorizontalFlip()],
    }
    options.update(kw)
    return FastLoader(source, num_workers=workers, **options)


def _batches(loader: FastLoader) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[int]]]:
    for images, labels, ids in loader:
        yield images.clone(), labels.clone(), ids.indices.tolist()


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) and torch.equal(u, v) and i == j for (x, u, i), (y, v, j) in zip(a, b, strict=True)
    )


def test_a_mix_gives_the_same_batches_for_0_and_2_workers(children: list[Source]) -> None:
    with _loader(_mix(children), 0) as inline, _loader(_mix(children), 2) as pooled:
        assert len(inline) == len(pooled) == 5
        for _ in range(2):  # two epochs: the children's streams go on
            assert _same(list(_batches(inline)), list(_batches(pooled)))


def test_sample_ids_name_each_samples_source(children: list[Source]) -> None:
    with _loader(_mix(children), 0) as loader:
        batches = list(loader)
    sources = torch.cat([ids.sources for _, _, ids in batches])
    assert torch.bincount(sources, minlength=3).tolist() == [20, 12, 8]  # the shares of 40
    ids = batches[0][2]
    starts = [0, 24, 36]
    for index, source, name in zip(ids.indices.tolist(), ids.sources.tolist(), ids.names or (), strict=True):
        assert starts[source] <= index < ([*starts[1:], 45])[source]
        assert name.startswith(f"{source}:")
        child_name = name.split(":", 1)[1]
        assert child_name == children[source].open().name(index - starts[source])


def test_a_mix_resumes_exactly_mid_epoch(children: list[Source]) -> None:
    with _loader(_mix(children), 2) as loader:
        list(_batches(loader))  # epoch 0
        reference = list(_batches(loader))  # epoch 1
    with _loader(_mix(children), 2) as loader:
        list(_batches(loader))
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        del it
    with _loader(_mix(children), 0, seed=99) as resumed:  # the state's seed wins
        resumed.load_state_dict(state)
        assert _same(list(_batches(resumed)), reference[2:])


def test_a_mix_resumes_under_another_batch_size(children: list[Source]) -> None:
    with _loader(_mix(children), 0, batch_size=4) as loader:
        list(_batches(loader))
        epoch1 = [i for _, _, ids in _batches(loader) for i in ids]
    with _loader(_mix(children), 0, batch_size=4) as loader:
        list(_batches(loader))
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()  # after 16 samples of epoch 1
        del it
    with _loader(_mix(children), 0, batch_size=8) as resumed:  # elastic: 16 is two batches of 8
        resumed.load_state_dict(state)
        assert [i for _, _, ids in _batches(resumed) for i in ids] == epoch1[16:]


def test_a_state_is_not_resumed_under_other_weights(children: list[Source]) -> None:
    with _loader(_mix(children), 0) as loader:
        next(iter(loader))
        state = loader.state_dict()
    other = _mix(children, weights=[0.2, 0.3, 0.5])
    with _loader(other, 0) as resumed, pytest.raises(ConfigError, match="mixture"):
        resumed.load_state_dict(state)


def test_a_mix_splits_its_epoch_between_ranks(children: list[Source]) -> None:
    seen = []
    for rank in range(3):
        with _loader(_mix(children, epoch_size=30), 0, rank=rank, world_size=3, batch_size=4) as loader:
            assert len(loader) == 3
            seen.append([i for _, _, ids in _batches(loader) for i in ids])
    assert [len(s) for s in seen] == [10, 10, 10]
    with _loader(_mix(children, epoch_size=30), 0, batch_size=4) as whole:
        everything = [i for _, _, ids in _batches(whole) for i in ids]
    assert sorted(i for rank in seen for i in rank) == sorted(everything)


def test_classes_are_the_childrens_when_they_agree(children: list[Source], tmp_path: Path) -> None:
    with _loader(_mix(children), 0) as loader:
        assert loader.classes == ("n00", "n01", "n02")
        assert len(loader.targets) == 45  # every child's samples, end to end
    other = ImageFolder(str(build_folder(tmp_path / "other", 2, 2, seed=4)))
    renamed = tmp_path / "other" / "n00"
    renamed.rename(tmp_path / "other" / "x")
    with _loader(Mix([children[0], other]), 0) as loader:
        assert loader.classes == () and loader.class_to_idx == {}


def test_default_weights_take_each_sample_once_an_epoch(children: list[Source]) -> None:
    with _loader(Mix(children), 0) as loader:
        ids = sorted(i for _, _, batch in _batches(loader) for i in batch)
    assert ids == list(range(45))


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"weights": [1, 2]}, "3 sources but 2 weights"),
        ({"weights": [1, -1, 1]}, "weight 1 must be a finite number >= 0"),
        ({"weights": [1, float("nan"), 1]}, "weight 1 must be a finite number"),
        ({"weights": [0, 0, 0]}, "weights are all 0"),
        ({"weights": [1, True, 1]}, "weight 1 must be"),
        ({"weights": "abc"}, "weights must be a list"),
        ({"epoch_size": 0}, "epoch_size must be an integer >= 1"),
    ],
)
def test_bad_weights_and_sizes_are_refused(children: list[Source], kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _mix(children, **kw)


def test_sources_that_cannot_mix_are_refused(children: list[Source], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs at least one source"):
        Mix([])
    with pytest.raises(ConfigError, match="source 1 is itself a Mix"):
        Mix([children[0], Mix(children)])
    with pytest.raises(ConfigError, match="list of sources"):
        Mix(children[0])  # type: ignore[arg-type]
    index = children[0].open()
    listing = tmp_path / "tags.tsv"
    listing.write_text("".join(f"{index.name(i)}\ta;b\n" for i in range(4)))
    with pytest.raises(DatasetError, match=r"Mix source 1 \(.*\) has multi-hot rows of 2 classes, source 0"):
        Mix([children[0], FileList(str(listing), multi_label=True)]).open()
    wider = tmp_path / "wider.tsv"
    wider.write_text("".join(f"{index.name(i)}\ta;b;c\n" for i in range(4)))
    two, three = FileList(str(listing), multi_label=True), FileList(str(wider), multi_label=True)
    with pytest.raises(DatasetError, match=r"multi-hot rows of 3 classes, source 0 .* multi-hot rows of 2"):
        Mix([two, three]).open()
    assert Mix([two, two]).open().labels.shape == (8, 2)
    h5py = pytest.importorskip("h5py")
    arrays = tmp_path / "arrays.h5"
    with h5py.File(arrays, "w") as f:
        f.create_dataset("x", data=np.zeros((4, 2, 2, 3), np.uint8))
    with pytest.raises(DatasetError, match=r"Mix source 1 .* holds arrays"):
        Mix([children[0], HDF5(str(arrays), data="x", labels=None)]).open()


def test_a_daemon_and_other_orders_are_refused(children: list[Source]) -> None:
    with pytest.raises(ConfigError, match="a daemon does not serve mix sources"):
        _loader(_mix(children), 0, daemon="ipc:///nowhere")
    for kw, name in (
        ({"shuffle_block": 4}, "shuffle_block"),
        ({"exclude": [0]}, "exclude"),
    ):
        with pytest.raises(ConfigError, match=f"a Mix orders its own epoch .* so {name} cannot apply"):
            _loader(_mix(children), 0, **kw)


def test_reads_are_routed_to_each_child_and_a_failure_names_its_place(
    children: list[Source], tmp_path: Path
) -> None:
    copy = ImageFolder(str(build_folder(tmp_path / "copy", 2, 3, seed=6)))
    index = Mix([children[1], copy]).open()
    batch = np.array([12 + 4, 3, 12 + 0, 11])
    blobs = index.read(batch)
    packed, folder = children[1].open(), copy.open()
    assert [bytes(b) for b in blobs] == [
        folder.read_sample(4),
        packed.read_sample(3),
        folder.read_sample(0),
        packed.read_sample(11),
    ]
    assert index.source_of(batch).tolist() == [1, 0, 1, 0]
    files = {f.path: f.what for f in index.files_read()}
    assert files[folder.path(2)] == "source 1: sample 2's file" and len(files) == 6 + 1  # a pack: 1 data file
    assert next(f.what for f in Mix([copy]).files_before_open()) == "source 0: its root"
    Path(folder.path(0)).unlink()
    with pytest.raises(ReadFailure) as failure:
        index.read(batch)
    assert failure.value.position == 2  # the batch's, not the child's group's


def test_a_mix_reads_ahead_through_its_remote_children(
    children: list[Source], image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))  # the default cache, this test's
    pack(image_folder, tmp_path / "served" / "pack", progress=False)
    assert remote_reads(Mix(children).open()) is None  # all local
    with range_http_server(tmp_path / "served") as base:
        remote = Packed(f"{base}/pack")
        index = Mix([children[0], remote]).open()
        alone = remote.open()
        assert remote_reads(index) is index and index.node_cache() is alone.node_cache()
        assert index.remote_bytes == alone.remote_bytes
        assert index.remote_chunk_count == alone.remote_chunk_count
        assert index.remote_chunks(np.arange(24)) == []  # the folder's samples
        assert index.remote_chunks(np.arange(24, 48)) == alone.remote_chunks(np.arange(24))
        with _loader(Mix([children[0], remote], weights=[1, 1], epoch_size=16), 0) as loader:
            sources_seen = torch.cat([ids.sources for _, _, ids in loader])
        assert torch.bincount(sources_seen).tolist() == [8, 8]


def test_a_child_with_declared_fields_is_refused(tmp_path: Path) -> None:
    """A Mix of sources with declared fields would drop the fields: refused, saying so."""
    with pytest.raises(ConfigError, match="declares fields"):
        Mix([TarShards(str(tmp_path / "a.tar"), fields={"image": "jpg"})])
