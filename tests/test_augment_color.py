"""The batched photometric kernels and the colour transforms' operations (`fastload._augment.color`,
`color_ops`; `batching.apply_kernel`, `groups.apply_to`) against torchvision v2's functional
kernels, sample by sample.

Exactness (max abs difference 0, on photo-like, random, gray, low-range and constant images, NHWC
and NCHW batches, several parameters per batch): brightness, contrast, saturation, hue, sharpness,
grayscale, posterize, solarize, invert, autocontrast, equalize. (Hue, saturation and grayscale
were also checked offline over all 2^24 colours: no difference.) Gaussian blur is separable where
torchvision convolves in 2-D: at most 1 apart, on a fraction of values below 1e-3 (measured on
224x224 photo-like images, sigma in [0.1, 2]: 3e-6 of the values for 3x3, 2.4e-5 for 23x23).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from helpers import photo_like, torchvision_or_skip
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload._augment import batching, color, color_ops, groups
from fastload._augment.ops import to_device
from fastload._augment.program import SampleProgram
from fastload._augment.registry import sample_op
from fastload._sample_random import PIXELS_STREAM
from fastload.transforms import (
    ColorJitter,
    GaussianBlur,
    RandomAutocontrast,
    RandomEqualize,
    RandomGrayscale,
    RandomPosterize,
    RandomSolarize,
)

HEIGHT, WIDTH = 40, 57  # odd width: rows of 171 bytes, not a multiple of any machine word
LAYOUTS = ("channels_last", "contiguous")


def _image_set(height: int = HEIGHT, width: int = WIDTH, seed: int = 0) -> np.ndarray:
    """Eight (H, W, 3) uint8 images: 3 photo-like, 2 uniform random, a gray one (r = g = b), a
    low-range one (values 40..167, a constant blue channel) and a constant one."""
    rng = np.random.default_rng(seed)
    photos = [np.asarray(photo_like(rng, width, height)) for _ in range(3)]
    noise = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(2)]
    gray = np.repeat(np.asarray(photo_like(rng, width, height))[..., :1], 3, axis=2)
    low_range = photos[0] // 2 + 40
    low_range[..., 2] = 99
    constant = np.full((height, width, 3), 77, dtype=np.uint8)
    return np.stack([*photos, *noise, gray, low_range, constant])


def _batch(images: np.ndarray, layout: str) -> torch.Tensor:
    """(N, 3, H, W) uint8 from (N, H, W, 3): the NHWC memory permuted (as a slot), or contiguous."""
    x = torch.from_numpy(images.copy()).permute(0, 3, 1, 2)
    return x if layout == "channels_last" else x.contiguous()


def _reference(kernel: Callable[..., torch.Tensor], x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
    """torchvision's `kernel` on each sample of x with its own parameters (as Python numbers)."""
    return torch.stack([kernel(x[i], *(p[i].item() for p in params)) for i in range(x.shape[0])])


def _difference(ours: torch.Tensor, reference: torch.Tensor) -> tuple[int, float]:
    """(max abs difference, fraction of values that differ)."""
    diff = (ours.to(torch.int16) - reference.to(torch.int16)).abs()
    return int(diff.max()), float((diff > 0).float().mean())


def _factors(dtype: torch.dtype) -> torch.Tensor:
    """Eight blend factors: 0, 1, below, above, large (as ColorJitter draws them: float32; as the
    policies pass them: float64)."""
    return torch.tensor([0.0, 0.5, 1.0, 1.37, 2.0, 0.9, 3.3, 0.123], dtype=dtype)


def _functional() -> Any:
    """torchvision.transforms.v2.functional (the test is skipped without torchvision)."""
    torchvision_or_skip()
    import torchvision.transforms.v2.functional as F

    return F


Case = tuple[str, Callable[..., torch.Tensor], Callable[..., torch.Tensor], list[torch.Tensor]]
"""(name, our kernel, torchvision's, per-sample parameters)."""


