"""The kernels of `fastload.transforms._timm_policies`: timm's AutoAugment and AugMix as `SampleOp`s
on uint8 batches, their operations the table timm's RandAugment runs on (`timm_ops.step_groups`,
`timm_ops.run_steps`: timm's level-to-argument formulas, PIL's Gaussian blur bit for bit, the
colour operations through torchvision's tensor arithmetic, geometric ones bilinear or nearest),
their randomness drawn from the uniforms they are given.

AugMix mixes as timm does, in float32: not blended, the chains summed with their weights, clipped,
truncated to uint8, then PIL's `Image.blend(image, mixed, m)` (`pil_enhance.pil_blend`); blended,
one PIL blend per chain into the running image.
"""

from __future__ import annotations

import numpy as np
import torch

from fastload._augment import groups
from fastload._augment.affine import Fill
from fastload._augment.draws import gamma, normalize
from fastload._augment.ops import DeviceParams, Params, SampleKernel
from fastload._augment.pil_enhance import pil_blend
from fastload._augment.timm_ops import run_steps, step_groups, timm_levels
from fastload._sample_random import uniform_integers
from fastload.transforms._policies import fill_values
from fastload.transforms._timm_policies import TIMM_AUGMIX_OPS, TimmAugMix, TimmAutoAugment

_PER_STEP = 5  # the operation's own draw (a blur's radius), apply, magnitude (two), sign
_PER_CHAIN_STEP = 4  # operation, magnitude (two), sign


class TimmAutoAugmentOp:
    """timm's AutoAugment: a sub-policy uniform over the policy's, then each of its steps applied
    when its uniform is <= its probability, at a level from `timm_levels` around its magnitude.
    Draws: sub-policy, then per step (own, apply, magnitude, magnitude, sign)."""

    def __init__(self, t: TimmAutoAugment) -> None:
        self.t = t
        policy = t.sub_policies
        self.names = tuple(dict.fromkeys(name for sub in policy for name, _, _ in sub))
        self.steps = max(len(sub) for sub in policy)
        shape = (len(policy), self.steps)
        self._op = np.full(shape, -1, dtype=np.int64)
        self._p = np.zeros(shape)
        self._magnitude = np.zeros(shape)
        for s, sub in enumerate(policy):
            for k, (name, p, magnitude) in enumerate(sub):
                self._op[s, k], self._p[s, k], self._magnitude[s, k] = self.names.index(name), p, magnitude
        self.draws = 1 + _PER_STEP * self.steps
        self.fill: Fill = None if t.fill is None else fill_values(t.fill)

    def params(self, u: np.ndarray) -> Params:
        """Each step's `step_groups` (a sample whose step does not apply is in none)."""
        sub = uniform_integers(u[:, 0], self._op.shape[0])
        t = self.t
        params: Params = {}
        for step in range(self.steps):
            d = u[:, 1 + _PER_STEP * step : 1 + _PER_STEP * (step + 1)]
            op = np.where(d[:, 1] <= self._p[sub, step], self._op[sub, step], -1)
            level = timm_levels(self._magnitude[sub, step], t.magnitude_std, 10.0, d[:, 2], d[:, 3])
            pct, interpolation = t.translate_pct, t.interpolation
            params.update(step_groups(step, self.names, op, level, d[:, 4], pct, interpolation, own=d[:, 0]))
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the steps' groups on x, in place, in order."""
        return run_steps(x, p, self.fill)


def blended_weights(weights: np.ndarray, m: np.ndarray) -> np.ndarray:
    """timm's `_calc_blended_weights` per sample, in its float32: the chain weights (N, width) times
    m (N,), then each chain's blend weight from the last chain back (`w / cump`, `cump *= 1 - w`)."""
    scaled = weights * m[:, None]
    out: np.ndarray = np.empty_like(scaled)
    cump = np.ones(scaled.shape[0], dtype=np.float32)
    for c in range(scaled.shape[1] - 1, -1, -1):
        out[:, c] = scaled[:, c] / cump
        cump = cump * (np.float32(1) - out[:, c])
    return out


