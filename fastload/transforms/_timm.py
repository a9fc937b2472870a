"""timm's transforms (what `timm.data.create_transform` and `timm.data.Mixup` make), converted to
fastload's for `from_torchvision`: its crops and resizes, RandAugment, AutoAugment (its policies
and DeiT III's '3a'), AugMix, RandomErasing and Mixup (modes 'batch', 'pair', 'elem'); read from the
attributes timm stores, by class name: timm is not a dependency, and is never imported here.

Where fastload approximates timm, the conversion says so with a `UserWarning` that names the
operation; what it cannot do is a `ConfigError` naming the transform and the way out.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from fastload._errors import ConfigError
from fastload.transforms._base import Transform
from fastload.transforms._geometric import RandomCrop, RandomResizedCrop, Resize
from fastload.transforms._mixing import RandomErasing
from fastload.transforms._timm_policies import (
    TIMM_AUGMIX_OPS,
    TIMM_AUTOAUGMENT_POLICIES,
    TimmAugMix,
    TimmAutoAugment,
)
from fastload.transforms._timm_transforms import (
    TIMM_INTERPOLATIONS,
    TIMM_RAND_INCREASING_OPS,
    TIMM_RAND_OPS,
    TimmMixup,
    TimmRandAugment,
)
from fastload.transforms._torchvision_reading import PIL_FILTERS

TIMM_CONVERSIONS = {
    "MaybeToTensor": "ToTensor",  # scales to [0, 1] floats, as torchvision's ToTensor
    "MaybePILToTensor": "PILToTensor",  # uint8, as it is
    "ToNumpy": "PILToTensor",  # uint8 (C, H, W) numpy
    "ToTensor": "ToDtype",  # timm's: float32, not rescaled (as ToDtype(float32, scale=False))
}
"""timm's conversions of the image's type, as the torchvision one each acts as (dropped, like
torchvision's: fastload's output makes the batch's type; they set the units of what follows)."""

def is_timm(t: object) -> bool:
    return type(t).__module__.startswith("timm.")


def timm_conversion(t: object) -> str | None:
    """The torchvision conversion a timm transform acts as, or None when it is not one."""
    return TIMM_CONVERSIONS.get(type(t).__name__) if is_timm(t) else None


def _approximated(what: str, how: str, stacklevel: int = 5) -> None:
    warnings.warn(f"fastload approximates {what}: {how}", UserWarning, stacklevel=stacklevel)


def _refused(name: str, why: str) -> ConfigError:
    return ConfigError(
        f"timm's {name} cannot be converted ({why}): run this pipeline through the Dataset path "
        "instead (a torch Dataset that applies it, e.g. timm's ImageDataset(root, transform=...), "
        f"given to FastLoader), or leave {name} out"
    )


def _mode_name(mode: Any) -> str:
    """An InterpolationMode (or a PIL constant) as its name."""
    name = getattr(mode, "value", mode)
    return PIL_FILTERS.get(name, str(name)) if isinstance(name, int) else str(name)


def _crop_interpolation(kind: str, mode: Any) -> str:
    """timm's interpolation for a crop or resize; 'random' (a tuple: bilinear or bicubic drawn per
    image) is approximated by bilinear, as timm's own no-augmentation recipe does."""
    if isinstance(mode, (tuple, list)):
        _approximated(
            f"{kind}(interpolation='random')",
            "timm draws bilinear or bicubic per image; fastload resamples a batch with one filter "
            "and uses bilinear (what timm's transforms_noaug_train does with 'random')",
        )
        return "bilinear"
    return _mode_name(mode)


def _random_resized_crop(t: Any) -> RandomResizedCrop:
    # timm's get_params is torchvision's (ten tries, then the central crop with the ratio clamped).
    interpolation = _crop_interpolation("RandomResizedCropAndInterpolation", t.interpolation)
    size = (int(t.size[0]), int(t.size[1]))
    scale = (float(t.scale[0]), float(t.scale[1]))
    ratio = (float(t.ratio[0]), float(t.ratio[1]))
    return RandomResizedCrop(size=size, scale=scale, ratio=ratio, interpolation=interpolation)


def _resize_keep_ratio(t: Any) -> Resize:
    height, width = (int(s) for s in t.size)
    if t.random_scale_prob > 0 or t.random_aspect_prob > 0:
        why = "random_scale_prob / random_aspect_prob > 0: a random size per image"
        raise _refused("ResizeKeepRatio", why)
    if float(t.longest) != 0.0 or height != width:
        raise _refused(
            "ResizeKeepRatio",
            "only longest=0 with a square size is a shorter-edge Resize; longest > 0 fits the longer edge, "
            "which needs the padding fastload does not do",
        )
    _approximated(
        "ResizeKeepRatio",
        "as Resize(size) of the shorter edge: timm rounds the longer edge, torchvision's Resize (and "
        "fastload) truncates it, so it may be one pixel shorter",
    )
    return Resize(size=height, interpolation=_crop_interpolation("ResizeKeepRatio", t.interpolation))


def _random_crop_or_pad(t: Any) -> RandomCrop:
    """timm's RandomCropOrPad: a random crop, or a pad at a random offset where the image is
    smaller, drawn in [-lack, 0] as RandomCrop(pad_if_needed=True) draws (the same pixels)."""
    fill = t.fill if isinstance(t.fill, (int, float)) else tuple(float(v) for v in t.fill)
    size = (int(t.size[0]), int(t.size[1]))
    return RandomCrop(size, pad_if_needed=True, fill=fill, padding_mode=str(t.padding_mode))


def _same(kind: str, ops: Sequence[Any], read: Callable[[Any], Any]) -> Any:
    values = {repr(read(op)) for op in ops}
    if len(values) != 1:
        raise _refused(kind, "its operations have different probabilities, magnitudes or hparams")
    return read(ops[0])


_FILL = (128, 128, 128)  # timm's default fill (_FILL)


def _op_settings(kind: str, ops: Sequence[Any]) -> dict[str, Any]:
    """What timm's AugmentOps of a policy share (their hparams): the resampling filter, the fill,
    the magnitude's noise and the translation's reach, as fastload's parameters; warns of what
    fastload approximates."""
    resample = _same(kind, ops, lambda op: op.kwargs.get("resample"))
    if isinstance(resample, (tuple, list)):
        names = {_mode_name(r) for r in resample}
        if names != {"bilinear", "bicubic"}:
            raise _refused(kind, f"resampling drawn from {sorted(names)}: fastload draws bilinear or bicubic")
        interpolation = "random"
    else:
        interpolation = _mode_name(resample)
        if interpolation not in TIMM_INTERPOLATIONS:
            why = f"resampling {interpolation!r}: PIL's affine takes nearest, bilinear or bicubic"
            raise _refused(kind, why)
    if float(_same(kind, ops, lambda op: op.magnitude_max) or 10.0) != 10.0 and kind != "RandAugment":
        raise _refused(kind, "magnitude_max other than 10")
    if interpolation == "nearest":  # bilinear, bicubic and 'random' are PIL's pixels
        _approximated(
            f"timm's {kind}",
            "its rotations, shears and translations resampled nearest through torch's grid, "
            "translations by whole pixels (its other operations are PIL's pixels)",
            stacklevel=6,
        )
    std = float(_same(kind, ops, lambda op: op.magnitude_std))
    return {
        "magnitude_std": math.inf if std == math.inf else std,
        "translate_pct": float(_same(kind, ops, lambda op: op.hparams.get("translate_pct", 0.45))),
        "interpolation": interpolation,
        "fill": tuple(float(v) for v in _same(kind, ops, lambda op: op.kwargs.get("fillcolor", _FILL))),
    }


def _rand_augment(t: Any) -> TimmRandAugment:
    names = tuple(op.name for op in t.ops)
    if t.choice_weights is not None or names not in (TIMM_RAND_OPS, TIMM_RAND_INCREASING_OPS):
        raise _refused(
            "RandAugment",
            f"operations {', '.join(names)}{' weighted' if t.choice_weights is not None else ''}: "
            "fastload has timm's default set and its 'inc1' set, drawn uniformly (not 't3a', "
            "'tweights' or 't3aw')",
        )
    ops = list(t.ops)
    return TimmRandAugment(
        num_layers=int(t.num_layers),
        magnitude=float(_same("RandAugment", ops, lambda op: op.magnitude)),
        magnitude_max=float(_same("RandAugment", ops, lambda op: op.magnitude_max) or 10.0),
        prob=float(_same("RandAugment", ops, lambda op: op.prob)),
        increasing=names == TIMM_RAND_INCREASING_OPS,
        **_op_settings("RandAugment", ops),
    )


def _auto_augment(t: Any) -> TimmAutoAugment:
    table = tuple(tuple((op.name, float(op.prob), float(op.magnitude)) for op in sub) for sub in t.policy)
    for name, policy in TIMM_AUTOAUGMENT_POLICIES.items():
        if table == policy:
            ops = [op for sub in t.policy for op in sub]
            return TimmAutoAugment(policy=name, **_op_settings("AutoAugment", ops))
    raise _refused("AutoAugment", f"its policy is none of timm's ({', '.join(TIMM_AUTOAUGMENT_POLICIES)})")


def _augmix(t: Any) -> TimmAugMix:
    ops = list(t.ops)
    names = tuple(op.name for op in ops)
    if names != TIMM_AUGMIX_OPS or _same("AugMixAugment", ops, lambda op: op.prob) != 1.0:
        raise _refused("AugMixAugment", "its operations are not timm's augmix_ops")
    return TimmAugMix(
        severity=int(_same("AugMixAugment", ops, lambda op: op.magnitude)),
        width=int(t.width),
        depth=int(t.depth) if int(t.depth) > 0 else -1,
        alpha=float(t.alpha),
        blended=bool(t.blended),
        **_op_settings("AugMixAugment", ops),
    )


def _random_erasing(t: Any, normalized: bool) -> RandomErasing:
    if not normalized:
        why = "it comes before Normalize: timm erases normalized tensors, as fastload does"
        raise _refused("RandomErasing", why)
    if int(t.min_count) != 1 or int(t.max_count) != 1:
        raise _refused("RandomErasing", f"count ({t.min_count}, {t.max_count}): fastload erases one box")
    value: float | str
    if t.mode == "const":
        value = 0.0
    elif t.mode == "pixel":
        value = "random"  # standard normal noise per pixel, as timm's
    elif t.mode == "rand":
        _approximated(
            "timm's RandomErasing(mode='rand')",
            "timm fills a box with one normal colour per channel; fastload with normal noise per pixel",
        )
        value = "random"
    else:
        raise _refused("RandomErasing", f"mode {t.mode!r}")
    # num_splits only acts on batches given to timm's RandomErasing; a dataset's transform gets images.
    low, high = (float(v) for v in t.log_aspect_ratio)
    scale = (float(t.min_area), float(t.max_area))
    ratio = (math.exp(low), math.exp(high))
    return RandomErasing(p=float(t.probability), scale=scale, ratio=ratio, value=value)


def _mixup(t: Any) -> TimmMixup:
    if t.mode not in ("batch", "pair", "elem"):
        raise _refused("Mixup", f"mode {t.mode!r}: fastload has 'batch', 'pair' and 'elem'")
    if getattr(t, "multi_label", False):
        raise _refused("Mixup", "multi_label=True: fastload mixes class indices")
    minmax = None if t.cutmix_minmax is None else (float(t.cutmix_minmax[0]), float(t.cutmix_minmax[1]))
    return TimmMixup(
        mixup_alpha=float(t.mixup_alpha),
        cutmix_alpha=float(t.cutmix_alpha),
        cutmix_minmax=minmax,
        prob=float(t.mix_prob) if t.mixup_enabled else 0.0,  # disabled: smoothed targets only, as timm's
        switch_prob=float(t.switch_prob),
        correct_lam=bool(t.correct_lam),
        label_smoothing=float(t.label_smoothing),
        num_classes=int(t.num_classes),
        mode=str(t.mode),
    )


def from_timm(t: Any, normalized: bool) -> Transform:
    """One timm transform as fastload's; `normalized` says whether the chain's Normalize is before it."""
    name = type(t).__name__
    if name == "RandomResizedCropAndInterpolation":
        return _random_resized_crop(t)
    if name == "ResizeKeepRatio":
        return _resize_keep_ratio(t)
    if name == "RandomCropOrPad":
        return _random_crop_or_pad(t)
    if name == "RandAugment":
        return _rand_augment(t)
    if name == "RandomErasing":
        return _random_erasing(t, normalized)
    if name == "Mixup":
        return _mixup(t)
    if name == "AutoAugment":
        return _auto_augment(t)
    if name == "AugMixAugment":
        return _augmix(t)
    raise _refused(name, "fastload has no equivalent")
