"""Samplers that are plans: small frozen descriptions of how an epoch draws a source's samples,
which `FastLoader(source, sampler=...)` turns into an order that is a pure function of (seed,
epoch, rank, world_size) — resumable exactly by `state_dict`, the same batches for any worker
count and through a daemon, and shared out by rank without a DistributedSampler.

    from fastload import FastLoader, samplers
    FastLoader(src, sampler=samplers.Weighted(weights))                    # WeightedRandomSampler
    FastLoader(src, sampler=samplers.ClassBalanced())                      # 1 / count(class)
    FastLoader(src, sampler=samplers.RepeatedAugmentation(repeats=3))      # DeiT's RASampler

The orders themselves are made in the loader (`fastload._loading.order.sampling`); a torch
sampler of your own still works as before, iterated in the trainer (it is not a plan).
"""

from __future__ import annotations

import abc
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import numpy as np

from fastload._errors import ConfigError

__all__ = [
    "MAX_REPEATS", "ClassBalanced", "RepeatedAugmentation", "Sampler", "Weighted", "class_balanced_weights",
]

MAX_REPEATS = 1024  # RepeatedAugmentation's repeats (a daemon takes no more from a peer)


class Sampler(abc.ABC):
    """The base of fastload's sampler descriptions (`Weighted`, `ClassBalanced`,
    `RepeatedAugmentation`): what the loader recognizes as a plan, not a torch sampler."""

    @abc.abstractmethod
    def to_config(self) -> dict[str, Any]:
        """What a `state_dict` records of this sampler (its kind and parameters; weights by digest)."""


def _count_or_none(value: object, name: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, Integral) or isinstance(value, bool) or int(value) < 1:
        raise ConfigError(f"{name} must be an integer >= 1 or None, got {value!r}")
    return int(value)


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return value


@dataclass(frozen=True, eq=False)
class Weighted(Sampler):
    """torch's `WeightedRandomSampler`: sample i drawn with probability weights[i] / sum(weights)
    (weights need not sum to 1; one per sample of the source, >= 0, finite, not all 0).

    `num_samples`: the epoch's draws across all ranks (None: the source's sample count, those an
    `exclude=` leaves). With `replacement`, independent multinomial draws; without, weighted
    sampling without replacement (each sample at most once an epoch), drawn by the Gumbel top-k
    trick: every sample gets key log(w) + Gumbel noise and the epoch is the `num_samples` largest
    keys in decreasing order — the same distribution as torch's successive draws. With
    `world_size > 1` the epoch is ceil(num_samples / world_size) draws per rank (floor with
    `drop_last`), and rank r takes draws r, r + world_size, ... of the epoch's sequence.
    """

    weights: np.ndarray = field(repr=False)
    num_samples: int | None = None
    replacement: bool = True

    def __init__(
        self, weights: Sequence[float] | np.ndarray, num_samples: int | None = None, replacement: bool = True
    ) -> None:
        array = np.array(weights, dtype=np.float64, copy=True)
        if array.ndim != 1 or not len(array):
            raise ConfigError(
                f"weights must be a non-empty 1-D sequence (one per sample), got shape {array.shape}"
            )
        if not np.isfinite(array).all() or (array < 0).any():
            raise ConfigError("weights must be finite and >= 0 (one per sample)")
        if not (array > 0).any():
            raise ConfigError("weights must not all be 0: no sample could be drawn")
        array.setflags(write=False)
        object.__setattr__(self, "weights", array)
        object.__setattr__(self, "num_samples", _count_or_none(num_samples, "num_samples"))
        object.__setattr__(self, "replacement", _flag(replacement, "replacement"))

    @functools.cached_property
    def weights_digest(self) -> str:
        """A digest of the weights (what a state records of them), computed once."""
        return hashlib.blake2b(self.weights.tobytes(), digest_size=8).hexdigest()

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": "Weighted", "weights": self.weights_digest, "num_samples": self.num_samples,
            "replacement": self.replacement,
        }


@dataclass(frozen=True)
class ClassBalanced(Sampler):
    """`Weighted` with weight 1 / count(class) for each sample, from the source's targets (each
    class drawn equally often on average). Single-label sources only: multi-hot targets are
    refused (a sample of several classes has no one class to count; compute weights of your own
    and pass `Weighted`), and so are samples without a label (-1); the classes are counted among
    the samples an `exclude=` leaves. A daemon holds the targets, not the trainer: there pass
    `Weighted(class_balanced_weights(targets))`. `num_samples` and `replacement` mean what they
    mean in `Weighted`."""

    num_samples: int | None = None
    replacement: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_samples", _count_or_none(self.num_samples, "num_samples"))
        _flag(self.replacement, "replacement")

    def to_config(self) -> dict[str, Any]:
        return {"kind": "ClassBalanced", "num_samples": self.num_samples, "replacement": self.replacement}


@dataclass(frozen=True)
class RepeatedAugmentation(Sampler):
    """DeiT's `RASampler`: the epoch's shuffled order (from (seed, epoch)) with each sample
    repeated `repeats` times in a row, dealt to the ranks strided (rank r takes positions r,
    r + world_size, ...), so that with world_size >= repeats a sample's repeats land on different
    ranks. `num_samples` is the epoch's samples across all ranks; None is DeiT's choice,
    `n // 256 * 256` for a source of n samples (n itself below 256), and each rank takes
    num_samples // world_size of them: an epoch sees about n / repeats distinct samples, each
    `repeats` times. Each repeat gets its own augmentation (NOTE [augmentation of repeats] in
    `fastload._loading.order.sampling`), locally and through a daemon; a GPU decoder in the
    trainer (backend "dali" or "nvjpeg" on CUDA) is refused."""

    repeats: int = 3
    num_samples: int | None = None

    def __post_init__(self) -> None:
        repeats = self.repeats
        whole = isinstance(repeats, Integral) and not isinstance(repeats, bool)
        if not whole or not 1 <= int(repeats) <= MAX_REPEATS:
            raise ConfigError(f"repeats must be an integer 1..{MAX_REPEATS}, got {repeats!r}")
        object.__setattr__(self, "repeats", int(self.repeats))
        object.__setattr__(self, "num_samples", _count_or_none(self.num_samples, "num_samples"))

    def to_config(self) -> dict[str, Any]:
        return {"kind": "RepeatedAugmentation", "repeats": self.repeats, "num_samples": self.num_samples}


def class_balanced_weights(targets: Sequence[int] | np.ndarray) -> np.ndarray:
    """Weights 1 / count(class) for each sample of single-label `targets` (class indices >= 0):
    what `ClassBalanced` uses, for `Weighted` where the loader does not hold the targets itself
    (a daemon keeps them: compute them from the source's targets opened where you can)."""
    labels = np.asarray(targets)
    if labels.ndim != 1:
        raise ConfigError(
            f"class-balanced weights need one class per sample; these targets have shape {labels.shape} "
            "(multi-hot rows: a sample of several classes has no one class to count): pass "
            "samplers.Weighted with weights of your own"
        )
    if not len(labels):
        raise ConfigError("class-balanced weights need at least one sample's target")
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
        raise ConfigError(
            "class-balanced weights need a class index >= 0 for every sample; some have none (-1) or "
            "are not integers: leave those out with exclude=, or pass samplers.Weighted"
        )
    counts = np.bincount(labels.astype(np.int64))
    weights: np.ndarray = 1.0 / counts[labels]
    return weights
