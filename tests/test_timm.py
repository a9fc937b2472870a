"""timm's recipes (`timm.data.create_transform`, `timm.data.Mixup`) and torchvision's RandomApply,
converted, checked against timm itself: parameters, RandAugment's operations and magnitudes,
pixels where they are deterministic, Mixup's targets on real batches, RandomApply's probability.
"""

from __future__ import annotations

import importlib
import json
import random
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import torchvision_or_skip

from fastload import ConfigError, FastLoader
from fastload import transforms as T
from fastload._augment.registry import KERNELS
from fastload._augment.timm_ops import RandomApplyOp, TimmMixupOp, TimmRandAugmentOp, level_argument
from fastload.transforms import from_torchvision
from fastload.transforms._timm_transforms import (
    TIMM_RAND_INCREASING_OPS,
    TIMM_RAND_OPS,
    RandomApply,
    TimmMixup,
    TimmRandAugment,
)

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def timm_data() -> types.ModuleType:
    torchvision_or_skip()  # timm imports torchvision: through the stub of its compiled operators
    try:
        import timm.data
    except ImportError:
        pytest.skip("timm is not installed (a test-only reference: tools/_venv.sh installs it, --no-deps)")
    return timm.data


def train_recipe(interpolation: str = "random", size: int = 224) -> Any:
    return timm_data().create_transform(
        input_size=size, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
        re_prob=0.25, re_mode="pixel", interpolation=interpolation,
    )


def convert(obj: Any) -> tuple[tuple[T.Transform, ...], Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        transforms, normalize = from_torchvision(obj)
    return transforms, normalize, [str(w.message) for w in caught]


def close(a: Any, b: Any) -> bool:
    return bool(np.allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), rtol=1e-6))


# ---------------------------------------------------------------------------------------------
# The recipes' conversions


@pytest.mark.parametrize("interpolation", ["bicubic", "random"])
def test_train_recipe_converts_with_timms_parameters(interpolation: str) -> None:
    recipe = train_recipe(interpolation)
    crop, flip, rand, _, norm, erase = recipe.transforms
    transforms, normalize, notes = convert(recipe)
    rrc, hflip, policy, erasing = transforms
    assert isinstance(rrc, T.RandomResizedCrop) and rrc.size == crop.size
    assert rrc.scale == tuple(crop.scale) and close(rrc.ratio, crop.ratio)
    assert rrc.interpolation == ("bicubic" if interpolation == "bicubic" else "bilinear")
    assert hflip == T.RandomHorizontalFlip(flip.p)
    op = rand.ops[0]
    assert isinstance(policy, TimmRandAugment) and policy.ops == tuple(o.name for o in rand.ops)
    assert (policy.num_layers, policy.magnitude, policy.magnitude_std, policy.prob) == (
        rand.num_layers, op.magnitude, op.magnitude_std, op.prob,
    )
    assert policy.fill == tuple(float(v) for v in op.kwargs["fillcolor"]) and policy.increasing
    assert isinstance(erasing, T.RandomErasing) and erasing.value == "random"
    assert (erasing.p, erasing.scale) == (erase.probability, (erase.min_area, erase.max_area))
    assert close(np.log(erasing.ratio), erase.log_aspect_ratio)
    assert close(normalize, (norm.mean.tolist(), norm.std.tolist()))
    assert policy.interpolation == interpolation  # PIL's bicubic, or timm's draw of bilinear / bicubic
    assert not any("RandAugment" in n for n in notes)  # PIL's pixels: nothing approximated
    assert any("'random'" in n for n in notes) == (interpolation == "random")


@pytest.mark.parametrize("crop_pct", [0.875, 0.95])
def test_eval_recipe_is_resize_and_center_crop_without_approximation(crop_pct: float) -> None:
    recipe = timm_data().create_transform(224, is_training=False, crop_pct=crop_pct)
    transforms, normalize, notes = convert(recipe)
    assert transforms == (T.Resize(int(224 / crop_pct)), T.CenterCrop((224, 224))) and not notes
    assert close(normalize, IMAGENET)


