"""The kernels of the stages after normalization: RandomErasing per sample (a `SampleOp`), MixUp,
CutMix and a RandomChoice of them per batch (`BatchOp`s, labels becoming soft targets), with
torchvision v2's algorithms and arithmetic, their randomness drawn from the uniforms they are given.

RandomErasing's "random" value (NOTE [erasing noise]) is the one noise drawn per pixel: it is read
from a fixed bank of standard normal values at an offset drawn per sample, so that it too depends
on the sample's uniforms alone, is the same on a CPU and a GPU, and never makes the host wait.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fastload._augment.ops import BatchKernel, BatchOp, DeviceParams, Kernels, Params, SampleKernel
from fastload._errors import ConfigError
from fastload._native_jpeg import native_pass
from fastload._sample_random import uniform_integers
from fastload.transforms import CutMix, MixUp, RandomChoice, RandomErasing

_TRIES = 10  # torchvision's RandomErasing.get_params tries this many boxes before giving up
_U53 = 2.0**53  # the uniforms are multiples of 2**-53: u * 2**53 is an exact integer

# NOTE [erasing noise]: torchvision fills a box erased with value="random" with fresh standard
# normal noise. Per-pixel noise cannot come from a sample's few uniforms, and `apply` cannot seed a
# torch.Generator from them without reading them back from the GPU (a synchronisation). So the
# noise is read from a bank: _BANK_SIZE standard normal float32 values drawn once from a fixed seed
# (on the CPU, then copied to each device once); sample i's noise, flattened (C, H, W), is the
# bank's values from offset[i] on (wrapping around), offset[i] drawn uniformly from one of its
# uniforms. Each sample's noise is thus i.i.d. N(0, 1) within its box, depends on (seed, epoch,
# index) alone, and is bit-identical on a CPU and a GPU. Two samples whose offsets are close share
# shifted copies of the same values (as unremarkable as any other draw: the bank is 4M values),
# and an image of more than 4M values (C * H * W) sees its noise repeat every 4M values.
_BANK_SIZE = 1 << 22
_BANK_SEED = 0x5EED_E2A5
_banks: dict[tuple[str, torch.dtype, int], torch.Tensor] = {}


def _beta(alpha: float, u: float) -> float:
    """A Beta(alpha, alpha) draw made from one uniform: it seeds a numpy Generator (deterministic)."""
    return float(np.random.default_rng(int(u * _U53)).beta(alpha, alpha))


def _noise_windows(device: torch.device, dtype: torch.dtype, length: int) -> torch.Tensor:
    """(bank size, length) view of the noise bank on `device`: row k is the `length` values from
    offset k on, wrapping around (NOTE [erasing noise]); made once per device, dtype and length."""
    key = (str(device), dtype, length)
    windows = _banks.get(key)
    if windows is None:
        bank = torch.randn(_BANK_SIZE, generator=torch.Generator().manual_seed(_BANK_SEED))
        reps = -(-(_BANK_SIZE + length) // _BANK_SIZE)
        extended = bank.repeat(reps)[: _BANK_SIZE + length].to(dtype)
        if device.type == "cuda":  # a copy from pinned memory does not make the host wait
            extended = extended.pin_memory().to(device, non_blocking=True)
        else:
            extended = extended.to(device)
        windows = extended.as_strided((_BANK_SIZE, length), (1, 1))
        _banks[key] = windows
    return windows


class Erasing:
    """RandomErasing, batched: torchvision's `get_params` per sample (apply with probability p,
    then up to 10 boxes of area in `scale` times the image's and log-uniform aspect ratio h/w in
    `ratio`, the first that fits strictly inside the image taken, its top and left uniform; no
    erase when none fits), computed on the batch's device without a synchronisation.

    Draws per sample: 1 (apply), 2 per try (area, ratio), 2 (top, left), 1 (noise offset).
    """

    draws = 1 + 2 * _TRIES + 2 + 1

    def __init__(self, t: RandomErasing) -> None:
        self.p = float(t.p)
        self.scale = (float(t.scale[0]), float(t.scale[1]))
        self.log_ratio = (math.log(t.ratio[0]), math.log(t.ratio[1]))
        value = t.value
        if isinstance(value, str):  # "random", the one string a RandomErasing accepts
            self.fill: tuple[float, ...] | None = None
        elif isinstance(value, (int, float)):
            self.fill = (float(value),)
        else:
            self.fill = tuple(float(v) for v in value)

    def params(self, u: np.ndarray) -> Params:
        """Per sample: whether to erase, each try's area fraction and aspect ratio (float64, on the
        host: `np.exp` there, so a CPU and a GPU get the same boxes), and the uniforms of its top,
        its left and its noise offset."""
        u = np.asarray(u, dtype=np.float64)
        tries = u[:, 1 : 1 + 2 * _TRIES]
        (s0, s1), (r0, r1) = self.scale, self.log_ratio
        return {
            "erase": u[:, 0] < self.p,
            "area": s0 + (s1 - s0) * tries[:, 0::2],
            "aspect": np.exp(r0 + (r1 - r0) * tries[:, 1::2]),
            "top": u[:, 1 + 2 * _TRIES],
            "left": u[:, 2 + 2 * _TRIES],
            "noise": np.floor(u[:, 3 + 2 * _TRIES] * _BANK_SIZE).astype(np.int64),
        }

    def boxes(self, height: int, width: int, p: DeviceParams) -> tuple[torch.Tensor, ...]:
        """(top, left, box height, box width) per sample, as exact integers in float tensors; a
        sample not erased has an empty box."""
        # float64 (exact enough to round as torchvision's Python floats do, and the same on a CPU and
        # a GPU: only correctly rounded operations); MPS has no float64.
        calc = torch.float32 if p["area"].device.type == "mps" else torch.float64
        erase_area = p["area"].to(calc) * float(height * width)
        aspect = p["aspect"].to(calc)
        h = torch.round(torch.sqrt(erase_area * aspect))
        w = torch.round(torch.sqrt(erase_area / aspect))
        fits = (h < height) & (w < width)
        first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first try that fits
        erase = fits.any(dim=1) & p["erase"]
        h = torch.where(erase, h.gather(1, first).squeeze(1), 0.0)
        w = torch.where(erase, w.gather(1, first).squeeze(1), 0.0)
        # torch.randint(0, n) as `uniform_integers` draws it: floor(u * n), at most n - 1.
        top = torch.minimum(torch.floor(p["top"].to(calc) * (height - h + 1)), height - h)
        left = torch.minimum(torch.floor(p["left"].to(calc) * (width - w + 1)), width - w)
        return top, left, h, w

    def _fill(self, channels: int) -> tuple[float, ...]:
        assert self.fill is not None
        fill = self.fill * channels if len(self.fill) == 1 else self.fill
        if len(fill) != channels:
            raise ConfigError(
                f"RandomErasing: value has {len(self.fill)} values, one per channel, but the images "
                f"have {channels} channels: give one value, or one per channel"
            )
        return fill

    def erase_by_slices(
        self, x: torch.Tensor, p: DeviceParams, boxes: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """The same boxes, filled by slicing each erased sample's box: on the CPU reading the
        boxes costs nothing, and a slice touches only the box where the masks of `apply` read the
        whole batch (measured: 128 -> ~3 us an image at 224x224, p=0.25)."""
        _, channels, height, width = x.shape
        rows = zip(*(b.tolist() for b in boxes), strict=True)  # on the CPU: nothing to wait for
        erased = [(i, *map(int, box)) for i, box in enumerate(rows)]
        erased = [e for e in erased if e[3] > 0 and e[4] > 0]
        if not erased:
            return x
        if self.fill is None:
            windows = _noise_windows(x.device, x.dtype, channels * height * width)
            for i, top, left, h, w in erased:
                noise = windows[int(p["noise"][i])].view(channels, height, width)
                x[i, :, top : top + h, left : left + w] = noise[:, top : top + h, left : left + w]
            return x
        fill = torch.tensor(self._fill(channels), dtype=x.dtype).view(channels, 1, 1)
        for i, top, left, h, w in erased:
            x[i, :, top : top + h, left : left + w] = fill
        return x

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Erase each sample's box in place (no box: nothing changes)."""
        height, width = x.shape[-2:]
        top, left, h, w = self.boxes(height, width, p)
        if x.device.type == "cpu":
            return self.erase_by_slices(x, p, (top, left, h, w))
        return self.erase_by_masks(x, p, (top, left, h, w))

    def erase_by_masks(
        self, x: torch.Tensor, p: DeviceParams, boxes: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """The boxes filled through per-sample masks over the batch: no value read back to the
        host, so a GPU never makes it wait."""
        n, channels, height, width = x.shape
        top, left, h, w = boxes
        rows = torch.arange(height, device=x.device, dtype=top.dtype)
        cols = torch.arange(width, device=x.device, dtype=top.dtype)
        in_rows = (rows >= top[:, None]) & (rows < (top + h)[:, None])
        in_cols = (cols >= left[:, None]) & (cols < (left + w)[:, None])
        mask = in_rows[:, :, None] & in_cols[:, None, :]  # (N, H, W)
        if self.fill is None:
            windows = _noise_windows(
                x.device, x.dtype if x.is_floating_point() else torch.float32, channels * height * width
            )
            noise = windows.index_select(0, p["noise"]).view(n, channels, height, width)
            return torch.where(mask[:, None], noise.to(x.dtype), x, out=x)
        for c, v in enumerate(self._fill(channels)):  # a channel at a time: faster than one mask on NHWC
            x[:, c].masked_fill_(mask, v)
        return x


def _check_batch(kind: str, x: torch.Tensor, labels: torch.Tensor, num_classes: int) -> None:
    """Images (N, C, H, W) and integer labels (N,) in 0..num_classes-1 (checked on the CPU only:
    reading a GPU's labels would make the host wait; there an out-of-range label fails scatter's
    device assertion)."""
    if x.dim() != 4 or labels.dim() != 1 or labels.shape[0] != x.shape[0]:
        raise ConfigError(
            f"{kind} takes a batch of images (N, C, H, W) and its labels (N,), got images "
            f"{tuple(x.shape)} and labels {tuple(labels.shape)}"
        )
    if labels.dtype.is_floating_point or labels.dtype == torch.bool or labels.is_complex():
        raise ConfigError(f"{kind} takes class indices (an integer tensor) as labels, got {labels.dtype}")
    if labels.device.type == "cpu" and labels.numel():
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            bad = low if low < 0 else high
            raise ConfigError(
                f"{kind}: label {bad} is not a class index in 0..{num_classes - 1}: set num_classes to "
                "the dataset's number of classes"
            )


def _mix_labels(labels: torch.Tensor, num_classes: int, lam: float, dtype: torch.dtype) -> torch.Tensor:
    """One-hot targets over `num_classes`, mixed with the batch rolled by one as torchvision does:
    `label.roll(1, 0) * (1 - lam) + label * lam`, in `dtype`."""
    target = torch.zeros((labels.shape[0], num_classes), dtype=dtype, device=labels.device)
    target.scatter_(1, labels.view(-1, 1).to(torch.int64), 1.0)
    return target.roll(1, 0).mul_(1.0 - lam).add_(target.mul(lam))


def _target_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.float32


class MixUpOp:
    """MixUp, torchvision v2's: lam ~ Beta(alpha, alpha) once per batch, each image blended with the
    previous one (the batch rolled by one), `rolled * (1 - lam) + x * lam`, labels alike. Draws: 1."""

    draws = 1

    def __init__(self, t: MixUp) -> None:
        self.alpha = float(t.alpha)
        self.num_classes = int(t.num_classes)
        self._native = native_pass("mixup")

    def lam(self, u: np.ndarray) -> float:
        """The batch's weight of its own images."""
        return _beta(self.alpha, float(u[0]))

    def apply(
        self, x: torch.Tensor, labels: torch.Tensor, u: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix `x` in place; return it and the soft targets (N, num_classes)."""
        _check_batch("MixUp", x, labels, self.num_classes)
        if not x.is_floating_point():
            raise ConfigError(
                f"MixUp blends float images, got {x.dtype}: give FastLoader normalize=(mean, std) "
                "so that the images it mixes are float"
            )
        lam = self.lam(u)
        if self.mix_natively(x, lam):
            return x, _mix_labels(labels, self.num_classes, lam, x.dtype)
        # In place, from the last image down, each blended with the one before it (the batch
        # rolled by one), so no copy of the whole batch is made: image 0 takes the last image's
        # original, kept aside. The same two products and sum as torchvision's
        # `rolled * (1 - lam) + x * lam`, so the same bits.
        last = x[-1].mul(1.0 - lam)
        for i in range(x.shape[0] - 1, 0, -1):
            x[i].mul_(lam).add_(x[i - 1].mul(1.0 - lam))
        x[0].mul_(lam).add_(last)
        return x, _mix_labels(labels, self.num_classes, lam, x.dtype)


    def mix_natively(self, x: torch.Tensor, lam: float) -> bool:
        """Mix a normalized CPU batch (float32, NHWC memory) in one native pass with the same bits;
        False, doing nothing, for any other batch."""
        nhwc = x.permute(0, 2, 3, 1)
        on_cpu = x.device.type == "cpu" and x.dtype == torch.float32
        if self._native is None or not on_cpu or not nhwc.is_contiguous():
            return False
        self._native(nhwc.numpy(), x.shape[0], lam, 1.0 - lam)
        return True


class CutMixOp:
    """CutMix, torchvision v2's: lam ~ Beta(alpha, alpha) once per batch, a box of half-sides
    0.5 * sqrt(1 - lam) of W and H around a uniform centre (clamped to the image) pasted from the
    previous image (the batch rolled by one), labels mixed by the area actually kept.
    Draws: 3 (lam, the centre's x, its y)."""

    draws = 3

    def __init__(self, t: CutMix) -> None:
        self.alpha = float(t.alpha)
        self.num_classes = int(t.num_classes)

    def box(self, height: int, width: int, u: np.ndarray) -> tuple[tuple[int, int, int, int], float]:
        """((x1, y1, x2, y2), lam adjusted to the box's area), torchvision's `make_params`."""
        lam = _beta(self.alpha, float(u[0]))
        r_x, r_y = int(uniform_integers(u[1], width)), int(uniform_integers(u[2], height))
        r = 0.5 * math.sqrt(1.0 - lam)
        r_w_half, r_h_half = int(r * width), int(r * height)
        x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
        x2, y2 = min(r_x + r_w_half, width), min(r_y + r_h_half, height)
        return (x1, y1, x2, y2), float(1.0 - (x2 - x1) * (y2 - y1) / (width * height))

    def apply(
        self, x: torch.Tensor, labels: torch.Tensor, u: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Paste the box in place; return `x` and the soft targets (N, num_classes)."""
        _check_batch("CutMix", x, labels, self.num_classes)
        (x1, y1, x2, y2), lam = self.box(x.shape[-2], x.shape[-1], u)
        x[..., y1:y2, x1:x2] = x[..., y1:y2, x1:x2].roll(1, 0)
        return x, _mix_labels(labels, self.num_classes, lam, _target_dtype(x))


class ChoiceOp:
    """RandomChoice of batch operations: one drawn per batch with probabilities p (uniform when
    None), then run with the batch's remaining uniforms. Draws: 1 + the most a member needs."""

    def __init__(self, t: RandomChoice, kernels: Kernels) -> None:
        """`kernels`: the registry, which makes the members' kernels (handed down, never imported:
        the registry imports this module)."""
        self.ops: list[BatchOp] = [kernels.batch_op(member) for member in t.transforms]
        self.num_classes = int(t.num_classes)
        self.draws = 1 + max(op.draws for op in self.ops)
        weights = np.asarray(t.p if t.p is not None else [1.0] * len(self.ops), dtype=np.float64)
        self.cumulative = np.cumsum(weights / weights.sum())

    def choose(self, u: float) -> int:
        """The member a batch's first uniform picks."""
        return min(int(np.searchsorted(self.cumulative, u, side="right")), len(self.ops) - 1)

    def apply(
        self, x: torch.Tensor, labels: torch.Tensor, u: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the chosen member."""
        op = self.ops[self.choose(float(u[0]))]
        return op.apply(x, labels, u[1 : 1 + op.draws])


KERNELS: dict[str, SampleKernel] = {"RandomErasing": lambda t, _: Erasing(t)}
"""The tensor stage's kernels, by the names their declarations give (`registry`)."""

BATCH_KERNELS: dict[str, BatchKernel] = {
    "MixUp": lambda t, _: MixUpOp(t),
    "CutMix": lambda t, _: CutMixOp(t),
    "RandomChoice": ChoiceOp,
}
"""The batch stage's kernels, likewise."""
