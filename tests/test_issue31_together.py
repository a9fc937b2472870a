"""Issue 31's pieces used together: each was built and tested alone (test_fields, test_views,
test_mix, test_samplers); a user combines them. Views under repeated augmentation give each repeat
its own views; a fields source takes a sampler; what is not built together is refused, saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fields_helpers import AUGMENT, FIELDS, assert_same_batches, epoch, write_field_shards

from fastload import ConfigError, FastLoader, samplers, sources
from fastload import transforms as T

VIEWS = T.Views([[T.RandomResizedCrop(16), T.RandomHorizontalFlip()]] * 2 + [[T.RandomResizedCrop(8)]])


@pytest.fixture(scope="module")
def field_shards(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("fields_together")
    write_field_shards(directory, image_folder)
    return str(directory / "train-{000000..000002}.tar")


def _views_epoch(
    root: Path, workers: int, **kwargs: Any
) -> list[tuple[list[torch.Tensor], torch.Tensor, Any]]:
    options: dict[str, Any] = {"batch_size": 6, "seed": 5, "device": "cpu", "sample_ids": True}
    options.update(kwargs)
    with FastLoader(root, transform=VIEWS, num_workers=workers, **options) as loader:
        return [([v.clone() for v in views], labels.clone(), ids) for views, labels, ids in loader]


def test_repeats_of_a_sample_get_their_own_views(image_folder: Path) -> None:
    """RepeatedAugmentation with Views: a sample's repeats in one epoch differ in every view (the
    repeat's key reaches each view's draws), and 0 and 2 workers give the same batches."""
    sampler = samplers.RepeatedAugmentation(3)
    runs = {n: _views_epoch(image_folder, n, sampler=sampler) for n in (0, 2)}
    for (va, la, _), (vb, lb, _) in zip(runs[0], runs[2], strict=True):
        assert torch.equal(la, lb)
        assert all(torch.equal(a, b) for a, b in zip(va, vb, strict=True))
    seen: dict[int, list[list[torch.Tensor]]] = {}
    for views, _, ids in runs[0]:
        for row, index in enumerate(ids.indices.tolist()):
            seen.setdefault(index, []).append([v[row] for v in views])
    repeated = [rows for rows in seen.values() if len(rows) > 1]
    assert repeated, "no sample was repeated within the epoch's rank"
    for rows in repeated:
        for v in range(len(VIEWS.views)):
            firsts = [r[v] for r in rows]
            assert not all(torch.equal(firsts[0], other) for other in firsts[1:]), f"view {v} repeated"


def test_a_fields_source_takes_a_weighted_sampler(field_shards: str) -> None:
    """Dict batches under a sampler: the same for 0 and 2 workers, drawn only where weight > 0."""
    weights = np.zeros(24)  # the folder's 24 samples, in 3 shards
    weights[:10] = 1.0
    sampler = samplers.Weighted(weights, num_samples=20)
    source = sources.TarShards(field_shards, fields=FIELDS)
    a = epoch(source, 0, sampler=sampler, shuffle=False, sample_ids=True)
    b = epoch(source, 2, sampler=sampler, shuffle=False, sample_ids=True)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["sample_ids"].indices, y["sample_ids"].indices)
    assert_same_batches(
        [{k: v for k, v in x.items() if k != "sample_ids"} for x in a],
        [{k: v for k, v in y.items() if k != "sample_ids"} for y in b],
    )
    drawn = torch.cat([x["sample_ids"].indices for x in a])
    assert len(drawn) == 20 and bool((drawn < 10).all())


def test_views_of_a_fields_source_are_refused(field_shards: str) -> None:
    with pytest.raises(ConfigError, match="Views of a source with declared fields"):
        FastLoader(
            sources.TarShards(field_shards, fields=FIELDS), transform=VIEWS, batch_size=4, device="cpu"
        )


def test_a_mix_takes_views_and_names_each_samples_source(image_folder: Path, field_shards: str) -> None:
    """A Mix of a folder and (label-only) shards under Views: [[views], labels, ids]; ids say the child."""
    mix = sources.Mix([str(image_folder), sources.TarShards(field_shards)], weights=[1, 1], epoch_size=12)
    with FastLoader(mix, transform=VIEWS, batch_size=6, seed=3, device="cpu", sample_ids=True) as loader:
        batches = list(loader)
    assert len(batches) == 2
    for views, labels, _ in batches:
        assert [tuple(v.shape) for v in views] == [(6, 3, 16, 16)] * 2 + [(6, 3, 8, 8)]
        assert labels.shape == (6,)
    children = torch.cat([ids.sources for _, _, ids in batches])
    assert sorted(children.tolist()) == [0] * 6 + [1] * 6


def test_a_mix_refuses_a_sampler(image_folder: Path) -> None:
    mix = sources.Mix([str(image_folder), str(image_folder)])
    with pytest.raises(ConfigError, match="sampler"):
        FastLoader(
            mix, transform=AUGMENT, batch_size=4, device="cpu", sampler=samplers.RepeatedAugmentation(2)
        )
