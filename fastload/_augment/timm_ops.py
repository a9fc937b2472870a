"""The kernels of `fastload.transforms._timm_transforms`: timm's RandAugment (a `SampleOp` on uint8
batches), timm's Mixup (a `BatchOp`) and RandomApply (a `SampleOp` over its members' kernels, which
the registry (`registry`), handed to it, makes: this module does not import the registry),
their randomness drawn from the uniforms they are given, as the policies' and mixing's are.

timm's operations run on PIL images; here they are batched kernels over one table (`step_groups`
makes a step's groups, `run_steps` runs them; timm's AutoAugment and AugMix, `timm_policies`, use
it too), with timm's level-to-argument formulas and draws: rotations, shears and translations
through PIL's affine bit for bit (`pil_affine`, bilinear, bicubic or timm's random choice of
the two; nearest through `affine.policy_op_`, approximated), its Gaussian blur (`pil_blur`),
ImageEnhance and autocontrast (`pil_enhance`) bit for bit, solarize, posterize, invert and
equalize with PIL's integer arithmetic (`color`): timm's pixels (tests/test_timm_recipes.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import torch

from fastload._augment import color, groups, pil_affine, pil_blur, pil_enhance
from fastload._augment.affine import Fill, policy_op_
from fastload._augment.mixing import _beta, _check_batch
from fastload._augment.ops import BatchKernel, DeviceParams, Kernels, Params, SampleKernel, SampleOp
from fastload._augment.policies import _bound, sample_groups
from fastload._sample_random import uniform_integers
from fastload.transforms._policies import fill_values
from fastload.transforms._timm_transforms import RandomApply, TimmMixup, TimmRandAugment

_DRAWS_PER_OP = 5  # operation (or apply), apply, magnitude (two: Box-Muller), sign; AutoAugment's
# and AugMix's steps use the first for an operation's own draw (a blur's radius)

_GEOMETRIC = {"Rotate": "Rotate", "ShearX": "ShearX", "ShearY": "ShearY",
              "TranslateXRel": "TranslateX", "TranslateYRel": "TranslateY"}
"""timm's geometric operations, as `policy_op_` names them."""

_NO_ARGUMENT = ("AutoContrast", "Equalize", "Invert")


def solarize_add(x: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    """timm's `solarize_add` per sample: `add` (N,) added to every value below 128, clamped to 255."""
    shifted = (x.to(torch.int16) + add.to(torch.int16).view(-1, 1, 1, 1)).clamp_(max=255).to(x.dtype)
    return torch.where(x < 128, shifted, x)


_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "AutoContrast": pil_enhance.autocontrast,
    "Equalize": color.equalize,
    "Invert": color.invert,
    "Posterize": color.posterize,
    "PosterizeOriginal": color.posterize,
    "Solarize": color.solarize,
    "SolarizeAdd": solarize_add,
    "Color": pil_enhance.color,
    "Contrast": pil_enhance.contrast,
    "Brightness": pil_enhance.brightness,
    "Sharpness": pil_enhance.sharpness,
    "Desaturate": pil_enhance.color,  # ImageEnhance.Color(1 - level)
    "GaussianBlurRand": pil_blur.gaussian_blur,
}


def level_argument(name: str, level: np.ndarray, negate: np.ndarray) -> np.ndarray:
    """timm's `LEVEL_TO_ARG[name]` on levels (float64, 0..10) and the sign draws (negate where
    True): posterize bits, solarize thresholds, SolarizeAdd's addend, enhance factors, degrees,
    shear factors, translation fractions; Desaturate's colour factor (1 - its level, as timm's
    `desaturate` takes it), GaussianBlurRand's factor (its radius is uniform in [0.1, 2 factor]).
    Operations without an argument give zeros."""
    frac = level / 10.0
    signed = np.where(negate, -1.0, 1.0)
    if name == "Posterize":
        return (frac * 4).astype(np.int64)
    if name == "PosterizeIncreasing":
        return 4 - (frac * 4).astype(np.int64)
    if name == "PosterizeOriginal":
        return (frac * 4).astype(np.int64) + 4
    if name == "Solarize":
        return np.minimum(256, (frac * 256).astype(np.int64)).astype(np.float64)
    if name == "SolarizeIncreasing":
        return 256.0 - np.minimum(256, (frac * 256).astype(np.int64))
    if name == "SolarizeAdd":
        return np.minimum(128, (frac * 110).astype(np.int64))
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return frac * 1.8 + 0.1
    if name.endswith("Increasing"):
        return np.maximum(0.1, 1.0 + signed * frac * 0.9)
    if name == "Rotate":
        return signed * frac * 30.0
    if name in ("ShearX", "ShearY"):
        return signed * frac * 0.3
    if name == "Desaturate":
        return np.clip(1.0 - np.clip(0.5 + 0.5 * frac, 0.5, 1.0), 0.0, 1.0)
    if name == "GaussianBlurRand":
        return np.clip(frac, 0.0, 1.0)
    return np.zeros_like(level)


