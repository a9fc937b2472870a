"""IterableDataset with DataLoader's semantics (NOTE [iterable streams]): each worker iterates its
own copy, `get_worker_info()` shards, batches come round-robin in DataLoader's order; plus what
DataLoader does not give: the same batches after a worker is killed, and a mid-epoch resume."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers import segfault_self
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from fastload import ConfigError, FastLoader, SampleError, WorkerError


class Shards(IterableDataset[Any]):
    """Sample i is (a row of i's, i, a random draw); each worker takes every num_workers-th."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n = n
        self.fail_at = fail_at

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(worker, self.n, workers):
            if i == self.fail_at:
                raise KeyError(f"sample {i} is missing")
            yield torch.full((3,), float(i)), i, torch.rand(())

    def __len__(self) -> int:
        return self.n


class Unsized(IterableDataset[Any]):
    def __iter__(self) -> Iterator[int]:
        yield from range(5)


def _ids(batches: list[Any]) -> list[list[int]]:
    return [b[1].tolist() for b in batches]


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 3 workers on 2 cores
@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize(("n", "drop_last"), [(23, False), (23, True), (2, False), (24, False)])
def test_batches_come_in_dataloaders_order(workers: int, n: int, drop_last: bool) -> None:
    # Streams of unequal length (and, with n=2 and 3 workers, an empty one) end at different rounds.
    expected = _ids(list(DataLoader(Shards(n), batch_size=4, num_workers=workers, drop_last=drop_last)))
    with FastLoader(Shards(n), batch_size=4, num_workers=workers, drop_last=drop_last) as loader:
        got = list(loader)
        assert len(loader) == len(DataLoader(Shards(n), batch_size=4, drop_last=drop_last))
    assert _ids(got) == expected
    rows = torch.cat([b[0] for b in got]) if got else torch.empty(0, 3)
    assert rows[:, 0].tolist() == [float(i) for batch in expected for i in batch]


def test_fixed_shape_samples_go_through_slots_and_others_are_collated() -> None:
    class Named(IterableDataset[Any]):
        def __iter__(self) -> Iterator[dict[str, Any]]:
            for i in range(6):
                yield {"name": f"s{i}", "x": torch.tensor([i])}

    with FastLoader(Named(), batch_size=4, num_workers=1) as loader:
        batches = list(loader)
    assert [b["name"] for b in batches] == [["s0", "s1", "s2", "s3"], ["s4", "s5"]]
    assert batches[1]["x"].tolist() == [[4], [5]]
    with FastLoader(Shards(8), batch_size=4, num_workers=2) as loader:
        it = iter(loader)
        next(it)
        assert loader._runs.pipeline is not None and loader._runs.pipeline.ring is not None  # the fast path


def test_random_draws_depend_on_seed_and_epoch_only() -> None:
    def draws(workers: int, seed: int) -> list[torch.Tensor]:
        with FastLoader(Shards(12), batch_size=4, num_workers=workers, seed=seed) as loader:
            return [torch.cat([b[2] for b in loader]) for _ in range(2)]

    first, again = draws(2, seed=5), draws(2, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], first[1]), "two epochs drew the same numbers"
    assert not torch.equal(first[0], draws(2, seed=6)[0])


def test_a_killed_worker_is_replaced_and_its_stream_replayed() -> None:
    with FastLoader(Shards(40), batch_size=2, num_workers=2, seed=3) as loader:
        expected = [(b[1].tolist(), b[2].tolist()) for b in loader]
        got, victim = [], -1
        for b, batch in enumerate(loader):
            got.append((batch[1].tolist(), batch[2].tolist()))
            if b == 3:
                victim = loader.worker_pids[0]
                os.kill(victim, signal.SIGKILL)
        assert victim not in loader.worker_pids and len(loader.worker_pids) == 2  # it was replaced
    # The next epoch draws other numbers; compare with a fresh loader's second epoch instead.
    with FastLoader(Shards(40), batch_size=2, num_workers=2, seed=3) as fresh:
        list(fresh)
        second = [(b[1].tolist(), b[2].tolist()) for b in fresh]
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    assert got == second


def test_resume_mid_epoch_continues_every_stream() -> None:
    with FastLoader(Shards(23), batch_size=3, num_workers=2, seed=9) as loader:
        whole = [(b[1].tolist(), b[2].tolist()) for b in loader]
    with FastLoader(Shards(23), batch_size=3, num_workers=2, seed=9) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = loader.state_dict()
    assert state["stream_batches"] == [2, 1]
    with FastLoader(Shards(23), batch_size=3, num_workers=2, seed=0) as resumed:
        resumed.load_state_dict(state)
        tail = [(b[1].tolist(), b[2].tolist()) for b in resumed]
    assert [(b[1].tolist(), b[2].tolist()) for b in head] + tail == whole


def test_an_error_in_the_stream_is_raised_with_its_type() -> None:
    loader = FastLoader(Shards(12, fail_at=5), batch_size=2, num_workers=2)
    with loader, pytest.raises(SampleError, match="sample 5 is missing") as caught:
        list(loader)
    assert isinstance(caught.value, KeyError)


def test_what_dataloader_refuses_is_refused() -> None:
    with pytest.raises(ConfigError, match="shuffle"):
        FastLoader(Shards(4), batch_size=2, shuffle=True)
    with pytest.raises(ConfigError, match="sampler"):
        FastLoader(Shards(4), batch_size=2, sampler=range(4))
    with FastLoader(Unsized(), batch_size=2) as loader, pytest.raises(TypeError, match="len"):
        len(loader)
    with FastLoader(Unsized(), batch_size=2) as loader:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4]]


class CrashesAt(IterableDataset[Any]):
    """Sample i of the worker's share; the worker process dies (SIGSEGV) when it reaches `crash`."""

    def __init__(self, n: int, crash: int) -> None:
        self.n, self.crash = n, crash

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        assert info is not None
        for i in range(info.id, self.n, info.num_workers):
            if i == self.crash:
                segfault_self()
            yield i


def test_a_stream_that_crashes_its_worker_ends_there() -> None:
    # Replayed, the crash comes back: after three workers, that batch raises WorkerError and its
    # stream ends (its later batches are not asked for); the other stream goes on to its end.
    got: list[list[int]] = []
    errors: list[Exception] = []
    with FastLoader(CrashesAt(20, crash=9), batch_size=2, num_workers=2) as loader:
        it = iter(loader)
        while True:
            try:
                got.append(next(it).tolist())
            except StopIteration:
                break
            except WorkerError as e:
                errors.append(e)
    assert len(errors) == 1 and "killed 3 worker processes" in str(errors[0])
    assert [b for b in got if b[0] % 2 == 0] == [[0, 2], [4, 6], [8, 10], [12, 14], [16, 18]]
    assert [b for b in got if b[0] % 2 == 1] == [[1, 3], [5, 7]]  # then 9 crashes its worker
