"""Resumption: a state_dict taken after batch k resumes exactly at batch k+1, in a new loader.

Protects checkpoint/restart: the restored loader (even built with another seed or worker count)
yields the very tensors the original would have yielded next, augmentations included, and the
epoch after; a state taken after an epoch's last batch resumes at the start of the next epoch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from fastload import ConfigError, FastLoader
from fastload import transforms as T

AUGMENT = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]
BATCHES_PER_EPOCH = 5  # 24 images or 20 samples in batches of 5 / 4


class NoisyDataset(Dataset[tuple[int, torch.Tensor]]):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.rand(3) + float(np.random.randint(100))


def _make(mode: str, root: Path, num_workers: int, seed: int) -> FastLoader:
    if mode == "folder":
        return FastLoader(
            root, batch_size=5, shuffle=True, num_workers=num_workers, transform=AUGMENT, seed=seed
        )
    return FastLoader(NoisyDataset(), batch_size=4, shuffle=True, num_workers=num_workers, seed=seed)


def _clone(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in batch]


def _assert_batches_equal(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(g, w, strict=True))


@pytest.fixture(scope="module", params=["folder", "dataset"])
def original(request: pytest.FixtureRequest, image_folder: Path) -> dict[str, Any]:
    """Two epochs of an uninterrupted run and the state_dict after every batch of the first."""
    mode = request.param
    with _make(mode, image_folder, num_workers=2, seed=21) as loader:
        assert len(loader) == BATCHES_PER_EPOCH
        epoch0, states = [], []
        for batch in loader:
            epoch0.append(_clone(batch))
            states.append(loader.state_dict())
        epoch1 = [_clone(b) for b in loader]
    return {"mode": mode, "epoch0": epoch0, "epoch1": epoch1, "states": states}


@pytest.mark.parametrize(("save_workers", "restore_workers"), [(2, 2), (0, 0), (2, 0), (0, 3)])
@pytest.mark.parametrize("k", [1, 3])
def test_resume_mid_epoch(
    original: dict[str, Any], image_folder: Path, save_workers: int, restore_workers: int, k: int
) -> None:
    mode = original["mode"]
    # The state is taken from a loader with `save_workers`, mid-iteration.
    with _make(mode, image_folder, save_workers, seed=21) as saver:
        it = iter(saver)
        for _ in range(k):
            next(it)
        state = saver.state_dict()
    assert state == original["states"][k - 1]
    # Built with another seed: the state carries the seed.
    with _make(mode, image_folder, restore_workers, seed=99) as restored:
        restored.load_state_dict(state)
        rest = [_clone(b) for b in restored]
        following = [_clone(b) for b in restored]
    _assert_batches_equal(rest, original["epoch0"][k:])
    _assert_batches_equal(following, original["epoch1"])


@pytest.mark.parametrize("restore_workers", [0, 2])
def test_resume_after_last_batch_starts_next_epoch(
    original: dict[str, Any], image_folder: Path, restore_workers: int
) -> None:
    state = original["states"][-1]
    with _make(original["mode"], image_folder, restore_workers, seed=99) as restored:
        restored.load_state_dict(state)
        _assert_batches_equal([_clone(b) for b in restored], original["epoch1"])


def test_state_survives_a_round_trip_through_torch_save(
    original: dict[str, Any], image_folder: Path, tmp_path: Path
) -> None:
    path = tmp_path / "loader.pt"
    torch.save(original["states"][1], path)
    with _make(original["mode"], image_folder, 1, seed=99) as restored:
        restored.load_state_dict(torch.load(path))
        _assert_batches_equal([_clone(b) for b in restored], original["epoch0"][2:])


def test_unknown_state_version_is_a_config_error() -> None:
    with FastLoader(NoisyDataset(), batch_size=4) as loader, pytest.raises(ConfigError, match="version"):
        loader.load_state_dict({"version": 999, "seed": 0, "epoch": 0, "batches_yielded": 0})