def test_eval_pixels_are_timms(image_folder: Path) -> None:
    from PIL import Image

    recipe = timm_data().create_transform(32, is_training=False, crop_pct=0.875)
    paths = sorted(p for p in image_folder.rglob("*") if p.is_file())
    common: dict[str, Any] = {"batch_size": len(paths), "num_workers": 0, "device": "cpu", "backend": "pil"}
    with FastLoader(image_folder, transform=recipe, **common) as loader:
        images, _ = next(iter(loader))
    want = torch.stack([recipe(Image.open(p).convert("RGB")) for p in paths])
    std = torch.tensor(IMAGENET[1]).view(1, 3, 1, 1)
    diff = ((images - want) * std * 255).abs()  # in uint8 levels
    # One resample of the crop's box instead of a resize then a crop, on noisy images: the same
    # filter, windows placed within rounding (a shifted window moves a noisy pixel by many levels).
    assert diff.mean() < 1.0 and (diff > 4).float().mean() < 0.02


def test_conversions_of_timm_set_the_units() -> None:
    data = timm_data()
    tt = torchvision_or_skip().transforms
    floats = ((0.0,) * 3, (1.0,) * 3)
    assert from_torchvision([tt.CenterCrop(8), data.transforms.MaybeToTensor()])[1] == floats
    assert from_torchvision([tt.CenterCrop(8), data.transforms.MaybePILToTensor()])[1] is None
    assert from_torchvision([tt.CenterCrop(8), data.transforms.ToNumpy()])[1] is None
    unscaled = from_torchvision([tt.CenterCrop(8), data.transforms.ToTensor()])[1]
    assert unscaled == ((0.0,) * 3, (1.0 / 255.0,) * 3)  # floats in 0..255


def test_resize_keep_ratio_is_a_shorter_edge_resize_or_refused() -> None:
    keep = timm_data().transforms.ResizeKeepRatio
    transforms, _, notes = convert([keep(64, interpolation="bicubic"), T.CenterCrop(56)])
    assert transforms == (T.Resize(64, interpolation="bicubic"), T.CenterCrop(56)) and notes
    for refused in (keep(64, longest=1.0), keep((64, 48)), keep(64, random_scale_prob=0.5)):
        with pytest.raises(ConfigError, match=r"ResizeKeepRatio.*Dataset"):
            from_torchvision([refused, T.CenterCrop(32)])


def test_timm_policies_without_fastload_equivalents_are_refused_by_name() -> None:
    aa = timm_data().auto_augment
    own_policy = aa.AutoAugment([[aa.AugmentOp("Invert", 0.5, 3)]])
    for obj, name in (
        (own_policy, "AutoAugment"),
        (aa.rand_augment_transform("rand-m9-tweights", {}), "RandAugment"),
        (aa.rand_augment_transform("rand-m9-t3a", {}), "RandAugment"),
    ):
        with pytest.raises(ConfigError, match=f"timm's {name}.*Dataset"):
            from_torchvision([T.CenterCrop(8), obj])


# ---------------------------------------------------------------------------------------------
# RandAugment: operations, levels, draws and pixels


@pytest.mark.parametrize("config", ["rand-m9-mstd0.5", "rand-m9-mstd0.5-inc1", "rand-m7-n3-p0.8-mstd101"])
def test_rand_augment_strings_map_onto_the_same_policy(config: str) -> None:
    timm_ra = timm_data().auto_augment.rand_augment_transform(config, {"translate_pct": 0.3})
    (policy,), _, _ = convert(timm_ra)
    assert isinstance(policy, TimmRandAugment)
    assert policy.ops == tuple(o.name for o in timm_ra.ops)
    assert policy.ops == (TIMM_RAND_INCREASING_OPS if "inc1" in config else TIMM_RAND_OPS)
    op = timm_ra.ops[0]
    assert (policy.num_layers, policy.prob, policy.magnitude) == (timm_ra.num_layers, op.prob, op.magnitude)
    assert policy.magnitude_std == op.magnitude_std and policy.translate_pct == 0.3


