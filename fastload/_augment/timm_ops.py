"""The kernels of `fastload.transforms._timm_transforms`: timm's RandAugment (a `SampleOp` on uint8
batches), timm's Mixup (a `BatchOp`) and RandomApply (a `SampleOp` over its members' kernels, which
the registry (`registry`), handed to it, makes: this module does not import the registry),
their randomness drawn from the uniforms they are given, as the policies' and mixing's are.

timm's RandAugment runs on PIL images; here its operations are fastload's batched kernels
(torchvision's tensor arithmetic for PIL's ImageOps / ImageEnhance, `fastload._augment.color`),
geometric ones through `affine.policy_op_` (bilinear or nearest, translations by whole pixels,
truncated, as torchvision's policies), with timm's level-to-argument formulas and draws.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from fastload._augment import color, groups
from fastload._augment.affine import Fill, policy_op_
from fastload._augment.mixing import _beta, _check_batch
from fastload._augment.ops import BatchKernel, DeviceParams, Kernels, Params, SampleKernel, SampleOp
from fastload._augment.policies import _bound
from fastload._sample_random import uniform_integers
from fastload.transforms._policies import fill_values
from fastload.transforms._timm_transforms import RandomApply, TimmMixup, TimmRandAugment

_DRAWS_PER_LAYER = 5  # operation, apply, magnitude (two: Box-Muller), sign

_GEOMETRIC = {"Rotate": "Rotate", "ShearX": "ShearX", "ShearY": "ShearY",
              "TranslateXRel": "TranslateX", "TranslateYRel": "TranslateY"}
"""timm's geometric operations, as `policy_op_` names them."""


def solarize_add(x: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    """timm's `solarize_add` per sample: `add` (N,) added to every value below 128, clamped to 255."""
    shifted = (x.to(torch.int16) + add.to(torch.int16).view(-1, 1, 1, 1)).clamp_(max=255).to(x.dtype)
    return torch.where(x < 128, shifted, x)


_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "AutoContrast": color.autocontrast,
    "Equalize": color.equalize,
    "Invert": color.invert,
    "Posterize": color.posterize,
    "Solarize": color.solarize,
    "SolarizeAdd": solarize_add,
    "Color": color.adjust_saturation,
    "Contrast": color.adjust_contrast,
    "Brightness": color.adjust_brightness,
    "Sharpness": color.adjust_sharpness,
}


def level_argument(name: str, level: np.ndarray, negate: np.ndarray) -> np.ndarray:
    """timm's `LEVEL_TO_ARG[name]` on levels (float64, 0..10) and the sign draws (negate where
    True): posterize bits, solarize thresholds, SolarizeAdd's addend, enhance factors, degrees,
    shear factors, translation fractions. Operations without an argument give zeros."""
    frac = level / 10.0
    signed = np.where(negate, -1.0, 1.0)
    if name == "Posterize":
        return (frac * 4).astype(np.int64)
    if name == "PosterizeIncreasing":
        return 4 - (frac * 4).astype(np.int64)
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
    return np.zeros_like(level)