def timm_levels(
    magnitude: np.ndarray | float, std: float, upper: float, u_mag: np.ndarray, u_box: np.ndarray
) -> np.ndarray:
    """Levels (float64), timm's `AugmentOp.__call__` distribution from two uniforms each: N(magnitude,
    std) (Box-Muller), uniform in [0, magnitude] for an infinite std, `magnitude` for 0; clipped
    to [0, upper]."""
    if std == math.inf:
        level = u_mag * magnitude
    elif std > 0:
        normal = np.sqrt(-2.0 * np.log1p(-u_mag)) * np.cos(2.0 * np.pi * u_box)
        level = magnitude + std * normal
    else:
        level = np.broadcast_to(np.asarray(magnitude, dtype=np.float64), u_mag.shape).copy()
    return np.clip(level, 0.0, upper)


def step_groups(
    step: int,
    names: Sequence[str],
    op: np.ndarray,
    level: np.ndarray,
    u_sign: np.ndarray,
    translate_pct: float,
    interpolation: str,
    own: np.ndarray | None = None,
) -> Params:
    """One step's groups, from per-sample choices (N,): `op` (an index into `names`, -1 for none),
    its `level`, its sign's uniform `u_sign` (negated above 0.5, as timm's `_randomly_negate`; its
    second bit draws the filter where `interpolation` is 'random', timm's choice of bilinear or
    bicubic) and `own` (the operation's own uniform: a blur's radius). Keys: "{step}|{op}"
    (samples) and "{step}|{op}|value" (their argument) for a pixel operation,
    "{step}|{op}|{argument!r}|{filter}" (samples) for a geometric one."""
    params: Params = {}
    negate = u_sign > 0.5
    if interpolation == "random":
        filters = np.where((u_sign * 2.0) % 1.0 >= 0.5, "bicubic", "bilinear")
    else:
        filters = np.full(u_sign.shape, interpolation)
    for k, name in enumerate(names):
        members = np.flatnonzero(op == k).astype(np.int64)
        if members.size == 0:
            continue
        if name in ("TranslateXRel", "TranslateYRel"):
            sign = np.where(negate[members], -1.0, 1.0)
            argument = sign * level[members] / 10.0 * translate_pct
        else:
            argument = level_argument(name, level[members], negate[members])
        if name in _GEOMETRIC:
            for value in np.unique(argument).tolist():
                for resample in np.unique(filters[members]).tolist():
                    chosen = (argument == value) & (filters[members] == resample)
                    if chosen.any():
                        params[f"{step}|{name}|{value!r}|{resample}"] = members[chosen]
            continue
        params[f"{step}|{name}"] = members
        if name == "GaussianBlurRand":  # random.uniform(0.1, 2 factor), then PIL's box taps
            assert own is not None
            argument = pil_blur.box_weights(0.1 + (2.0 * argument - 0.1) * own[members])
        if name not in _NO_ARGUMENT:
            params[f"{step}|{name}|value"] = argument
    return params


