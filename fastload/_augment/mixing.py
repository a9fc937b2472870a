"""RandomErasing (per sample, after normalization) and MixUp / CutMix / RandomChoice (per batch,
labels to soft targets), matching torchvision v2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload._augment.ops import BatchOp, SampleOp

OPS: dict[type, Callable[[Any], SampleOp]] = {}
BATCH_OPS: dict[type, Callable[[Any], BatchOp]] = {}
