"""timm's AutoAugment, AugMix, 3-Augment and Mixup(mode='elem' / 'pair') in fastload, against
timm's own output recorded by tools/make_timm_fixtures.py (tests/fixtures/timm_recipes.npz: this
suite runs without timm), their draws' distributions, their conversions from timm's objects (where
timm is importable), and their determinism through FastLoader.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fastload import ConfigError, FastLoader
from fastload import transforms as T
from fastload._augment import pil_affine, pil_blur, pil_images
from fastload._augment.timm_ops import TimmMixupOp, level_argument, run_steps, step_groups
from fastload._augment.timm_policies import TimmAugMixOp, TimmAutoAugmentOp, blended_weights
from fastload.transforms import from_torchvision
from fastload.transforms._timm_policies import TIMM_AUGMIX_OPS, TIMM_AUTOAUGMENT_POLICIES

FIXTURES = np.load(Path(__file__).parent / "fixtures" / "timm_recipes.npz")
FILL = (124.0, 116.0, 104.0)
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))



def as_batch(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).unsqueeze(0).contiguous()


def as_image(x: torch.Tensor) -> np.ndarray:
    return x[0].permute(1, 2, 0).numpy()


def on_torch(params: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.asarray(v)) for k, v in params.items()}


def run_one(name: str, level: float, negate: bool, image: np.ndarray, resample: str = "bilinear") -> Any:
    u_sign = np.array([0.75 if negate else 0.25])
    params = step_groups(0, (name,), np.array([0]), np.array([level]), u_sign, 0.45, resample)
    return as_image(run_steps(as_batch(image), on_torch(params), FILL))


@pytest.fixture(params=["batched", "pillow"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both paths of the PIL-exact kernels: the batched torch arithmetic (a GPU's) and Pillow per
    image (a CPU's, where Pillow is installed)."""
    if request.param == "pillow" and pil_images.pillow() is None:
        pytest.skip("Pillow is not installed: the kernels take their batched path")
    for module in (pil_affine, pil_blur):
        monkeypatch.setattr(module, "runs_on_pil", lambda x, use_pil, p=request.param: p == "pillow")
    return str(request.param)


def timm_data() -> Any:
    try:
        from helpers import torchvision_or_skip

        torchvision_or_skip()
        import timm.data
    except ImportError:
        pytest.skip("timm is not installed: conversions need timm's objects (pixels use the fixtures)")
    return timm.data


def convert(obj: Any) -> tuple[T.Transform, ...]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the approximations, named by test_timm.py
        transforms, _ = from_torchvision(obj)
    return transforms


# ---------------------------------------------------------------------------------------------
# Pixels against timm's


@pytest.mark.parametrize("radius", [float(r) for r in FIXTURES["blur_radii"]])
def test_gaussian_blur_is_pils_bit_for_bit(radius: float, path: str) -> None:
    taps = torch.from_numpy(pil_blur.box_weights(np.array([radius])))
    want = FIXTURES["blur"][list(FIXTURES["blur_radii"]).index(radius)]
    assert np.array_equal(as_image(pil_blur.gaussian_blur(as_batch(FIXTURES["image"]), taps)), want)


def test_gaussian_blur_runs_each_sample_with_its_radius(path: str) -> None:
    images = np.stack([FIXTURES["image"], FIXTURES["image"][::-1].copy()])
    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    radii = np.array([0.37, 2.0])
    both = pil_blur.gaussian_blur(x, torch.from_numpy(pil_blur.box_weights(radii)))
    for i, r in enumerate(radii):
        alone = pil_blur.gaussian_blur(x[i : i + 1], torch.from_numpy(pil_blur.box_weights(radii[i : i + 1])))
        assert torch.equal(both[i], alone[0]), r


@pytest.mark.parametrize("size", [(31, 40), (24, 17)])
def test_batched_path_is_pillows_on_many_warps_and_blurs(size: tuple[int, int]) -> None:
    if pil_images.pillow() is None:
        pytest.skip("Pillow is not installed: nothing to compare the batched path with")
    rng = np.random.default_rng(sum(size))
    x = torch.from_numpy(rng.integers(0, 256, (3, *size, 3), dtype=np.uint8)).permute(0, 3, 1, 2)
    x = x.contiguous(memory_format=torch.channels_last)  # a ring slot's layout
    for k in range(12):
        name = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")[k % 5]
        argument = float(rng.uniform(-30, 30) if name == "Rotate" else rng.uniform(-0.45, 0.45))
        matrix = pil_affine.timm_matrix(name, argument, *size)
        for resample in ("bilinear", "bicubic"):
            batched = pil_affine.transform(x, matrix, resample, FILL, use_pil=False)
            assert torch.equal(batched, pil_affine.transform(x, matrix, resample, FILL, use_pil=True)), name
    weights = torch.from_numpy(pil_blur.box_weights(rng.uniform(0.0, 3.0, 3)))
    batched = pil_blur.gaussian_blur(x, weights, use_pil=False)
    assert torch.equal(batched, pil_blur.gaussian_blur(x, weights, use_pil=True))


