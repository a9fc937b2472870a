"""The augmentation policies' batched kernels against torchvision v2 (`fastload._augment.policies`,
`affine`, `draws`, `groups`).

Protects: the geometric kernels equal torchvision's tensor `affine` / `rotate` per sample, nearest
and bilinear (tolerance 0: the same grid arithmetic, the same `grid_sample`), every fill, both
memory layouts; every operation of every policy's space, at every magnitude bin and sign, equals
torchvision's `_apply_image_or_video_transform` with torchvision's own magnitude tables; whole
policies equal torchvision's `forward` when its `torch.randint` / `torch.rand` / Dirichlet draws
are replaced by the choices the uniforms stand for (so the mapping from uniforms to choices, the
order of the steps and AugMix's float mixing are torchvision's); the choices' distributions; and
that a sample's pixels depend on its uniforms alone (same u, same pixels, in any batch).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from helpers import torchvision_or_skip

from fastload import transforms as T
from fastload._augment import affine, draws, groups, policies
from fastload._augment.ops import to_device
from fastload._augment.program import SampleProgram
from fastload._augment.registry import sample_op
from fastload._sample_random import PIXELS_STREAM
from fastload.transforms._policies import fill_values

FILLS = [None, 0, (10, 20.5, 30)]
INTERPOLATIONS = ["nearest", "bilinear"]


def _v2() -> Any:
    """torchvision.transforms.v2, the reference (the test is skipped without torchvision)."""
    torchvision_or_skip()
    import torchvision.transforms.v2

    return torchvision.transforms.v2


def _images(n: int, height: int, width: int, channels_last: bool, seed: int = 0) -> torch.Tensor:
    """Smooth-ish random uint8 images (noise plus gradients: equalize and autocontrast have work)."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 180, width)[None, None, None, :] + np.linspace(0, 60, height)[None, None, :, None]
    pixels = np.clip(
        rng.normal(0, 30, (n, 3, height, width)) + ramp * rng.uniform(0.2, 1, (n, 3, 1, 1)), 0, 255
    )
    x = torch.from_numpy(pixels.astype(np.uint8))
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def _tv_fill(fill: Any) -> Any:
    return list(fill) if isinstance(fill, tuple) else fill


def _tv_mode(interpolation: str) -> Any:
    """torchvision's InterpolationMode for fastload's name: torchvision before 0.28 refuses a string."""
    return _v2().InterpolationMode(interpolation)


def _ours_fill(fill: Any) -> affine.Fill:
    return None if fill is None else fill_values(fill)


def _tv_geometric(
    tv_f: Any, image: torch.Tensor, op: str, m: float, interpolation: str, fill: Any
) -> torch.Tensor:
    """torchvision's call for a policy's geometric operation (as `_apply_image_or_video_transform`)."""
    f, mode = _tv_fill(fill), _tv_mode(interpolation)
    if op == "Rotate":
        return tv_f.rotate(image, angle=m, interpolation=mode, fill=f)
    common: dict[str, Any] = dict(angle=0.0, scale=1.0, interpolation=mode, fill=f)
    if op == "ShearX":
        return tv_f.affine(
            image, translate=[0, 0], shear=[math.degrees(math.atan(m)), 0.0], center=[0, 0], **common
        )
    if op == "ShearY":
        return tv_f.affine(
            image, translate=[0, 0], shear=[0.0, math.degrees(math.atan(m))], center=[0, 0], **common
        )
    translate = [int(m), 0] if op == "TranslateX" else [0, int(m)]
    return tv_f.affine(image, translate=translate, shear=[0.0, 0.0], **common)


