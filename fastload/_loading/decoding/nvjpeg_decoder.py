"""`NvjpegDecoder`: a batch decoded by torchvision's batched nvJPEG, then cropped and resized on the GPU.

The second GPU decoder behind the in-trainer executor's seam (`dali_executor`), for
`backend="nvjpeg"`: no package beyond torchvision. Per batch, on the executor's CUDA stream:

    torchvision.io.decode_jpeg(encoded, device=...)   every JPEG whole, RGB, EXIF ignored (as the
                                                      other backends), one batched call
    crop_resize                                       fastload's boxes (drawn by the plan from the
                                                      header sizes, as for DALI) in one kernel

Images that are not JPEGs (PNG, ...) are decoded on the CPU by torchvision (`decode_image`) and
copied up; so is a JPEG nvJPEG refuses that the CPU decodes (CMYK, say). A batch nvJPEG fails
is decoded one sample at a time to find the sample; one that no decoder reads is a
`SampleFailure` at its position, with the CPU decoder's reason.

On the CPU (`device` cpu: the executor's testing aid) the same steps run with Pillow decoding and
`crop_resize_reference`, so the executor's path is tested where no GPU is (and no torchvision
whose compiled operators load: a CUDA torchvision beside a CPU torch has none).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from fastload._encoded_bytes import JPEG_MAGIC
from fastload._errors import ConfigError
from fastload._loading.decoding.backend import SampleFailure
from fastload._loading.decoding.crop_resize import crop_resize
from fastload.transforms import TransformPlan

# The executor's read threads for backend="nvjpeg" (at most; fewer with fewer num_workers): on an
# H100 with 16 cores, 2, 4 and 8 gave the same loader rate within its run-to-run spread (6.4k to
# 10.8k img/s, docs/BENCHMARKS.md), so the fewest: each is one more thread in the trainer's process.
NVJPEG_READ_THREADS = 2


def torchvision_io() -> Any:
    """torchvision.io, or a ConfigError saying what to install."""
    try:
        import torchvision.io as tvio
    except Exception as e:  # ImportError, or a torchvision built for another torch
        raise ConfigError(
            f"backend='nvjpeg' decodes with torchvision's nvJPEG, which could not be imported ({e}): "
            "install the torchvision built for your torch (`pip install torchvision`), or use "
            "backend='dali' or 'native'"
        ) from e
    return tvio


class NvjpegDecoder:
    """Decodes batches onto `device` (see the module docstring); one per executor, its thread only."""

    def __init__(self, plan: TransformPlan, device: torch.device) -> None:
        self._plan = plan
        self._device = device
        self._io = torchvision_io() if device.type == "cuda" else None
        self._rgb = self._io.ImageReadMode.RGB if self._io is not None else None

    def decode(self, blobs: Sequence[bytes | memoryview], inputs: np.ndarray) -> torch.Tensor:
        """The batch's (n, H, W, 3) uint8 pixels on the device, in the current stream's order;
        SampleFailure for a sample no decoder reads."""
        encoded = [_as_tensor(b) for b in blobs]
        if self._io is None:
            images = [self._decode_with_pillow(i, t) for i, t in enumerate(encoded)]
        else:
            images = self._decode_all(encoded, [bytes(b[:3]) == JPEG_MAGIC for b in blobs])
        shape = (len(blobs), self._plan.out_height, self._plan.out_width, 3)
        out = torch.empty(shape, dtype=torch.uint8, device=self._device)
        for i, image in enumerate(images):
            self._check_size(i, image, inputs[i])
        crop_resize(images, inputs, out, self._plan.interpolation)
        return out

    def _decode_all(self, encoded: list[torch.Tensor], is_jpeg: list[bool]) -> list[torch.Tensor]:
        assert self._io is not None
        jpegs = [i for i, yes in enumerate(is_jpeg) if yes]
        images: list[torch.Tensor | None] = [None] * len(encoded)
        if jpegs:
            try:
                decoded = self._io.decode_jpeg(
                    [encoded[i] for i in jpegs], mode=self._rgb, device=self._device
                )
            except RuntimeError:  # one bad file fails the batch: one at a time, to find it
                decoded = [self._decode_one(i, encoded[i]) for i in jpegs]
            for i, image in zip(jpegs, decoded, strict=True):
                images[i] = image
        for i, image in enumerate(images):
            if image is None:
                images[i] = self._decode_on_cpu(i, encoded[i])
        return images  # type: ignore[return-value]

    def _decode_one(self, position: int, encoded: torch.Tensor) -> torch.Tensor:
        assert self._io is not None
        try:
            return cast(torch.Tensor, self._io.decode_jpeg(encoded, mode=self._rgb, device=self._device))
        except RuntimeError:
            return self._decode_on_cpu(position, encoded)

    @staticmethod
    def _decode_with_pillow(position: int, encoded: torch.Tensor) -> torch.Tensor:
        """The testing aid's decoder (see the module docstring): RGB CHW, EXIF ignored."""
        from PIL import Image

        try:
            with Image.open(io.BytesIO(encoded.numpy().tobytes())) as img:
                pixels = np.asarray(img.convert("RGB"))
        except Exception as e:
            raise SampleFailure(position, f"{type(e).__name__}: Pillow could not decode it: {e}") from e
        return torch.from_numpy(pixels.transpose(2, 0, 1).copy())

    def _decode_on_cpu(self, position: int, encoded: torch.Tensor) -> torch.Tensor:
        """A sample nvJPEG does not take (not a JPEG, or refused), decoded on the CPU and copied up."""
        assert self._io is not None
        try:
            image = self._io.decode_image(encoded, mode=self._rgb)
        except Exception as e:
            reason = f"{type(e).__name__}: torchvision could not decode the image: {e}"
            raise SampleFailure(position, reason) from e
        return cast(torch.Tensor, image.to(self._device, non_blocking=True))

    @staticmethod
    def _check_size(position: int, image: torch.Tensor, inputs: np.ndarray) -> None:
        """The boxes were drawn on the header's size: a decoder that disagrees is the sample's failure."""
        (ay, ax), (sh, sw) = inputs[0], inputs[1]
        if image.shape[0] != 3 or ay + sh > image.shape[1] or ax + sw > image.shape[2]:
            raise SampleFailure(
                position,
                f"ValueError: the decoded image is {tuple(image.shape[1:])} (C={image.shape[0]}), smaller "
                f"than its header's crop box {(int(ay + sh), int(ax + sw))}",
            )


def _as_tensor(blob: bytes | memoryview) -> torch.Tensor:
    """A 1-D uint8 CPU tensor over the blob's bytes (a copy only for a read-only blob)."""
    view = memoryview(blob)
    if view.readonly:
        view = memoryview(bytearray(view))
    return torch.frombuffer(view, dtype=torch.uint8)