def _exact_cases(F: Any) -> list[Case]:
    """Every kernel that equals torchvision's exactly, with eight per-sample parameters."""
    hue_shifts = torch.tensor([-0.5, -0.37, -0.1, 0.0, 0.05, 0.25, 0.4999, 0.5], dtype=torch.float32)
    bits = torch.tensor([0, 1, 2, 3, 4, 5, 7, 8], dtype=torch.int64)
    # 127.99999 and 128.000001 compare as 128.0 in float32, as torchvision compares them.
    thresholds = torch.tensor([0.0, 1.0, 64.5, 127.99999, 128.000001, 200.0, 254.5, 255.0]).double()
    cases = []
    for dtype in (torch.float32, torch.float64):
        factors = _factors(dtype)
        cases += [
            (f"brightness-{dtype}", color.adjust_brightness, F.adjust_brightness_image, [factors]),
            (f"contrast-{dtype}", color.adjust_contrast, F.adjust_contrast_image, [factors]),
            (f"saturation-{dtype}", color.adjust_saturation, F.adjust_saturation_image, [factors]),
            (f"sharpness-{dtype}", color.adjust_sharpness, F.adjust_sharpness_image, [factors]),
        ]
    return [
        *cases,
        ("hue", color.adjust_hue, F.adjust_hue_image, [hue_shifts]),
        ("grayscale", color.rgb_to_grayscale, lambda im: F.rgb_to_grayscale_image(im, 3), []),
        ("posterize", color.posterize, F.posterize_image, [bits]),
        ("solarize", color.solarize, F.solarize_image, [thresholds]),
        ("invert", color.invert, F.invert_image, []),
        ("autocontrast", color.autocontrast, F.autocontrast_image, []),
        ("equalize", color.equalize, F.equalize_image, []),
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernels_equal_torchvision_per_sample(layout: str) -> None:
    """Each kernel on a batch with eight per-sample parameters equals torchvision sample by sample,
    in the input's layout, leaving the input as it was."""
    F = _functional()
    x = _batch(_image_set(), layout)
    before = x.clone()
    for name, ours, theirs, params in _exact_cases(F):
        out = ours(x, *params)
        assert out.dtype == torch.uint8 and out.shape == x.shape, name
        assert out.stride() == x.stride(), f"{name}: the result is in the input's layout"
        biggest, fraction = _difference(out, _reference(theirs, x, *params))
        assert biggest == 0, f"{name}: max abs difference {biggest}, on {fraction:.2e} of the values"
        assert torch.equal(x, before), f"{name} modified its input"


def test_kernels_exact_on_all_values_of_a_channel() -> None:
    """65536 colours: every (r, g) pair, b a mix of both, so that every value occurs in every
    channel (the float paths, autocontrast's and equalize's tables see each)."""
    F = _functional()
    values = torch.arange(256)
    red, green = torch.meshgrid(values, values, indexing="ij")
    blue = (3 * red + 7 * green) % 256
    x = torch.stack([red, green, blue]).to(torch.uint8).unsqueeze(0).expand(8, 3, 256, 256)
    x = x.contiguous(memory_format=torch.channels_last)
    for name, ours, theirs, params in _exact_cases(F):
        biggest, fraction = _difference(ours(x, *params), _reference(theirs, x, *params))
        assert biggest == 0, f"{name}: max abs difference {biggest}, on {fraction:.2e} of the values"


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kernel_size", [(3, 3), (5, 9), (9, 5), (23, 23)])
def test_gaussian_blur_within_one_of_torchvision(layout: str, kernel_size: tuple[int, int]) -> None:
    """Separable: at most 1 apart from torchvision's 2-D convolution, on under 0.1% of the values."""
    F = _functional()
    x = _batch(_image_set(), layout)
    sigma = torch.tensor([0.1, 0.5, 1.0, 1.5, 2.0, 3.0, 0.3, 5.0], dtype=torch.float32)
    out = color.gaussian_blur(x, kernel_size, sigma)
    assert out.stride() == x.stride()
    reference = _reference(lambda im, s: F.gaussian_blur_image(im, list(kernel_size), [s, s]), x, sigma)
    biggest, fraction = _difference(out, reference)
    assert biggest <= 1 and fraction < 1e-3, f"max {biggest}, on {fraction:.2e} of the values"


def test_small_images() -> None:
    """Images of 2 pixels a side or fewer: sharpness leaves them be (as torchvision), the others work."""
    F = _functional()
    x = _batch(_image_set(2, 3), "channels_last")
    for name, ours, theirs, params in _exact_cases(F):
        assert torch.equal(ours(x, *params), _reference(theirs, x, *params)), name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_chunks_do_not_change_results(layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One sample per chunk (the smallest working set) gives the whole-batch result."""
    x = _batch(_image_set(), layout)
    factors, shifts = _factors(torch.float32), torch.linspace(-0.5, 0.5, 8)
    runs: list[Callable[[], torch.Tensor]] = [
        lambda: color.adjust_saturation(x, factors),
        lambda: color.adjust_contrast(x, factors),
        lambda: color.adjust_hue(x, shifts),
        lambda: color.adjust_sharpness(x, factors),
        lambda: color.equalize(x),
        lambda: color.autocontrast(x),
        lambda: color.gaussian_blur(x, (5, 5), factors + 0.1),
    ]
    whole = [run() for run in runs]
    monkeypatch.setattr(batching, "CPU_CHUNK_BYTES", 1)
    for run, expected in zip(runs, whole, strict=True):
        assert torch.equal(run(), expected)


# apply_to, apply_kernel: a kernel on a group of samples, in place


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("size", [(HEIGHT, WIDTH), (8, 8), (5, 7)])  # rows of int16, int64, bytes
def test_apply_to_and_apply_kernel_transform_only_the_group(layout: str, size: tuple[int, int]) -> None:
    """The group's samples become the kernel's result, the others stay, the layout stays."""
    x = _batch(_image_set(*size), layout)
    index = torch.tensor([1, 4, 5], dtype=torch.int64)
    factors = torch.tensor([0.3, 1.7, 0.8])
    expected = x.clone()
    expected[index] = color.adjust_saturation(x[index], factors)
    via_apply_to = groups.apply_to(x.clone(), index, lambda s: color.adjust_saturation(s, factors))
    via_apply_kernel = batching.apply_kernel(x.clone(), index, color.adjust_saturation, factors)
    assert torch.equal(via_apply_to, expected) and torch.equal(via_apply_kernel, expected)
    assert via_apply_kernel.stride() == x.stride()
    blurred = x.clone()
    blurred[index] = color.gaussian_blur(x[index], (3, 3), factors)
    via_constants = batching.apply_kernel(x.clone(), index, color.gaussian_blur, factors, kernel_size=(3, 3))
    assert torch.equal(via_constants, blurred)


def test_apply_to_edge_groups() -> None:
    """No sample, every sample, and a batch that is not dense (the fallback path)."""
    x = _batch(_image_set(), "channels_last")
    none, every = torch.zeros(0, dtype=torch.int64), torch.arange(x.shape[0])
    assert torch.equal(groups.apply_to(x.clone(), none, color.invert), x)
    assert torch.equal(batching.apply_kernel(x.clone(), none, color.invert), x)
    assert torch.equal(groups.apply_to(x.clone(), every, color.invert), color.invert(x))
    assert torch.equal(batching.apply_kernel(x.clone(), every, color.invert), color.invert(x))
    strided = torch.from_numpy(_image_set()).permute(0, 3, 1, 2)[:, :, ::2]  # not dense: the fallback
    expected = strided.clone()
    expected[1:3] = color.invert(strided[1:3])
    index = torch.tensor([1, 2])
    assert torch.equal(batching.apply_kernel(strided.clone(), index, color.invert), expected)
    assert torch.equal(groups.apply_to(strided.clone(), index, color.invert), expected)


# The transforms' operations


def _uniforms(n: int, draws: int, seed: int = 0) -> np.ndarray:
    """(n, draws) uniforms in [0, 1), as the loader gives an op."""
    return np.random.default_rng(seed).random((n, draws))


def _run(op: Any, x: torch.Tensor, u: np.ndarray) -> torch.Tensor:
    """The op's params from u, applied to a copy of x (as `SampleProgram.run`)."""
    return op.apply(x.clone(), to_device(op.params(u), x.device))


RANDOM_APPLY = [
    lambda p: RandomGrayscale(p=p),
    lambda p: RandomSolarize(threshold=128, p=p),
    lambda p: RandomPosterize(bits=3, p=p),
    lambda p: RandomAutocontrast(p=p),
    lambda p: RandomEqualize(p=p),
]


@pytest.mark.parametrize("make", RANDOM_APPLY)
def test_random_apply_ops(make: Callable[[float], Any]) -> None:
    """p = 0 changes nothing, p = 1 changes every sample, the same uniforms give the same batch,
    and a chosen sample gets exactly the kernel's result."""
    images = _image_set()[:6] // 2 + 40  # no sample already at full range (autocontrast) or gray
    images[..., 0] += np.arange(6, dtype=np.uint8)[:, None, None]
    x = _batch(images, "channels_last")
    u = _uniforms(6, 1)
    assert torch.equal(_run(sample_op(make(0.0)), x, u), x)
    everything = _run(sample_op(make(1.0)), x, u)
    assert all(not torch.equal(everything[i], x[i]) for i in range(6))
    op = sample_op(make(0.5))
    once, twice = _run(op, x, u), _run(op, x, u)
    assert torch.equal(once, twice)
    chosen = u[:, 0] < 0.5
    for i in range(6):
        assert torch.equal(once[i], everything[i] if chosen[i] else x[i])


@given(p=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=30, deadline=None)
def test_random_apply_picks_samples_below_p(p: float, seed: int) -> None:
    op = sample_op(RandomPosterize(bits=2, p=p))
    u = _uniforms(200, op.draws, seed)
    params = op.params(u)
    assert np.array_equal(params["index"], np.flatnonzero(u[:, 0] < p))
    assert params["bits"].dtype == np.int64 and (params["bits"] == 2).all()


JITTER_NAMES = ("brightness", "contrast", "saturation", "hue")  # torchvision's fn_idx order


def _range_or_none() -> st.SearchStrategy[Any]:
    """A brightness/contrast/saturation argument: None, a number or a (min, max) pair."""
    number = st.floats(0.0, 2.0)
    pair = st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 3.0)).map(lambda t: (min(t), max(t)))
    return st.one_of(st.none(), number, pair)


