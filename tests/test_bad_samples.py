"""The bad-sample policy (NOTE [bad samples]): with on_error="raise" a broken file costs its batch;
with on_error="skip" every batch stays full, the stand-ins are the same for any worker count,
through a daemon and after a resume, each broken sample is named once and counted, and past
`max_skipped` the loader raises.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from daemon_helpers import RESIZE, DaemonProcess
from helpers import build_folder

from fastload import ConfigError, DatasetError, FastLoader, SampleError
from fastload._bad_samples import SkippedSample, replacement
from fastload._batch_counters import BatchCounters
from fastload._errors import WireError
from fastload._loading.jobs.executor import Done, Opaque
from fastload._loading.link import daemon_link
from fastload._loading.running import worker_link

pytestmark = pytest.mark.timeout(120)

KW: dict[str, Any] = {"batch_size": 4, "transform": RESIZE, "device": "cpu", "sample_ids": True}


@pytest.fixture(scope="module")
def broken_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    """18 images in 3 classes, 2 of them not images at all (one truncated JPEG, one text)."""
    root = build_folder(tmp_path_factory.mktemp("broken"), classes=3, per_class=6)
    first, second = sorted(root.glob("n00/*"))[2], sorted(root.glob("n02/*"))[4]
    first.write_bytes(first.read_bytes()[:200])  # a JPEG cut short in its header
    second.write_bytes(b"this is not an image at all" * 20)
    return root, {str(first), str(second)}


def _epoch(loader: FastLoader, epoch: int = 0) -> list[list[Any]]:
    loader.set_epoch(epoch)
    return [[t.clone() if isinstance(t, torch.Tensor) else t for t in batch] for batch in loader]


def _ids(batches: list[list[Any]]) -> list[int]:
    return [int(i) for batch in batches for i in batch[2].indices]


def _names(loader: FastLoader, ids: list[int]) -> set[str]:
    index = loader._assembly.index
    assert index is not None
    return {index.name(i) for i in ids}


def test_raise_loses_the_batch_and_names_the_file(broken_folder: tuple[Path, set[str]]) -> None:
    root, bad = broken_folder
    with FastLoader(root, num_workers=1, shuffle=False, **KW) as loader, pytest.raises(SampleError) as caught:
        _epoch(loader)
    assert any(Path(b).name in str(caught.value) for b in bad)


def test_skip_keeps_batches_full_and_every_good_sample(broken_folder: tuple[Path, set[str]]) -> None:
    root, bad = broken_folder
    with (
        warnings.catch_warnings(record=True) as caught,
        FastLoader(root, num_workers=2, shuffle=True, seed=5, on_error="skip", max_skipped=2, **KW) as loader,
    ):
        warnings.simplefilter("always")
        first, second = _epoch(loader, 0), _epoch(loader, 1)
        stats, skipped = loader.stats(), loader.skipped()
    for batches in (first, second):
        assert [len(b[1]) for b in batches] == [4, 4, 4, 4, 2]  # 18 samples: full batches, none lost
        held = _names(loader, _ids(batches))
        assert not held & bad  # no broken sample delivered
        assert held >= {str(p) for p in root.rglob("*.*")} - bad  # every good one delivered
        assert len(_ids(batches)) == 18
    named = [str(w.message) for w in caught if "on_error='skip'" in str(w.message)]
    assert len(named) == 2 and all(any(Path(b).name in m for m in named) for b in bad)  # once each
    # counted every time met: twice an epoch, and again where a stand-in drawn was the other one
    assert stats is not None and stats.skipped >= 4
    assert sorted(name for name, _ in skipped) == sorted(bad)
    # Why, in words (not "cannot identify image file <_io.BytesIO object at 0x...>"), in both reports.
    reasons = dict(skipped)
    truncated, text = sorted(bad, key=lambda name: "n02" in name)
    assert reasons[truncated] == "truncated JPEG: no end-of-image marker (200 bytes)"
    assert reasons[text] == "not an image: starts with b'this is ' (text?) (540 bytes)"
    assert all(any(reasons[b] in m for m in named if Path(b).name in m) for b in bad)


def test_labels_and_pixels_are_the_stand_ins(broken_folder: tuple[Path, set[str]]) -> None:
    """The row of a broken sample holds another sample whole: its pixels and its label."""
    root, _ = broken_folder
    with (
        warnings.catch_warnings(),
        FastLoader(root, num_workers=1, shuffle=False, on_error="skip", max_skipped=2, **KW) as skipping,
        FastLoader(root, num_workers=1, on_error="skip", max_skipped=2, **{**KW, "batch_size": 1}) as single,
    ):
        warnings.simplefilter("ignore")
        batches = _epoch(skipping)
        index = skipping._assembly.index
        assert index is not None
        for _, labels, ids in batches:
            for row, i in enumerate(ids.indices):
                assert int(labels[row]) == int(index.labels[int(i)])
        # a stand-in is decoded with its own draws: its pixels equal a plain load of it
        stand_in_rows = [(b, r) for b, (_, _, ids) in enumerate(batches) for r, i in enumerate(ids.indices)
                         if int(i) != b * 4 + r]
        assert len(stand_in_rows) == 2
        plain = {int(ids.indices[0]): images[0] for images, _, ids in _epoch(single)}
        for b, r in stand_in_rows:
            i = int(batches[b][2].indices[r])
            assert torch.equal(batches[b][0][r], plain[i])


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_the_same_stand_ins_for_any_worker_count(broken_folder: tuple[Path, set[str]], workers: int) -> None:
    root, _ = broken_folder
    kw = {**KW, "seed": 11, "shuffle": True, "on_error": "skip", "max_skipped": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FastLoader(root, num_workers=2, **kw) as reference:
            expected = _epoch(reference, 3)
        with FastLoader(root, num_workers=workers, **kw) as loader:
            got = _epoch(loader, 3)
    assert _ids(got) == _ids(expected)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_resume_gives_the_same_stand_ins(broken_folder: tuple[Path, set[str]]) -> None:
    root, _ = broken_folder
    kw = {**KW, "seed": 2, "shuffle": True, "on_error": "skip", "max_skipped": 2, "num_workers": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FastLoader(root, **kw) as whole:
            expected = _epoch(whole)
        with FastLoader(root, **kw) as first:
            iterator = iter(first)
            next(iterator), next(iterator)
            state = first.state_dict()
        with FastLoader(root, **kw) as resumed:
            resumed.load_state_dict(state)
            rest = [[t.clone() if isinstance(t, torch.Tensor) else t for t in b] for b in resumed]
    assert _ids(rest) == _ids(expected[2:])
    assert all(torch.equal(a[0], b[0]) for a, b in zip(rest, expected[2:], strict=True))


def test_a_daemon_gives_the_same_stand_ins(
    broken_folder: tuple[Path, set[str]], shared_daemon: DaemonProcess
) -> None:
    root, _ = broken_folder
    kw = {**KW, "seed": 4, "shuffle": True, "on_error": "skip", "max_skipped": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FastLoader(root, num_workers=1, **kw) as local:
            expected = _epoch(local)
        with FastLoader(root, daemon=shared_daemon.address, **kw) as served:
            got = _epoch(served)
            stats, skipped = served.stats(), served.skipped()
    assert _ids(got) == _ids(expected)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got, expected, strict=True))
    assert stats is not None and stats.skipped >= 2 and len(skipped) == 2


def test_past_max_skipped_it_raises(broken_folder: tuple[Path, set[str]]) -> None:
    root, _ = broken_folder
    with (
        warnings.catch_warnings(),
        FastLoader(root, num_workers=1, shuffle=False, on_error="skip", max_skipped=1, **KW) as loader,
    ):
        warnings.simplefilter("ignore")
        with pytest.raises(DatasetError, match=r"max_skipped=1.*fastload verify"):
            _epoch(loader)
    # 5% of 18 rounds up to one sample: two broken ones are too many by default
    with (
        warnings.catch_warnings(),
        FastLoader(root, num_workers=0, shuffle=False, on_error="skip", **KW) as by_default,
    ):
        warnings.simplefilter("ignore")
        with pytest.raises(DatasetError, match=r"0\.05 of 18 = 1"):
            _epoch(by_default)


class _Flaky(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """12 samples; those in `bad` raise, as a Dataset whose file is gone would."""

    def __init__(self, bad: set[int]) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if i in self.bad:
            raise FileNotFoundError(f"sample {i} is gone")
        return torch.full((2,), float(i)), i

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        return [self[i] for i in indices]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_s_failing_samples_get_stand_ins(workers: int) -> None:
    kw: dict[str, Any] = {"batch_size": 4, "num_workers": workers, "shuffle": True, "seed": 3}
    with FastLoader(_Flaky({5}), **kw) as loader, pytest.raises(SampleError, match="sample 5 is gone"):
        list(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with FastLoader(_Flaky({5, 7}), on_error="skip", max_skipped=2, **kw) as loader:
            batches = list(loader)
            stats, skipped = loader.stats(), loader.skipped()
    labels = [int(v) for _, y in batches for v in y]
    assert [len(y) for _, y in batches] == [4, 4, 4]
    assert not {5, 7} & set(labels) and set(range(12)) - {5, 7} <= set(labels)
    assert stats is not None and stats.skipped >= 2
    assert sorted(why for _, why in skipped) == [f"FileNotFoundError: sample {i} is gone" for i in (5, 7)]
    assert sum("on_error='skip'" in str(w.message) for w in caught) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with FastLoader(_Flaky({5, 7}), on_error="skip", max_skipped=2, **{**kw, "num_workers": 1}) as other:
            assert [[int(v) for v in y] for _, y in other] == [[int(v) for v in y] for _, y in batches]


def test_a_dataset_s_opaque_batches_count_their_stand_ins() -> None:
    """A collate_fn sends batches pickled (the slow path): stand-ins are counted there too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw: dict[str, Any] = {"batch_size": 4, "num_workers": 1, "collate_fn": list}
        with FastLoader(_Flaky({1}), on_error="skip", max_skipped=1, **kw) as loader:
            batches = list(loader)
            stats = loader.stats()
    assert [len(b) for b in batches] == [4, 4, 4]
    assert 1 not in [label for batch in batches for _, label in batch]
    assert stats is not None and stats.skipped == 1


