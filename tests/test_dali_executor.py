"""The in-process DALI executor (`dali_executor`), the path `backend="dali"` takes with CUDA, run
here on DALI's CPU operators (the testing aid FASTLOAD_DALI_IN_TRAINER=1). Protects what a user
moving to GPU decoding relies on: the same batches as the worker DALI path, bit for bit (the
same operators, the same geometry, the same trainer stages), with normalization, the pixel
stage, RandomErasing and MixUp; `state_dict` resume mid-epoch; lookahead into the next epoch,
and an epoch broken off and restarted; a corrupt file raising `SampleError` naming it, the
batches behind it still right; and a daemon keeps decoding in its own workers.
The `mixed` (nvJPEG) path itself is tested on a GPU: tests/gpu/test_gpu_dali.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from daemon_helpers import AUGMENT, assert_resumes_after_two, assert_same_batches, take
from helpers import epoch_outcomes, undefined_huffman_table

from fastload import ConfigError, FastLoader, SampleError
from fastload import transforms as T

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed: `pip install fastload[dali]`")

from fastload._loading.running.dali_executor import DaliExecutor
from fastload._loading.settings.spec import LoaderSpec

pytestmark = pytest.mark.timeout(120)

KWARGS: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 7, "device": "cpu", "backend": "dali"}
NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
FULL_CHAIN = [
    T.RandomResizedCrop(32, scale=(0.3, 1.0)),
    T.RandomHorizontalFlip(),
    T.ColorJitter(0.4, 0.4, 0.4),
    T.RandomErasing(p=0.5),
    T.MixUp(alpha=0.4, num_classes=3),
]


@pytest.fixture
def in_trainer(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Switch between the in-process executor and fastload's workers for the next loader made."""

    def use(on: bool) -> None:
        monkeypatch.setenv("FASTLOAD_DALI_IN_TRAINER", "1" if on else "0")

    return use


def _loader(folder: Path, num_workers: int, **kwargs: Any) -> FastLoader:
    return FastLoader(folder, num_workers=num_workers, **{**KWARGS, "transform": AUGMENT, **kwargs})



def test_uses_the_in_process_executor_and_no_worker_processes(
    image_folder: Path, in_trainer: Callable[[bool], None]
) -> None:
    in_trainer(True)
    with _loader(image_folder, 2) as loader:
        batches = take(loader)
        assert loader._runs.pipeline is not None
        assert isinstance(loader._runs.pipeline.executor, DaliExecutor)
        assert loader.worker_pids == []
        stats = loader.stats()  # what iostat reads: its batches are counted as any loader's
        assert stats is not None and stats.batches >= len(batches)  # (and any decoded ahead)
        assert stats.samples >= sum(len(labels) for _, labels in batches) and stats.decode_s > 0


@pytest.mark.parametrize(
    ("chain", "normalize"), [(AUGMENT, None), (FULL_CHAIN, NORMALIZE)], ids=["uint8", "normalized-mixup"]
)
def test_bit_identical_to_the_worker_dali_path(
    image_folder: Path, in_trainer: Callable[[bool], None], chain: list[Any], normalize: Any
) -> None:
    in_trainer(False)
    with _loader(image_folder, 2, transform=chain, normalize=normalize) as loader:
        workers = [take(loader), take(loader)]
    in_trainer(True)
    with _loader(image_folder, 2, transform=chain, normalize=normalize) as loader:
        here = [take(loader), take(loader)]
    for e in (0, 1):
        assert_same_batches(here[e], workers[e])
        for (x, y), (xw, _) in zip(here[e], workers[e], strict=True):
            assert x.stride() == xw.stride()  # channels_last, as the worker path delivers
            assert x.is_contiguous(memory_format=torch.channels_last)
            assert y.dtype == (torch.int64 if normalize is None else torch.float32)  # MixUp: soft
    assert not torch.equal(here[0][0][0], here[1][0][0]), "epochs 0 and 1 gave the same batch"


def test_state_dict_resume_mid_epoch_gives_the_rest_of_the_epoch(
    image_folder: Path, in_trainer: Callable[[bool], None]
) -> None:
    in_trainer(True)
    with _loader(image_folder, 1) as loader:
        full = take(loader)
    assert_resumes_after_two(lambda **kw: _loader(image_folder, 1, **kw), full)


def test_lookahead_and_an_epoch_broken_off_then_restarted(
    image_folder: Path, in_trainer: Callable[[bool], None]
) -> None:
    in_trainer(False)
    with _loader(image_folder, 2) as loader:
        expected = [take(loader), take(loader), take(loader)]
    in_trainer(True)
    with _loader(image_folder, 2, prefetch=3) as loader:
        first = take(loader)  # its tail decodes epoch 1's first batches ahead
        it = iter(loader)
        partial = [[t.clone() for t in next(it)]]  # epoch 1, broken off after one batch
        del it
        loader.set_epoch(1)
        again = take(loader)  # epoch 1 again, from its start
        third = take(loader)
    assert_same_batches(first, expected[0])
    assert_same_batches(partial, expected[1][:1])
    assert_same_batches(again, expected[1])
    assert_same_batches(third, expected[2])


