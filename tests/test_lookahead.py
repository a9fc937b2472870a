"""No drain at epoch ends (NOTE [no drain] in `_loading.running.epoch`): once an epoch's batches are all
submitted, the loader decodes the next epoch's first batches; the next iteration takes them over
if it runs that epoch, and they change nothing about which batches it yields."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, SequentialSampler

from fastload import FastLoader
from fastload import transforms as T

pytestmark = pytest.mark.timeout(120)


class Numbers(Dataset[int]):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        return i


def _take(batches: Any) -> list[int]:
    """Every sample, one batch at a time, holding none (as a training loop does): slots come back."""
    return [i for batch in batches for i in batch.tolist()]


def _epochs(loader: FastLoader, epochs: list[int]) -> list[list[int]]:
    out = []
    for epoch in epochs:
        loader.set_epoch(epoch)
        out.append(_take(loader))
    return out


def _fresh(epoch: int, **kwargs: Any) -> list[int]:
    with FastLoader(Numbers(), **kwargs) as loader:
        loader.set_epoch(epoch)
        return _take(loader)


KWARGS: dict[str, Any] = {
    "batch_size": 4,
    "shuffle": True,
    "seed": 3,
    "num_workers": 2,
    "persistent_workers": True,
}


def test_the_next_epoch_is_decoding_before_its_iteration_starts() -> None:
    with FastLoader(Numbers(), **KWARGS) as loader:
        first = _take(loader)
        ahead = loader._runs.iterator._ahead  # type: ignore[union-attr]
        assert ahead is not None and ahead.epoch == 1, "nothing was submitted for the next epoch"
        assert len(ahead.batch_of_ticket) + len(ahead.ready) == loader._runs.pipeline.window.limit  # type: ignore[union-attr]
        time.sleep(0.2)
        it = iter(loader)  # epoch 1, as the loader counts: it takes them over
        assert it._lane.batch_of_ticket or it._lane.ready  # type: ignore[attr-defined]
        second = _take(it)
    assert sorted(first) == sorted(second) == list(range(40))
    assert second == _fresh(1, **KWARGS), "decoding ahead changed the next epoch's batches"


@pytest.mark.parametrize("then", [1, 7, 0])
def test_set_epoch_decides_and_what_was_decoded_for_another_epoch_is_dropped(then: int) -> None:
    with FastLoader(Numbers(), **KWARGS) as loader:
        (first,) = _epochs(loader, [0])
        (after,) = _epochs(loader, [then])
    assert after == _fresh(then, **KWARGS)
    assert first == _fresh(0, **KWARGS)


def test_a_resumed_position_is_not_taken_over_from_the_lookahead() -> None:
    with FastLoader(Numbers(), **KWARGS) as loader:
        _take(loader)  # epoch 0; epoch 1 decoded ahead from its first batch
        loader.load_state_dict({"version": 1, "seed": 3, "epoch": 1, "batches_yielded": 3})
        resumed = _take(loader)
    assert resumed == _fresh(1, **KWARGS)[12:]


def test_slots_come_back_when_the_lookahead_is_dropped() -> None:
    with FastLoader(Numbers(), **KWARGS) as loader:
        for epoch in (0, 5, 9, 2):  # never the epoch decoded ahead: every lookahead is dropped
            loader.set_epoch(epoch)
            assert len(_take(loader)) == 40
        ring = loader._runs.pipeline.ring  # type: ignore[union-attr]
        assert ring is not None and len(ring) <= loader._runs.pipeline.window.limit + 2  # type: ignore[union-attr]


def test_a_users_sampler_is_never_iterated_ahead() -> None:
    calls: list[int] = []

    class Counting(SequentialSampler):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            calls.append(1)
            return super().__iter__()

    with FastLoader(
        Numbers(), batch_size=4, sampler=Counting(Numbers()), num_workers=2, persistent_workers=True
    ) as loader:
        _take(loader)
        assert len(calls) == 1
        _take(loader)
        assert len(calls) == 2


def test_a_folder_loader_alternating_with_another_keeps_its_batches(image_folder: Path) -> None:
    kwargs: dict[str, Any] = {
        "batch_size": 5,
        "shuffle": True,
        "seed": 2,
        "transform": [T.Resize((16, 16))],
        "device": "cpu",
    }
    with (
        FastLoader(image_folder, num_workers=2, **kwargs) as train,
        FastLoader(
            image_folder, num_workers=1, batch_size=8, transform=[T.Resize((16, 16))], device="cpu"
        ) as val,
    ):
        got = []
        for epoch in range(3):
            train.set_epoch(epoch)
            got.append([b[0].clone() for b in train])
            assert sum(len(b[1]) for b in val) == 24  # the validation loop between two training epochs
    with FastLoader(image_folder, num_workers=0, **kwargs) as reference:
        for epoch in range(3):
            reference.set_epoch(epoch)
            expected = [b[0].clone() for b in reference]
            assert all(torch.equal(a, b) for a, b in zip(got[epoch], expected, strict=True))
