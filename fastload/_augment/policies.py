"""Batched augmentation policies (RandAugment, TrivialAugmentWide, AutoAugment, AugMix) and the
geometric kernels they need (shear, translate, rotate), matching torchvision v2's tensor kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload._augment.ops import SampleOp

OPS: dict[type, Callable[[Any], SampleOp]] = {}