def test_refused_settings() -> None:
    with pytest.raises(ConfigError, match="on_error='ignore'"):
        FastLoader(_Flaky(set()), on_error="ignore")
    with pytest.raises(ConfigError, match="max_skipped"):
        FastLoader(_Flaky(set()), on_error="skip", max_skipped=-1)
    with pytest.raises(ConfigError, match=r"max_skipped=1\.5"):
        FastLoader(_Flaky(set()), on_error="skip", max_skipped=1.5)

    class Stream(torch.utils.data.IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(3))

    with pytest.raises(ConfigError, match="IterableDataset"):
        FastLoader(Stream(), on_error="skip")


def test_replacement_is_a_function_of_its_arguments_and_never_the_sample() -> None:
    draws = [replacement(7, 1, 10, attempt, 50) for attempt in range(2000)]
    assert draws == [replacement(7, 1, 10, attempt, 50) for attempt in range(2000)]
    assert 10 not in draws and set(draws) == set(range(50)) - {10}
    counts = np.bincount(draws, minlength=50)
    assert counts.max() < 3 * counts[counts > 0].mean()  # roughly uniform
    assert replacement(7, 2, 10, 0, 50) != replacement(7, 1, 10, 0, 50) or replacement(8, 1, 10, 0, 50) != (
        replacement(7, 1, 10, 0, 50)
    )
    with pytest.raises(DatasetError):
        replacement(0, 0, 0, 0, 1)


def test_skipped_samples_cross_both_wires() -> None:
    skipped = (SkippedSample(3, "a/b.jpg", "OSError: truncated", 1, 9), SkippedSample(9, "c.jpg", "x", 1, 4))
    done = Done(5, BatchCounters(4, 1, 2, 3, 4, 5, 6), skipped=skipped)
    assert worker_link.decode_event(worker_link.encode_event(done)) == done
    plain = Done(5, BatchCounters(4, 1, 2, 3, 4, 5, 6))
    assert worker_link.decode_event(worker_link.encode_event(plain)) == plain
    opaque = Opaque(5, [1, 2], 2, 7, skipped)
    assert worker_link.decode_event([bytes(f) for f in worker_link.encode_event(opaque)]) == opaque
    op, fields = daemon_link.event_message(done, 5)
    assert daemon_link.event_from_message(*daemon_link.decode(daemon_link.encode(op, **fields))) == done
    fields["skipped"] = [[1, "x"]]
    with pytest.raises(WireError, match="skipped"):
        daemon_link.event_from_message(*daemon_link.decode(daemon_link.encode(op, **fields)))