def _hue_or_none() -> st.SearchStrategy[Any]:
    """A hue argument: None, a number in [0, 0.5] or a pair within [-0.5, 0.5]."""
    pair = st.tuples(st.floats(-0.5, 0.5), st.floats(-0.5, 0.5)).map(lambda t: (min(t), max(t)))
    return st.one_of(st.none(), st.floats(0.0, 0.5), pair)


@given(
    brightness=_range_or_none(),
    contrast=_range_or_none(),
    saturation=_range_or_none(),
    hue=_hue_or_none(),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=60, deadline=None)
def test_color_jitter_params_follow_the_ranges(
    brightness: Any, contrast: Any, saturation: Any, hue: Any, seed: int
) -> None:
    """Factors within their ranges (float32), absent ones not drawn; the order a permutation per
    sample; per position, each operation's group is the samples with that operation there."""
    transform = ColorJitter(brightness, contrast, saturation, hue)
    op = sample_op(transform)
    u = _uniforms(64, op.draws, seed)
    params = op.params(u)
    order = params["order"]
    assert (np.sort(order, axis=1) == np.arange(4)).all()  # a permutation per sample
    for name, bounds in zip(JITTER_NAMES, transform.ranges(), strict=True):
        if bounds is None:
            assert name not in params
            continue
        factor = params[name]
        assert factor.dtype == np.float32
        assert (factor >= np.float32(bounds[0])).all() and (factor <= np.float32(bounds[1])).all()
        for position in range(4):
            index = params[f"index@{position}:{name}"]
            assert np.array_equal(index, np.flatnonzero(order[:, position] == JITTER_NAMES.index(name)))
            assert np.array_equal(params[f"{name}@{position}"], factor[index])


