"""`Mix`: several sources of encoded images sampled in set proportions, as one source (MosaicML
Streaming's streams, WebDataset's `RandomMix`, LitData's `CombinedStreamingDataset`).

    from fastload import FastLoader, sources
    mix = sources.Mix(["data/web", "packed/curated", "shards/extra-{00..09}.tar"],
                      weights=[0.5, 0.3, 0.2], epoch_size=100_000)
    loader = FastLoader(mix, batch_size=256, shuffle=True, sample_ids=True)

This module's one job is the description: its children, weights and epoch size, checked, and
`open()`, which opens every child and gives one `MixIndex` over them with each child's share of an
epoch (`shares`: exact counts by largest remainder). The epoch's order (each child drawn without
replacement, continuing through its own permutations across epochs, then interleaved) is the
loader's `MixturePlan` (`_loading/order/mixture.py`).

NOTE [a mix's labels]: each child keeps its own targets: class indices are NOT merged or
renumbered (label 3 of child 0 and label 3 of child 1 are both 3), as with torch's
`ConcatDataset`. Children must carry one kind of target: all class indices, or all multi-hot
rows of one width (a mix of the two is refused, naming the child). `classes` (and a loader's
`classes`/`class_to_idx`) is the children's class list when every child that names classes names
the same ones, in the same order (one label space, as ImageNet in several formats); where they
differ it is `()`, as a ConcatDataset has none, since no one list would name every label right;
read each child's from its own source then.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from numbers import Integral, Real
from typing import Any

from fastload._errors import ConfigError, DatasetError
from fastload._sizes import shown
from fastload.sources._base import FileToOpen, Source, as_source, source_from_config
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.mixed import MixIndex
from fastload.sources._indexes.sample_index import SampleIndex

SourceLike = Source | str | os.PathLike[str]


@dataclasses.dataclass(frozen=True)
class Mix(Source, kind="mix"):
    """Sources of encoded images sampled in set proportions, as one source (module docstring).

    - `sources`: the children: `Source`s or plain paths (`as_source`), each of encoded images
      with the same kind of target (NOTE [a mix's labels]); not a Mix, not an HDF5 of arrays.
    - `weights`: each child's share of an epoch, any non-negative numbers (normalized); None:
      in proportion to the children's sizes (each sample once an epoch at the default size).
    - `epoch_size`: samples per epoch, all ranks together; None: the children's total.

    Each child's samples in an epoch are exact counts (`shares`), drawn without replacement from
    its own permutations, which continue across epochs: a small child cycles (a new permutation
    each time through), a large one is not re-read until it is exhausted. `FastLoader(mix,
    sample_ids=True)` says each sample's child (`SampleIds.sources`). A daemon does not serve a
    Mix (`check_served_by_daemon` says why).
    """

    sources: tuple[Source, ...]
    weights: tuple[float, ...] | None = None
    epoch_size: int | None = None

    def __post_init__(self) -> None:
        children = self.sources
        if isinstance(children, (str, os.PathLike, Source)) or not isinstance(children, Sequence):
            raise ConfigError(f"Mix takes a list of sources, got {shown(children)}")
        made = tuple(_child(c, k) for k, c in enumerate(children))
        if not made:
            raise ConfigError("Mix needs at least one source")
        object.__setattr__(self, "sources", made)
        if self.weights is not None:
            object.__setattr__(self, "weights", _checked_weights(self.weights, len(made)))
        size = self.epoch_size
        if size is not None and not (isinstance(size, Integral) and not isinstance(size, bool) and size >= 1):
            raise ConfigError(
                f"Mix epoch_size must be an integer >= 1 (samples per epoch) or None, got {shown(size)}"
            )

    @property
    def where(self) -> str:
        return f"mix of {len(self.sources)} sources ({', '.join(s.where for s in self.sources)})"

    def files_before_open(self) -> Iterator[FileToOpen]:
        for k, child in enumerate(self.sources):
            for f in child.files_before_open():
                yield dataclasses.replace(f, what=f"source {k}: {f.what}")

    def check_served_by_daemon(self) -> None:
        raise ConfigError(
            "a daemon does not serve mix sources: a daemon shares one index per session with its "
            "workers through a segment, and a mix's children open into indexes of several types. Load "
            "the Mix without daemon= (its children are read by this loader's own workers)"
        )

    def resolved(self) -> Mix:
        return dataclasses.replace(self, sources=tuple(s.resolved() for s in self.sources))

    def to_config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sources": [s.to_config() for s in self.sources],
            "weights": None if self.weights is None else list(self.weights),
            "epoch_size": self.epoch_size,
        }

    def open(self) -> MixIndex:
        """Open every child (in order) into one `MixIndex`; DatasetError naming the child whose
        samples are not encoded images, whose targets differ in kind from the first's, or that
        holds no samples but has a share."""
        children: list[SampleIndex] = []
        for k, source in enumerate(self.sources):
            index = source.open()
            if isinstance(index, ArrayIndex):
                raise DatasetError(
                    f"Mix source {k} ({source.where}) holds arrays delivered as stored, not encoded images: "
                    "a Mix mixes sources of encoded images; load arrays in a loader of their own"
                )
            children.append(index)
        _check_targets(self.sources, children)
        sizes = [len(c) for c in children]
        weights = self.weights if self.weights is not None else tuple(float(n) for n in sizes)
        if not any(w > 0 and n > 0 for w, n in zip(weights, sizes, strict=True)):
            raise DatasetError(f"{self.where}: no source with a share of the epoch holds any sample")
        counts = shares(self.epoch_size if self.epoch_size is not None else sum(sizes), weights)
        for k, (n, c) in enumerate(zip(sizes, counts, strict=True)):
            if c and not n:
                raise DatasetError(
                    f"Mix source {k} ({self.sources[k].where}) holds no samples but has weight "
                    f"{weights[k]}: give it weight 0 or leave it out"
                )
        return MixIndex.of(self.where, _common_classes(children), children, counts)


def shares(epoch_size: int, weights: Sequence[float]) -> tuple[int, ...]:
    """Each child's samples in an epoch of `epoch_size`: exact counts by largest remainder (the
    floor of each quota `epoch_size * w / sum(w)`, then one more to the largest fractional parts,
    the earlier child first on ties), so that they add up to `epoch_size` and no count is more
    than one sample from its quota. The same counts every epoch (never multinomial draws)."""
    total = math.fsum(weights)
    quotas = [epoch_size * w / total for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in by_remainder[: epoch_size - sum(counts)]:
        counts[k] += 1
    return tuple(counts)


def _child(child: Any, k: int) -> Source:
    """Child `k` as a Source: a Source as is, a path by `as_source`, a config (a Mix rebuilt from
    JSON) by `source_from_config`; a Mix inside a Mix is refused."""
    if isinstance(child, dict):
        child = source_from_config(child)
    elif isinstance(child, (str, os.PathLike)):
        child = as_source(child)
    if not isinstance(child, Source):
        raise ConfigError(f"Mix source {k} must be a Source or a path, got {shown(child)}")
    if isinstance(child, Mix):
        raise ConfigError(
            f"Mix source {k} is itself a Mix: give its sources to one Mix, with its weights multiplied in"
        )
    if getattr(child, "fields", None) is not None:
        raise ConfigError(
            f"Mix source {k} declares fields: a Mix of (image, label) sources only, for now; "
            "leave fields= out of its sources"
        )
    return child


def _checked_weights(weights: Any, count: int) -> tuple[float, ...]:
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ConfigError(f"Mix weights must be a list of numbers, one per source, got {shown(weights)}")
    if len(weights) != count:
        raise ConfigError(f"Mix has {count} sources but {len(weights)} weights: give one weight per source")
    for k, w in enumerate(weights):
        if not (isinstance(w, Real) and not isinstance(w, bool) and math.isfinite(w) and float(w) >= 0):
            raise ConfigError(f"Mix weight {k} must be a finite number >= 0, got {shown(w)}")
    if not any(w > 0 for w in weights):
        raise ConfigError("Mix weights are all 0: give at least one source a share of the epoch")
    return tuple(float(w) for w in weights)


def _target_kind(labels: Any) -> str:
    if labels.ndim == 1:
        return "class indices"
    return f"multi-hot rows of {labels.shape[1]} classes"


def _check_targets(sources: Sequence[Source], children: Sequence[SampleIndex]) -> None:
    """DatasetError naming the first child whose kind of target differs from child 0's."""
    first = _target_kind(children[0].labels)
    for k, child in enumerate(children[1:], start=1):
        kind = _target_kind(child.labels)
        if kind != first or child.labels.dtype != children[0].labels.dtype:
            raise DatasetError(
                f"Mix source {k} ({sources[k].where}) has {kind}, source 0 ({sources[0].where}) has "
                f"{first}: a Mix's sources carry one kind of target (NOTE [a mix's labels])"
            )


def _common_classes(children: Sequence[SampleIndex]) -> tuple[str, ...]:
    """The class names every child that names any shares, else () (NOTE [a mix's labels])."""
    named = {c.classes for c in children if c.classes}
    return named.pop() if len(named) == 1 else ()