@pytest.mark.parametrize("resample", ["bilinear", "bicubic"])
@pytest.mark.parametrize("case", range(len(FIXTURES["ops"])))
def test_each_operation_against_timms_pixels(case: int, resample: str, path: str) -> None:
    name = str(FIXTURES["ops"][case])
    level, negate = float(FIXTURES["op_levels"][case]), bool(FIXTURES["op_negate"][case])
    ours = run_one(name, level, negate, FIXTURES["image"], resample).astype(int)
    diff = np.abs(ours - FIXTURES[f"ops_{resample}"][case].astype(int))
    assert diff.max() == 0, name  # PIL's pixels, bit for bit


@pytest.mark.parametrize("case", range(len(FIXTURES["ops"])))
def test_each_operation_against_timms_pixels_on_an_odd_sized_image(case: int, path: str) -> None:
    name = str(FIXTURES["ops"][case])
    level, negate = float(FIXTURES["op_levels"][case]), bool(FIXTURES["op_negate"][case])
    ours = run_one(name, level, negate, FIXTURES["image_odd"], "bicubic")
    assert np.array_equal(ours, FIXTURES["ops_odd_bicubic"][case]), name


def test_new_level_arguments_are_timms() -> None:
    levels = FIXTURES["level_grid"]
    no = np.zeros(levels.shape, dtype=bool)
    posterize = level_argument("PosterizeOriginal", levels, no)
    assert np.array_equal(posterize, FIXTURES["level_posterize_original"])
    # timm's Desaturate level l; its op enhances colour by 1 - l
    assert np.allclose(level_argument("Desaturate", levels, no), 1.0 - FIXTURES["level_desaturate"], atol=0)
    assert np.allclose(level_argument("GaussianBlurRand", levels, no), FIXTURES["level_blur_rand"], atol=0)


@pytest.mark.parametrize("blended", [False, True])
def test_augmix_mixing_is_timms(blended: bool) -> None:
    image = FIXTURES["image"]
    x = as_batch(image)
    exact = ("Invert", "Equalize", "Posterize")
    chains = torch.cat([as_batch(run_one(name, 10.0, False, image)) for name in exact])
    op = TimmAugMixOp(T.TimmAugMix(width=3, depth=1, blended=blended))
    for k in range(2):
        w, m = FIXTURES["augmix_weights"][k : k + 1], FIXTURES["augmix_m"][k : k + 1]
        params = {"blend": blended_weights(w, m)} if blended else {"weights": w, "m": m}
        out = op.mix(x.clone(), chains, on_torch(params))
        want = FIXTURES["augmix_blended" if blended else "augmix_basic"][k]
        assert np.array_equal(as_image(out), want), k


GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
SIGNED = (*GEOMETRIC, "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing")


def _auto_augment_uniforms(policy: str, log: np.ndarray) -> np.ndarray:
    """fastload's uniforms (1, draws) for the draws timm made (the fixture's log, in timm's call
    order: the sub-policy's choice; per operation its apply check (p < 1), sign (signed ones),
    resampling choice (geometric ones) and blur radius)."""
    table = TIMM_AUTOAUGMENT_POLICIES[policy]
    draws = iter((int(kind), float(u)) for kind, u in log if kind >= 0)
    _, u_sub = next(draws)
    chosen = table[int(u_sub * len(table))]
    row = [u_sub]
    for step in range(max(len(sub) for sub in table)):
        own, apply, sign = 0.5, 0.0, 0.25
        if step < len(chosen):
            name, p, _ = chosen[step]
            if p < 1.0:
                apply = next(draws)[1]
            if apply <= p:
                if name in SIGNED:
                    sign = next(draws)[1]
                if name in GEOMETRIC:  # the sign's second bit draws the filter
                    bicubic = int(next(draws)[1] * 2) == 1
                    sign = (0.5 if sign > 0.5 else 0.0) + (0.375 if bicubic else 0.125)
                if name == "GaussianBlurRand":
                    own = next(draws)[1]
        row += [own, apply, 0.5, 0.5, sign]
    assert next(draws, None) is None  # every draw timm made is accounted for
    return np.array([row])


