"""RandomErasing, MixUp, CutMix and RandomChoice kernels: torchvision v2's algorithms and arithmetic.

Exact: given the same draws (torch's RNG replaced by the kernel's uniforms, fed in torchvision's
order), the images and soft targets are torchvision's bit for bit; the erasing box is also checked
against a transcription of `get_params`. Statistical: the Beta draws, the erase rate, box areas and
ratios, RandomChoice's picks, the "random" noise. And the kernel rules: deterministic for the same
uniforms, no host synchronisation (every kernel runs on the meta device, where `.item()`,
`nonzero` and boolean-mask indexing raise), declarations with torchvision's defaults.
"""

from __future__ import annotations

import inspect
import math
import re
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from helpers import torchvision_or_skip

from fastload import ConfigError
from fastload import transforms as T
from fastload._augment import mixing
from fastload._augment.ops import to_device
from fastload._augment.program import TrainerStages
from fastload._augment.registry import KERNELS, batch_op, sample_op
from fastload._sample_random import BATCH_STREAM, TENSOR_STREAM, sample_uniforms


def tv_v2() -> types.ModuleType:
    """torchvision.transforms.v2 (the test is skipped without torchvision)."""
    torchvision_or_skip()
    import torchvision.transforms.v2

    return torchvision.transforms.v2


def erase(t: T.RandomErasing, x: torch.Tensor, u: np.ndarray) -> torch.Tensor:
    op = sample_op(t)
    return op.apply(x, to_device(op.params(u), x.device))


def boxes(t: T.RandomErasing, height: int, width: int, u: np.ndarray) -> list[tuple[int, int, int, int]]:
    op = mixing.Erasing(t)
    top, left, h, w = op.boxes(height, width, to_device(op.params(u), torch.device("cpu")))
    return [tuple(int(v) for v in box) for box in zip(top, left, h, w, strict=True)]  # type: ignore[misc]


def uniforms(n: int, draws: int, seed: int) -> np.ndarray:
    return sample_uniforms(seed, 0, np.arange(n), draws, TENSOR_STREAM)


# ---------------------------------------------------------------------------------------------
# RandomErasing against torchvision


def tv_erasing_params(
    height: int, width: int, t: T.RandomErasing, u: np.ndarray
) -> tuple[int, int, int, int] | None:
    """torchvision's RandomErasing (forward, then get_params), transcribed, its draws taken from
    the sample's uniforms in the kernel's layout: (i, j, h, w), or None when nothing is erased."""
    if not u[0] < t.p:
        return None
    area = height * width
    log_ratio = (math.log(t.ratio[0]), math.log(t.ratio[1]))
    for k in range(10):
        erase_area = area * (t.scale[0] + (t.scale[1] - t.scale[0]) * u[1 + 2 * k])
        aspect_ratio = float(np.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u[2 + 2 * k]))
        h = int(round(math.sqrt(erase_area * aspect_ratio)))
        w = int(round(math.sqrt(erase_area / aspect_ratio)))
        if not (h < height and w < width):
            continue
        i = min(int(u[21] * (height - h + 1)), height - h)
        j = min(int(u[22] * (width - w + 1)), width - w)
        return i, j, h, w
    return None


ERASINGS = [
    T.RandomErasing(),
    T.RandomErasing(p=1.0, scale=(0.3, 1.0), ratio=(0.1, 10.0)),  # many tries fail
    T.RandomErasing(p=1.0, scale=(0.9, 1.0), ratio=(3.0, 10.0)),  # nearly all fail: no erase
    T.RandomErasing(p=0.7, scale=(0.0, 0.01), ratio=(1.0, 1.0)),  # tiny, possibly empty boxes
]


