"""Crafted resume states (issue 29, item 8): `load_state_dict` validates every field before it
changes anything, and refuses what no loader could have saved with a ConfigError naming the
field and what is allowed; a state it accepts resumes exactly where an uninterrupted run is.

Attacks reproduced: `batches_yielded=-3` (6 batches of a 4-batch epoch, 8 samples repeated),
`world_size` -1 or -3 (samples repeated), `batches_yielded=-2**63` (a hang), a forged
`epoch_batches` that declares the epoch over (the rest of it skipped), an IterableDataset state
whose stream counts run far past the stream's end (a worker replaying empty batches for ever).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from fastload import ConfigError, FastLoader

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(60)]

N, BATCH = 16, 4  # a 4-batch epoch


class Ids(Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(10))


def _loader(**kwargs: Any) -> FastLoader:
    return FastLoader(Ids(), **{"batch_size": BATCH, "shuffle": True, "seed": 5, "num_workers": 0, **kwargs})


def _ids(loader: FastLoader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


def _state(batches: int = 1, **kwargs: Any) -> dict[str, Any]:
    with _loader(**kwargs) as saver:
        it = iter(saver)
        for _ in range(batches):
            next(it)
        return saver.state_dict()


def _refused(state: Any, field: str, **kwargs: Any) -> str:
    """The ConfigError `state` gets, which must name `field`; the loader's position is unchanged
    (its next epoch is still its first, whole)."""
    with _loader(**kwargs) as loader:
        with pytest.raises(ConfigError) as err:
            loader.load_state_dict(state)
        assert field in str(err.value), str(err.value)
        with _loader(**kwargs) as fresh:
            assert _ids(loader) == _ids(fresh)
    return str(err.value)


def test_a_negative_position_is_refused_not_replayed() -> None:
    """The attack: batches_yielded=-3 gave 6 batches of a 4-batch epoch, 8 samples twice."""
    message = _refused({**_state(), "batches_yielded": -3}, "batches_yielded")
    assert "0..4" in message


@pytest.mark.parametrize("world_size", [-1, -3, 0])
def test_a_world_size_below_one_is_refused(world_size: int) -> None:
    _refused({**_state(), "world_size": world_size}, "world_size")


def test_the_most_negative_position_is_refused_at_once() -> None:
    """batches_yielded=-2**63 hung for over 60 s (an endless run of empty batches)."""
    _refused({**_state(), "batches_yielded": -(2**63)}, "batches_yielded")


def test_a_forged_epoch_length_cannot_skip_the_rest_of_the_epoch() -> None:
    """epoch_batches=1 made a state after batch 1 look like the epoch's end: 3 batches skipped."""
    _refused({**_state(), "epoch_batches": 1}, "epoch_batches")


def test_samples_that_disagree_with_batches_are_refused() -> None:
    """Another world size converts from samples_yielded: one that does not match batches_yielded
    would resume elsewhere than the batch count says."""
    _refused({**_state(), "samples_yielded": 12}, "samples_yielded")


BAD_VALUES: list[tuple[str, Any]] = [
    ("version", True), ("version", 2.0), ("version", "2"),
    ("seed", -1), ("seed", 2.5), ("seed", None), ("seed", 2**200),
    ("epoch", -1), ("epoch", 2**63), ("epoch", math.nan), ("epoch", "0"), ("epoch", True),
    ("batches_yielded", 5), ("batches_yielded", 2**63), ("batches_yielded", 1.0), ("batches_yielded", None),
    ("batches_yielded", False), ("batches_yielded", [1]),
    ("epoch_batches", -4), ("epoch_batches", "4"), ("samples_yielded", -4), ("samples_yielded", 4.0),
    ("batch_size", 0), ("batch_size", -4), ("batch_size", True), ("batch_size", 2**63),
    ("rank", -1), ("rank", 1), ("rank", None), ("world_size", 2**63), ("world_size", 1.0),
    ("shuffle", 1), ("shuffle", None), ("drop_last", "no"), ("shuffle_block", 0), ("shuffle_block", True),
    ("shuffle_window", 0), ("shuffle_window", None),
    ("source", None), ("source", []), ("source", {"num_samples": "16"}), ("source", {"x": 1}),
    ("transforms", "RandomResizedCrop"), ("transforms", [1]), ("excluded", 7),
]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES, ids=[f"{f}={v!r}"[:40] for f, v in BAD_VALUES])
def test_each_field_out_of_its_range_or_type_is_refused_naming_it(field: str, value: Any) -> None:
    _refused({**_state(), field: value}, field)


