"""`load_state_dict` never resumes silently wrong (issue 22, item 2).

A state records what its position depends on (batch size, rank and world size, seed, shuffle
settings, the source's fingerprint, the transform chain) and the position in samples. Another
batch size or world size converts where the position falls on a batch boundary of the new layout
(the same samples follow); a setting that changes which samples a position names is refused with
a ConfigError naming it, old -> new; the state's seed wins; version-1 states load as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fastload import ConfigError, FastLoader
from fastload import transforms as T

pytestmark = pytest.mark.hostile

AUGMENT = [T.RandomResizedCrop(16), T.RandomHorizontalFlip()]  # image_folder: 24 images


def _loader(root: Path, **kwargs: Any) -> FastLoader:
    args: dict[str, Any] = {
        "batch_size": 8, "shuffle": True, "seed": 21, "num_workers": 0, "transform": AUGMENT,
        "device": "cpu", "sample_ids": True, **kwargs,
    }
    return FastLoader(root, **args)


def _state_after(root: Path, batches: int, **kwargs: Any) -> dict[str, Any]:
    with _loader(root, **kwargs) as saver:
        it = iter(saver)
        for _ in range(batches):
            next(it)
        return saver.state_dict()


def _rest(loader: FastLoader) -> list[list[torch.Tensor]]:
    """The rest of the epoch: [images, labels, sample indices] per batch, copied."""
    return [[b[0].clone(), b[1].clone(), b[2].indices.clone()] for b in loader]


def _ids(batches: list[list[torch.Tensor]]) -> list[int]:
    return [int(i) for b in batches for i in b[2]]


def _assert_same(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(g, w, strict=True))


def test_state_records_what_the_position_depends_on(image_folder: Path) -> None:
    state = _state_after(image_folder, 2)
    assert state["version"] == 2 and state["batches_yielded"] == 2 and state["samples_yielded"] == 16
    assert (state["batch_size"], state["rank"], state["world_size"], state["seed"]) == (8, 0, 1, 21)
    assert (state["shuffle"], state["shuffle_block"], state["drop_last"]) == (True, None, False)
    assert state["source"]["num_samples"] == 24 and state["transforms"][0]["type"] == "RandomResizedCrop"


def test_another_batch_size_resumes_at_the_same_sample(image_folder: Path) -> None:
    with _loader(image_folder) as full:
        everything = _ids(_rest(full))
    state = _state_after(image_folder, 1)  # 8 samples in
    with _loader(image_folder, batch_size=4) as restored:
        restored.load_state_dict(state)
        rest = _rest(restored)
    assert _ids(rest) == everything[8:]
    with _loader(image_folder, batch_size=4) as fresh:  # pixels too: what a batch_size=4 run yields
        _assert_same(rest, _rest(fresh)[2:])


def test_a_batch_size_off_the_boundary_is_refused_naming_both(image_folder: Path) -> None:
    state = _state_after(image_folder, 1)  # 8 samples in
    with _loader(image_folder, batch_size=3) as restored, pytest.raises(ConfigError) as err:
        restored.load_state_dict(state)
    assert "batch_size: 8 -> 3" in str(err.value) and "[1, 2, 4, 8]" in str(err.value)


def test_a_finished_epoch_resumes_at_the_next_under_any_batch_size(image_folder: Path) -> None:
    state = _state_after(image_folder, 3)  # the whole epoch
    with _loader(image_folder, batch_size=5) as restored:
        restored.load_state_dict(state)
        rest = _rest(restored)
    with _loader(image_folder, batch_size=5) as fresh:
        fresh.set_epoch(1)
        _assert_same(rest, _rest(fresh))


@pytest.mark.parametrize(
    ("field", "changed"),
    [
        ("shuffle", {"shuffle": False}),
        ("shuffle_block", {"shuffle_block": 2}),
        ("drop_last", {"drop_last": True}),
    ],
)
def test_a_changed_setting_is_refused_naming_it(
    image_folder: Path, field: str, changed: dict[str, Any]
) -> None:
    state = _state_after(image_folder, 1)
    with _loader(image_folder, **changed) as restored, pytest.raises(ConfigError, match=f"{field}: ") as err:
        restored.load_state_dict(state)
    assert "->" in str(err.value) and "to resume" in str(err.value)


# Progressive resizing (FFCV's, fastai's) and a stronger augmentation for the next stage: the
# transforms change, the order does not.
NEXT_STAGES = [
    [T.RandomResizedCrop(20), T.RandomHorizontalFlip()],
    [T.RandomResizedCrop(16, scale=(0.5, 1.0)), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4)],
]


@pytest.mark.parametrize("stage", NEXT_STAGES)
@pytest.mark.parametrize("batches", [1, 3])  # mid-epoch, and the epoch over (3 batches of 8)
def test_new_transforms_resume_at_the_same_sample(image_folder: Path, stage: list[Any], batches: int) -> None:
    """Issue 28: a state was refused when only the transforms changed ("its position names other
    samples here"): they move no sample. The rest comes as a fresh loader of the new transforms
    gives it, from the state's position."""
    state = _state_after(image_folder, batches)
    with _loader(image_folder, transform=stage) as restored:
        restored.load_state_dict(state)
        rest = _rest(restored)
    with _loader(image_folder, transform=stage) as fresh:
        if batches == 3:
            fresh.set_epoch(1)
        _assert_same(rest, _rest(fresh)[batches % 3 :])


@pytest.mark.parametrize("changed", [{"shuffle": False}, {"drop_last": True}, {"shuffle_block": 2}])
def test_an_epoch_over_resumes_at_the_next_under_new_order_settings(
    image_folder: Path, changed: dict[str, Any]
) -> None:
    """At an epoch's end the next epoch starts afresh: its order settings are the new loader's."""
    state = _state_after(image_folder, 3)
    with _loader(image_folder, **changed) as restored:
        restored.load_state_dict(state)
        rest = _rest(restored)
    with _loader(image_folder, **changed) as fresh:
        fresh.set_epoch(1)
        _assert_same(rest, _rest(fresh))


def test_another_dataset_is_refused_even_at_an_epochs_end(
    image_folder: Path, make_folder: Callable[..., Path]
) -> None:
    other = make_folder(classes=4, per_class=6)
    state = _state_after(image_folder, 3)
    with _loader(other) as restored, pytest.raises(ConfigError, match="source: 24 samples"):
        restored.load_state_dict(state)


def test_another_dataset_is_refused(image_folder: Path, make_folder: Callable[..., Path]) -> None:
    other = make_folder(classes=4, per_class=6)  # 24 images too, other targets
    state = _state_after(image_folder, 1)
    with _loader(other) as restored, pytest.raises(ConfigError, match="source: 24 samples, targets") as err:
        restored.load_state_dict(state)
    assert state["source"]["targets"] in str(err.value)


def test_the_states_seed_wins(image_folder: Path) -> None:
    """The rule kept: a loader built with another seed goes on with the saved run's order."""
    with _loader(image_folder) as full:
        everything = _rest(full)
    state = _state_after(image_folder, 1)
    with _loader(image_folder, seed=99) as restored:
        restored.load_state_dict(state)
        assert restored.seed == 21
        _assert_same(_rest(restored), everything[1:])


def test_a_state_survives_json(image_folder: Path) -> None:
    state = json.loads(json.dumps(_state_after(image_folder, 1)))
    with _loader(image_folder) as restored:
        restored.load_state_dict(state)
        assert len(_rest(restored)) == 2


def test_a_version_1_state_loads_as_before(image_folder: Path) -> None:
    """{version, seed, epoch, batches_yielded}: a position in batches, unchecked."""
    with _loader(image_folder, batch_size=4) as full:
        everything = _rest(full)
    with _loader(image_folder, batch_size=4, seed=5) as restored:
        restored.load_state_dict({"version": 1, "seed": 21, "epoch": 0, "batches_yielded": 3})
        _assert_same(_rest(restored), everything[3:])


def _ranks(root: Path, world: int, batch_size: int, state: dict[str, Any] | None) -> list[list[int]]:
    """Each rank's remaining sample ids, resumed from `state` (None: from the start)."""
    out = []
    for rank in range(world):
        with _loader(root, batch_size=batch_size, rank=rank, world_size=world) as loader:
            if state is not None:
                loader.load_state_dict(state)
            out.append(_ids(_rest(loader)))
    return out


@pytest.mark.parametrize(
    ("world", "batch_size", "new_world", "new_batch"),
    [(2, 4, 1, 8), (1, 4, 2, 4), (2, 4, 4, 1), (1, 8, 2, 2)],
)
def test_another_world_size_deals_out_the_rest(
    image_folder: Path, world: int, batch_size: int, new_world: int, new_batch: int
) -> None:
    """Elastic resumption: after 8 samples of the epoch's order (any rank's state: ranks are in
    step), the new ranks together take the rest of that order, each sample once."""
    order = _ranks(image_folder, 1, 1, None)[0]  # the epoch's order (seed 21)
    steps = 8 // (batch_size * world)
    state = _state_after(image_folder, steps, batch_size=batch_size, rank=0, world_size=world)
    rest = _ranks(image_folder, new_world, new_batch, state)
    assert sorted(i for r in rest for i in r) == sorted(order[8:])
    fresh = _ranks(image_folder, new_world, 1, None)  # each new rank's whole epoch
    assert rest == [f[8 // new_world :] for f in fresh]


def test_another_ranks_state_resumes_at_its_step(image_folder: Path) -> None:
    state = _state_after(image_folder, 1, batch_size=4, rank=0, world_size=2)
    with _loader(image_folder, batch_size=4, rank=1, world_size=2) as full:
        everything = _ids(_rest(full))
    assert _ranks(image_folder, 2, 4, state)[1] == everything[4:]


def test_a_world_size_off_the_boundary_is_refused(image_folder: Path) -> None:
    state = _state_after(image_folder, 1, batch_size=4)  # 4 samples of the order
    restored = _loader(image_folder, batch_size=4, rank=0, world_size=2)
    with restored, pytest.raises(ConfigError) as err:
        restored.load_state_dict(state)
    assert "world_size: 1 -> 2" in str(err.value)
    assert "batch sizes that work with world_size=2: [1, 2]" in str(err.value)


def test_a_block_shuffle_does_not_convert(image_folder: Path) -> None:
    state = _state_after(image_folder, 1, batch_size=4, shuffle_block=2)
    with _loader(image_folder, batch_size=2, shuffle_block=2) as restored, pytest.raises(ConfigError) as err:
        restored.load_state_dict(state)
    assert "batch_size: 4 -> 2" in str(err.value) and "block shuffle" in str(err.value)
