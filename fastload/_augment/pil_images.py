"""The CPU path of the PIL-exact kernels (`pil_affine`, `pil_blur`): a batch run through Pillow
itself, image by image, where Pillow is installed (it is optional: `fastload[pillow]`). PIL is
the arithmetic those kernels reproduce, so this path gives their batched path's bits (the tests
compare the two) at native speed per image, where the batched float64 arithmetic costs tens of
milliseconds an image on a CPU; on a GPU the batched path runs.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import torch

_UNSET: Any = object()
_pil: Any = _UNSET


def pillow() -> ModuleType | None:
    """`PIL.Image`, or None where Pillow is not installed (imported once, lazily)."""
    global _pil
    if _pil is _UNSET:
        try:
            from PIL import Image, ImageFilter

            Image.ImageFilter = ImageFilter  # type: ignore[attr-defined]
            _pil = Image
        except ImportError:
            _pil = None
    return _pil  # type: ignore[no-any-return]


def runs_on_pil(x: torch.Tensor, use_pil: bool | None) -> bool:
    """Whether a kernel takes this path: asked (`use_pil`), or by default on a CPU with Pillow."""
    if use_pil is None:
        return x.device.type == "cpu" and x.shape[1] == 3 and pillow() is not None
    return use_pil


def per_image(x: torch.Tensor, fn: Callable[[int, Any], Any]) -> torch.Tensor:
    """`fn(i, image)` (a PIL RGB image in, one of the same size out) for each sample i of the uint8
    CPU batch x (N, 3, H, W); the results as a new batch in x's memory format."""
    image = pillow()
    assert image is not None
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        pixels = np.ascontiguousarray(x[i].permute(1, 2, 0).numpy())
        result = np.asarray(fn(i, image.fromarray(pixels, "RGB")))
        out[i].copy_(torch.from_numpy(np.array(result)).permute(2, 0, 1))
    return out