# ---------------------------------------------------------------------------------------------
# Geometric kernels


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
def test_geometric_kernels_equal_torchvision(interpolation: str, fill: Any, channels_last: bool) -> None:
    """`warp_` with one matrix per sample (`policy_matrix`), on a group inside a batch, equals
    torchvision's affine/rotate per sample, exactly; the other samples are untouched."""
    tv_f = _v2().functional
    rng = np.random.default_rng(1)
    height, width, n = 23, 37, 9
    x0 = _images(n, height, width, channels_last)
    index = torch.tensor([0, 2, 3, 5, 8])
    ranges = {"ShearX": 0.99, "ShearY": 0.99, "TranslateX": 40.0, "TranslateY": 40.0, "Rotate": 180.0}
    for op, bound in ranges.items():
        magnitudes = rng.uniform(-bound, bound, len(index)).tolist()
        theta = torch.tensor([affine.policy_matrix(op, m, height, width) for m in magnitudes]).view(-1, 2, 3)
        x = x0.clone()
        affine.warp_(x, index, theta.float(), interpolation, _ours_fill(fill))
        assert x.stride() == x0.stride()
        for k, i in enumerate(index.tolist()):
            expected = _tv_geometric(tv_f, x0[i], op, magnitudes[k], interpolation, fill)
            assert torch.equal(x[i], expected), (op, magnitudes[k])
        untouched = [i for i in range(n) if i not in index.tolist()]
        assert torch.equal(x[untouched], x0[untouched])


@pytest.mark.parametrize("fill", FILLS)
def test_policy_geometry_fast_paths_equal_torchvision(fill: Any) -> None:
    """`policy_op_` (one magnitude for a group: cached maps, quarter turns, whole-pixel shifts,
    shears through a shared map), at the magnitudes the policies use, equals
    torchvision, square and not, both interpolations."""
    tv_f = _v2().functional
    cases = [("Rotate", m) for m in (0.0, -0.0, 90.0, -90.0, 180.0, 270.0, 135.0, -4.5, 30.0)]
    cases += [(op, m) for op in ("TranslateX", "TranslateY") for m in (0.0, 0.7, -5.9, 14.0, -40.0, 99.0)]
    cases += [(op, m) for op in ("ShearX", "ShearY") for m in (0.0, 0.09, -0.3, 0.99)]
    for height, width in ((24, 24), (19, 30)):
        for interpolation in INTERPOLATIONS:
            x0 = _images(6, height, width, channels_last=True, seed=height)
            index = torch.tensor([1, 2, 4])
            for op, m in cases:
                x = x0.clone()
                affine.policy_op_(x, index, op, m, interpolation, _ours_fill(fill))
                for i in index.tolist():
                    expected = _tv_geometric(tv_f, x0[i], op, m, interpolation, fill)
                    assert torch.equal(x[i], expected), (height, width, interpolation, op, m)
                assert torch.equal(x[[0, 3, 5]], x0[[0, 3, 5]])


def test_elementwise_grid_is_torchvision_matmul() -> None:
    """The separable grid equals `_affine_grid`'s matmul bit for bit where it is used."""
    tv_grid = _v2().functional._geometry._affine_grid
    for height, width in ((224, 224), (17, 41)):
        thetas = [
            affine.policy_matrix(op, m, height, width) for op, m in (("Rotate", 13.3), ("ShearY", 0.41))
        ]
        theta = torch.tensor(thetas, dtype=torch.float32).view(-1, 2, 3)
        ours = affine.affine_grid(theta, height, width)
        for i in range(len(thetas)):
            assert torch.equal(ours[i], tv_grid(theta[i : i + 1].clone(), width, height, width, height)[0])


# ---------------------------------------------------------------------------------------------
# Every operation, magnitude bin and sign of each policy's space


def _tv_policy(name: str, interpolation: str, fill: Any) -> Any:
    v2 = _v2()
    kinds = {
        "RandAugment": v2.RandAugment,
        "TrivialAugmentWide": v2.TrivialAugmentWide,
        "AutoAugment": v2.AutoAugment,
        "AugMix": v2.AugMix,
    }
    return kinds[name](interpolation=_tv_mode(interpolation), fill=_tv_fill(fill))


def _ours(name: str, **kwargs: Any) -> policies.PolicyOp:
    transform = getattr(T, name)(**kwargs)
    op = sample_op(transform)
    assert isinstance(op, policies.PolicyOp)
    return op


POLICY_BINS = {"RandAugment": 31, "TrivialAugmentWide": 31, "AutoAugment": 10, "AugMix": 10}