class TimmRandAugmentOp:
    """timm's RandAugment, batched: per sample and layer, an operation uniform over the space (with
    replacement), applied when its draw is <= prob, at a magnitude N(m, std) (Box-Muller on two
    uniforms; uniform in [0, m] for an infinite std) clipped to [0, magnitude_max], negated when its
    draw is > 0.5. Layers run in order, each grouping its samples by operation (and, for a
    geometric one, by its argument: one group when std is 0)."""

    def __init__(self, t: TimmRandAugment) -> None:
        self.t = t
        self.names = t.ops
        self.draws = _DRAWS_PER_LAYER * t.num_layers
        self.fill: Fill = None if t.fill is None else fill_values(t.fill)

    def magnitudes(self, u_mag: np.ndarray, u_box: np.ndarray) -> np.ndarray:
        """Levels (float64) from two uniforms each, timm's `AugmentOp.__call__` distribution."""
        t = self.t
        if t.magnitude_std == math.inf:
            level = u_mag * t.magnitude
        elif t.magnitude_std > 0:
            normal = np.sqrt(-2.0 * np.log1p(-u_mag)) * np.cos(2.0 * np.pi * u_box)
            level = t.magnitude + t.magnitude_std * normal
        else:
            level = np.full_like(u_mag, float(t.magnitude))
        return np.clip(level, 0.0, t.magnitude_max or 10.0)

    def params(self, u: np.ndarray) -> Params:
        """Per layer: "{layer}|{op}" (samples) and "{layer}|{op}|value" for an operation with a
        per-sample argument; "{layer}|{op}|{argument!r}" (samples) for a geometric one."""
        params: Params = {}
        for layer in range(self.t.num_layers):
            d = u[:, _DRAWS_PER_LAYER * layer : _DRAWS_PER_LAYER * (layer + 1)]
            op = uniform_integers(d[:, 0], len(self.names))
            applied = d[:, 1] <= self.t.prob
            level = self.magnitudes(d[:, 2], d[:, 3])
            negate = d[:, 4] > 0.5
            for k, name in enumerate(self.names):
                members = np.flatnonzero(applied & (op == k)).astype(np.int64)
                if members.size == 0:
                    continue
                if name in ("TranslateXRel", "TranslateYRel"):
                    sign = np.where(negate[members], -1.0, 1.0)
                    argument = sign * level[members] / 10.0 * self.t.translate_pct
                else:
                    argument = level_argument(name, level[members], negate[members])
                if name in _GEOMETRIC:
                    for value in np.unique(argument).tolist():
                        params[f"{layer}|{name}|{value!r}"] = members[argument == value]
                    continue
                params[f"{layer}|{name}"] = members
                if name not in ("AutoContrast", "Equalize", "Invert"):
                    params[f"{layer}|{name}|value"] = argument
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the layers' groups on x, in place, in order."""
        height, width = x.shape[-2], x.shape[-1]
        for key, index in p.items():
            parts = key.split("|")
            if parts[-1] == "value" or index.shape[0] == 0:
                continue
            name = parts[1]
            if name in _GEOMETRIC:
                argument = float(parts[2])
                # PIL's affine maps an output pixel to the input one `argument` further: the image
                # moves by -argument, as torchvision's translate by `argument` does not.
                if name == "TranslateXRel":
                    argument *= -width
                elif name == "TranslateYRel":
                    argument *= -height
                policy_op_(x, index, _GEOMETRIC[name], argument, self.t.interpolation, self.fill)
                continue
            kernel = _KERNELS[name.removesuffix("Increasing")]
            groups.apply_to(x, index, _bound(kernel, p.get(f"{key}|value")))
        return x


class TimmMixupOp:
    """timm's Mixup in mode 'batch' (`_params_per_batch`, `_mix_batch`, `mixup_target`).
    Draws: 7 (apply, switch, lam, then the box's: centre y and x (two left unused); or height,
    width, top and left)."""

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

    def box(
        self, height: int, width: int, lam: float, u: np.ndarray
    ) -> tuple[tuple[int, int, int, int], float]:
        """((top, bottom, left, right), lam), timm's `cutmix_bbox_and_lam` from the uniforms `u` (4,)."""
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
            ratio = math.sqrt(1.0 - lam)
            cut_h, cut_w = int(height * ratio), int(width * ratio)
            cy, cx = int(uniform_integers(u[0], height)), int(uniform_integers(u[1], width))
            top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + (cut_h + 1) // 2, 0), height)
            left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + (cut_w + 1) // 2, 0), width)
        if self.t.correct_lam or minmax is not None:
            lam = 1.0 - (bottom - top) * (right - left) / float(height * width)
        return (top, bottom, left, right), lam

    def targets(self, labels: torch.Tensor, lam: float, dtype: torch.dtype) -> torch.Tensor:
        """timm's `mixup_target`: smoothed one-hot targets, mixed with the flipped batch's."""
        off = self.t.label_smoothing / self.num_classes
        on = 1.0 - self.t.label_smoothing + off
        shape = (labels.shape[0], self.num_classes)
        y1 = torch.full(shape, off, dtype=dtype, device=labels.device)
        y1.scatter_(1, labels.view(-1, 1).to(torch.int64), on)
        return y1 * lam + y1.flip(0) * (1.0 - lam)

    def apply(
        self, x: torch.Tensor, labels: torch.Tensor, u: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix `x` in place; return it and the soft targets (N, num_classes)."""
        _check_batch("TimmMixup", x, labels, self.num_classes)
        dtype = x.dtype if x.is_floating_point() else torch.float32
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