def test_a_corrupt_file_raises_sample_error_naming_it_and_the_batches_behind_it_are_right(
    make_folder: Callable[..., Path], in_trainer: Callable[[bool], None]
) -> None:
    root = make_folder(classes=2, per_class=6)
    truncated = root / "n00" / "img_002.jpg"  # in batch 0: DALI names it (sample #2)
    truncated.write_bytes(undefined_huffman_table(truncated.read_bytes()))  # DALI's decoder refuses it
    corrupt = root / "n01" / "img_004.jpg"  # its header cannot be read: refused before DALI
    corrupt.write_bytes(b"this is not a JPEG at all" * 20)
    kwargs: dict[str, Any] = {"batch_size": 3, "transform": [T.Resize((24, 24))], "shuffle": False}
    in_trainer(True)
    with _loader(root, 1, prefetch=4, **kwargs) as loader:
        outcomes = epoch_outcomes(loader)
    errors = [o for o in outcomes if isinstance(o, SampleError)]
    assert [isinstance(o, SampleError) for o in outcomes] == [True, False, False, True]
    for error, path, index in ((errors[0], truncated, 2), (errors[1], corrupt, 10)):
        assert error.path == str(path) and str(path) in str(error)
        assert error.index == index
    # Why, as DALI's decoder logged it (to stderr, where the message alone would not say).
    assert "cannot decode this JPEG" in str(errors[0]), str(errors[0])
    assert "Huffman table 0x03 was not defined" in str(errors[0]), str(errors[0])
    # The batches queued behind the failed run were fed again to a fresh pipeline: the same
    # pixels as the worker path.
    in_trainer(False)
    with _loader(root, 1, **kwargs) as loader:
        it = iter(loader)
        with pytest.raises(SampleError):
            next(it)
        good = [[t.clone() for t in next(it)], [t.clone() for t in next(it)]]
    assert_same_batches(outcomes[1:3], good)


def test_a_daemon_keeps_decoding_in_its_own_workers(
    image_folder: Path, in_trainer: Callable[[bool], None]
) -> None:
    in_trainer(True)
    with _loader(image_folder, 1) as loader:
        spec: LoaderSpec = loader._assembly.spec
    assert spec.decodes_in_trainer
    assert not dataclasses.replace(spec, daemon="ipc:///nowhere").decodes_in_trainer
    assert not dataclasses.replace(spec, dali_in_trainer=False).decodes_in_trainer  # CPU: the workers


def test_a_file_that_cannot_be_read_raises_sample_error_naming_it(
    make_folder: Callable[..., Path], in_trainer: Callable[[bool], None]
) -> None:
    root = make_folder(classes=2, per_class=6)
    kwargs: dict[str, Any] = {"batch_size": 4, "transform": [T.Resize((24, 24))], "shuffle": False}
    in_trainer(True)
    with _loader(root, 3, **kwargs) as loader:  # 3 threads: a task's reads in three parts
        gone = next((root / "n01").glob("img_003.*"))  # sample 9: the second of batch 2's three reads
        gone.unlink()  # after the folder was indexed
        outcomes = epoch_outcomes(loader)
    assert [isinstance(o, SampleError) for o in outcomes] == [False, False, True]
    error = outcomes[2]
    assert error.path == str(gone) and error.index == 9
    assert "No such file" in str(error)


@pytest.mark.parametrize(
    "tuning",
    ["region=1,pipelined=0,queue_depth=1", "region=1", "region=0,queue_depth=3", "pipelined=0,threads=3"],
)
def test_every_pipeline_shape_gives_the_worker_paths_batches(
    image_folder: Path, in_trainer: Callable[[bool], None], monkeypatch: pytest.MonkeyPatch, tuning: str
) -> None:
    """The shapes bench_gpu_decode.py compares (NOTE [GPU decode tuning]) differ in speed only."""
    in_trainer(False)
    with _loader(image_folder, 2) as loader:
        expected = [take(loader), take(loader)]
    in_trainer(True)
    monkeypatch.setenv("FASTLOAD_DALI_TUNING", tuning)
    with _loader(image_folder, 2, prefetch=4) as loader:
        got = [take(loader), take(loader)]
    for e in (0, 1):
        assert_same_batches(got[e], expected[e])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("region=2x", "invalid literal"),
        ("depth=3", "no setting 'depth'"),
        ("queue_depth=0", "must be positive"),
    ],
)
def test_a_bad_tuning_is_refused_naming_it(text: str, problem: str) -> None:
    from fastload._loading.decoding.dali_tuning import DaliTuning

    with pytest.raises(ConfigError, match=problem):
        DaliTuning.parse(text)
    assert DaliTuning.parse(" region=1, hw_decoder_load=0.5 ") == DaliTuning(region=True, hw_decoder_load=0.5)
