"""Batched augmentation policies (RandAugment, TrivialAugmentWide, AutoAugment, AugMix), equal per
sample to torchvision v2's, on uint8 (N, 3, H, W) batches.

Each policy draws, per sample and from its uniforms only, the choices torchvision draws with
`torch.randint` / `torch.rand`: which operation of its space, which magnitude bin, whether a
signed magnitude is negated (`rand <= 0.5`, as torchvision), and for AutoAugment whether each
operation of the drawn sub-policy applies (`rand <= p`). The operations then run as torchvision's
`_apply_image_or_video_transform` runs them, in order, step by step (RandAugment's k-th operation,
AutoAugment's first or second, an AugMix chain's k-th), each step grouping the samples by what
they run:

- photometric operations: one group per operation, the kernels of `fastload._augment.color` with a
  parameter per sample (factor 1 + magnitude, posterize bits, solarize threshold 255 * magnitude);
- geometric ones (`fastload._augment.affine`): one group per operation and signed magnitude, so a
  group shares one sampling grid (cached: RandAugment and AutoAugment use a handful).

The magnitude tables are torchvision's, built with the same torch calls (float32 `linspace`, the
posterize formula); translations depend on the image size, so geometric magnitudes are looked up
in `apply`, the others in `params`.

Params keys: "{step}|{op}" (the samples, increasing int64) and "{step}|{op}|value" (their
parameter) for a photometric group; "{step}|{op}|{bin}|{sign}" for a geometric group (sign 0 or 1,
negated); AugMix adds "weights". `apply` runs them in insertion order (steps in order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

from fastload._augment import color, groups
from fastload._augment.affine import GEOMETRIC_OPS, Fill, policy_op_
from fastload._augment.draws import gamma, normalize
from fastload._augment.ops import DeviceParams, Params, SampleKernel
from fastload._augment.spaces import (
    AUGMIX_PARTIAL_SPACE,
    AUGMIX_SPACE,
    AUTOAUGMENT_POLICIES,
    AUTOAUGMENT_SPACE,
    RANDAUGMENT_SPACE,
    TRIVIALAUGMENT_SPACE,
    Operation,
)
from fastload._sample_random import uniform_integers
from fastload.transforms._policies import AugMix, AutoAugment, RandAugment, TrivialAugmentWide, fill_values

# Kernels: what each photometric operation runs, and its parameter from the signed magnitude

_COLOR_KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    "Brightness": color.adjust_brightness,
    "Color": color.adjust_saturation,
    "Contrast": color.adjust_contrast,
    "Sharpness": color.adjust_sharpness,
    "Posterize": color.posterize,
    "Solarize": color.solarize,
    "AutoContrast": color.autocontrast,
    "Equalize": color.equalize,
    "Invert": color.invert,
}


def _bound(kernel: Callable[..., torch.Tensor], value: torch.Tensor | None) -> groups.Kernel:
    """`kernel` with its per-sample parameter (if it takes one) bound after the batch."""
    if value is None:
        return kernel
    return lambda batch: kernel(batch, value)


def sample_groups(p: DeviceParams) -> Iterator[tuple[str, list[str], torch.Tensor]]:
    """The groups of a policy's parameters, in order, as (key, its "|" parts, the samples): the
    per-sample values ("...|value"), other entries ("weights") and empty groups left out."""
    for key, index in p.items():
        parts = key.split("|")
        if len(parts) >= 2 and parts[-1] != "value" and index.shape[0] > 0:
            yield key, parts, index


def _kernel_parameter(name: str, magnitude: np.ndarray) -> np.ndarray:
    """The kernel's per-sample parameter as torchvision derives it from a (signed, float64)
    magnitude: factor 1.0 + m (float64: the kernels take 1 - factor in double, as torchvision's
    Python floats), posterize bits int(m), solarize threshold 255 * m."""
    if name == "Posterize":
        return magnitude.astype(np.int64)
    if name == "Solarize":
        return 255 * magnitude
    return 1.0 + magnitude


class PolicyOp:
    """What the policies share: the groups of each step from per-sample choices (`step_groups`),
    and running them (`run`). Subclasses draw the choices (`params`)."""

    draws = 0

    def __init__(
        self,
        space: tuple[Operation, ...],
        num_bins: int,
        interpolation: str,
        fill: float | tuple[float, ...] | None,
    ) -> None:
        self.space = space
        self.num_bins = num_bins
        self.interpolation = interpolation
        self.fill: Fill = None if fill is None else fill_values(fill)
        self.names = tuple(op.name for op in space)
        self.signed = np.array([op.signed for op in space])
        # Size-free magnitude tables (bins,), float64, for the photometric operations (in params).
        self._tables = {
            op.name: np.array([float(v) for v in op.magnitudes(num_bins, (0, 0))])
            for op in space
            if op.magnitudes is not None and op.name not in GEOMETRIC_OPS
        }
        self._sized: dict[tuple[str, int, int], tuple[float, ...]] = {}

    def step_groups(self, op: np.ndarray, bins: np.ndarray, negate: np.ndarray) -> Params:
        """The groups of every step from per-sample choices (N, steps): `op` (an index into the
        space, -1 for none), `bins` (the magnitude bin) and `negate` (bool: only where signed)."""
        params: Params = {}
        for step in range(op.shape[1]):
            chosen, bin_, neg = op[:, step], bins[:, step], negate[:, step] & self.signed[op[:, step]]
            for k, name in enumerate(self.names):
                members = chosen == k
                if name == "Identity" or not members.any():
                    continue
                if name in GEOMETRIC_OPS:
                    codes = bin_ * 2 + neg
                    for code in np.unique(codes[members]).tolist():
                        group = np.flatnonzero(members & (codes == code)).astype(np.int64)
                        params[f"{step}|{name}|{code // 2}|{code % 2}"] = group
                    continue
                group = np.flatnonzero(members).astype(np.int64)
                params[f"{step}|{name}"] = group
                table = self._tables.get(name)
                if table is not None:
                    magnitude = np.where(neg[group], -table[bin_[group]], table[bin_[group]])
                    params[f"{step}|{name}|value"] = _kernel_parameter(name, magnitude)
        return params

    def _geometric_table(self, name: str, height: int, width: int) -> tuple[float, ...]:
        """A geometric operation's magnitudes (bins,) on an image of this size (cached)."""
        key = (name, height, width)
        table = self._sized.get(key)
        if table is None:
            magnitudes = self.space[self.names.index(name)].magnitudes
            assert magnitudes is not None
            table = tuple(float(v) for v in magnitudes(self.num_bins, (height, width)))
            if len(self._sized) > 256:
                self._sized.clear()
            self._sized[key] = table
        return table

    def run(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the groups of `p` (from `step_groups`) on x, in place, in order."""
        height, width = x.shape[-2], x.shape[-1]
        for key, parts, index in sample_groups(p):
            name = parts[1]
            if name in GEOMETRIC_OPS:
                magnitude = self._geometric_table(name, height, width)[int(parts[2])]
                if parts[3] == "1":
                    magnitude *= -1
                policy_op_(x, index, name, magnitude, self.interpolation, self.fill)
                continue
            groups.apply_to(x, index, _bound(_COLOR_KERNELS[name], p.get(f"{key}|value")))
        return x

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Transform the batch x in place with the choices of `params`."""
        return self.run(x, p)


class RandAugmentOp(PolicyOp):
    """RandAugment: `num_ops` operations per sample, uniform over the 14 with replacement, at the
    fixed magnitude bin, each signed one negated with probability 0.5. Draws: (operation, sign)
    per operation."""

    def __init__(self, t: RandAugment) -> None:
        super().__init__(RANDAUGMENT_SPACE, t.num_magnitude_bins, t.interpolation, t.fill)
        self.num_ops = t.num_ops
        self.magnitude = t.magnitude
        self.draws = 2 * t.num_ops

    def params(self, u: np.ndarray) -> Params:
        """The groups of each of the `num_ops` steps."""
        op = uniform_integers(u[:, 0::2], len(self.space))
        bins = np.full_like(op, self.magnitude)
        return self.step_groups(op, bins, u[:, 1::2] <= 0.5)


class TrivialAugmentWideOp(PolicyOp):
    """TrivialAugmentWide: one operation per sample, uniform over the 14, at a uniform magnitude
    bin, negated with probability 0.5 when signed. Draws: operation, bin, sign."""

    draws = 3

    def __init__(self, t: TrivialAugmentWide) -> None:
        super().__init__(TRIVIALAUGMENT_SPACE, t.num_magnitude_bins, t.interpolation, t.fill)

    def params(self, u: np.ndarray) -> Params:
        """The groups of the one step."""
        op = uniform_integers(u[:, 0:1], len(self.space))
        return self.step_groups(op, uniform_integers(u[:, 1:2], self.num_bins), u[:, 2:3] <= 0.5)


class AutoAugmentOp(PolicyOp):
    """AutoAugment: a sub-policy uniform over the policy's 25, each of its two operations applied
    with its probability (`rand <= p`) at its magnitude bin (of 10), negated with probability 0.5
    when signed. Draws: sub-policy, then (apply, sign) per operation."""

    draws = 5

    def __init__(self, t: AutoAugment) -> None:
        super().__init__(AUTOAUGMENT_SPACE, 10, t.interpolation, t.fill)
        policy = AUTOAUGMENT_POLICIES[t.policy]
        self._op = np.array([[self.names.index(name) for name, _, _ in sub] for sub in policy])
        self._p = np.array([[p for _, p, _ in sub] for sub in policy])
        self._bin = np.array([[0 if b is None else b for _, _, b in sub] for sub in policy])

    def params(self, u: np.ndarray) -> Params:
        """The groups of the two steps (a sample whose operation does not apply is in none)."""
        sub = uniform_integers(u[:, 0], len(self._op))
        applied = u[:, 1::2] <= self._p[sub]
        op = np.where(applied, self._op[sub], -1)
        return self.step_groups(op, self._bin[sub], u[:, 2::2] <= 0.5)


_MIX_BLOCK = 1 << 19
"""Float elements per block of AugMix's mixing on the CPU (2 MiB: its float temporaries stay in
cache and are reused, rather than page-faulted in, 38 MB at a time for 64 images of 224 x 224)."""


class AugMixOp(PolicyOp):
    """AugMix: `mixture_width` chains per sample, each of `chain_depth` (or uniform in 1..3)
    operations uniform over the space, at a bin uniform below `severity` (of 10), negated with
    probability 0.5 when signed; the chains' images mixed with Dirichlet(alpha) weights times the
    augmented share of a Beta(alpha, alpha) split with the original, in float32, truncated.

    Batched: the chains of all samples are rows of one (width * N) batch (chain c of sample i is row
    c * N + i) whose steps run as RandAugment's do. The Dirichlet and Beta weights come from one
    uniform per sample through `fastload._augment.draws` (exact Gamma variates). Draws: the weights'
    uniform, then per chain its depth and (operation, bin, sign) per step.
    """

    def __init__(self, t: AugMix) -> None:
        space = AUGMIX_SPACE if t.all_ops else AUGMIX_PARTIAL_SPACE
        super().__init__(space, 10, t.interpolation, t.fill)
        self.severity = t.severity
        self.width = t.mixture_width
        self.chain_depth = t.chain_depth
        self.alpha = float(t.alpha)
        self.steps = t.chain_depth if t.chain_depth > 0 else 3
        self.draws = 1 + self.width * (1 + 3 * self.steps)

    def params(self, u: np.ndarray) -> Params:
        """The chains' groups (rows of the (width * N) batch) and `weights` (N, 1 + width) float32:
        the original's, then each chain's."""
        n = u.shape[0]
        chains = (
            u[:, 1:].reshape(n, self.width, 1 + 3 * self.steps).transpose(1, 0, 2).reshape(n * self.width, -1)
        )
        if self.chain_depth > 0:
            depth = np.full(n * self.width, self.chain_depth)
        else:
            depth = 1 + uniform_integers(chains[:, 0], 3)
        steps = chains[:, 1:].reshape(n * self.width, self.steps, 3)
        chosen = uniform_integers(steps[..., 0], len(self.space))
        op = np.where(np.arange(self.steps) < depth[:, None], chosen, -1)
        params = self.step_groups(op, uniform_integers(steps[..., 1], self.severity), steps[..., 2] <= 0.5)
        params["weights"] = self.weights(u[:, 0])
        return params

    def split(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """torchvision's two Dirichlet draws, float32, from one uniform per sample `u` (N,): the
        (original, augmented) split (N, 2) and the chains' weights (N, width)."""
        g = gamma(u, self.alpha, 2 + self.width)
        return normalize(g[:, :2]).astype(np.float32), normalize(g[:, 2:]).astype(np.float32)

    def weights(self, u: np.ndarray) -> np.ndarray:
        """(N, 1 + width) float32: the original's weight, then each chain's (its Dirichlet weight
        times the augmented share, a float32 product as torchvision's)."""
        split, chains = self.split(u)
        return np.concatenate([split[:, :1], chains * split[:, 1:2]], axis=1)

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the chains on copies of x, then mix them into x, in place."""
        n = x.shape[0]
        if n == 0:
            return x
        fmt = groups.memory_format(x)
        chains = torch.empty(
            (self.width * n, *x.shape[1:]), dtype=x.dtype, device=x.device, memory_format=fmt
        )
        chains.view(self.width, n, *x.shape[1:]).copy_(x.unsqueeze(0).expand(self.width, *x.shape))
        self.run(chains, p)
        weights = p["weights"]
        # In blocks of samples on the CPU (`_MIX_BLOCK`); all at once on a GPU.
        block = max(1, _MIX_BLOCK // x[0].numel()) if x.device.type == "cpu" else n
        for start in range(0, n, block):
            rows = slice(start, min(start + block, n))
            mix = weights[rows, 0].view(-1, 1, 1, 1) * x[rows]  # float32, as torchvision's
            term = torch.empty_like(mix)
            for c in range(self.width):
                chain = chains[c * n + rows.start : c * n + rows.stop]
                mix.add_(torch.mul(weights[rows, c + 1].view(-1, 1, 1, 1), chain, out=term))
            x[rows] = mix  # truncated to uint8, as torchvision's `.to(dtype)`
        return x


KERNELS: dict[str, SampleKernel] = {
    "RandAugment": lambda t, _: RandAugmentOp(t),
    "TrivialAugmentWide": lambda t, _: TrivialAugmentWideOp(t),
    "AutoAugment": lambda t, _: AutoAugmentOp(t),
    "AugMix": lambda t, _: AugMixOp(t),
}
"""The policies' batched kernels, by the names their declarations give (`registry`)."""
