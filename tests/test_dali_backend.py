"""`backend="dali"`: NVIDIA DALI's CPU operators behind the decode seam, in fastload's own workers.
Protects what a user switching backends relies on: the same batches' structure, labels and order
as the native backend, pixels close to its (bounds measured on the session's folder: JPEGs of
several sizes, portrait, grayscale and a PNG); the same batches, bit for bit, for any worker
count, through the daemon and after a mid-epoch `state_dict` resume; a corrupt file raises
`SampleError` naming it; a parent's inline pipeline never crashes a forked worker; and without
DALI, `backend="dali"` is refused at construction with the install command.
Skipped, saying so, where `nvidia.dali` cannot be imported (`pip install fastload[dali]`).
"""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from daemon_helpers import AUGMENT, DaemonProcess, assert_same_batches, take
from helpers import epoch_outcomes, split_outcomes, undefined_huffman_table, write_tar_shards

from fastload import ConfigError, FastLoader, SampleError, sources
from fastload import transforms as T
from fastload._loading.decoding import boxes
from fastload._loading.decoding.backend import SampleFailure, make_backend
from fastload._sample_random import sample_randoms
from fastload.transforms import compile_transforms

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed: `pip install fastload[dali]`")

from fastload._loading.decoding import dali as dali_backend

pytestmark = pytest.mark.timeout(120)  # a regression here tends to be a hang (NOTE [DALI pipelines
# and fork])

CHAINS = {
    "rrc-flip": [T.RandomResizedCrop(48), T.RandomHorizontalFlip()],
    "resize-centercrop": [T.Resize(56), T.CenterCrop(48)],
}
KWARGS: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 7, "device": "cpu"}
# Measured against the native backend on the session's folder (DALI 2.4, libjpeg-turbo in both):
# 54-55 dB over the whole epoch, >= 51 dB for the worst image, at most 19 levels on one value.
# The two decode at different scales (native: DCT-scaled ROI decode) and filter slightly
# differently, so pixels are close, not equal.
MIN_PSNR_DB = 45.0
MIN_IMAGE_PSNR_DB = 40.0
MAX_ABS_DIFF = 40


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def epoch(
    folder: Path | sources.Source, backend: str, num_workers: int, transform: list[Any], **kwargs: Any
) -> list[list[torch.Tensor]]:
    with FastLoader(
        folder, num_workers=num_workers, transform=transform, backend=backend, **{**KWARGS, **kwargs}
    ) as loader:
        return take(loader)


# ---------------------------------------------------------------------------------------------
# Same batches as the native backend, within the measured bounds


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_same_structure_labels_and_order_as_native_and_close_pixels(image_folder: Path, chain: str) -> None:
    native = epoch(image_folder, "native", 0, CHAINS[chain])
    dali = epoch(image_folder, "dali", 0, CHAINS[chain])
    assert len(dali) == len(native) == 5
    for (x, y), (xn, yn) in zip(dali, native, strict=True):
        assert x.shape == xn.shape and x.dtype == xn.dtype == torch.uint8
        assert x.stride() == xn.stride()  # channels_last, as the native backend delivers
        assert torch.equal(y, yn) and y.dtype == torch.int64
    images = torch.cat([b[0] for b in dali])
    reference = torch.cat([b[0] for b in native])
    assert psnr(images, reference) > MIN_PSNR_DB
    worst = min(psnr(images[i], reference[i]) for i in range(len(images)))
    assert worst > MIN_IMAGE_PSNR_DB, f"an image is {worst:.1f} dB from the native backend's"
    assert (images.int() - reference.int()).abs().max().item() <= MAX_ABS_DIFF


