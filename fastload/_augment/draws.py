"""Random variates beyond uniforms for the batched kernels, drawn from a sample's own uniforms:
Gamma, and the Dirichlet and Beta weights AugMix mixes with.

A sample's parameters must depend on its uniforms alone (`fastload._augment.ops`), but Gamma
variates of an arbitrary shape have no closed-form inverse CDF, and exact samplers reject a
random number of candidates. So one uniform per sample keys a counter-based stream (SplitMix64's
finalizer over (key, counter), the generator of `fastload._sample_random`) with as many
further uniforms as the sampler needs, and Marsaglia & Tsang's method (ACM TOMS 26(3), 2000)
runs on all the pending variates of a batch at once, round after round, until each has accepted a
candidate (more than 95% do in every round). The variates are exact Gamma draws (to double
precision), never dependent on the batch a sample is in.
"""

from __future__ import annotations

import math

import numpy as np

from fastload._sample_random import SPLITMIX_GAMMA, splitmix64

_U53 = 2.0**-53
_TRIES = 1 << 10  # rounds before giving up on a variate: never reached (rejection < 5% a round)


def _keys(u: np.ndarray) -> np.ndarray:
    """A 64-bit stream key per uniform of `u` (N,) in [0, 1)."""
    return splitmix64((u * 2.0**53).astype(np.uint64) + np.uint64(0x2545F4914F6CDD1D))


def _stream(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1] (never 0, for logarithms): the counters' draws of each key (broadcast)."""
    bits = splitmix64(keys + (counters.astype(np.uint64) + np.uint64(1)) * SPLITMIX_GAMMA)
    return ((bits >> np.uint64(11)).astype(np.float64) + 1.0) * _U53


def gamma(u: np.ndarray, alpha: float, count: int) -> np.ndarray:
    """(N, count) independent Gamma(alpha, 1) variates, row i from the uniform `u[i]` alone."""
    n = u.shape[0]
    keys = np.repeat(_keys(u), count)  # variate j of sample i: keys[i * count + j], its own counters
    variate = np.tile(np.arange(count, dtype=np.uint64), n)
    shape = alpha if alpha >= 1.0 else alpha + 1.0  # Gamma(a) = Gamma(a + 1) * U^(1/a) for a < 1
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    out = np.full(n * count, d)  # a variate that never accepts (it cannot happen) keeps the mode
    pending = np.arange(n * count)
    for attempt in range(_TRIES):
        if pending.size == 0:
            break
        base = (variate[pending] * np.uint64(_TRIES) + np.uint64(attempt)) * np.uint64(4)
        k = keys[pending]
        u1, u2, u3 = (_stream(k, base + np.uint64(j)) for j in range(3))
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)  # Box-Muller: a standard normal
        v = (1.0 + c * z) ** 3
        positive = v > 0
        log_v = np.log(np.where(positive, v, 1.0))
        accepted = positive & (np.log(u3) < 0.5 * z * z + d - d * v + d * log_v)
        out[pending[accepted]] = d * v[accepted]
        pending = pending[~accepted]
    if alpha < 1.0:
        last = variate * np.uint64(_TRIES) * np.uint64(4) + np.uint64(3)  # a counter no round uses
        out *= _stream(keys, last) ** (1.0 / alpha)
    return out.reshape(n, count)


def normalize(g: np.ndarray) -> np.ndarray:
    """Rows of Gamma(alpha) variates (N, k) divided by their sums: Dirichlet(alpha, ..., alpha)
    weights (k=2: (B, 1 - B) with B ~ Beta(alpha, alpha)); a row of zeros (tiny alpha underflowing)
    becomes equal weights."""
    total = g.sum(axis=1, keepdims=True)
    weights: np.ndarray = np.divide(g, total, out=np.full_like(g, 1.0 / g.shape[1]), where=total > 0)
    return weights
