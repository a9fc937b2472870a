"""backend="nvjpeg" (`nvjpeg_decoder`, `crop_resize`) where no GPU is: the in-trainer executor's path
with the testing aid FASTLOAD_DALI_IN_TRAINER=1 (Pillow decodes, `crop_resize_reference` crops),
and the resampling weights against Pillow's own. Protects: Pillow's geometry and filters (the
same weights as the native decoder), the native backend's labels and order with pixels close to
its, the same batches for any number of read threads and after a `state_dict` resume, a PNG among
JPEGs, a corrupt file raising `SampleError` naming it, and the refusals (CPU batches, a daemon,
a worker). The GPU path itself (torchvision's nvJPEG, the Triton kernel): tests/gpu/test_gpu_nvjpeg.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from daemon_helpers import AUGMENT, assert_resumes_after_two, assert_same_batches, take
from helpers import epoch_outcomes

from fastload import ConfigError, FastLoader, SampleError
from fastload import transforms as T
from fastload._loading.decoding.backend import make_backend
from fastload._loading.decoding.crop_resize import axis_weights
from fastload._loading.running.dali_executor import DaliExecutor
from fastload.transforms import compile_transforms

pytestmark = pytest.mark.timeout(120)

KWARGS: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 7, "device": "cpu", "backend": "nvjpeg"}


@pytest.fixture
def in_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTLOAD_DALI_IN_TRAINER", "1")


def _loader(folder: Path, num_workers: int, **kwargs: Any) -> FastLoader:
    return FastLoader(folder, num_workers=num_workers, **{**KWARGS, "transform": AUGMENT, **kwargs})


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a.double() - b.double()).pow(2).mean().item()
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


@pytest.mark.parametrize("filter_name", ["box", "bilinear", "hamming", "bicubic", "lanczos"])
def test_weights_are_pillows(filter_name: str) -> None:
    """Pillow resizes float images ("F") with double weights and no rounding: the same arithmetic."""
    from PIL import Image

    rng = np.random.default_rng(3)
    pixels = rng.uniform(0, 255, (41, 57)).astype(np.float32)
    resample = getattr(Image.Resampling, filter_name.upper())
    for box, (out_w, out_h) in [((3.25, 1.5, 50.75, 39.0), (19, 13)), ((0, 0, 20.5, 9.25), (33, 27))]:
        image = Image.fromarray(pixels, "F")
        want = np.asarray(image.resize((out_w, out_h), resample, box=box, reducing_gap=None))
        wy = axis_weights(41, box[1], box[3], out_h, filter_name).numpy()
        wx = axis_weights(57, box[0], box[2], out_w, filter_name).numpy()
        np.testing.assert_allclose(wy @ pixels.astype(np.float64) @ wx.T, want, atol=2e-3)


def test_runs_in_the_trainer_with_the_native_backends_labels_and_pixels_close_to_its(
    image_folder: Path, in_trainer: None
) -> None:
    with _loader(image_folder, 2) as loader:
        got = take(loader)
        assert loader._runs.pipeline is not None and isinstance(loader._runs.pipeline.executor, DaliExecutor)
        assert loader.worker_pids == []
    with _loader(image_folder, 0, backend="native") as native:
        reference = take(native)
    assert len(got) == len(reference) > 0
    for (x, y), (xn, yn) in zip(got, reference, strict=True):
        assert x.shape == xn.shape and x.dtype == torch.uint8
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(y, yn)
    # Pillow (with the exact box) against libjpeg-turbo's DCT-scaled region decode: a few levels.
    assert _psnr(torch.cat([b[0] for b in got]), torch.cat([b[0] for b in reference])) > 28


def test_same_batches_for_any_threads_and_after_a_resume(image_folder: Path, in_trainer: None) -> None:
    with _loader(image_folder, 1) as loader:
        full = take(loader)
    with _loader(image_folder, 3) as loader:
        assert_same_batches(take(loader), full)
    assert_resumes_after_two(lambda **kw: _loader(image_folder, 2, **kw), full)


def test_a_corrupt_file_raises_sample_error_naming_it(
    make_folder: Callable[..., Path], in_trainer: None
) -> None:
    root = make_folder(classes=2, per_class=6)
    truncated = root / "n00" / "img_002.jpg"  # its header reads, its pixels do not
    truncated.write_bytes(truncated.read_bytes()[: len(truncated.read_bytes()) // 3])
    corrupt = root / "n01" / "img_004.jpg"  # its header cannot be read: refused before decoding
    corrupt.write_bytes(b"this is not a JPEG at all" * 20)
    kwargs: dict[str, Any] = {"batch_size": 3, "transform": [T.Resize((24, 24))], "shuffle": False}
    with _loader(root, 2, **kwargs) as loader:
        outcomes = epoch_outcomes(loader)
    assert [isinstance(o, SampleError) for o in outcomes] == [True, False, False, True]
    errors = [o for o in outcomes if isinstance(o, SampleError)]
    for error, path, index in ((errors[0], truncated, 2), (errors[1], corrupt, 10)):
        assert error.path == str(path) and str(path) in str(error)
        assert error.index == index


def test_refused_where_it_cannot_run(image_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FASTLOAD_DALI_IN_TRAINER", raising=False)
    with pytest.raises(ConfigError, match="device='cuda'"):
        _loader(image_folder, 1)  # CPU batches
    with pytest.raises(ConfigError, match="daemon"):
        _loader(image_folder, 1, daemon="ipc:///nowhere")
    with pytest.raises(ConfigError, match="worker processes cannot run it"):
        make_backend("nvjpeg", compile_transforms(AUGMENT))