def test_normalized_float_batches(image_folder: Path) -> None:
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    (x, _), *_ = epoch(image_folder, "dali", 0, CHAINS["rrc-flip"], normalize=(mean, std))
    assert x.dtype == torch.float32 and x.shape == (5, 3, 48, 48)
    (raw, _), *_ = epoch(image_folder, "dali", 0, CHAINS["rrc-flip"])
    expected = (raw.float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    assert torch.allclose(x, expected, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Determinism: worker counts, epochs, resume, the daemon


def test_bit_identical_for_any_worker_count_and_epoch(image_folder: Path) -> None:
    # 24 samples in batches of 5, split across up to 3 workers: tasks of 1 to 5 rows, so each
    # worker's pipeline sees batches of several sizes (and grows for a larger one).
    runs: dict[int, list[list[list[torch.Tensor]]]] = {}
    for workers in (0, 1, 3):
        with FastLoader(
            image_folder, num_workers=workers, transform=CHAINS["rrc-flip"], backend="dali", **KWARGS
        ) as loader:
            runs[workers] = [take(loader), take(loader)]  # epochs 0 and 1
    for workers in (1, 3):
        for e in (0, 1):
            assert_same_batches(runs[workers][e], runs[0][e])
    assert not torch.equal(runs[0][0][0][0], runs[0][1][0][0]), "epochs 0 and 1 gave the same batch"


def test_every_source_of_encoded_images_gives_the_folders_batches(
    image_folder: Path, tmp_path: Path
) -> None:
    # DALI decodes what the source reads (views of merged reads for packed files and shards).
    shards = write_tar_shards(image_folder, tmp_path / "shards", per_shard=7)
    packed = sources.pack(image_folder, tmp_path / "packed", progress=False)
    expected = epoch(image_folder, "dali", 0, CHAINS["rrc-flip"])
    for source in (packed, sources.TarShards([str(s) for s in shards])):
        assert_same_batches(epoch(source, "dali", 2, CHAINS["rrc-flip"]), expected)


def test_spawned_workers_get_the_backend_by_pickle_and_the_same_batches(
    image_folder: Path, tmp_path: Path
) -> None:
    # spawn starts multiprocessing's resource tracker, which lives as long as its process: run
    # it in a process of its own (as test_dropin does).
    script = tmp_path / "spawned.py"
    script.write_text(_SPAWNED.format(tests=str(Path(__file__).parent), folder=str(image_folder)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["spawn", "same"]


_SPAWNED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    from daemon_helpers import assert_same_batches, take
    from fastload import FastLoader
    from test_dali_backend import CHAINS, KWARGS

    if __name__ == "__main__":
        kwargs = dict(transform=CHAINS["rrc-flip"], backend="dali", **KWARGS)
        with FastLoader({folder!r}, num_workers=0, **kwargs) as loader:
            local = take(loader)
        with FastLoader({folder!r}, num_workers=1, multiprocessing_context="spawn", **kwargs) as loader:
            spawned = take(loader)
            print(loader._runs.pipeline.executor._mp.get_start_method())
        assert_same_batches(spawned, local)
        print("same")
    """
)


def test_state_dict_resume_mid_epoch_gives_the_rest_of_the_epoch(image_folder: Path) -> None:
    full = epoch(image_folder, "dali", 2, CHAINS["rrc-flip"])
    with FastLoader(
        image_folder, num_workers=2, transform=CHAINS["rrc-flip"], backend="dali", **KWARGS
    ) as saver:
        it = iter(saver)
        next(it), next(it)
        state = saver.state_dict()
    with FastLoader(
        image_folder, num_workers=0, transform=CHAINS["rrc-flip"], backend="dali", **{**KWARGS, "seed": 99}
    ) as restored:
        restored.load_state_dict(state)
        rest = take(restored)
    assert_same_batches(rest, full[2:])


def test_through_the_daemon_equals_local(shared_daemon: DaemonProcess, image_folder: Path) -> None:
    local = epoch(image_folder, "dali", 0, AUGMENT)
    attached = epoch(image_folder, "dali", 2, AUGMENT, daemon=shared_daemon.address)
    assert_same_batches(attached, local)


# ---------------------------------------------------------------------------------------------
# Faults


def _collect(loader: FastLoader) -> tuple[list[torch.Tensor], list[SampleError]]:
    batches, errors = split_outcomes(epoch_outcomes(loader))
    return [labels for _, labels in batches], errors


@pytest.mark.parametrize("num_workers", [0, 2])
def test_corrupt_and_truncated_files_raise_sample_errors_naming_them(
    make_folder: Callable[..., Path], num_workers: int
) -> None:
    root = make_folder(classes=2, per_class=6)
    truncated = root / "n00" / "img_002.jpg"  # last of batch 0: DALI names it (its sample #2)
    truncated.write_bytes(undefined_huffman_table(truncated.read_bytes()))  # DALI's decoder refuses it
    corrupt = root / "n01" / "img_004.jpg"  # its header cannot be read: refused before DALI
    corrupt.write_bytes(b"this is not a JPEG at all" * 20)
    with FastLoader(
        root, batch_size=3, num_workers=num_workers, transform=[T.Resize((24, 24))], backend="dali",
        device="cpu",  # DALI's CPU decoder, in the workers: the messages asserted below are its own
    ) as loader:
        labels, errors = _collect(loader)
    assert [y.tolist() for y in labels] == [[0, 0, 0], [1, 1, 1]]  # iteration went on
    assert len(errors) == 2
    for error, path, index in ((errors[0], truncated, 2), (errors[1], corrupt, 10)):
        assert error.path == str(path) and str(path) in str(error)
        assert error.index == index
        assert "Traceback" in error.worker_traceback
    # Why, as DALI's decoder logged it (to stderr, where the message alone would not say).
    assert "cannot decode this JPEG" in str(errors[0]), str(errors[0])
    assert "Huffman table 0x03 was not defined" in str(errors[0]), str(errors[0])
    assert "not an image: starts with b'this is '" in str(errors[1]), str(errors[1])


@pytest.mark.parametrize("num_workers", [0, 1])
def test_broken_files_are_skipped_with_reasons_in_words_and_nothing_from_dali_on_stderr(
    make_folder: Callable[..., Path], capfd: pytest.CaptureFixture[str], num_workers: int
) -> None:
    root = make_folder(classes=2, per_class=6)
    cut, text, empty = (root / name for name in ("n00/img_002.jpg", "n01/img_004.jpg", "n01/img_005.jpg"))
    cut.write_bytes(cut.read_bytes()[:-300])
    text.write_bytes(b"hello world, not a picture\n" * 20)
    empty.write_bytes(b"")
    with (
        warnings.catch_warnings(),
        FastLoader(
            root, batch_size=3, num_workers=num_workers, transform=[T.Resize((24, 24))], backend="dali",
            device="cpu", on_error="skip", max_skipped=3,
        ) as loader,
    ):
        warnings.simplefilter("ignore")
        assert sum(len(y) for _, y in loader) == 12  # every batch full
        reasons = dict(loader.skipped())
    assert reasons[str(cut)].startswith("truncated JPEG: no end-of-image marker ("), reasons
    assert reasons[str(text)] == "not an image: starts with b'hello wo' (text?) (540 bytes)"
    assert reasons[str(empty)] == "empty file (0 bytes)"
    # DALI's own log lines ("[ERROR] ... Premature end of JPEG data") stay off the user's stderr.
    err = capfd.readouterr().err
    assert "[ERROR]" not in err and "JPEG" not in err, err


def test_a_failure_dali_does_not_place_is_found_sample_by_sample(
    image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    originals = [p.read_bytes() for p in sorted(image_folder.glob("n00/*.jpg"))[:4]]
    blobs = list(originals)
    blobs[2] = undefined_huffman_table(blobs[2])  # refused by DALI's decoder, not before it
    monkeypatch.setattr(dali_backend, "failed_position", lambda message, n: None)
    backend = make_backend("dali", compile_transforms([T.Resize((24, 24))]))
    out = np.zeros((4, 24, 24, 3), np.uint8)
    with pytest.raises(SampleFailure) as info:
        backend.decode_batch(blobs, sample_randoms(0, 0, np.arange(4)), out)
    assert info.value.position == 2
    backend.decode_batch(originals, sample_randoms(0, 0, np.arange(4)), out)  # a fresh pipeline works
    assert out.any(axis=(1, 2, 3)).all()


def test_a_parents_inline_pipeline_never_crashes_a_forked_worker(image_folder: Path) -> None:
    """NOTE [DALI pipelines and fork]: a pipeline the trainer used inline, left in a reference
    cycle, is garbage the workers' collector finds; freeing it there would join threads the fork
    did not copy (a hang, then SIGSEGV)."""
    gc.disable()  # the cycle must still be there when the workers are forked
    try:
        backend = make_backend("dali", compile_transforms([T.Resize((24, 24))]))
        blob = next(image_folder.glob("n00/*.jpg")).read_bytes()
        backend.decode_batch([blob], sample_randoms(0, 0, np.arange(1)), np.zeros((1, 24, 24, 3), np.uint8))
        cycle: list[Any] = [backend]
        cycle.append(cycle)
        del backend, cycle
        local = epoch(image_folder, "dali", 0, AUGMENT)
        with FastLoader(
            image_folder, num_workers=2, transform=AUGMENT, backend="dali", hang_timeout=20,
            worker_init_fn=lambda worker_id: gc.collect(), **KWARGS,
        ) as loader:
            assert_same_batches(take(loader), local)
    finally:
        gc.enable()
        gc.collect()


# ---------------------------------------------------------------------------------------------
# Configuration


def test_without_dali_the_loader_is_refused_at_construction_with_the_install_command(
    image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # `import nvidia.dali` raises ImportError
    monkeypatch.delitem(sys.modules, "fastload._loading.decoding.dali")
    with pytest.raises(ConfigError, match=r"pip install fastload\[dali\]") as info:
        FastLoader(
            image_folder, batch_size=4, num_workers=2, transform=[T.Resize((24, 24))], backend="dali",
            device="cpu",
        )
    assert "nvidia-dali-cuda120" in str(info.value)


def test_an_unknown_backend_is_refused_at_construction(image_folder: Path) -> None:
    with pytest.raises(ConfigError, match="'native', 'pil', 'dali', 'nvjpeg'"):
        FastLoader(image_folder, batch_size=4, transform=[T.Resize((24, 24))], backend="opencv")
    with pytest.raises(ConfigError, match="backend must be one of"):
        FastLoader(
            image_folder, batch_size=4, transform=[T.Resize((24, 24))], backend="opencv", daemon="default"
        )


def test_filters_dali_does_not_have_are_refused(image_folder: Path) -> None:
    with pytest.raises(ConfigError, match="DALI backend has no 'box' filter"):
        FastLoader(
            image_folder, batch_size=4, transform=[T.Resize((24, 24), interpolation="box")], backend="dali",
            device="cpu", num_workers=0,
        )


@pytest.mark.parametrize(
    "chain",
    [
        [T.RandomResizedCrop(64), T.RandomHorizontalFlip()],
        [T.Resize(80), T.CenterCrop(64)],
        [T.RandomHorizontalFlip(), T.Resize((48, 40))],
    ],
)
def test_a_tasks_slices_and_boxes_are_each_samples_own(chain: list[T.Transform]) -> None:
    """DALI's inputs drawn a batch at a time (NOTE [per-batch geometry]) are the per-sample
    walk's, sample for sample."""
    from fastload.transforms._batch_geometry import sample_batch

    plan = compile_transforms(chain)
    rng = np.random.default_rng(3)
    heights, widths = rng.integers(80, 2000, 300), rng.integers(80, 2000, 300)
    draws = sample_randoms(5, 1, rng.permutation(10_000)[:300])
    geometry = sample_batch(plan, heights, widths, draws.uniforms)
    assert geometry is not None
    batched = boxes.batch_slice_and_roi(geometry, heights, widths)
    for i in range(300):
        h, w = int(heights[i]), int(widths[i])
        one = boxes.slice_and_roi(plan.sample(h, w, draws[i]), h, w)
        assert np.array_equal(batched[i], one), i