@pytest.mark.parametrize(
    ("interpolation", "fill", "size"),
    [("nearest", None, (24, 24)), ("bilinear", (10, 20.5, 30), (24, 24)), ("nearest", 7, (21, 30))],
)
@pytest.mark.parametrize("name", list(POLICY_BINS))
def test_every_operation_equals_torchvision(
    name: str, interpolation: str, fill: Any, size: tuple[int, int]
) -> None:
    """Each (operation, bin, sign) forced through `step_groups` equals torchvision's
    `_apply_image_or_video_transform` at torchvision's magnitude for it, on a channels_last batch."""
    theirs = _tv_policy(name, interpolation, fill)
    ours = _ours(name, interpolation=interpolation, fill=fill)
    bins = POLICY_BINS[name]
    op = np.repeat(np.arange(len(ours.names)), bins * 2)
    bin_ = np.tile(np.repeat(np.arange(bins), 2), len(ours.names))
    negate = np.tile([False, True], len(ours.names) * bins)
    height, width = size
    x0 = _images(len(op), height, width, channels_last=True)
    x = x0.clone()
    ours.run(x, to_device(ours.step_groups(op[:, None], bin_[:, None], negate[:, None]), x.device))
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert set(ours.names) == set(theirs._AUGMENTATION_SPACE)
    for i in range(len(op)):
        transform_id = ours.names[op[i]]
        magnitudes_fn, signed = theirs._AUGMENTATION_SPACE[transform_id]
        magnitudes = magnitudes_fn(bins, height, width)
        magnitude = 0.0
        if magnitudes is not None:
            magnitude = float(magnitudes[bin_[i]])
            if signed and negate[i]:
                magnitude *= -1
        expected = theirs._apply_image_or_video_transform(
            x0[i], transform_id, magnitude, interpolation=theirs.interpolation, fill=theirs._fill
        )
        assert torch.equal(x[i], expected), (transform_id, bin_[i], negate[i])


# ---------------------------------------------------------------------------------------------
# Whole policies against torchvision's forward, its draws replaced by the uniforms' choices


class _Script:
    """torch.randint / torch.rand replacements that hand out scripted values in order."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def push(self, *values: float) -> None:
        self.values.extend(values)

    def randint(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        size = kwargs.get("size", args[-1] if args and isinstance(args[-1], tuple) else ())
        return torch.full(size, int(self.values.pop(0)), dtype=torch.int64)

    def rand(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.tensor(float(self.values.pop(0)))


def _pick(u: float, count: int) -> int:
    return min(int(u * count), count - 1)


def _script_sample(name: str, theirs: Any, ours: policies.PolicyOp, u: np.ndarray, script: _Script) -> None:
    """Push, for one sample, the draws torchvision's forward makes, as our op reads them from u."""
    space = theirs._AUGMENTATION_SPACE
    if name == "AugMix" and not theirs.all_ops:
        space = theirs._PARTIAL_AUGMENTATION_SPACE

    def operation(op_u: float, bin_value: int | None, sign_u: float) -> None:
        k = _pick(op_u, len(space))
        script.push(k)
        transform_id = list(space)[k]
        magnitudes_fn, signed = space[transform_id]
        if magnitudes_fn(10, 8, 8) is not None:
            if bin_value is not None:
                script.push(bin_value)
            if signed:
                script.push(sign_u)

    if name == "RandAugment":
        for k in range(theirs.num_ops):
            operation(u[2 * k], None, u[2 * k + 1])
    elif name == "TrivialAugmentWide":
        operation(u[0], _pick(u[1], theirs.num_magnitude_bins), u[2])
    elif name == "AutoAugment":
        sub = _pick(u[0], len(theirs._policies))
        script.push(sub)
        for t, (transform_id, p, _) in enumerate(theirs._policies[sub]):
            script.push(u[1 + 2 * t])
            magnitudes_fn, signed = space[transform_id]
            if u[1 + 2 * t] <= p and magnitudes_fn(10, 8, 8) is not None and signed:
                script.push(u[2 + 2 * t])
    else:
        assert isinstance(ours, policies.AugMixOp)
        per_chain = 1 + 3 * ours.steps
        for c in range(ours.width):
            chain = u[1 + c * per_chain : 1 + (c + 1) * per_chain]
            depth = ours.chain_depth if ours.chain_depth > 0 else 1 + _pick(chain[0], 3)
            if ours.chain_depth <= 0:
                script.push(depth)
            for s in range(depth):
                step = chain[1 + 3 * s : 4 + 3 * s]
                operation(step[0], _pick(step[1], ours.severity), step[2])