@pytest.mark.parametrize("t", ERASINGS, ids=repr)
@pytest.mark.parametrize(("height", "width"), [(224, 224), (17, 23), (3, 200), (1, 1)])
def test_erasing_boxes_are_torchvisions_get_params(t: T.RandomErasing, height: int, width: int) -> None:
    u = uniforms(300, mixing.Erasing.draws, seed=height * 1000 + width)
    got = boxes(t, height, width, u)
    for row, box in zip(u, got, strict=True):
        expected = tv_erasing_params(height, width, t, row)
        if expected is None:
            assert box[2:] == (0, 0)
        else:
            assert box == expected


class TorchDraws:
    """torch's RNG as torchvision's RandomErasing, MixUp and CutMix call it, answered from one
    sample's (or batch's) uniforms in the kernels' layout."""

    def __init__(self, u: np.ndarray, randint_columns: tuple[int, ...]) -> None:
        self.u = u
        self.next_try = 1
        self.randints = list(randint_columns)

    def rand(self, *size: Any, **kwargs: Any) -> torch.Tensor:
        return torch.tensor([self.u[0]], dtype=torch.float64)

    def uniform_(self, tensor: torch.Tensor, low: Any, high: Any) -> torch.Tensor:
        # A float64 result: torchvision reads it with .item() (or exp then .item()), as the kernel
        # computes in float64.
        u = self.u[self.next_try]
        self.next_try += 1
        return torch.tensor([float(low) + (float(high) - float(low)) * u], dtype=torch.float64)

    def randint(self, *args: Any, size: Any = None, **kwargs: Any) -> torch.Tensor:
        low, high = (0, int(args[0])) if len(args) == 1 else (int(args[0]), int(args[1]))
        u = self.u[self.randints.pop(0)]
        return torch.tensor([low + min(int(u * (high - low)), high - low - 1)])

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch, "rand", self.rand)
        monkeypatch.setattr(torch, "randint", self.randint)
        monkeypatch.setattr(torch.Tensor, "uniform_", lambda t, low, high: self.uniform_(t, low, high))