class TimmAugMixOp:
    """timm's AugMix, batched: the chains of all samples are rows of one (width * N) batch (chain c
    of sample i is row c * N + i) whose steps run as RandAugment's layers do. Draws: the weights'
    uniform (Dirichlet and Beta from exact Gamma variates, `fastload._augment.draws`), then per
    chain its depth and (operation, magnitude, magnitude, sign) per step."""

    def __init__(self, t: TimmAugMix) -> None:
        self.t = t
        self.names = TIMM_AUGMIX_OPS
        self.width = t.width
        self.steps = t.depth if t.depth > 0 else 3
        self.draws = 1 + self.width * (1 + _PER_CHAIN_STEP * self.steps)
        self.fill: Fill = None if t.fill is None else fill_values(t.fill)

    def weights(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chain weights (N, width), m (N,)), float32 as timm's: Dirichlet(alpha) and Beta(alpha,
        alpha) from one uniform per sample."""
        g = gamma(u, float(self.t.alpha), 2 + self.width)
        m = normalize(g[:, :2])[:, 0].astype(np.float32)
        return normalize(g[:, 2:]).astype(np.float32), m

    def params(self, u: np.ndarray) -> Params:
        """The chains' groups (rows of the (width * N) batch), "weights" (N, width) and "m" (N,) (not
        blended) or "blend" (N, width) (blended)."""
        n = u.shape[0]
        per_chain = 1 + _PER_CHAIN_STEP * self.steps
        chains = u[:, 1:].reshape(n, self.width, per_chain).transpose(1, 0, 2).reshape(n * self.width, -1)
        depth = np.full(n * self.width, self.t.depth)
        if self.t.depth < 0:
            depth = 1 + uniform_integers(chains[:, 0], 3)
        params: Params = {}
        for step in range(self.steps):
            d = chains[:, 1 + _PER_CHAIN_STEP * step : 1 + _PER_CHAIN_STEP * (step + 1)]
            op = np.where(step < depth, uniform_integers(d[:, 0], len(self.names)), -1)
            level = timm_levels(float(self.t.severity), self.t.magnitude_std, 10.0, d[:, 1], d[:, 2])
            t = self.t
            params.update(step_groups(step, self.names, op, level, d[:, 3], t.translate_pct, t.interpolation))
        weights, m = self.weights(u[:, 0])
        if self.t.blended:
            params["blend"] = blended_weights(weights, m)
        else:
            params["weights"], params["m"] = weights, m
        return params

    def apply(self, x: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Run the chains on copies of x, then mix them into x, in place."""
        n = x.shape[0]
        if n == 0:
            return x
        fmt = groups.memory_format(x)
        shape = (self.width * n, *x.shape[1:])
        chains = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)
        chains.view(self.width, n, *x.shape[1:]).copy_(x.unsqueeze(0).expand(self.width, *x.shape))
        steps = {k: v for k, v in p.items() if k not in ("weights", "m", "blend")}
        return self.mix(x, run_steps(chains, steps, self.fill), p)

    def mix(self, x: torch.Tensor, chains: torch.Tensor, p: DeviceParams) -> torch.Tensor:
        """Mix the augmented `chains` (width * N rows) into x, in place, as timm's `_apply_basic`
        (or `_apply_blended`) does."""
        n = x.shape[0]
        if self.t.blended:
            for c in range(self.width):
                x.copy_(pil_blend(x, chains[c * n : (c + 1) * n], p["blend"][:, c]))
            return x
        mixed = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        weights = p["weights"]
        for c in range(self.width):
            mixed.add_(chains[c * n : (c + 1) * n].to(torch.float32).mul_(weights[:, c].view(-1, 1, 1, 1)))
        x.copy_(pil_blend(x, mixed.clamp_(0, 255).to(torch.uint8), p["m"]))
        return x


KERNELS: dict[str, SampleKernel] = {
    "TimmAutoAugment": lambda t, _: TimmAutoAugmentOp(t),
    "TimmAugMix": lambda t, _: TimmAugMixOp(t),
}
"""The per-sample kernels of this module, by the names their declarations give (`registry`)."""