POLICIES = [
    ("RandAugment", {"num_ops": 3, "magnitude": 13}),
    ("TrivialAugmentWide", {"num_magnitude_bins": 17}),
    ("AutoAugment", {"policy": "imagenet"}),
    ("AutoAugment", {"policy": "cifar10"}),
    ("AutoAugment", {"policy": "svhn"}),
    ("AugMix", {}),
    ("AugMix", {"chain_depth": 2, "mixture_width": 2, "alpha": 0.4, "all_ops": False, "severity": 7}),
]


@pytest.mark.parametrize(("name", "kwargs"), POLICIES)
def test_policy_equals_torchvision_forward(
    name: str, kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our batch equals torchvision's forward per sample, torchvision drawing what u stands for."""
    interpolation, fill = ("bilinear", 5) if name == "AugMix" else ("nearest", (1, 2, 3.5))
    v2 = _v2()
    if name == "AutoAugment":
        theirs = v2.AutoAugment(
            v2.AutoAugmentPolicy(kwargs["policy"]), interpolation=_tv_mode(interpolation), fill=_tv_fill(fill)
        )
    else:
        theirs = getattr(v2, name)(**kwargs, interpolation=_tv_mode(interpolation), fill=_tv_fill(fill))
    ours = _ours(name, **kwargs, interpolation=interpolation, fill=fill)
    n = 24
    u = np.random.default_rng(7).random((n, ours.draws))
    x0 = _images(n, 20, 26, channels_last=True, seed=3)
    x = x0.clone()
    ours.apply(x, to_device(ours.params(u), x.device))
    script = _Script()
    monkeypatch.setattr(torch, "randint", script.randint)
    monkeypatch.setattr(torch, "rand", script.rand)
    for i in range(n):
        _script_sample(name, theirs, ours, u[i], script)
        if isinstance(ours, policies.AugMixOp):
            split, weights = ours.split(u[i : i + 1, 0])
            dirichlets = iter([torch.from_numpy(split), torch.from_numpy(weights)])
            monkeypatch.setattr(theirs, "_sample_dirichlet", lambda params, d=dirichlets: next(d))
        expected = theirs(x0[i])
        assert not script.values, "torchvision drew less than scripted"
        assert torch.equal(x[i], expected), i


# ---------------------------------------------------------------------------------------------
# Distributions of the choices


def _chosen_ops(params: dict[str, np.ndarray], step: int, names: tuple[str, ...], n: int) -> np.ndarray:
    """Per sample, the operation it runs at `step` (the space's index; -1 for none or Identity)."""
    chosen = np.full(n, -1)
    for key, index in params.items():
        parts = key.split("|")
        if len(parts) >= 2 and parts[0] == str(step) and parts[-1] != "value":
            chosen[index] = names.index(parts[1])
    return chosen


def _chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def test_choices_are_uniform() -> None:
    """RandAugment's operations (each step, with replacement) and signs, TrivialAugmentWide's
    magnitude bins, AutoAugment's sub-policies and AugMix's depths are uniform (chi-square, p=0.001)."""
    rng = np.random.default_rng(11)
    n = 28000
    ra = _ours("RandAugment")
    p = ra.params(rng.random((n, ra.draws)))
    identity = ra.names.index("Identity")
    for step in range(2):
        chosen = _chosen_ops(p, step, ra.names, n)
        counts = np.bincount(np.where(chosen < 0, identity, chosen), minlength=14)
        assert _chi_square(counts, np.full(14, n / 14)) < 34.5  # df 13
    negated = sum(len(v) for k, v in p.items() if k.count("|") == 3 and k.endswith("|1"))
    signed = sum(len(v) for k, v in p.items() if k.count("|") == 3)
    assert abs(negated / signed - 0.5) < 0.02

    ta = _ours("TrivialAugmentWide")
    u = rng.random((n, ta.draws))
    p = ta.params(u)
    bins = np.concatenate([np.full(len(v), int(k.split("|")[2])) for k, v in p.items() if k.count("|") == 3])
    counts = np.bincount(bins, minlength=31)
    assert _chi_square(counts, np.full(31, len(bins) / 31)) < 59.7  # df 30

    aa = _ours("AutoAugment")
    u = rng.random((n, aa.draws))
    sub = np.minimum((u[:, 0] * 25).astype(int), 24)
    assert _chi_square(np.bincount(sub, minlength=25), np.full(25, n / 25)) < 51.2  # df 24
    first = _chosen_ops(aa.params(u), 0, aa.names, n)
    posterize = sub == 0  # ("Posterize", 0.4, 8) first
    assert abs((first[posterize] == aa.names.index("Posterize")).mean() - 0.4) < 0.05

    am = _ours("AugMix")
    u = rng.random((n, am.draws))
    depth_u = u[:, 1 :: 1 + 3 * am.steps][:, : am.width]
    depth = 1 + np.minimum((depth_u * 3).astype(int), 2)
    assert _chi_square(np.bincount(depth.ravel(), minlength=4)[1:], np.full(3, depth.size / 3)) < 13.8


@pytest.mark.parametrize("alpha", [0.3, 1.0, 4.0])
def test_dirichlet_and_beta_weights(alpha: float) -> None:
    """Gamma variates have mean and variance alpha; AugMix's weights are Beta / Dirichlet(alpha)
    (means 1/2 and 1/width, Beta's variance 1/(4(2 alpha + 1))), rows sum to 1, depend on u alone."""
    u = np.random.default_rng(5).random(40000)
    g = draws.gamma(u, alpha, 2)
    assert abs(g.mean() / alpha - 1) < 0.03 and abs(g.var() / alpha - 1) < 0.08
    op = _ours("AugMix", alpha=alpha, mixture_width=4)
    split, chains = op.split(u)
    assert np.allclose(split.sum(1), 1, atol=1e-6) and np.allclose(chains.sum(1), 1, atol=1e-6)
    assert abs(split[:, 0].mean() - 0.5) < 0.01
    assert abs(split[:, 0].var() - 1 / (4 * (2 * alpha + 1))) < 0.01
    assert abs(chains.mean() - 0.25) < 0.01
    again, _ = op.split(u[::-7].copy())
    assert np.array_equal(again, split[::-7])


# ---------------------------------------------------------------------------------------------
# Determinism, layouts and the loader's seam


@pytest.mark.parametrize(("name", "kwargs"), POLICIES[:3] + POLICIES[5:6])
def test_same_uniforms_same_pixels_in_any_batch(name: str, kwargs: dict[str, Any]) -> None:
    """The same u gives the same pixels, and a sample's pixels do not depend on the batch it is in
    (a worker's share of a batch), contiguous or channels_last."""
    op = _ours(name, **kwargs)
    u = np.random.default_rng(2).random((16, op.draws))
    x0 = _images(16, 30, 30, channels_last=True, seed=9)
    whole = x0.clone()
    op.apply(whole, to_device(op.params(u), whole.device))
    again = x0.clone()
    op.apply(again, to_device(op.params(u), again.device))
    assert torch.equal(whole, again)
    rows = np.array([3, 4, 9, 15])
    part = x0[rows].contiguous()
    op.apply(part, to_device(op.params(u[rows]), part.device))
    assert torch.equal(part, whole[rows])
    assert not torch.equal(whole, x0)


def test_sample_program_runs_a_policy_in_a_slot() -> None:
    """The loader's seam: a policy in a `SampleProgram`, in place on NHWC slot rows, equals the
    same program on a tensor batch."""
    program = SampleProgram([T.RandAugment(), T.AugMix()], PIXELS_STREAM)
    slot = np.ascontiguousarray(_images(8, 32, 32, channels_last=True).permute(0, 2, 3, 1).numpy())
    batch = torch.from_numpy(slot.copy()).permute(0, 3, 1, 2)
    indices = np.arange(100, 108)
    expected = program.run(batch, seed=1, epoch=2, indices=indices)
    program.run_in_slot(slot, seed=1, epoch=2, indices=indices)
    assert torch.equal(torch.from_numpy(slot).permute(0, 3, 1, 2), expected)


def test_group_moves_keep_layout() -> None:
    """`groups.take` / `put_` move samples as whole rows and keep the batch's memory format."""
    for channels_last in (False, True):
        x = _images(7, 5, 9, channels_last)
        index = torch.tensor([1, 4, 6])
        taken = groups.take(x, index)
        assert torch.equal(taken, x[index])
        assert groups.memory_format(taken) == groups.memory_format(x)
        y = x.clone()
        groups.put_(y, index, 255 - taken)
        assert torch.equal(y[index], 255 - x[index]) and torch.equal(y[[0, 2, 3, 5]], x[[0, 2, 3, 5]])
