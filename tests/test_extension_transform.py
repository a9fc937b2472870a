"""A transform of one's own, declared with its kernel in this file alone (no fastload file edited),
loads through FastLoader like fastload's own: inline and with 2 workers, the same batches.

`PermuteChannels` is torchvision v2's `functional.permute_channels` applied with probability `p`
per sample (as a `RandomApply` of it would be): its declaration and its kernel are registered at
import, so a plain `import test_extension_transform` (a daemon's `--plugin`) declares them too.
Being declared, it is also checked by tests/test_transform_contract.py (collected after this file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from fastload import ConfigError, FastLoader
from fastload import transforms as T
from fastload._augment.ops import DeviceParams, Kernels, Params
from fastload._augment.registry import register_kernel
from fastload._demo import photo_like


@T.declare_transform(stage="pixels", kernel="PermuteChannels", example={"permutation": (2, 0, 1)})
@dataclass(frozen=True)
class PermuteChannels(T.Transform):
    """Reorder the channels: output channel i is input channel `permutation[i]`, with probability `p`."""

    permutation: tuple[int, ...] = (2, 1, 0)
    p: float = 1.0

    def __post_init__(self) -> None:
        if sorted(self.permutation) != [0, 1, 2]:
            raise ConfigError(f"PermuteChannels: permutation must order 0, 1 and 2, got {self.permutation!r}")
        if not 0.0 <= self.p <= 1.0:
            raise ConfigError(f"PermuteChannels: p must be a number in [0, 1], got {self.p!r}")
        object.__setattr__(self, "permutation", tuple(self.permutation))


class PermuteChannelsOp:
    """The kernel: the chosen samples (uniform < p) gathered, their channels reordered, put back."""

    draws = 1

    def __init__(self, t: PermuteChannels) -> None:
        self.t = t

    def params(self, u: np.ndarray) -> Params:
        chosen = np.flatnonzero(u[:, 0] < self.t.p).astype(np.int64)
        return {"index": chosen, "order": np.asarray(self.t.permutation, dtype=np.int64)}

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        permuted = x.index_select(0, p["index"]).index_select(1, p["order"])
        return x.index_copy_(0, p["index"], permuted)


def _make(t: PermuteChannels, _kernels: Kernels) -> PermuteChannelsOp:
    return PermuteChannelsOp(t)


register_kernel("PermuteChannels", _make)

SIZE = 24
COMMON = {"batch_size": 4, "shuffle": True, "seed": 5, "device": "cpu"}


@pytest.fixture(scope="module")
def jpeg_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes x 5 photo-like RGB JPEGs of a few sizes."""
    root = tmp_path_factory.mktemp("extension_folder")
    rng = np.random.default_rng(3)
    for c in range(2):
        (root / f"class{c}").mkdir()
        for i in range(5):
            photo_like(rng, 40 + 8 * i, 32 + 4 * c).save(root / f"class{c}" / f"img{i}.jpg", quality=90)
    return root


def _epoch(folder: Path, chain: list[T.Transform], workers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with FastLoader(folder, transform=chain, num_workers=workers, **COMMON) as loader:  # type: ignore[arg-type]
        return [(images.clone(), labels.clone()) for images, labels in loader]


GEOMETRY: list[T.Transform] = [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_declared_in_a_test_file_loads_with_its_kernel(jpeg_folder: Path, workers: int) -> None:
    # The reference: the same epoch without it (the geometry draws from its own stream), its
    # channels then reordered here.
    reference = _epoch(jpeg_folder, GEOMETRY, 0)
    permuted = _epoch(jpeg_folder, [*GEOMETRY, PermuteChannels((2, 0, 1))], workers)
    assert len(permuted) == len(reference) == 3
    for (images, labels), (expected, expected_labels) in zip(permuted, reference, strict=True):
        assert torch.equal(labels, expected_labels)
        assert torch.equal(images, expected[:, [2, 0, 1]])


def test_its_per_sample_draws_do_not_depend_on_the_workers(jpeg_folder: Path) -> None:
    chain = [*GEOMETRY, PermuteChannels((1, 2, 0), p=0.5)]
    inline, workers = _epoch(jpeg_folder, chain, 0), _epoch(jpeg_folder, chain, 2)
    reference = _epoch(jpeg_folder, GEOMETRY, 0)
    outcomes = []
    for (a, _), (b, _), (plain, _) in zip(inline, workers, reference, strict=True):
        assert torch.equal(a, b)
        for image, original in zip(a, plain, strict=True):
            swapped = torch.equal(image, original[[1, 2, 0]])
            assert swapped or torch.equal(image, original)
            outcomes.append(swapped)
    assert any(outcomes) and not all(outcomes)  # p=0.5 over 10 samples: both happen (seeded)


def test_it_crosses_json_as_fastloads_own_do() -> None:
    t = PermuteChannels((0, 2, 1), p=0.25)
    assert T.from_config(T.to_config([T.CenterCrop(8), t])) == (T.CenterCrop(8), t)
    with pytest.raises(ConfigError, match="permutation must order"):
        T.from_config([{"type": "PermuteChannels", "permutation": [0, 0, 1]}])
