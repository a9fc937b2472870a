"""Record timm's own output for tests/test_timm_recipes.py (tests/fixtures/timm_recipes.npz): the
operations of timm's AutoAugment, AugMix and 3-Augment on a small image, AugMix's mixing, and
Mixup in modes 'elem' and 'pair' with the parameters timm drew. The test suite compares fastload
against these values without timm installed.

Run with a Python that has timm (and Pillow, numpy, torch); fastload is not imported:

    python tools/make_timm_fixtures.py --out tests/fixtures/timm_recipes.npz
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

OPS = (  # (operation, level, negate): every operation of timm's AutoAugment policies and AugMix
    ("AutoContrast", 5.0, False), ("Equalize", 5.0, False), ("Invert", 5.0, False),
    ("Posterize", 6.0, False), ("PosterizeIncreasing", 6.0, False), ("PosterizeOriginal", 6.0, False),
    ("Solarize", 3.0, False), ("SolarizeIncreasing", 3.0, False), ("SolarizeAdd", 7.0, False),
    ("Color", 9.0, False), ("ColorIncreasing", 7.0, True), ("Contrast", 8.0, False),
    ("ContrastIncreasing", 7.0, False), ("BrightnessIncreasing", 7.0, True), ("Sharpness", 7.0, False),
    ("SharpnessIncreasing", 7.0, False), ("Desaturate", 10.0, False), ("Desaturate", 3.0, False),
    ("Rotate", 8.0, False), ("Rotate", 5.0, True), ("ShearX", 9.0, False), ("ShearY", 4.0, True),
    ("TranslateXRel", 9.0, False), ("TranslateYRel", 9.0, True),
)
BLUR_RADII = (0.1, 0.37, 0.9, 1.5, 2.0)
FILL = (124, 116, 104)  # create_transform's img_mean for ImageNet's mean


def image(seed: int, height: int = 24, width: int = 32) -> np.ndarray:
    """A smooth random image with edges: 4x4 blocks of random colours over a gradient."""
    rng = np.random.default_rng(seed)
    blocks = np.kron(rng.integers(0, 256, (height // 4, width // 4, 3)), np.ones((4, 4, 1)))
    ramp = np.linspace(0, 60, width)[None, :, None]
    return np.clip(blocks * 0.8 + ramp, 0, 255).astype(np.uint8)


def operations(aa: Any, img: Image.Image, resample: int) -> np.ndarray:
    hparams = {"img_mean": FILL, "interpolation": resample, "translate_pct": 0.45, "translate_const": 100}
    out = []
    real = aa._randomly_negate
    for name, level, negate in OPS:
        aa._randomly_negate = (lambda v: -v) if negate else (lambda v: v)
        op = aa.AugmentOp(name, prob=1.0, magnitude=level, hparams=hparams)
        out.append(np.asarray(op(img)))
    aa._randomly_negate = real
    return np.stack(out)


class Draws:
    """Python's `random` as timm's auto_augment module uses it, over logged uniforms: `random()`,
    `choice(seq)` = seq[floor(u len)], `uniform(a, b)` = a + (b - a) u (Python's own formula). The
    log (kind: 0 random, 1 choice, 2 uniform; u) lets the test give fastload the same draws."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.log: list[tuple[int, float]] = []

    def _u(self, kind: int) -> float:
        u = float(self.rng.random())
        self.log.append((kind, u))
        return u

    def random(self) -> float:
        return self._u(0)

    def choice(self, seq: Any) -> Any:
        return seq[min(int(self._u(1) * len(seq)), len(seq) - 1)]

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self._u(2)


AUTOAUGMENT_CASES = (("original", 8), ("v0r", 8), ("3a", 6))


def auto_augments(aa: Any, img: Image.Image) -> dict[str, np.ndarray]:
    """timm's whole AutoAugment (timm's create_transform hparams, resampling drawn per operation)
    on the odd-sized image, several draws per policy, with the draws it made."""
    hparams = {"img_mean": FILL, "translate_const": 100}
    real = aa.random
    out: dict[str, np.ndarray] = {}
    for policy, count in AUTOAUGMENT_CASES:
        transform = aa.auto_augment_transform(policy, dict(hparams))
        images, logs = [], np.full((count, 12, 2), -1.0)
        for case in range(count):
            draws = Draws(1000 * len(policy) + case)
            aa.random = draws
            images.append(np.asarray(transform(img)))
            logs[case, : len(draws.log)] = draws.log
        out[f"aa_{policy}"] = np.stack(images)
        out[f"aa_{policy}_draws"] = logs
    aa.random = real
    return out


def augmixes(aa: Any, img: Image.Image) -> dict[str, np.ndarray]:
    """timm's whole AugMix ('augmix-m5-w3', depth drawn) on the odd-sized image, basic and blended,
    with its draws: numpy's (chain weights, m, each chain's depth and operations) and Python's."""
    transform = aa.augment_and_mix_transform("augmix-m5-w3", {"img_mean": FILL, "translate_const": 100})
    rnd, real = np.random, (np.random.dirichlet, np.random.beta, np.random.randint, np.random.choice)
    rng = np.random.default_rng(11)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("out", "weights", "m", "chains", "draws")}
    for blended in (False, True):
        transform.blended = blended
        for case in range(3):
            chains: list[list[int]] = []
            rnd.dirichlet = lambda alpha: rng.dirichlet(alpha)
            rnd.beta = lambda a, b: rng.beta(a, b)
            rnd.randint = lambda low, high: int(rng.integers(low, high))

            def choice(ops: Any, depth: int, replace: bool = True, chains: list = chains) -> Any:
                picked = rng.integers(0, len(ops), depth)
                chains.append([depth, *picked.tolist(), *[-1] * (3 - depth)])
                return [ops[i] for i in picked]

            rnd.choice = choice
            draws = Draws(50 + case)
            aa.random = draws
            w, m = rng.dirichlet([1.0] * 3), rng.beta(1.0, 1.0)  # drawn here so they can be recorded
            rnd.dirichlet, rnd.beta = (lambda alpha, w=w: w), (lambda a, b, m=m: m)
            out["out"].append(np.asarray(transform(img)))
            out["weights"].append(np.float32(w))
            out["m"].append(np.float32(m))
            out["chains"].append(np.array(chains))
            log = np.full((40, 2), -1.0)
            log[: len(draws.log)] = draws.log
            out["draws"].append(log)
    rnd.dirichlet, rnd.beta, rnd.randint, rnd.choice = real
    return {f"augmix_full_{k}": np.stack(v) for k, v in out.items()}


