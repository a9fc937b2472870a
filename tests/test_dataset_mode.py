"""Dataset mode: a drop-in for torch.utils.data.DataLoader over map-style datasets.

Protects drop-in compatibility: the same batches as DataLoader (structure, types, dtypes,
values) on the shared-memory fast path and on the pickled slow path (strings, collate_fn); the
user's sampler and batch_sampler honoured; batches the user keeps (`list(loader)`, or after
close()) never overwritten; persistent_workers meaning what it means in DataLoader; and
argument errors that DataLoader rejects rejected as ConfigError, also a ValueError.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from fastload import ConfigError, FastLoader

WORKERS = [0, 2]


class Structured(Dataset[dict[str, Any]]):
    """Every kind of leaf default_collate handles, nested in dicts, tuples and lists."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "image": np.full((2, 3), i, np.float32),
            "meta": (i, i / 3, i % 2 == 0),  # int, float, bool
            "extra": [np.int16(i), torch.tensor([i, -i], dtype=torch.int32), np.float64(i) / 7],
            "mask": np.arange(4, dtype=np.uint8) + i,
        }


class Pairs(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((3,), float(i)), i


class Named(Dataset[tuple[np.ndarray, str]]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[np.ndarray, str]:
        return np.full(2, i, np.int64), f"sample-{i}"


def assert_same_batch(got: Any, want: Any, where: str = "batch") -> None:
    """Equal values, and the same containers, tensor dtypes and shapes as DataLoader's."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {type(got).__name__} is not a tensor"
        assert got.dtype == want.dtype, f"{where}: {got.dtype} != {want.dtype}"
        assert got.shape == want.shape, f"{where}: {tuple(got.shape)} != {tuple(want.shape)}"
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert type(got) is dict and list(got) == list(want), where
        for key in want:
            assert_same_batch(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), f"{where}: {type(got)} vs {type(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_batch(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def assert_same_batches(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same_batch(g, w, f"batch {k}")


@pytest.mark.parametrize("num_workers", WORKERS)
def test_same_batches_as_dataloader(num_workers: int) -> None:
    want = list(DataLoader(Structured(), batch_size=5))
    with FastLoader(Structured(), batch_size=5, num_workers=num_workers) as loader:
        assert len(loader) == len(want)
        got = list(loader)
    assert_same_batches(got, want)
    assert got[0]["meta"][0].dtype == torch.int64 and got[0]["meta"][1].dtype == torch.float64


@pytest.mark.parametrize("drop_last", [False, True])
def test_tensor_and_int_samples(drop_last: bool) -> None:
    want = list(DataLoader(Pairs(), batch_size=6, drop_last=drop_last))
    with FastLoader(Pairs(), batch_size=6, drop_last=drop_last, num_workers=1) as loader:
        assert_same_batches(list(loader), want)


class EveryThird(Sampler[int]):
    """A deterministic custom sampler: 2, 5, 8, ... then 0, 3, 6, ..."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        yield from range(2, self.n, 3)
        yield from range(0, self.n, 3)

    def __len__(self) -> int:
        return len(range(2, self.n, 3)) + len(range(0, self.n, 3))


@pytest.mark.parametrize("num_workers", WORKERS)
def test_custom_sampler_is_honoured(num_workers: int) -> None:
    sampler = EveryThird(40)
    want = list(DataLoader(Pairs(), batch_size=4, sampler=sampler))
    with FastLoader(Pairs(), batch_size=4, sampler=sampler, num_workers=num_workers) as loader:
        assert len(loader) == len(want)
        assert_same_batches(list(loader), want)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_batch_sampler_is_honoured(num_workers: int) -> None:
    batches = [[3, 1, 4], [15], [9, 2, 6, 5], [35, 8, 9], [0]]  # uneven sizes, a repeat
    want = list(DataLoader(Pairs(), batch_sampler=batches))
    with FastLoader(Pairs(), batch_sampler=batches, num_workers=num_workers) as loader:
        assert len(loader) == len(want)
        assert_same_batches(list(loader), want)


def test_random_sampler_with_generator_matches_dataloader() -> None:
    want = list(
        DataLoader(
            Pairs(),
            batch_size=8,
            sampler=torch.utils.data.RandomSampler(Pairs(), generator=torch.Generator().manual_seed(3)),
        )
    )
    sampler = torch.utils.data.RandomSampler(Pairs(), generator=torch.Generator().manual_seed(3))
    with FastLoader(Pairs(), batch_size=8, sampler=sampler, num_workers=2) as loader:
        assert_same_batches(list(loader), want)


def collate_as_dict(samples: list[tuple[torch.Tensor, int]]) -> dict[str, Any]:
    return {"x": torch.stack([s[0] for s in samples]) * 2, "ids": [s[1] for s in samples]}


@pytest.mark.parametrize("num_workers", WORKERS)
def test_collate_fn_gives_what_dataloader_gives(num_workers: int) -> None:
    want = list(DataLoader(Pairs(), batch_size=7, collate_fn=collate_as_dict))
    with FastLoader(Pairs(), batch_size=7, collate_fn=collate_as_dict, num_workers=num_workers) as loader:
        got = list(loader)
    assert_same_batches(got, want)
    assert got[0]["ids"] == [0, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_string_leaves_take_the_slow_path_and_work(num_workers: int) -> None:
    want = list(DataLoader(Named(), batch_size=4))
    with FastLoader(Named(), batch_size=4, num_workers=num_workers) as loader:
        got = list(loader)
    assert_same_batches(got, want)
    assert got[-1][1] == ("sample-8", "sample-9")  # default_collate leaves strings as they come


@pytest.mark.parametrize("num_workers", WORKERS)
def test_list_of_loader_keeps_every_batch_intact(num_workers: int) -> None:
    # 40 batches, far more than the ring's slots: batches held by the user must not be reused.
    with FastLoader(Pairs(80), batch_size=2, num_workers=num_workers) as loader:
        batches = list(loader)
        again = list(loader)  # a second epoch while the first is still held
    assert len(batches) == len(again) == 40
    for k, (x, i) in enumerate(batches):
        assert i.tolist() == [2 * k, 2 * k + 1]
        assert torch.equal(x, i.float()[:, None].expand(-1, 3))
    assert all(torch.equal(a[1], b[1]) for a, b in zip(batches, again, strict=True))
    assert len({b[0].data_ptr() for b in batches}) == 40, "two batches share memory"


def test_list_of_loader_does_not_collect_garbage_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Holding every batch makes the ring grow one slot per batch; a full gc.collect() each time
    # would make list(loader) take ~0.1 s per batch. A few collections in all are fine.
    collections: list[int] = []
    real_collect = gc.collect

    def counting_collect(generation: int = 2) -> int:
        collections.append(generation)
        return real_collect(generation)

    monkeypatch.setattr(gc, "collect", counting_collect)
    with FastLoader(Pairs(200), batch_size=1, num_workers=1) as loader:
        batches = list(loader)
    assert [int(b[1]) for b in batches] == list(range(200))
    assert len(collections) <= 8


@pytest.mark.parametrize("persistent_workers", [False, True])
def test_batches_stay_valid_after_close_and_new_epochs(persistent_workers: bool) -> None:
    with FastLoader(Pairs(), batch_size=4, num_workers=2, persistent_workers=persistent_workers) as loader:
        first = list(loader)
        second = list(loader)  # without persistent workers this restarts the pipeline
    for epoch in (first, second):
        for k, (x, i) in enumerate(epoch):
            assert i.tolist() == list(range(4 * k, 4 * k + 4))
            assert torch.equal(x[:, 0], i.float())


class Mutable(Dataset[int]):
    def __init__(self) -> None:
        self.offset = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i + self.offset


def test_persistent_workers_false_starts_fresh_workers_each_epoch() -> None:
    dataset = Mutable()
    with FastLoader(dataset, batch_size=4, num_workers=2, persistent_workers=False) as loader:
        first = torch.cat(list(loader)).tolist()
        pids = set(loader.worker_pids)
        dataset.offset = 100  # as with DataLoader: the next epoch's workers see the change
        second = torch.cat(list(loader)).tolist()
        assert not pids & set(loader.worker_pids)
    assert first == list(range(8))
    assert second == list(range(100, 108))


def test_persistent_workers_true_keeps_workers() -> None:
    dataset = Mutable()
    with FastLoader(dataset, batch_size=4, num_workers=2, persistent_workers=True) as loader:
        first = torch.cat(list(loader)).tolist()
        pids = set(loader.worker_pids)
        dataset.offset = 100  # the workers hold their own copy, as DataLoader's do
        second = torch.cat(list(loader)).tolist()
        assert set(loader.worker_pids) == pids
    assert first == second == list(range(8))


def test_breaking_out_of_an_epoch_then_iterating_again() -> None:
    with FastLoader(Pairs(), batch_size=4, num_workers=2, persistent_workers=True) as loader:
        for k, _ in enumerate(loader):
            if k == 2:
                break
        assert [b[1].tolist()[0] for b in loader] == list(range(0, 40, 4))


class Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_sampler": [[0, 1]], "batch_size": 2},
        {"batch_sampler": [[0, 1]], "shuffle": True},
        {"batch_sampler": [[0, 1]], "drop_last": True},
        {"batch_sampler": [[0, 1]], "sampler": [0, 1]},
        {"sampler": [0, 1], "shuffle": True},
        {"num_workers": -1},
        {"timeout": -1},
        {"num_workers": 0, "prefetch_factor": 2},
    ],
    ids=lambda kw: ",".join(kw),
)
def test_argument_errors_mirror_dataloader(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        DataLoader(Pairs(), **kwargs)
    with pytest.raises(ConfigError) as info:
        FastLoader(Pairs(), **kwargs)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": None}, "batch_size"),
        ({"transform": []}, "image folders"),
        ({"normalize": ((0.5,) * 3, (0.5,) * 3)}, "image folders"),
    ],
)
def test_fastload_specific_argument_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        FastLoader(Pairs(), **kwargs)


def test_an_iterable_dataset_refuses_shuffle_as_dataloader_does() -> None:
    # IterableDataset is served (tests/test_iterable.py); what DataLoader refuses with one is refused.
    with pytest.raises(ConfigError, match="IterableDataset"):
        FastLoader(Stream(), batch_size=2, shuffle=True)
