"""Helpers of the declared-fields tests (`test_fields.py`, `test_fields_daemon.py`): shards whose
samples carry a caption, JSON metadata and raw bytes besides image and label, epochs of dict
batches, and their comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from helpers import write_tar_shards

from fastload import FastLoader, sources
from fastload import transforms as T

AUGMENT = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]
FIELDS = {"image": "jpg;jpeg;png", "text": "txt", "meta": "json", "label": "cls", "raw": "bin"}


def caption(i: int) -> str:
    return f"sample {i} " + "é" * (i % 7) + "x" * (i * 13 % 50)  # varying lengths, non-ASCII


def meta(i: int) -> Any:
    return {"i": i, "tags": ["a"] * (i % 4), "w": i / 4}


def members(i: int) -> list[tuple[str, bytes]]:
    """Sample i's caption, metadata and raw bytes, as shard members."""
    return [
        (".txt", caption(i).encode()),
        (".json", json.dumps(meta(i)).encode()),
        (".bin", bytes(range(i % 256)) * 3),
    ]


def write_field_shards(directory: Path, folder: Path, **kwargs: Any) -> list[Path]:
    """Shards of 10 of the folder (sample i is key s{i:05d}) with `members(i)` and .cls labels."""
    return write_tar_shards(folder, directory, 10, extra=members, **kwargs)


def epoch(source: sources.Source, workers: int, **kwargs: Any) -> list[Any]:
    options: dict[str, Any] = {"batch_size": 5, "shuffle": True, "transform": AUGMENT, "seed": 7}
    options.update(device="cpu", **kwargs)
    with FastLoader(source, num_workers=workers, **options) as loader:
        return [copied(batch) for batch in loader]


def copied(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: copied(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and not isinstance(batch, str):
        return type(batch)(copied(v) for v in batch)
    return batch.clone() if isinstance(batch, torch.Tensor) else batch


def assert_same_batches(a: list[Any], b: list[Any]) -> None:
    """Two epochs of dict batches are equal: tensors exactly, lists item for item."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert list(x) == list(y)
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key