def test_color_jitter_order_varies_per_sample() -> None:
    """All 24 orders occur, each operation about equally often at each position."""
    op = sample_op(ColorJitter(0.4, 0.4, 0.4, 0.1))
    order = op.params(_uniforms(480, op.draws))["order"]
    permutations = {tuple(row) for row in order.tolist()}
    assert len(permutations) == 24
    for position in range(4):  # each operation about a quarter of the time at each position
        counts = np.bincount(order[:, position], minlength=4)
        assert (counts > 480 / 4 - 4 * np.sqrt(480 * 3 / 16)).all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_color_jitter_equals_torchvision_applied_in_the_drawn_order(layout: str) -> None:
    """The op's result is torchvision's four kernels applied per sample in its drawn order with its
    drawn factors, exactly; deterministic; a ColorJitter with nothing to do changes nothing."""
    F = _functional()
    kernels = (
        F.adjust_brightness_image,
        F.adjust_contrast_image,
        F.adjust_saturation_image,
        F.adjust_hue_image,
    )
    x = _batch(_image_set(), layout)
    op = sample_op(ColorJitter(0.4, (0.5, 1.5), 0.6, 0.2))
    u = _uniforms(x.shape[0], op.draws, seed=3)
    params = op.params(u)
    out = _run(op, x, u)
    for i in range(x.shape[0]):
        expected = x[i]
        for op_id in params["order"][i]:
            expected = kernels[op_id](expected, float(params[JITTER_NAMES[op_id]][i]))
        assert torch.equal(out[i], expected), f"sample {i}, order {params['order'][i]}"
    assert torch.equal(_run(op, x, u), out)  # the same uniforms, the same batch
    assert torch.equal(_run(sample_op(ColorJitter()), x, u), x)  # nothing to jitter