@pytest.mark.parametrize("policy", ["original", "v0r", "3a"])
def test_auto_augment_is_timms_given_its_draws(policy: str, path: str) -> None:
    op = TimmAutoAugmentOp(T.TimmAutoAugment(policy, interpolation="random", fill=FILL))
    image = FIXTURES["image_odd"]
    cases = zip(FIXTURES[f"aa_{policy}"], FIXTURES[f"aa_{policy}_draws"], strict=True)
    for case, (want, log) in enumerate(cases):
        params = op.params(_auto_augment_uniforms(policy, log))
        assert np.array_equal(as_image(op.apply(as_batch(image), on_torch(params))), want), (policy, case)


def _augmix_uniforms(chains: np.ndarray, log: np.ndarray) -> np.ndarray:
    """fastload's uniforms (1, draws) for TimmAugMix(width=3, depth=-1) from timm's draws: each
    chain's depth and operations (numpy's), each operation's level (`uniform(0, m)`), sign and
    resampling (Python's, in call order)."""
    draws = iter((int(kind), float(u)) for kind, u in log if kind >= 0)
    row = [0.5]  # the weights' uniform: the test gives timm's weights instead
    for depth, *ops in chains.tolist():
        row.append((depth - 1 + 0.5) / 3)
        for step in range(3):
            if step >= depth:
                row += [0.5, 0.5, 0.5, 0.25]
                continue
            name = TIMM_AUGMIX_OPS[ops[step]]
            level_u = next(draws)[1]
            sign = next(draws)[1] if name in SIGNED else 0.25
            if name in GEOMETRIC:
                bicubic = int(next(draws)[1] * 2) == 1
                sign = (0.5 if sign > 0.5 else 0.0) + (0.375 if bicubic else 0.125)
            row += [(ops[step] + 0.5) / len(TIMM_AUGMIX_OPS), level_u, 0.5, sign]
    assert next(draws, None) is None
    return np.array([row])


@pytest.mark.parametrize("case", range(6))
def test_augmix_is_timms_given_its_draws(case: int, path: str) -> None:
    blended = case >= 3
    op = TimmAugMixOp(T.TimmAugMix(severity=5, width=3, blended=blended, interpolation="random", fill=FILL))
    f = {k: FIXTURES[f"augmix_full_{k}"][case] for k in ("out", "weights", "m", "chains", "draws")}
    params = op.params(_augmix_uniforms(f["chains"], f["draws"]))
    weights, m = f["weights"][None], f["m"][None]
    params.update({"blend": blended_weights(weights, m)} if blended else {"weights": weights, "m": m})
    assert np.array_equal(as_image(op.apply(as_batch(FIXTURES["image_odd"]), on_torch(params))), f["out"])