def run_steps(x: torch.Tensor, p: DeviceParams, fill: Fill) -> torch.Tensor:
    """Run the groups of `step_groups` (keys in step order) on x, in place, in order: geometric
    ones bilinear or bicubic through PIL's affine (`pil_affine`), nearest through torch's grid."""
    height, width = x.shape[-2], x.shape[-1]
    for key, parts, index in sample_groups(p):
        name = parts[1]
        if name in _GEOMETRIC:
            argument, resample = float(parts[2]), parts[3]
            if resample != "nearest":
                matrix = pil_affine.timm_matrix(name, argument, height, width)
                warp = partial(pil_affine.transform, matrix=matrix, resample=resample, fill=fill or (0, 0, 0))
                groups.apply_to(x, index, warp)
                continue
            # PIL's affine maps an output pixel to the input one `argument` further: the image
            # moves by -argument, as torchvision's translate by `argument` does not.
            if name == "TranslateXRel":
                argument *= -width
            elif name == "TranslateYRel":
                argument *= -height
            policy_op_(x, index, _GEOMETRIC[name], argument, "nearest", fill)
            continue
        kernel = _KERNELS[name.removesuffix("Increasing")]
        groups.apply_to(x, index, _bound(kernel, p.get(f"{key}|value")))
    return x


class TimmRandAugmentOp:
    """timm's RandAugment, batched: per sample and layer, an operation uniform over the space (with
    replacement), applied when its draw is <= prob, at a magnitude N(m, std) (Box-Muller on two
    uniforms; uniform in [0, m] for an infinite std) clipped to [0, magnitude_max], negated when its
    draw is > 0.5. Layers run in order, each grouping its samples by operation (and, for a
    geometric one, by its argument: one group when std is 0)."""

    def __init__(self, t: TimmRandAugment) -> None:
        self.t = t
        self.names = t.ops
        self.draws = _DRAWS_PER_OP * t.num_layers
        self.fill: Fill = None if t.fill is None else fill_values(t.fill)

    def magnitudes(self, u_mag: np.ndarray, u_box: np.ndarray) -> np.ndarray:
        """Levels (float64) from two uniforms each, timm's `AugmentOp.__call__` distribution."""
        t = self.t
        return timm_levels(float(t.magnitude), t.magnitude_std, t.magnitude_max or 10.0, u_mag, u_box)

    def params(self, u: np.ndarray) -> Params:
        """Each layer's `step_groups`."""
        params: Params = {}
        for layer in range(self.t.num_layers):
            d = u[:, _DRAWS_PER_OP * layer : _DRAWS_PER_OP * (layer + 1)]
            op = np.where(d[:, 1] <= self.t.prob, uniform_integers(d[:, 0], len(self.names)), -1)
            level = self.magnitudes(d[:, 2], d[:, 3])
            pct, interpolation = self.t.translate_pct, self.t.interpolation
            params.update(step_groups(layer, self.names, op, level, d[:, 4], pct, interpolation))
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the layers' groups on x, in place, in order."""
        return run_steps(x, p, self.fill)


