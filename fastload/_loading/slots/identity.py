"""`SampleIds`: which samples a batch holds, returned with it when a loader is asked to
(`FastLoader(..., sample_ids=True)`), for debugging and for evaluation code that writes
per-image results."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


class SampleIds:
    """The samples of one batch, in its row order.

    `indices`: an int64 CPU tensor of the samples' numbers in the source (a folder's or a file
    list's order, the order `fastload pack` keeps); `names`: each sample's file path (or where it
    lives in a container, `SHARD.tar:KEY`), looked up when first read, or None for a loader
    attached to a daemon (the trainer holds no index then). For a `sources.Mix`, `sources` is an
    int64 CPU tensor of each sample's child (its position in the mix's list) and each name reads
    `K:NAME` (child K's name of the sample); None for any other source.
    """

    __slots__ = ("_name_of", "_names", "indices", "sources")

    def __init__(
        self,
        indices: np.ndarray,
        name_of: Callable[[int], str] | None,
        source_of: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.indices = torch.from_numpy(np.array(indices, dtype=np.int64))  # a copy: plan arrays are shared
        self._name_of = name_of
        self._names: tuple[str, ...] | None = None
        self.sources = None if source_of is None else torch.from_numpy(source_of(np.asarray(indices)))

    @property
    def names(self) -> tuple[str, ...] | None:
        if self._names is None and self._name_of is not None:
            self._names = tuple(self._name_of(int(i)) for i in self.indices)
        return self._names

    def __len__(self) -> int:
        return int(self.indices.shape[0])

    def __repr__(self) -> str:
        return f"SampleIds({self.indices.tolist()})"
