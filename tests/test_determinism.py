"""Determinism: batches depend only on (seed, epoch), never on the worker count or timing.

Protects the seeding scheme: random crops/flips in folder mode and the global random state
(torch, numpy, random) inside a Dataset's `__getitem__` give bit-identical batches for
num_workers 0..3; epochs differ from each other; `set_epoch(e)` reproduces epoch e; another
seed gives other batches; and with num_workers=0 the caller's random state is left untouched.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from fastload import FastLoader
from fastload import transforms as T

AUGMENT = [T.RandomResizedCrop(40), T.RandomHorizontalFlip()]
WORKER_COUNTS = (0, 1, 2, 3)
# Ten samples a batch: 2 and 3 workers split each batch into parts (NOTE [split batches]), whose
# draws must be those of one task.
DATASET_BATCH = 10


class RandomDataset(Dataset[dict[str, Any]]):
    """Samples drawn from the global random generators, as augmentations in __getitem__ are."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "index": i,
            "torch": torch.rand(4),
            "numpy": np.random.rand(3).astype(np.float32),
            "python": random.random(),
        }


def _folder_epochs(
    root: Path, num_workers: int, seed: int, epochs: int = 2
) -> list[list[list[torch.Tensor]]]:
    with FastLoader(
        root, batch_size=5, shuffle=True, num_workers=num_workers, transform=AUGMENT, seed=seed
    ) as loader:
        return [[[x.clone(), y.clone()] for x, y in loader] for _ in range(epochs)]


def _dataset_epochs(num_workers: int, seed: int, epochs: int = 2) -> list[list[dict[str, torch.Tensor]]]:
    with FastLoader(
        RandomDataset(), batch_size=DATASET_BATCH, shuffle=True, num_workers=num_workers, seed=seed
    ) as loader:
        return [[{k: v.clone() for k, v in b.items()} for b in loader] for _ in range(epochs)]


def _flatten(epoch: list[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for batch in epoch:
        out.extend(batch.values() if isinstance(batch, dict) else batch)
    return out


def assert_same(a: list[Any], b: list[Any]) -> None:
    ta, tb = _flatten(a), _flatten(b)
    assert len(ta) == len(tb)
    for x, y in zip(ta, tb, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y)


def assert_differ(a: list[Any], b: list[Any]) -> None:
    ta, tb = _flatten(a), _flatten(b)
    assert any(x.shape != y.shape or not torch.equal(x, y) for x, y in zip(ta, tb, strict=True))


@pytest.fixture(scope="module")
def folder_runs(image_folder: Path) -> dict[int, list[list[list[torch.Tensor]]]]:
    return {n: _folder_epochs(image_folder, n, seed=11) for n in WORKER_COUNTS}


@pytest.fixture(scope="module")
def dataset_runs() -> dict[int, list[list[dict[str, torch.Tensor]]]]:
    return {n: _dataset_epochs(n, seed=11) for n in WORKER_COUNTS}


@pytest.mark.parametrize("num_workers", WORKER_COUNTS[1:])
def test_folder_same_batches_for_any_worker_count(folder_runs: dict[int, Any], num_workers: int) -> None:
    for epoch in range(2):
        assert_same(folder_runs[0][epoch], folder_runs[num_workers][epoch])


@pytest.mark.parametrize("num_workers", WORKER_COUNTS[1:])
def test_dataset_same_batches_for_any_worker_count(dataset_runs: dict[int, Any], num_workers: int) -> None:
    for epoch in range(2):
        assert_same(dataset_runs[0][epoch], dataset_runs[num_workers][epoch])


def test_folder_epochs_differ(image_folder: Path, folder_runs: dict[int, Any]) -> None:
    assert_differ(folder_runs[0][0], folder_runs[0][1])
    # Not only the order: without shuffling, the same images get other crops in another epoch.
    with FastLoader(image_folder, batch_size=8, num_workers=0, transform=AUGMENT, seed=11) as loader:
        first, second = ([[x.clone(), y.clone()] for x, y in loader] for _ in range(2))
    for (x0, y0), (x1, y1) in zip(first, second, strict=True):
        assert torch.equal(y0, y1)
        assert not torch.equal(x0, x1)


def test_dataset_random_state_differs_between_batches_and_epochs(dataset_runs: dict[int, Any]) -> None:
    first, second = dataset_runs[0]
    assert_differ(first, second)
    draws = torch.cat([b["torch"] for b in first])
    assert len(torch.unique(draws)) == draws.numel(), "batches repeat the same random draws"
    python = torch.cat([b["python"] for b in first])
    assert python.dtype == torch.float64 and len(torch.unique(python)) == len(python)


def test_set_epoch_reproduces_that_epoch(image_folder: Path, folder_runs: dict[int, Any]) -> None:
    with FastLoader(
        image_folder, batch_size=5, shuffle=True, num_workers=2, transform=AUGMENT, seed=11
    ) as loader:
        loader.set_epoch(1)
        epoch1 = [[x.clone(), y.clone()] for x, y in loader]
        loader.set_epoch(0)
        epoch0 = [[x.clone(), y.clone()] for x, y in loader]
        again = [[x.clone(), y.clone()] for x, y in loader]  # no set_epoch: the next one, 1
    assert_same(epoch1, folder_runs[0][1])
    assert_same(epoch0, folder_runs[0][0])
    assert_same(again, folder_runs[0][1])


def test_dataset_set_epoch_reproduces_that_epoch(dataset_runs: dict[int, Any]) -> None:
    with FastLoader(
        RandomDataset(), batch_size=DATASET_BATCH, shuffle=True, num_workers=1, seed=11
    ) as loader:
        loader.set_epoch(1)
        epoch1 = [{k: v.clone() for k, v in b.items()} for b in loader]
    assert_same(epoch1, dataset_runs[0][1])


def test_other_seed_other_batches(
    image_folder: Path, folder_runs: dict[int, Any], dataset_runs: dict[int, Any]
) -> None:
    assert_differ(_folder_epochs(image_folder, 2, seed=12, epochs=1)[0], folder_runs[0][0])
    assert_differ(_dataset_epochs(0, seed=12, epochs=1)[0], dataset_runs[0][0])


def test_seed_from_generator_like_dataloader(image_folder: Path) -> None:
    # Without `seed`, the base seed is drawn from `generator` (as DataLoader draws its own).
    runs = []
    for _ in range(2):
        g = torch.Generator().manual_seed(5)
        with FastLoader(
            image_folder, batch_size=6, shuffle=True, num_workers=0, transform=AUGMENT, generator=g
        ) as loader:
            runs.append([[x.clone(), y.clone()] for x, y in loader])
    assert_same(runs[0], runs[1])


def test_inline_loading_leaves_callers_random_state_alone() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    with FastLoader(RandomDataset(), batch_size=4, shuffle=True, num_workers=0, seed=3) as loader:
        for _ in loader:
            pass
    after = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(after[0], expected[0])
    assert np.array_equal(after[1], expected[1])
    assert after[2] == expected[2]