def augmix_mixes(aa: Any, img: Image.Image) -> dict[str, np.ndarray]:
    """`_apply_basic` and `_apply_blended` with chain c running ops[c] (Invert, Equalize,
    Posterize at 10: fastload's are PIL's bits), for two drawn (weights, m)."""
    ops = [aa.AugmentOp(n, prob=1.0, magnitude=10) for n in ("Invert", "Equalize", "Posterize")]
    mix = aa.AugMixAugment(ops, alpha=1.0, width=3, depth=1)
    rng = np.random.default_rng(5)
    weights, ms, basic, blended = [], [], [], []
    for _ in range(2):
        w = np.float32(rng.dirichlet([1.0] * 3))
        m = np.float32(rng.beta(1.0, 1.0))
        for apply, into in ((mix._apply_basic, basic), (mix._apply_blended, blended)):
            chain = iter(range(3))
            aa.np.random.choice = lambda _ops, _n, replace=True, p=None, it=chain: [ops[next(it)]]
            into.append(np.asarray(apply(img, w, m)))
        weights.append(w)
        ms.append(m)
    # numpy.random.choice (aa.np is numpy) is restored by main()
    return {"augmix_weights": np.stack(weights), "augmix_m": np.array(ms, dtype=np.float32),
            "augmix_basic": np.stack(basic), "augmix_blended": np.stack(blended)}