def _box_uniforms(calls: np.ndarray, minmax: bool) -> np.ndarray:
    """The uniforms that make fastload's box draw the values timm's randint calls gave."""
    per = 4 if minmax else 2
    rows = np.zeros((len(calls) // per, 4))
    for i in range(len(rows)):
        for j, (low, high, value) in enumerate(calls[i * per : (i + 1) * per]):
            rows[i, j] = (value - low + 0.5) / (high - low)
    return rows


@pytest.mark.parametrize("case", ["elem", "pair", "elem_minmax", "pair_uncorrected"])
def test_mixup_per_element_is_timms_given_its_draws(case: str) -> None:
    settings = {
        "elem": {"mode": "elem", "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5, "prob": 0.9},
        "pair": {"mode": "pair", "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5, "prob": 0.9},
        "elem_minmax": {"mode": "elem", "mixup_alpha": 0.8, "cutmix_minmax": (0.2, 0.8), "prob": 1.0},
        "pair_uncorrected": {"mode": "pair", "mixup_alpha": 0.0, "cutmix_alpha": 1.0, "correct_lam": False},
    }[case]
    prefix = f"mixup_{case}_"
    f = {k.removeprefix(prefix): FIXTURES[k] for k in FIXTURES.files if k.startswith(prefix)}
    op = TimmMixupOp(T.TimmMixup(num_classes=5, label_smoothing=0.1, **settings))  # type: ignore[arg-type]
    lam, use_cutmix = f["lam"], f["use_cutmix"]
    cut = np.flatnonzero(use_cutmix & (lam != 1.0))
    u_box = np.zeros((len(lam), 4))
    u_box[cut] = _box_uniforms(f["randint"], "minmax" in case)
    x = torch.from_numpy(f["x"].copy())
    lam_each = op.mix_each(x, lam, use_cutmix, u_box)
    targets = op.targets(torch.from_numpy(f["labels"]), torch.from_numpy(lam_each).view(-1, 1), torch.float32)
    assert cut.size and not torch.equal(x, torch.from_numpy(f["x"]))  # CutMix drawn, and something mixed
    assert torch.equal(x, torch.from_numpy(f["out"]))
    assert torch.equal(targets, torch.from_numpy(f["targets"]))


def test_mixup_per_element_draws_follow_timms_distributions() -> None:
    op = TimmMixupOp(T.TimmMixup(num_classes=3, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.3, prob=0.6))
    lam, use_cutmix, boxes = op.choose_each(40000, np.random.default_rng(1))
    assert lam.dtype == np.float32 and boxes.shape == (40000, 4)
    assert abs(use_cutmix.mean() - 0.3) < 0.01 and abs((lam != 1.0).mean() - 0.6) < 0.01
    cutmix_lam = lam[use_cutmix & (lam != 1.0)]
    assert abs(cutmix_lam.mean() - 0.5) < 0.01  # Beta(1, 1)


@pytest.mark.parametrize("mode", ["elem", "pair"])
def test_mixup_per_element_mixes_each_image_with_its_mirror(mode: str) -> None:
    op = TimmMixupOp(T.TimmMixup(num_classes=7, mixup_alpha=1.0, label_smoothing=0.0, mode=mode))
    x = torch.arange(7, dtype=torch.float32).view(7, 1, 1, 1).expand(7, 3, 4, 4).contiguous()
    labels = torch.arange(7)
    out, targets = op.apply(x.clone(), labels, np.full(7, 0.25))
    lam = targets[torch.arange(7), labels]  # each image's own share (its mirror's label differs)
    mirror = torch.arange(6.0, -1, -1)
    assert torch.allclose(out[:, 0, 0, 0], lam * torch.arange(7.0) + (1 - lam) * mirror, atol=1e-5)
    if mode == "pair":  # pairs share lam; the middle of an odd batch is left as it is
        assert torch.equal(lam, lam.flip(0)) and lam[3] == 1.0 and torch.equal(out[3], x[3])
    assert torch.allclose(targets.sum(1), torch.ones(7))


# ---------------------------------------------------------------------------------------------
# AutoAugment and AugMix: draws and policies


def test_auto_augment_draws_sub_policies_uniformly_and_applies_by_probability() -> None:
    op = TimmAutoAugmentOp(T.TimmAutoAugment("v0"))
    n = 50000
    params = op.params(np.random.default_rng(2).random((n, op.draws)))
    counts: dict[str, int] = {}
    for key, members in params.items():
        if not key.endswith("|value") and key.split("|")[0] == "0":
            counts[key.split("|")[1]] = counts.get(key.split("|")[1], 0) + members.size
    # step 0 of v0: expected count of each op = n * sum over sub-policies of p / 25
    want: dict[str, float] = {}
    for sub in TIMM_AUTOAUGMENT_POLICIES["v0"]:
        name, p, _ = sub[0]
        want[name] = want.get(name, 0.0) + n * p / 25
    for name, expected in want.items():
        assert abs(counts.get(name, 0) - expected) < 5 * math.sqrt(expected) + 1, name


def test_three_augment_gives_each_image_one_of_solarize_grayscale_blur() -> None:
    op = TimmAutoAugmentOp(T.TimmAutoAugment("3a"))
    n = 3000
    params = op.params(np.random.default_rng(3).random((n, op.draws)))
    groups = {key: members for key, members in params.items() if not key.endswith("|value")}
    assert set(groups) == {"0|Solarize", "0|Desaturate", "0|GaussianBlurRand"}
    assert sum(m.size for m in groups.values()) == n  # probability 1: every image, once
    assert all(abs(m.size / n - 1 / 3) < 0.04 for m in groups.values())
    assert (params["0|Solarize|value"] == 128).all() and (params["0|Desaturate|value"] == 0).all()
    images = np.stack([FIXTURES["image"]] * 6)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    small = op.params(np.random.default_rng(4).random((6, op.draws)))
    out = op.apply(x.clone(), on_torch(small))
    for i in small["0|Desaturate"]:
        assert (out[i].max(0).values - out[i].min(0).values).max() == 0  # grey
    for i in small["0|Solarize"]:
        assert torch.equal(out[i], torch.where(x[i] >= 128, 255 - x[i], x[i]))


def test_augmix_chains_and_weights() -> None:
    t = T.TimmAugMix(severity=5, width=4, depth=-1)
    op = TimmAugMixOp(t)
    u = np.random.default_rng(5).random((2000, op.draws))
    params = op.params(u)
    assert params["weights"].shape == (2000, 4) and np.allclose(params["weights"].sum(1), 1, atol=1e-6)
    assert params["m"].dtype == np.float32 and abs(params["m"].mean() - 0.5) < 0.02
    rows = {int(r) for key, v in params.items() if key[0] in "012" and not key.endswith("value") for r in v}
    assert len(rows) == 2000 * 4  # every chain runs at least one operation (depth 1..3)
    x = torch.from_numpy(np.stack([FIXTURES["image"]] * 3)).permute(0, 3, 1, 2).contiguous()
    small = op.params(u[:3])
    assert torch.equal(op.apply(x.clone(), on_torch(small)), op.apply(x.clone(), on_torch(small)))


# ---------------------------------------------------------------------------------------------
# Conversions from timm's objects


@pytest.mark.parametrize("policy", ["original", "originalr", "v0", "v0r"])
def test_timms_auto_augment_converts(policy: str) -> None:
    data = timm_data()
    recipe = data.create_transform(
        224, is_training=True, auto_augment=f"{policy}-mstd0.5", interpolation="bilinear"
    )
    converted = convert(recipe)
    aa = next(t for t in converted if isinstance(t, T.TimmAutoAugment))
    assert aa == T.TimmAutoAugment(policy=policy, magnitude_std=0.5, fill=(124, 116, 104))
    assert not any(isinstance(t, T.ColorJitter) for t in converted)  # timm disables it with AA


def test_timms_augmix_converts() -> None:
    recipe = timm_data().create_transform(224, is_training=True, auto_augment="augmix-m5-w4-d2")
    (mix,) = [t for t in convert(recipe) if isinstance(t, T.TimmAugMix)]
    assert mix == T.TimmAugMix(severity=5, width=4, depth=2, translate_pct=0.3, fill=(124, 116, 104))
    blended = timm_data().auto_augment.augment_and_mix_transform("augmix-m3-w2-b1-mstd0.5", {})
    # hparams without an interpolation: timm draws bilinear or bicubic per operation
    want = T.TimmAugMix(width=2, blended=True, magnitude_std=0.5, interpolation="random")
    assert convert(blended) == (want,)


def test_timms_three_augment_converts_to_three_augment() -> None:
    recipe = timm_data().create_transform(224, is_training=True, auto_augment="3a", color_jitter=0.3,
                                          interpolation="bilinear")
    converted = convert(recipe)
    start = next(i for i, t in enumerate(converted) if isinstance(t, T.TimmAutoAugment))
    assert converted[start] == T.TimmAutoAugment("3a", fill=(124, 116, 104))
    jitter = converted[start + 1]  # timm's ColorJitter(0.3, 0.3, 0.3), as three_augment(0.3)'s
    assert isinstance(jitter, T.ColorJitter) and jitter.hue is None
    for k in ("brightness", "contrast", "saturation"):
        assert tuple(getattr(jitter, k)) == pytest.approx((0.7, 1.3)), k


def test_three_augment_is_a_chain() -> None:
    assert T.three_augment(None) == (T.TimmAutoAugment("3a"),)
    _, jitter = T.three_augment(0.3)
    assert jitter == T.ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ConfigError, match="policy"):
        T.TimmAutoAugment("imagenet")
    with pytest.raises(ConfigError, match="depth"):
        T.TimmAugMix(depth=0)
    with pytest.raises(ConfigError, match="mode"):
        T.TimmMixup(num_classes=3, mode="half")


# ---------------------------------------------------------------------------------------------
# Through FastLoader: deterministic from the seed, whatever the workers


def _batches(folder: Path, workers: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    chain = [T.RandomResizedCrop(32), T.TimmAutoAugment("v0", magnitude_std=0.5), T.TimmAugMix(),
             *T.three_augment(0.3), T.TimmMixup(num_classes=3, cutmix_alpha=1.0, mode="elem")]
    with FastLoader(folder, transform=chain, normalize=IMAGENET, batch_size=8, num_workers=workers,
                    device="cpu", seed=seed) as loader:
        return [(x.clone(), y.clone()) for x, y in loader]


def test_recipes_through_fastloader_are_deterministic(image_folder: Path) -> None:
    first = _batches(image_folder, 0, seed=3)
    again = _batches(image_folder, 2, seed=3)
    other = _batches(image_folder, 0, seed=4)
    assert len(first) == 3
    for (x, y), (x2, y2) in zip(first, again, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert y.shape == (8, 3) and torch.allclose(y.sum(1), torch.ones(8))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, other, strict=True))