def test_gaussian_blur_op() -> None:
    """Sigma uniform in its range per sample; the result within 1 of torchvision's; deterministic."""
    F = _functional()
    x = _batch(_image_set(), "channels_last")
    op = sample_op(GaussianBlur(kernel_size=(5, 3), sigma=(0.5, 2.0)))
    u = _uniforms(x.shape[0], op.draws)
    params = op.params(u)
    sigma = params["sigma"]
    assert sigma.dtype == np.float32 and (sigma >= 0.5).all() and (sigma <= 2.0).all()
    out = _run(op, x, u)
    reference = torch.stack(
        [F.gaussian_blur_image(x[i], [5, 3], [float(s), float(s)]) for i, s in enumerate(sigma)]
    )
    biggest, fraction = _difference(out, reference)
    assert biggest <= 1 and fraction < 1e-3
    assert torch.equal(_run(op, x, u), out)


def test_all_seven_run_in_a_program() -> None:
    """The registry serves every colour transform; a stage of all seven is a function of (seed,
    epoch, index)."""
    chain = [
        ColorJitter(0.4, 0.4, 0.4, 0.1),
        RandomGrayscale(p=0.2),
        GaussianBlur(5),
        RandomSolarize(threshold=128, p=0.3),
        RandomPosterize(bits=4, p=0.3),
        RandomAutocontrast(p=0.3),
        RandomEqualize(p=0.3),
    ]
    program = SampleProgram(chain, PIXELS_STREAM)
    images = _image_set()
    indices = np.arange(100, 108)
    first = program.run(_batch(images, "channels_last"), seed=1, epoch=0, indices=indices)
    again = program.run(_batch(images, "channels_last"), seed=1, epoch=0, indices=indices)
    other_epoch = program.run(_batch(images, "channels_last"), seed=1, epoch=1, indices=indices)
    assert torch.equal(first, again) and not torch.equal(first, other_epoch)
    slot = images.copy()
    program.run_in_slot(slot, seed=1, epoch=0, indices=indices)
    assert np.array_equal(slot, first.permute(0, 2, 3, 1).numpy())


def test_histograms_without_bincount() -> None:
    """Equalize's histograms on a GPU (index_add_: bincount would synchronise) are bincount's."""
    values = torch.from_numpy(np.random.default_rng(0).integers(0, 768, 10_000).astype(np.int32))
    expected = torch.bincount(values, minlength=800)
    assert torch.equal(color._count_values_by_index_add(values, 800), expected)


def test_empty_batches_and_images() -> None:
    """No samples, or images without pixels: results of the same (empty) shape."""
    factors = torch.zeros(0)
    for shape in [(0, 3, 8, 8), (2, 3, 0, 5)]:
        x = torch.zeros(shape, dtype=torch.uint8)
        per_sample = factors if shape[0] == 0 else torch.ones(2)
        for kernel in (color.adjust_saturation, color.adjust_sharpness, color.adjust_hue):
            assert kernel(x, per_sample).shape == x.shape
        assert color.equalize(x).shape == x.shape and color.autocontrast(x).shape == x.shape


@pytest.mark.parametrize(
    "jitter",
    [
        ColorJitter(0.4, 0.4, 0.4),
        ColorJitter(brightness=(0.1, 3.0)),
        ColorJitter(contrast=0.9, saturation=2.0),
    ],
)
def test_color_jitter_native_pass_equals_the_kernels(jitter: ColorJitter) -> None:
    # CPU batches without hue take one native pass per sample; it must give the kernels' bits.
    op = color_ops.ColorJitterOp(jitter)
    if op._native is None:
        pytest.skip("the native extension is not built")
    nhwc = torch.from_numpy(np.concatenate([_image_set(seed=1), _image_set(seed=2)]))
    u = np.random.default_rng(7).random((nhwc.shape[0], op.draws))
    params = to_device(op.params(u), torch.device("cpu"))
    native = nhwc.clone()
    op.apply(native.permute(0, 3, 1, 2), params)
    kernels = nhwc.clone().permute(0, 3, 1, 2).contiguous()  # not a slot's layout: the kernels run
    op.apply(kernels, params)
    assert not torch.equal(native, nhwc)
    assert torch.equal(native.permute(0, 3, 1, 2), kernels)
