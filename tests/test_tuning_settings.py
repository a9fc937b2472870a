"""NOTE [what is tuned] (`settings.auto`): which of the worker count and the batches in flight a
loader tunes, from what the user gave; numbers are obeyed; what cannot be tuned says so."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fastload import ConfigError, FastLoader, SettingsWarning
from fastload import transforms as T
from fastload._loading.settings.auto import resolve_tuning
from fastload._loading.settings.build import default_workers


def _spec(dataset: Any, **kw: Any) -> Any:
    if not isinstance(dataset, torch.utils.data.Dataset):
        kw.setdefault("transform", [T.RandomResizedCrop(32)])
    loader = FastLoader(dataset, batch_size=4, **kw)
    try:
        return loader._assembly.spec
    finally:
        loader.close()


class _Squares(torch.utils.data.Dataset[np.ndarray]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(3, i * i)


class _Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(8))


@pytest.mark.parametrize(
    ("kw", "workers", "window"),
    [
        ({}, True, True),  # neither given: a source tunes both
        ({"num_workers": "auto", "prefetch": "auto"}, True, True),
        ({"num_workers": 2}, False, False),  # a number given: as before, nothing tuned
        ({"prefetch": 4}, False, False),
        ({"num_workers": "auto", "prefetch": 4}, True, False),  # the number is obeyed
        ({"num_workers": 2, "prefetch": "auto"}, False, True),
        ({"num_workers": 2, "autotune": True}, False, True),
        ({"autotune": False}, False, False),
        ({"num_workers": "auto", "autotune": False}, False, False),
        ({"prefetch_factor": 2}, False, False),
    ],
)
def test_a_source_tunes_what_was_left_to_it(
    image_folder: Path, kw: dict[str, Any], workers: bool, window: bool
) -> None:
    spec = _spec(image_folder, **kw)
    assert (spec.tune_workers, spec.tune_in_flight) == (workers, window)
    if kw.get("num_workers") in (None, "auto"):
        assert spec.num_workers == default_workers()  # where a tuner starts: today's default
    if kw.get("prefetch") in (None, "auto") and "prefetch_factor" not in kw:
        assert spec.prefetch is None  # the ring plan derives the start


def test_a_dataset_keeps_dataloaders_default_unless_told_auto() -> None:
    spec = _spec(_Squares())
    assert (spec.num_workers, spec.tuned) == (0, False)
    spec = _spec(_Squares(), num_workers="auto")
    assert (spec.num_workers, spec.tune_workers, spec.tune_in_flight) == (default_workers(), True, True)


def test_an_iterable_dataset_tunes_only_its_window_and_says_so() -> None:
    with pytest.warns(SettingsWarning, match="IterableDataset: its worker count is not tuned"):
        spec = _spec(_Stream(), num_workers="auto")
    assert (spec.tune_workers, spec.tune_in_flight) == (False, True)


def test_nothing_is_tuned_without_workers_of_its_own(image_folder: Path) -> None:
    assert not _spec(image_folder, num_workers=0, prefetch="auto").tuned  # in this process


def test_autotune_with_nothing_left_to_tune_is_refused() -> None:
    with pytest.raises(ConfigError, match="autotune=True, but num_workers and prefetch are both numbers"):
        resolve_tuning(2, 4, None, True, is_source=True, iterable=False)


@pytest.mark.parametrize("bad", [{"num_workers": "many"}, {"prefetch": "lots"}, {"autotune": "yes"}])
def test_words_other_than_auto_are_refused(image_folder: Path, bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"'auto'|autotune must be"):
        FastLoader(image_folder, batch_size=4, **bad)


@pytest.mark.parametrize("priority", [0, -1.0, 0.001, 1000, float("inf"), float("nan"), True, "high"])
def test_priority_is_a_positive_weight(image_folder: Path, priority: Any) -> None:
    with pytest.raises(ConfigError, match="priority must be a number > 0"):
        FastLoader(image_folder, batch_size=4, priority=priority)


def test_priority_needs_a_daemon(image_folder: Path) -> None:
    with pytest.raises(ConfigError, match="priority= weighs a daemon session"):
        FastLoader(image_folder, batch_size=4, priority=0.5)


def test_no_warning_for_a_plain_auto_source(image_folder: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", SettingsWarning)
        _spec(image_folder, num_workers="auto")