def test_unknown_and_missing_keys_are_refused() -> None:
    state = _state()
    _refused({**state, "batches_yeilded": 2}, "batches_yeilded")
    for key in ("epoch", "seed", "batches_yielded", "source", "world_size"):
        _refused({k: v for k, v in state.items() if k != key}, key)
    _refused({"version": 1, "seed": 5, "epoch": 0}, "batches_yielded")


@pytest.mark.parametrize("state", [None, [], "state", 2, {1: 2}])
def test_a_state_that_is_not_a_dict_of_fields_is_refused(state: Any) -> None:
    with _loader() as loader, pytest.raises(ConfigError, match="state"):
        loader.load_state_dict(state)


def test_a_version_1_position_past_the_epoch_is_refused() -> None:
    _refused({"version": 1, "seed": 5, "epoch": 0, "batches_yielded": 5}, "batches_yielded")


def test_a_consistent_shifted_position_resumes_exactly_there() -> None:
    """A state moved to another batch (both counts together) is a position a run could have
    saved: it resumes at that batch, each remaining sample once."""
    with _loader() as full:
        everything = _ids(full)
    state = _state(1)
    for batches in (0, 2, 3):
        shifted = {**state, "batches_yielded": batches, "samples_yielded": batches * BATCH}
        with _loader() as restored:
            restored.load_state_dict(copy.deepcopy(shifted))
            assert _ids(restored) == everything[batches * BATCH :]


def test_a_stream_count_list_of_another_length_is_a_config_error() -> None:
    with FastLoader(Stream(), batch_size=3, num_workers=0, seed=5) as saver:
        next(iter(saver))
        state = saver.state_dict()
    with FastLoader(Stream(), batch_size=3, num_workers=0, seed=5) as restored:
        for counts in ([1, 1], [], [-1], [1.0], None, [True]):
            with pytest.raises(ConfigError, match="stream_batches"):
                restored.load_state_dict({**state, "stream_batches": counts})


@pytest.mark.parametrize("workers", [0, 1])
def test_stream_counts_past_the_streams_end_resume_at_its_end_at_once(workers: int) -> None:
    """A count within the state's own batches_yielded but far past the stream's end (10 samples,
    4 batches of 3) ends the stream at once: it does not replay a billion empty batches."""
    with FastLoader(Stream(), batch_size=3, num_workers=workers, seed=5) as saver:
        next(iter(saver))
        state = saver.state_dict()
    state = {**state, "batches_yielded": 10**9, "stream_batches": [10**9 - 1]}
    with FastLoader(Stream(), batch_size=3, num_workers=workers, seed=5) as restored:
        restored.load_state_dict(state)
        assert [torch.as_tensor(b).tolist() for b in restored] == []


class EpochStream(IterableDataset[int]):
    """Six numbers from the global random state, which fastload seeds per (seed, epoch, stream)."""

    def __iter__(self) -> Any:
        import numpy as np

        return iter([int(np.random.randint(1000)) for _ in range(6)])


def test_a_stream_state_saved_at_its_epochs_end_resumes_at_the_next_epoch() -> None:
    """It gave an empty epoch, then the saved epoch again (its samples and augmentations twice)."""
    with FastLoader(EpochStream(), batch_size=3, num_workers=0, seed=5) as saver:
        list(saver)
        state = saver.state_dict()
        following = [b.tolist() for b in saver]
    with FastLoader(EpochStream(), batch_size=3, num_workers=0, seed=5) as restored:
        restored.load_state_dict(state)
        assert [b.tolist() for b in restored] == []  # the rest of the saved epoch: nothing
        assert [b.tolist() for b in restored] == following


@pytest.mark.parametrize("seed", [-1, 2**128, True, 1.5, "3"])
def test_a_seed_out_of_range_is_refused_at_construction(seed: Any) -> None:
    """The seed's range is a resume state's (0..2**128-1): -1 failed at the first batch with
    numpy's words, True and 1.5 were taken as 1 and 1."""
    with pytest.raises(ConfigError, match=r"seed must be an integer 0\.\.2\*\*128-1"):
        _loader(seed=seed)


@pytest.mark.parametrize("epoch", [-1, 2**63, 2**62 + 1, True, 1.5])
def test_an_epoch_out_of_range_is_refused_by_set_epoch(epoch: Any) -> None:
    """-1 failed in the workers with numpy's words, 2**63 overflowed their int64."""
    said = r"set_epoch takes an integer epoch 0\.\.2\*\*62"
    with _loader() as loader, pytest.raises(ConfigError, match=said):
        loader.set_epoch(epoch)


def test_integer_seeds_and_epochs_of_numpy_and_torch_are_taken() -> None:
    import numpy as np

    with _loader(seed=np.int64(5)) as a, _loader(seed=5) as b:
        a.set_epoch(np.int64(3))
        b.set_epoch(torch.tensor(3))
        assert _ids(a) == _ids(b)