class TimmMixupOp:
    """timm's Mixup (`_params_per_batch` / `_params_per_elem`, `_mix_batch` / `_mix_elem` /
    `_mix_pair`, `mixup_target`). Draws: 7 (apply, switch, lam, then the box's: centre y and x
    (two left unused); or height, width, top and left); in modes 'elem' and 'pair' the first seeds
    the numpy Generator that draws the images' parameters in timm's order."""

    draws = 7

    def __init__(self, t: TimmMixup) -> None:
        self.t = t
        self.num_classes = int(t.num_classes)

    def choose(self, u: np.ndarray) -> tuple[float, bool]:
        """(lam, use_cutmix) for the batch, timm's `_params_per_batch`."""
        t = self.t
        if not u[0] < t.prob:
            return 1.0, False
        if t.mixup_alpha > 0 and t.cutmix_alpha > 0:
            use_cutmix = bool(u[1] < t.switch_prob)
        else:
            use_cutmix = t.cutmix_alpha > 0
        return _beta(t.cutmix_alpha if use_cutmix else t.mixup_alpha, float(u[2])), use_cutmix

    def choose_each(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lam float32 (count,), use_cutmix bool (count,), box uniforms (count, 4)): timm's
        `_params_per_elem`, `rng` drawing where timm's draws from numpy's global state."""
        t = self.t
        use_cutmix = np.zeros(count, dtype=bool)
        if t.mixup_alpha > 0 and t.cutmix_alpha > 0:
            use_cutmix = rng.random(count) < t.switch_prob
            cut = rng.beta(t.cutmix_alpha, t.cutmix_alpha, count)
            lam_mix = np.where(use_cutmix, cut, rng.beta(t.mixup_alpha, t.mixup_alpha, count))
        elif t.mixup_alpha > 0:
            lam_mix = rng.beta(t.mixup_alpha, t.mixup_alpha, count)
        else:
            use_cutmix = np.ones(count, dtype=bool)
            lam_mix = rng.beta(t.cutmix_alpha, t.cutmix_alpha, count)
        lam = np.where(rng.random(count) < t.prob, lam_mix.astype(np.float32), np.float32(1.0))
        return lam.astype(np.float32), use_cutmix, rng.random((count, 4))

    def box(
        self, height: int, width: int, lam: float | np.float32, u: np.ndarray
    ) -> tuple[tuple[int, int, int, int], float]:
        """((top, bottom, left, right), lam), timm's `cutmix_bbox_and_lam` from the uniforms `u` (4,);
        a float32 lam (modes 'elem', 'pair') sizes the box in float32, as timm's numpy does."""
        minmax = self.t.cutmix_minmax
        if minmax is not None:
            low_h, high_h = int(height * minmax[0]), int(height * minmax[1])
            low_w, high_w = int(width * minmax[0]), int(width * minmax[1])
            cut_h = low_h + int(uniform_integers(u[0], max(1, high_h - low_h)))
            cut_w = low_w + int(uniform_integers(u[1], max(1, high_w - low_w)))
            top = int(uniform_integers(u[2], height - cut_h + 1))
            left = int(uniform_integers(u[3], width - cut_w + 1))
            bottom, right = top + cut_h, left + cut_w
        else:
            if isinstance(lam, float):
                cut_h, cut_w = int(height * math.sqrt(1.0 - lam)), int(width * math.sqrt(1.0 - lam))
            else:
                ratio = np.sqrt(np.float32(1.0) - lam)
                cut_h, cut_w = int(np.float32(height) * ratio), int(np.float32(width) * ratio)
            cy, cx = int(uniform_integers(u[0], height)), int(uniform_integers(u[1], width))
            top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + (cut_h + 1) // 2, 0), height)
            left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + (cut_w + 1) // 2, 0), width)
        if self.t.correct_lam or minmax is not None:
            lam = 1.0 - (bottom - top) * (right - left) / float(height * width)
        return (top, bottom, left, right), float(lam)

    def targets(self, labels: torch.Tensor, lam: float | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """timm's `mixup_target`: smoothed one-hot targets, mixed with the flipped batch's by lam
        (a float, or (N, 1) per image)."""
        off = self.t.label_smoothing / self.num_classes
        on = 1.0 - self.t.label_smoothing + off
        shape = (labels.shape[0], self.num_classes)
        y1 = torch.full(shape, off, dtype=dtype, device=labels.device)
        y1.scatter_(1, labels.view(-1, 1).to(torch.int64), on)
        return y1 * lam + y1.flip(0) * (1.0 - lam)

    def mix_each(
        self, x: torch.Tensor, lam: np.ndarray, use_cutmix: np.ndarray, u_box: np.ndarray
    ) -> np.ndarray:
        """timm's `_mix_elem` (lam etc. (N,)) or `_mix_pair` ((N // 2,)) on x, in place, batched:
        image i mixed with the original image N-1-i. Returns each image's lam (N,) float32."""
        n, height, width = x.shape[0], x.shape[-2], x.shape[-1]
        count = lam.shape[0]
        lam = lam.astype(np.float32)  # a copy: CutMix's lam is corrected to its box
        mixed = lam != 1.0
        cut = use_cutmix & mixed
        boxes = np.zeros((count, 4), dtype=np.int64)
        for i in np.flatnonzero(cut).tolist():
            boxes[i], lam[i] = self.box(height, width, lam[i], u_box[i])
        if count < n:  # pairs: image N-1-i takes pair i's draw (the middle of an odd batch, none)
            pad = n - 2 * count
            lam = np.concatenate([lam, np.ones(pad, dtype=np.float32), lam[::-1]])
            mixed = np.concatenate([mixed, np.zeros(pad, dtype=bool), mixed[::-1]])
            cut = np.concatenate([cut, np.zeros(pad, dtype=bool), cut[::-1]])
            boxes = np.concatenate([boxes, np.zeros((pad, 4), dtype=np.int64), boxes[::-1]])
        source = x.flip(0)  # a copy: the originals each image is mixed with
        blend = np.flatnonzero(mixed & ~cut)
        if blend.size:
            index = torch.from_numpy(blend).to(x.device)
            own = torch.from_numpy(lam[blend]).to(x.device, x.dtype).view(-1, 1, 1, 1)
            other = torch.from_numpy(np.float32(1.0) - lam[blend]).to(x.device, x.dtype).view(-1, 1, 1, 1)
            x.index_copy_(0, index, x.index_select(0, index) * own + source.index_select(0, index) * other)
        chosen = np.flatnonzero(cut)
        if chosen.size:
            b = torch.from_numpy(boxes[chosen]).to(x.device).view(-1, 4, 1, 1)
            rows = torch.arange(height, device=x.device).view(1, -1, 1)
            cols = torch.arange(width, device=x.device).view(1, 1, -1)
            inside = (rows >= b[:, 0]) & (rows < b[:, 1]) & (cols >= b[:, 2]) & (cols < b[:, 3])
            index = torch.from_numpy(chosen).to(x.device)
            pasted = torch.where(inside.unsqueeze(1), source.index_select(0, index), x.index_select(0, index))
            x.index_copy_(0, index, pasted)
        return lam

    def apply(
        self, x: torch.Tensor, labels: torch.Tensor, u: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix `x` in place; return it and the soft targets (N, num_classes)."""
        _check_batch("TimmMixup", x, labels, self.num_classes)
        dtype = x.dtype if x.is_floating_point() else torch.float32
        if self.t.mode != "batch":
            count = x.shape[0] // 2 if self.t.mode == "pair" else x.shape[0]
            rng = np.random.default_rng(int(u[0] * 2.0**53))
            lam_each = torch.from_numpy(self.mix_each(x, *self.choose_each(count, rng)))
            return x, self.targets(labels, lam_each.to(labels.device, dtype).view(-1, 1), dtype)
        lam, use_cutmix = self.choose(u)
        if lam != 1.0:
            if use_cutmix:
                (top, bottom, left, right), lam = self.box(x.shape[-2], x.shape[-1], lam, u[3:7])
                x[:, :, top:bottom, left:right] = x.flip(0)[:, :, top:bottom, left:right]
            else:
                flipped = x.flip(0).mul_(1.0 - lam)
                x.mul_(lam).add_(flipped)
        return x, self.targets(labels, lam, dtype)


class RandomApplyOp:
    """RandomApply: a sample whose first uniform is < p runs every member, on the others' rows
    taken out of the batch; the members draw from the sample's remaining uniforms."""

    def __init__(self, t: RandomApply, kernels: Kernels) -> None:
        """`kernels`: the registry, which makes the members' kernels (handed down, never imported:
        the registry imports this module)."""
        self.p = float(t.p)
        self.ops: list[SampleOp] = [kernels.sample_op(member) for member in t.transforms]
        self.draws = 1 + sum(op.draws for op in self.ops)

    def params(self, u: np.ndarray) -> Params:
        """"chosen" (the samples that apply) and each member's parameters for them, "{k}|{key}"."""
        chosen = np.flatnonzero(u[:, 0] < self.p).astype(np.int64)
        params: Params = {"chosen": chosen}
        start = 1
        for k, op in enumerate(self.ops):
            for key, value in op.params(u[chosen, start : start + op.draws]).items():
                params[f"{k}|{key}"] = value
            start += op.draws
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the members on the chosen samples, in place."""

        def members(batch: torch.Tensor) -> torch.Tensor:
            for k, op in enumerate(self.ops):
                prefix = f"{k}|"
                own = {key[len(prefix) :]: v for key, v in p.items() if key.startswith(prefix)}
                batch = op.apply(batch, own)
            return batch

        return groups.apply_to(x, p["chosen"], members)


KERNELS: dict[str, SampleKernel] = {
    "TimmRandAugment": lambda t, _: TimmRandAugmentOp(t),
    "RandomApply": RandomApplyOp,
}
"""The per-sample kernels of this module, by the names their declarations give (`registry`)."""

BATCH_KERNELS: dict[str, BatchKernel] = {"TimmMixup": lambda t, _: TimmMixupOp(t)}
"""The batch kernel of this module, likewise."""