def test_level_arguments_are_timms(monkeypatch: pytest.MonkeyPatch) -> None:
    aa = timm_data().auto_augment
    hparams = {"translate_pct": 0.45, "translate_const": 100}
    for negate in (False, True):
        monkeypatch.setattr(aa, "_randomly_negate", lambda v, n=negate: -v if n else v)
        for name in set(TIMM_RAND_OPS + TIMM_RAND_INCREASING_OPS) - {"TranslateXRel", "TranslateYRel"}:
            level_fn = aa.LEVEL_TO_ARG[name]
            for level in (0.0, 2.5, 5.0, 9.0, 9.7, 10.0):
                ours = level_argument(name, np.array([level]), np.array([negate]))[0]
                want = level_fn(level, hparams)[0] if level_fn is not None else 0.0
                assert ours == pytest.approx(want, abs=1e-12), (name, level, negate)


def test_rand_augment_draws_follow_timms_distributions() -> None:
    rng = np.random.default_rng(0)
    n = 40000
    op = TimmRandAugmentOp(TimmRandAugment(num_layers=1, magnitude=9, magnitude_std=0.5, prob=0.5))
    levels = op.magnitudes(rng.random(n), rng.random(n))
    assert abs(levels.mean() - 9.0) < 0.02 and abs(levels.std() - 0.5) < 0.02 and levels.max() <= 10.0
    uniform = TimmRandAugmentOp(TimmRandAugment(magnitude=9, magnitude_std=float("inf")))
    spread = uniform.magnitudes(rng.random(n), rng.random(n))
    assert abs(spread.mean() - 4.5) < 0.05 and spread.min() >= 0 and spread.max() <= 9
    fixed = TimmRandAugmentOp(TimmRandAugment(magnitude=9, magnitude_std=0.0))
    assert (fixed.magnitudes(rng.random(10), rng.random(10)) == 9).all()
    params = op.params(rng.random((n, op.draws)))
    counts = dict.fromkeys(op.names, 0)
    for key, value in params.items():  # samples: "0|op" and a geometric op's "0|op|argument"
        if not key.endswith("|value"):
            counts[key.split("|")[1]] += value.size
    applied = sum(counts.values())
    assert abs(applied / n - 0.5) < 0.015  # prob 0.5 per layer
    for name, count in counts.items():  # uniform over the 15
        assert abs(count / applied - 1 / 15) < 0.01, name


def _apply_one(name: str, image: np.ndarray, increasing: bool = True) -> np.ndarray:
    t = TimmRandAugment(num_layers=1, magnitude=7, prob=1.0, increasing=increasing, fill=(124, 116, 104))
    op = TimmRandAugmentOp(t)
    u = np.array([[(t.ops.index(name) + 0.5) / 15, 0.0, 0.5, 0.5, 0.0]])  # that op, applied, not negated
    x = torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0).contiguous()
    params = {k: torch.from_numpy(np.asarray(v)) for k, v in op.params(u).items()}
    return op.apply(x, params)[0].permute(1, 2, 0).numpy()


@pytest.mark.parametrize("name", TIMM_RAND_INCREASING_OPS)
def test_each_rand_augment_operation_is_timms_on_pixels(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    aa = timm_data().auto_augment
    monkeypatch.setattr(aa, "_randomly_negate", lambda v: v)
    rng = np.random.default_rng(3)
    smooth = np.kron(rng.integers(0, 256, (8, 10, 3)), np.ones((6, 6, 1))).astype(np.uint8)
    hparams = {"img_mean": (124, 116, 104), "interpolation": Image.BILINEAR}
    want = np.asarray(aa.AugmentOp(name, prob=1.0, magnitude=7, hparams=hparams)(Image.fromarray(smooth)))
    ours = _apply_one(name, smooth.copy())
    diff = np.abs(ours.astype(int) - want.astype(int))
    assert diff.max() == 0, name  # PIL's arithmetic (pil_affine, pil_enhance, PIL's integer LUTs)
    if name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
        assert np.abs(ours.astype(int) - smooth).mean() > 2, name  # and it did move


# ---------------------------------------------------------------------------------------------
# RandomErasing and Mixup


def test_random_erasing_modes_and_refusals() -> None:
    data = timm_data()
    erasing = data.random_erasing.RandomErasing
    tt = torchvision_or_skip().transforms
    head = [tt.CenterCrop(8), tt.ToTensor(), tt.Normalize(*IMAGENET)]
    for mode, value, noted in (("const", 0.0, False), ("pixel", "random", False), ("rand", "random", True)):
        transforms, _, notes = convert([*head, erasing(0.3, mode=mode, device="cpu")])
        assert transforms[-1] == T.RandomErasing(0.3, (0.02, 1 / 3), transforms[-1].ratio, value)
        assert any("mode='rand'" in n for n in notes) == noted
    with pytest.raises(ConfigError, match="count"):
        from_torchvision([*head, erasing(0.3, max_count=3, device="cpu")])
    with pytest.raises(ConfigError, match="before Normalize"):
        early = erasing(0.3, device="cpu")
        from_torchvision([tt.CenterCrop(8), early, tt.ToTensor(), tt.Normalize(*IMAGENET)])


def test_mixup_converts_with_its_parameters_and_refuses_other_modes() -> None:
    mixup = timm_data().Mixup
    (t,), _, _ = convert(mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.7, switch_prob=0.4,
                               label_smoothing=0.2, num_classes=10))
    assert t == TimmMixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.7, switch_prob=0.4,
                          label_smoothing=0.2, num_classes=10)
    (minmax,), _, _ = convert(mixup(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8), num_classes=10))
    assert minmax.cutmix_minmax == (0.2, 0.8) and minmax.cutmix_alpha == 1.0  # as timm sets it
    for mode in ("elem", "pair"):  # tests/test_timm_recipes.py checks their pixels
        (each,), _, _ = convert(mixup(mode=mode, num_classes=10))
        assert each == TimmMixup(num_classes=10, mode=mode)
    with pytest.raises(ConfigError, match="mode 'half'"):
        from_torchvision(mixup(mode="half", num_classes=10))


