"""Exactly once: over an epoch every sample is delivered once, whatever the configuration.

Protects the epoch plan, the reorder buffer and the ring: no sample lost or repeated for any
dataset size, batch size, worker count, drop_last and shuffle; batches in order and of the right
size; `len(loader)` equal to DataLoader's. Checked on a cheap Dataset (property test) and on an
image folder, where a sample is identified by its decoded pixels.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from fastload import FastLoader
from fastload import transforms as T


class IndexDataset(Dataset[tuple[np.int64, np.ndarray]]):
    """Sample i is (i, [i, i, i] as float32): cheap, and the payload is tied to the index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.int64, np.ndarray]:
        return np.int64(i), np.full(3, i, np.float32)


def _check_epoch(batches: list[list[torch.Tensor]], n: int, bs: int, drop_last: bool, shuffle: bool) -> None:
    expected_batches = n // bs if drop_last else -(-n // bs)
    assert len(batches) == expected_batches
    for k, (index, payload) in enumerate(batches):
        full = drop_last or k < expected_batches - 1
        assert len(index) == (bs if full else n - bs * (expected_batches - 1))
        assert index.dtype == torch.int64
        assert torch.equal(payload, index.to(torch.float32)[:, None].expand(-1, 3))
    seen = torch.cat([b[0] for b in batches]).tolist() if batches else []
    assert len(seen) == len(set(seen)), "a sample was delivered twice"
    assert set(seen) <= set(range(n))
    assert len(seen) == (n // bs * bs if drop_last else n)
    if not shuffle:
        assert seen == list(range(len(seen)))


# An epoch with no batch (drop_last, a batch larger than the data) is one of the cases: said by a
# SettingsWarning (tests/test_settings_sense.py), and run here like any other.
@pytest.mark.filterwarnings("ignore:batch_size=.*gives no batches")
# ~1 s an example (workers, two epochs); the tests below pin the edges.
@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(1, 60),
    bs=st.integers(1, 17),
    num_workers=st.sampled_from([0, 1, 2]),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_dataset_every_sample_exactly_once(
    n: int, bs: int, num_workers: int, drop_last: bool, shuffle: bool
) -> None:
    dataset = IndexDataset(n)
    reference = DataLoader(dataset, batch_size=bs, shuffle=shuffle, drop_last=drop_last)
    with FastLoader(
        dataset,
        batch_size=bs,
        shuffle=shuffle,
        drop_last=drop_last,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,  # the second epoch reuses the workers
        seed=n * 100 + bs,
    ) as loader:
        assert len(loader) == len(reference)
        epochs = [list(loader) for _ in range(2)]
    for batches in epochs:
        _check_epoch(batches, n, bs, drop_last, shuffle)
    if shuffle and n // bs >= 2:
        orders = [torch.cat([b[0] for b in batches]) for batches in epochs]
        assert not torch.equal(orders[0], orders[1]), "both epochs had the same order"


def _fingerprint(image: torch.Tensor) -> str:
    return hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest()


@pytest.mark.parametrize(
    ("bs", "num_workers", "drop_last"),
    [(5, 2, False), (7, 1, True), (24, 2, False), (4, 0, True)],
)
def test_folder_every_image_exactly_once(
    image_folder: Path, bs: int, num_workers: int, drop_last: bool
) -> None:
    # A deterministic transform makes each image's pixels its fingerprint.
    transform = [T.Resize((24, 24))]
    with FastLoader(image_folder, batch_size=1, num_workers=0, transform=transform, device="cpu") as plain:
        reference = [(_fingerprint(x[0]), int(y[0])) for x, y in plain]
    index_of = {fp: i for i, (fp, _) in enumerate(reference)}
    assert len(index_of) == len(reference) == 24, "test images must be distinct"

    with FastLoader(
        image_folder,
        batch_size=bs,
        shuffle=True,
        drop_last=drop_last,
        num_workers=num_workers,
        transform=transform,
        seed=7,
        device="cpu",  # the fingerprints are computed on the host
    ) as loader:
        assert len(loader) == len(DataLoader(IndexDataset(24), batch_size=bs, drop_last=drop_last))
        batches = list(loader)
    assert len(batches) == len(loader)
    seen = []
    for images, labels in batches:
        assert images.shape[1:] == (3, 24, 24)
        for image, label in zip(images, labels.tolist(), strict=True):
            i = index_of[_fingerprint(image)]
            assert label == reference[i][1]
            seen.append(i)
    assert len(seen) == len(set(seen))
    assert len(seen) == (24 // bs * bs if drop_last else 24)
