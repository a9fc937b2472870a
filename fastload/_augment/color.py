"""Batched photometric kernels (ColorJitter, grayscale, blur, solarize, posterize, autocontrast,
equalize) on uint8 (N, 3, H, W) batches with per-sample parameters, matching torchvision v2's
tensor kernels; the policies reuse them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload._augment.ops import SampleOp

OPS: dict[type, Callable[[Any], SampleOp]] = {}