@pytest.mark.parametrize("value", [0.0, 0.5, (1.0, -2.0, 3.5)])
@pytest.mark.parametrize("t", ERASINGS, ids=repr)
def test_erasing_is_torchvisions_given_the_same_draws(
    t: T.RandomErasing, value: float | tuple[float, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    v2 = tv_v2()
    t = T.RandomErasing(p=t.p, scale=t.scale, ratio=t.ratio, value=value)
    reference = v2.RandomErasing(p=t.p, scale=t.scale, ratio=t.ratio, value=value)  # type: ignore[arg-type]
    reference._log_ratio = torch.log(torch.tensor(t.ratio, dtype=torch.float64))  # as the kernel's
    x = torch.randn(40, 3, 31, 45, generator=torch.Generator().manual_seed(1))
    u = uniforms(len(x), mixing.Erasing.draws, seed=7)
    got = erase(t, x.clone().contiguous(memory_format=torch.channels_last), u)
    with monkeypatch.context() as patch:
        expected = []
        for image, row in zip(x, u, strict=True):
            TorchDraws(row, randint_columns=(21, 22)).install(patch)
            expected.append(reference(image.clone()))
    assert torch.equal(got, torch.stack(expected))


def test_v1_erasing_get_params_takes_the_same_boxes(monkeypatch: pytest.MonkeyPatch) -> None:
    v1 = torchvision_or_skip().transforms
    t = T.RandomErasing(p=1.0, scale=(0.02, 0.5), ratio=(0.5, 2.0))
    u = uniforms(100, mixing.Erasing.draws, seed=3)
    got = boxes(t, 60, 50, u)
    image = torch.zeros(3, 60, 50)
    with monkeypatch.context() as patch:
        for row, box in zip(u, got, strict=True):
            TorchDraws(row, randint_columns=(21, 22)).install(patch)
            # (v1 takes the ratio's log in float32: no box of these draws is at a rounding boundary.)
            i, j, h, w, _ = v1.RandomErasing.get_params(image, scale=t.scale, ratio=t.ratio, value=[0.0])
            assert (i, j, h, w) == box or ((h, w) == (60, 50) and box[2:] == (0, 0))  # (no box fits)


# ---------------------------------------------------------------------------------------------
# RandomErasing: distribution, noise, determinism


def test_erasing_rate_areas_and_ratios() -> None:
    t = T.RandomErasing(p=0.5)
    height = width = 224
    u = uniforms(8000, mixing.Erasing.draws, seed=11)
    got = np.array(boxes(t, height, width, u))
    erased = got[:, 2] > 0
    assert abs(erased.mean() - 0.5) < 0.03
    top, left, h, w = got[erased].T
    assert (top >= 0).all() and (top + h <= height).all() and (left >= 0).all() and (left + w <= width).all()
    side = np.sqrt(h * w)  # within the scale's range, up to the rounding of h and w
    assert (side >= math.sqrt(0.02 * height * width) - 1).all()
    assert (side <= math.sqrt(0.33 * height * width) + 1).all()
    log_ratio = np.log(h / w)  # log-uniform over (0.3, 3.3): centred near 0 (a few tall boxes fail)
    assert abs(log_ratio.mean()) < 0.1
    assert log_ratio.min() < math.log(0.4) and log_ratio.max() > math.log(2.5)
    # Each of the 4 corners of the image gets erased sometimes: tops and lefts are uniform.
    assert (top == 0).any() and (left == 0).any()
    assert (top + h == height).any() and (left + w == width).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_erasing_random_noise_fills_only_the_box(dtype: torch.dtype) -> None:
    t = T.RandomErasing(p=1.0, value="random")
    x = torch.full((64, 3, 40, 48), 100.0, dtype=dtype)
    u = uniforms(len(x), mixing.Erasing.draws, seed=5)
    got = erase(t, x.clone(), u)
    noise = []
    for image, (top, left, h, w) in zip(got, boxes(t, 40, 48, u), strict=True):
        inside = torch.zeros(40, 48, dtype=torch.bool)
        inside[top : top + h, left : left + w] = True
        assert (image[:, ~inside] == 100).all()
        assert (image[:, inside] != 100).all()
        noise.append(image[:, inside].flatten().double())
    values = torch.cat(noise)
    assert values.numel() > 10_000
    assert abs(values.mean()) < 0.05 and abs(values.std() - 1) < 0.05


def test_erasing_random_noise_depends_on_the_sample_alone() -> None:
    # A sample's uniforms give its noise wherever it stands in a batch, whatever the others are.
    t = T.RandomErasing(p=1.0, value="random")
    u = uniforms(16, mixing.Erasing.draws, seed=9)
    x = torch.zeros(16, 3, 20, 24)
    whole = erase(t, x.clone(), u)
    alone = erase(t, x[5:6].clone(), u[5:6])
    shuffled = erase(t, x[[5, 2, 9]].clone(), u[[5, 2, 9]])
    assert torch.equal(alone[0], whole[5]) and torch.equal(shuffled[0], whole[5])
    assert not torch.equal(whole[2], whole[9])


@pytest.mark.parametrize("value", [0.0, (0.1, 0.2, 0.3), "random"])
def test_erasing_is_deterministic_and_keeps_the_memory_format(value: float | tuple[float, ...] | str) -> None:
    t = T.RandomErasing(p=0.8, value=value)
    x = torch.randn(32, 3, 24, 24).contiguous(memory_format=torch.channels_last)
    u = uniforms(len(x), mixing.Erasing.draws, seed=2)
    first, second = erase(t, x.clone(), u), erase(t, x.clone(), u)
    assert torch.equal(first, second)
    assert not torch.equal(first, x)
    assert first.is_contiguous(memory_format=torch.channels_last)
    target = x.clone()
    assert erase(t, target, u).data_ptr() == target.data_ptr()  # in place


def test_erasing_per_channel_value_must_match_the_channels() -> None:
    x = torch.zeros(2, 4, 8, 8)
    with pytest.raises(ConfigError, match="one per channel"):
        erase(T.RandomErasing(p=1.0, value=(1.0, 2.0, 3.0)), x, uniforms(2, mixing.Erasing.draws, 0))


# ---------------------------------------------------------------------------------------------
# MixUp and CutMix against torchvision


class FixedBeta:
    def __init__(self, lam: float) -> None:
        self.lam = lam

    def sample(self, shape: Any = ()) -> torch.Tensor:
        return torch.tensor(self.lam, dtype=torch.float64)


def batch(n: int = 12, classes: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 29, 37, generator=g), torch.randint(0, classes, (n,), generator=g)


def batch_uniforms(draws: int, count: int, seed: int = 0) -> np.ndarray:
    return sample_uniforms(seed, 0, np.arange(count), draws, BATCH_STREAM)


@pytest.mark.parametrize("alpha", [1.0, 0.2, 4.0])
def test_mixup_is_torchvisions_given_the_same_lam(alpha: float, monkeypatch: pytest.MonkeyPatch) -> None:
    v2 = tv_v2()
    t = T.MixUp(alpha=alpha, num_classes=10)
    op = mixing.MixUpOp(t)
    reference = v2.MixUp(alpha=alpha, num_classes=10)
    for seed, u in enumerate(batch_uniforms(op.draws, 10)):
        x, labels = batch(seed=seed)
        reference._dist = FixedBeta(op.lam(u))
        expected_x, expected_labels = reference(x.clone(), labels)
        got_x, got_labels = op.apply(x.clone(), labels, u)
        assert torch.equal(got_x, expected_x)
        assert torch.equal(got_labels, expected_labels)


@pytest.mark.parametrize("alpha", [1.0, 0.2, 4.0])
@pytest.mark.parametrize(("height", "width"), [(29, 37), (1, 5), (224, 224)])
def test_cutmix_is_torchvisions_given_the_same_draws(
    alpha: float, height: int, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    v2 = tv_v2()
    t = T.CutMix(alpha=alpha, num_classes=10)
    op = mixing.CutMixOp(t)
    reference = v2.CutMix(alpha=alpha, num_classes=10)
    for seed, u in enumerate(batch_uniforms(op.draws, 20)):
        g = torch.Generator().manual_seed(seed)
        x, labels = torch.randn(6, 3, height, width, generator=g), torch.randint(0, 10, (6,), generator=g)
        (box, lam) = op.box(height, width, u)
        reference._dist = FixedBeta(op_lam := mixing._beta(alpha, float(u[0])))
        with monkeypatch.context() as patch:
            TorchDraws(u, randint_columns=(1, 2)).install(patch)
            expected_x, expected_labels = reference(x.clone(), labels)
        got_x, got_labels = op.apply(x.clone(), labels, u)
        assert torch.equal(got_x, expected_x), (box, op_lam)
        assert torch.equal(got_labels, expected_labels), (box, lam)


def test_cutmix_box_follows_lam() -> None:
    op = mixing.CutMixOp(T.CutMix(num_classes=3))
    lams, adjusted = [], []
    for u in batch_uniforms(op.draws, 4000, seed=1):
        (x1, y1, x2, y2), lam = op.box(224, 224, u)
        assert 0 <= x1 <= x2 <= 224 and 0 <= y1 <= y2 <= 224
        assert lam == pytest.approx(1 - (x2 - x1) * (y2 - y1) / 224**2)
        lams.append(mixing._beta(1.0, float(u[0])))
        adjusted.append(lam)
    # The box's area is at most 1 - lam (its half-sides truncated, then clamped to the image, which
    # cuts it often: its centre is uniform): the adjusted lam is at least lam.
    assert all(a >= b - 1e-12 for a, b in zip(adjusted, lams, strict=True))
    assert np.mean(adjusted) > np.mean(lams) + 0.1


@pytest.mark.parametrize(("alpha", "variance"), [(1.0, 1 / 12), (0.2, 1 / (4 * 1.4)), (4.0, 1 / 36)])
def test_lam_is_beta_distributed(alpha: float, variance: float) -> None:
    # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
    lams = np.array([mixing._beta(alpha, float(u[0])) for u in batch_uniforms(1, 5000, seed=3)])
    assert ((lams >= 0) & (lams <= 1)).all()
    assert abs(lams.mean() - 0.5) < 0.015
    assert abs(lams.var() - variance) < 0.1 * variance
    if alpha == 1.0:  # uniform: each tenth of [0, 1] gets its share
        counts = np.histogram(lams, bins=10, range=(0, 1))[0]
        assert counts.min() > 420 and counts.max() < 580


# ---------------------------------------------------------------------------------------------
# Soft targets, RandomChoice, determinism, checks

BATCH_TRANSFORMS = [
    T.MixUp(num_classes=10),
    T.CutMix(alpha=0.5, num_classes=10),
    T.RandomChoice([T.MixUp(num_classes=10), T.CutMix(num_classes=10)]),
    T.RandomChoice([T.MixUp(alpha=0.8, num_classes=10), T.CutMix(num_classes=10)], p=[0.2, 0.8]),
]


@pytest.mark.parametrize("t", BATCH_TRANSFORMS, ids=repr)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_soft_targets_sum_to_one_in_the_images_dtype(t: T.Transform, dtype: torch.dtype) -> None:
    op = batch_op(t)
    for seed, u in enumerate(batch_uniforms(op.draws, 5)):
        x, labels = batch(seed=seed)
        images, targets = op.apply(x.to(dtype), labels, u)
        assert images.dtype == targets.dtype == dtype
        assert targets.shape == (len(labels), 10)
        sums = targets.double().sum(1)
        assert torch.allclose(sums, torch.ones(len(labels), dtype=torch.float64), atol=1e-2)
        # Each row weighs its own label by lam and its predecessor's by 1 - lam.
        rows = torch.arange(len(labels))
        assert (targets[rows, labels] > 0).all() and (targets[rows, labels.roll(1)] > 0).all()
        assert torch.count_nonzero(targets, dim=1).max() <= 2


@pytest.mark.parametrize("t", BATCH_TRANSFORMS, ids=repr)
def test_batch_ops_are_deterministic_for_the_same_uniforms(t: T.Transform) -> None:
    op = batch_op(t)
    x, labels = batch()
    u = batch_uniforms(op.draws, 1)[0]
    first, second = op.apply(x.clone(), labels, u), op.apply(x.clone(), labels, u)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    other = op.apply(x.clone(), labels, batch_uniforms(op.draws, 2)[1])
    assert not torch.equal(first[0], other[0])


@pytest.mark.parametrize(("p", "share"), [(None, 0.5), ((3.0, 1.0), 0.75), ((0.0, 1.0), 0.0)])
def test_random_choice_picks_with_p_and_runs_the_member(p: tuple[float, ...] | None, share: float) -> None:
    members = [T.MixUp(num_classes=4), T.CutMix(num_classes=4)]
    op = mixing.ChoiceOp(T.RandomChoice(members, p=p), KERNELS)
    assert op.draws == 1 + 3 and op.num_classes == 4
    picks = np.array([op.choose(float(u[0])) for u in batch_uniforms(op.draws, 4000, seed=4)])
    assert abs((picks == 0).mean() - share) < 0.03
    x, labels = batch(n=5, classes=4)
    for u in batch_uniforms(op.draws, 6, seed=5):
        member = batch_op(members[op.choose(float(u[0]))])
        expected = member.apply(x.clone(), labels, u[1 : 1 + member.draws])
        got = op.apply(x.clone(), labels, u)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_cutmix_takes_uint8_images_mixup_needs_float() -> None:
    x, labels = batch()
    images = (x * 40 + 128).clamp(0, 255).to(torch.uint8)
    u = batch_uniforms(3, 1)[0]
    mixed, targets = mixing.CutMixOp(T.CutMix(num_classes=10)).apply(images.clone(), labels, u)
    assert mixed.dtype == torch.uint8 and targets.dtype == torch.float32
    with pytest.raises(ConfigError, match="normalize"):
        mixing.MixUpOp(T.MixUp(num_classes=10)).apply(images, labels, u)


@pytest.mark.parametrize("bad", [torch.tensor([0, 1, 10]), torch.tensor([0, -1, 2])])
def test_labels_outside_num_classes_are_a_config_error(bad: torch.Tensor) -> None:
    x = torch.zeros(3, 3, 4, 4)
    for t in BATCH_TRANSFORMS:
        op = batch_op(t)
        with pytest.raises(ConfigError, match="num_classes"):
            op.apply(x.clone(), bad, batch_uniforms(op.draws, 1)[0])


def test_labels_must_be_class_indices_of_the_batch() -> None:
    op = mixing.MixUpOp(T.MixUp(num_classes=3))
    u = batch_uniforms(1, 1)[0]
    with pytest.raises(ConfigError, match="labels"):
        op.apply(torch.zeros(3, 3, 4, 4), torch.tensor([0, 1]), u)
    with pytest.raises(ConfigError, match="class indices"):
        op.apply(torch.zeros(2, 3, 4, 4), torch.tensor([0.0, 1.0]), u)


# ---------------------------------------------------------------------------------------------
# The no-synchronisation rule


@pytest.mark.parametrize("value", [0.0, (0.1, 0.2, 0.3), "random"])
def test_erasing_never_reads_device_values(value: float | tuple[float, ...] | str) -> None:
    # On the meta device a tensor has no values: .item(), nonzero and boolean-mask indexing raise,
    # as each of them would make the host wait for a GPU.
    op = mixing.Erasing(T.RandomErasing(value=value))
    meta = torch.device("meta")
    x = torch.empty(8, 3, 16, 16, device=meta)
    out = op.apply(x, to_device(op.params(uniforms(8, op.draws, 0)), meta))
    assert out.shape == x.shape and out.device == meta


@pytest.mark.parametrize("t", BATCH_TRANSFORMS, ids=repr)
def test_batch_ops_never_read_device_values(t: T.Transform) -> None:
    op = batch_op(t)
    meta = torch.device("meta")
    images, targets = op.apply(
        torch.empty(8, 3, 16, 16, device=meta),
        torch.empty(8, dtype=torch.int64, device=meta),
        batch_uniforms(op.draws, 1)[0],
    )
    assert images.shape == (8, 3, 16, 16) and targets.shape == (8, 10) and targets.device == meta


def test_kernels_source_has_no_synchronising_calls() -> None:
    # Erasing.erase_by_slices reads boxes back and MixUpOp.mix_natively hands memory to C: both run
    # on CPU batches only, and are checked against the device paths below.
    source = inspect.getsource(mixing)
    for cpu_only in (mixing.Erasing.erase_by_slices, mixing.MixUpOp.mix_natively):
        source = source.replace(inspect.getsource(cpu_only), "")
    for pattern in (r"\.item\(", r"\.nonzero\(", r"torch\.nonzero", r"\.tolist\(", r"\.cpu\(", r"\.numpy\("):
        assert not re.search(pattern, source), pattern


# ---------------------------------------------------------------------------------------------
# In the trainer's stages, and the declarations


def test_trainer_stages_run_erasing_then_mixing() -> None:
    chain = [T.RandomResizedCrop(16), T.RandomErasing(p=1.0), T.CutMix(num_classes=5)]
    stages = TrainerStages(T.compile_transforms(chain), seed=3, pixels_here=False)
    x = torch.randn(6, 3, 16, 16)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    indices = np.arange(100, 106)
    first = stages.after_normalize(x.clone(), labels, epoch=1, indices=indices)
    again = stages.after_normalize(x.clone(), labels, epoch=1, indices=indices)
    other = stages.after_normalize(x.clone(), labels, epoch=2, indices=indices)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])
    assert first[1].shape == (6, 5)


def _tv_defaults(cls: Callable[..., Any]) -> dict[str, Any]:
    return {
        name: p.default for name, p in inspect.signature(cls).parameters.items() if p.default is not p.empty
    }


@pytest.mark.parametrize("name", ["RandomErasing", "MixUp", "CutMix", "RandomChoice"])
def test_declarations_have_torchvisions_defaults(name: str) -> None:
    v2 = tv_v2()
    ours = _tv_defaults(getattr(T, name))
    theirs = _tv_defaults(getattr(v2, name))
    for param, default in ours.items():
        assert theirs[param] == default, param
    # What fastload leaves out: in-place (its kernels work in place), the labels' getter (batches
    # are (images, labels)), num_classes=None (fastload's labels are indices: it is required).
    assert set(theirs) - set(ours) <= {"inplace", "labels_getter", "num_classes"}


def test_erasing_accepts_what_torchvision_accepts() -> None:
    v2 = tv_v2()
    for kwargs in (
        {"scale": (0.0, 0.1)},
        {"scale": (0.5, 1.0)},
        {"scale": [0.1, 0.1], "ratio": [1.0, 1.0]},
        {"value": 3},
        {"value": [1, 2, 3]},
        {"value": (0.5,)},
        {"value": "random"},
        {"p": 0},
        {"p": 1},
    ):
        v2.RandomErasing(**kwargs)  # type: ignore[arg-type]
        t = T.RandomErasing(**kwargs)  # type: ignore[arg-type]
        assert T.from_config(T.to_config([t])) == (t,)
    assert T.RandomErasing(value=[1, 2, 3]).value == (1.0, 2.0, 3.0)
    for kwargs in ({"scale": (-0.1, 0.5)}, {"scale": (0.1, 1.5)}, {"p": 1.5}, {"value": "noise"}):
        with pytest.raises(ValueError):
            v2.RandomErasing(**kwargs)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            T.RandomErasing(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0.0, (0.5, -1.0, 2.0), "random"])