def test_mixup_switch_and_prob_are_timms() -> None:
    op = TimmMixupOp(TimmMixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.6, switch_prob=0.3, num_classes=3))
    rng = np.random.default_rng(1)
    draws = [op.choose(u) for u in rng.random((4000, op.draws))]
    mixed = [cut for lam, cut in draws if lam != 1.0]
    assert abs(len(mixed) / 4000 - 0.6) < 0.03 and abs(np.mean(mixed) - 0.3) < 0.03
    boxes = [op.box(32, 48, lam, u[3:]) for (lam, cut), u in zip(draws, rng.random((4000, 7)), strict=True)
             if cut]
    for (top, bottom, left, right), lam in boxes:
        assert 0 <= top <= bottom <= 32 and 0 <= left <= right <= 48
        assert lam == pytest.approx(1 - (bottom - top) * (right - left) / (32 * 48))


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_mixup_targets_on_real_batches(kind: str, image_folder: Path) -> None:
    data = timm_data()
    recipe = data.create_transform(24, is_training=False, crop_pct=1.0)
    alphas = {"mixup_alpha": 1.0, "cutmix_alpha": 0.0}
    if kind == "cutmix":
        alphas = {"mixup_alpha": 0.0, "cutmix_alpha": 1.0}
    mixup = data.Mixup(**alphas, label_smoothing=0.1, num_classes=3)
    common: dict[str, Any] = {"batch_size": 8, "num_workers": 0, "device": "cpu", "seed": 5, "shuffle": True}
    off, on = 0.1 / 3, 0.9 + 0.1 / 3
    with FastLoader(image_folder, transform=[recipe, mixup], **common) as mixed, FastLoader(
        image_folder, transform=recipe, **common
    ) as plain:
        for (x, y), (x0, y0) in zip(mixed, plain, strict=True):
            assert torch.allclose(y.sum(1), torch.ones(8))
            one = torch.full((8, 3), off).scatter_(1, y0.view(-1, 1), on)
            # lam from the first row: y = lam * one + (1 - lam) * one.flip(0)
            rows = [i for i in range(8) if y0[i] != y0.flip(0)[i]]
            i = rows[0]  # the batches here mix two classes at least
            a, f = one[i], one.flip(0)[i]
            k = int(torch.argmax((a - f).abs()))
            lam = float((y[i, k] - f[k]) / (a[k] - f[k]))
            assert torch.allclose(y, lam * one + (1 - lam) * one.flip(0), atol=1e-5)
            if kind == "mixup":
                assert torch.allclose(x, lam * x0 + (1 - lam) * x0.flip(0), atol=1e-5)
            else:
                pasted = (x != x0).any(dim=1) | (x == x0.flip(0)).all(dim=1) & (x0 != x0.flip(0)).any(dim=1)
                area = pasted[0].sum().item() if (x0[0] != x0.flip(0)[0]).any() else None
                if area is not None:
                    assert lam == pytest.approx(1 - area / (24 * 24), abs=1e-6)
                nhwc, flipped = x.permute(0, 2, 3, 1), x0.flip(0).permute(0, 2, 3, 1)
                assert torch.equal(nhwc[pasted], flipped[pasted])