def mixups(mixup_module: Any) -> dict[str, np.ndarray]:
    """timm's Mixup in modes elem and pair, with the parameters it drew: per case the batch, the
    labels, `_params_per_elem`'s (lam, use_cutmix), each `randint(low, high)` call's value, and
    timm's images and targets."""
    out: dict[str, np.ndarray] = {}
    cases = {
        "elem": {"mode": "elem", "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5, "prob": 0.9},
        "pair": {"mode": "pair", "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "switch_prob": 0.5, "prob": 0.9},
        "elem_minmax": {"mode": "elem", "mixup_alpha": 0.8, "cutmix_minmax": (0.2, 0.8), "prob": 1.0},
        "pair_uncorrected": {"mode": "pair", "mixup_alpha": 0.0, "cutmix_alpha": 1.0, "correct_lam": False},
    }
    real_randint = np.random.randint
    real_params = mixup_module.Mixup._params_per_elem
    np.random.seed(7)
    for name, kwargs in cases.items():
        calls: list[tuple[int, int, int]] = []
        drawn: list[tuple[np.ndarray, np.ndarray]] = []

        def randint(low: int, high: int | None = None, size: Any = None, calls: list = calls) -> Any:
            value = real_randint(low, high, size=size)
            calls.append((int(low), int(high), int(value)))
            return value

        def params(self: Any, batch_size: int, drawn: list = drawn) -> Any:
            lam, use_cutmix = real_params(self, batch_size)
            drawn.append((lam.copy(), use_cutmix.copy()))
            return lam, use_cutmix

        np.random.randint = randint
        mixup_module.Mixup._params_per_elem = params
        x = torch.from_numpy(np.random.default_rng(len(name)).normal(size=(8, 3, 12, 10)).astype(np.float32))
        target = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2])
        mixer = mixup_module.Mixup(label_smoothing=0.1, num_classes=5, **kwargs)
        mixed, soft = mixer(x.clone(), target)
        np.random.randint = real_randint
        mixup_module.Mixup._params_per_elem = real_params
        out[f"mixup_{name}_x"] = x.numpy()
        out[f"mixup_{name}_labels"] = target.numpy()
        out[f"mixup_{name}_lam"] = drawn[0][0]
        out[f"mixup_{name}_use_cutmix"] = drawn[0][1]
        out[f"mixup_{name}_randint"] = np.array(calls, dtype=np.int64).reshape(-1, 3)
        out[f"mixup_{name}_out"] = mixed.numpy()
        out[f"mixup_{name}_targets"] = soft.numpy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    args = parser.parse_args()
    import timm
    import timm.data.auto_augment as aa
    import timm.data.mixup as mixup_module

    def level(name: str, value: float) -> float:
        return float(aa.LEVEL_TO_ARG[name](value, {})[0])

    random.seed(0)
    img = image(3)
    pil = Image.fromarray(img)
    odd = np.ascontiguousarray(image(4, 20, 24)[1:18, 2:23])  # 17 x 21: centres between pixels
    levels = np.array([0.0, 2.5, 5.0, 9.7, 10.0])
    arrays: dict[str, np.ndarray] = {
        "timm_version": np.array(timm.__version__),
        "image": img,
        "ops": np.array([n for n, _, _ in OPS]),
        "op_levels": np.array([lv for _, lv, _ in OPS]),
        "op_negate": np.array([ng for _, _, ng in OPS]),
        "ops_bilinear": operations(aa, pil, Image.BILINEAR),
        "ops_bicubic": operations(aa, pil, Image.BICUBIC),
        "image_odd": odd,
        "ops_odd_bicubic": operations(aa, Image.fromarray(odd), Image.BICUBIC),
        "blur_radii": np.array(BLUR_RADII),
        "blur": np.stack([np.asarray(aa.gaussian_blur(pil, r)) for r in BLUR_RADII]),
        "level_grid": levels,
        "level_posterize_original": np.array([level("PosterizeOriginal", v) for v in levels]),
        "level_desaturate": np.array([level("Desaturate", v) for v in levels]),
        "level_blur_rand": np.array([level("GaussianBlurRand", v) for v in levels]),
    }
    real_choice = np.random.choice
    arrays.update(augmix_mixes(aa, pil))
    real_random = aa.random
    arrays.update(auto_augments(aa, Image.fromarray(odd)))
    arrays.update(augmixes(aa, Image.fromarray(odd)))
    aa.random = real_random
    aa.np.random.choice = real_choice
    arrays.update(mixups(mixup_module))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"{args.out}: {args.out.stat().st_size} bytes, timm {timm.__version__}")


if __name__ == "__main__":
    main()