def test_erasing_by_slices_on_the_cpu_equals_the_masks(value: Any) -> None:
    op = mixing.Erasing(T.RandomErasing(p=0.7, value=value))
    x = torch.randn(12, 3, 20, 17)
    u = np.random.default_rng(4).random((12, op.draws))
    p = to_device(op.params(u), x.device)
    boxes = op.boxes(20, 17, p)
    by_masks = op.erase_by_masks(x.clone(), p, boxes)
    by_slices = op.erase_by_slices(x.clone(), p, boxes)
    assert not torch.equal(by_masks, x)
    assert torch.equal(by_masks, by_slices)


def test_mixup_native_pass_on_the_cpu_equals_torchs_arithmetic() -> None:
    op = mixing.MixUpOp(T.MixUp(alpha=0.8, num_classes=4))
    if op._native is None:
        pytest.skip("the native extension is not built")
    nhwc = torch.randn(7, 9, 11, 3)
    labels = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    u = np.array([0.37])
    native, _ = op.apply(nhwc.clone().permute(0, 3, 1, 2), labels, u)  # a normalized slot: NHWC memory
    by_torch, _ = op.apply(nhwc.clone().permute(0, 3, 1, 2).contiguous(), labels, u)
    lam = op.lam(u)
    x = nhwc.permute(0, 3, 1, 2)
    expected = x.roll(1, 0).mul(1.0 - lam).add_(x.mul(lam))  # torchvision's sum
    assert torch.equal(native, expected) and torch.equal(by_torch, expected)
