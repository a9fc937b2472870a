"""torchvision `ImageFolder`'s view of an opened index's targets: `class_to_idx` and `targets`.

One meaning for every kind of source, read from what any index holds (`IndexBase`: `classes`
and `labels`), so a format never says it twice:

- `class_to_idx(classes)`: each class name to its index, `{name: i}` in `classes`' order (a
  folder's sorted folder names, as ImageFolder's). A source that names no classes (a file list
  or tar shards with integer labels, an HDF5 file without class names) has `classes == ()`, and
  so `{}`: its labels are already the indices.
- `targets_list(labels)`: every sample's target in the source's order, as the batches carry it,
  in Python values: an `int` per sample for class-index labels (`-1` where the source holds no
  label: an HDF5 source without targets, or a pack made of one, or tar shards whose `fields=`
  declare no label); for multi-label sources
  (float32 multi-hot rows) a `list[float]` per sample, its row. Built when asked (a list of a million
  ints takes ~40 MB): callers build it on first access, never when a source is opened.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def class_to_idx(classes: Sequence[str]) -> dict[str, int]:
    """Each class name to its index in `classes` (ImageFolder's `class_to_idx`); `{}` without names."""
    return {name: i for i, name in enumerate(classes)}


def targets_list(labels: np.ndarray) -> list[int] | list[list[float]]:
    """Every sample's target as a Python value (ImageFolder's `targets`): an int each for int64
    class indices (N,), a list of floats each for float32 multi-hot rows (N, K)."""
    values: list[int] | list[list[float]] = labels.tolist()
    return values