# ---------------------------------------------------------------------------------------------
# RandomApply


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_random_apply_converts_by_its_probability(version: str) -> None:
    torchvision_or_skip()
    m = importlib.import_module("torchvision.transforms" if version == "v1" else "torchvision.transforms.v2")
    head = [m.RandomResizedCrop(8)]
    jitter = T.ColorJitter(brightness=(0.6, 1.4))
    assert from_torchvision([*head, m.RandomApply([m.ColorJitter(0.4)], p=0.0)])[0][1:] == ()
    assert from_torchvision([*head, m.RandomApply([m.ColorJitter(0.4)], p=1.0)])[0][1:] == (jitter,)
    half = from_torchvision([*head, m.RandomApply([m.ColorJitter(0.4), m.RandomGrayscale(0.3)], p=0.5)])[0]
    assert half[1:] == (RandomApply((jitter, T.RandomGrayscale(0.3)), 0.5),)
    assert from_torchvision([*head, m.RandomApply([m.RandomHorizontalFlip(0.5)], p=0.5)])[0][1:] == (
        T.RandomHorizontalFlip(0.25),
    )
    with pytest.raises(ConfigError, match="RandomApply"):
        from_torchvision([m.RandomApply([m.RandomResizedCrop(8)], p=0.5)])


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0])
def test_random_apply_runs_its_members_on_a_share_p_of_the_samples(p: float) -> None:
    solarize_all = T.RandomSolarize(threshold=0.0, p=1.0)  # solarize at 0: invert
    op = RandomApplyOp(RandomApply((solarize_all,), p), KERNELS)
    n = 400
    x = torch.from_numpy(np.random.default_rng(2).integers(0, 256, (n, 3, 4, 4), dtype=np.uint8))
    params = op.params(np.random.default_rng(3).random((n, op.draws)))
    out = op.apply(x.clone(), {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()})
    inverted = (out == 255 - x).flatten(1).all(1)
    untouched = (out == x).flatten(1).all(1)
    assert bool((inverted | untouched).all())
    if p in (0.0, 1.0):
        assert bool(inverted.all() if p == 1.0 else untouched.all())
    else:
        assert abs(inverted.float().mean().item() - p) < 0.08


# ---------------------------------------------------------------------------------------------
# The whole recipe through FastLoader, and across the wire


@pytest.mark.parametrize("interpolation", ["bicubic", "random"])
def test_fastloader_takes_timms_train_recipe_and_mixup(interpolation: str, image_folder: Path) -> None:
    mixup = timm_data().Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the approximations, checked above
        loader = FastLoader(image_folder, transform=[train_recipe(interpolation, 32), mixup], batch_size=8,
                            num_workers=1, device="cpu", seed=1)
    with loader:
        batches = list(loader)
    assert len(batches) == 3
    for x, y in batches:
        assert x.shape == (8, 3, 32, 32) and x.dtype == torch.float32 and bool(torch.isfinite(x).all())
        assert y.shape == (8, 3) and torch.allclose(y.sum(1), torch.ones(8))


def test_converted_recipe_survives_to_config_and_from_config() -> None:
    transforms, _, _ = convert([train_recipe(), timm_data().Mixup(cutmix_minmax=(0.3, 0.7), num_classes=5)])
    half = RandomApply((T.ColorJitter(brightness=(0.6, 1.4)),), 0.8)
    uniform = TimmRandAugment(magnitude_std=float("inf"))
    for chain in (transforms, (half,), (uniform,)):
        assert T.from_config(json.loads(json.dumps(T.to_config(chain)))) == chain


def test_python_random_is_not_used() -> None:
    # The conversions draw nothing: two conversions are equal, whatever Python's RNG state.
    random.seed(1)
    first = convert(train_recipe())[0]
    random.seed(2)
    assert convert(train_recipe())[0] == first
