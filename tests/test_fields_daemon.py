"""Declared fields through a daemon (`FastLoader(TarShards(fields=...), daemon=...)`).

Protects: the hello carries the source's fields, the daemon's workers read the members from the
index's shared segment (its `FLEXTNT3` form) and write them into the slots, and the trainer gets
the same dict batches (images, labels, captions, JSON, bytes, sample ids) as a local loader;
a confined daemon (dataset roots) serves shards inside its roots and refuses shards outside
them, fields or not (the allowlist checks every shard the source names); MixUp over fields
without a label is refused when the loader is made, as locally.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import DaemonPool
from fields_helpers import AUGMENT, FIELDS, assert_same_batches, epoch, write_field_shards

from fastload import ConfigError, FastLoader, sources
from fastload import transforms as T
from fastload._errors import FastloadError


def test_a_daemon_serves_the_local_batches(
    image_folder: Path, tmp_path: Path, daemon_pool: DaemonPool
) -> None:
    inside = tmp_path / "inside"
    write_field_shards(inside, image_folder)
    source = sources.TarShards(str(inside / "train-{000000..000002}.tar"), fields=FIELDS)
    daemon = daemon_pool.start(workers=2, extra=["--root", str(inside)])
    local = epoch(source, 0, sample_ids=True)
    served = epoch(source, 1, sample_ids=True, daemon=daemon.address)
    for batch in (*local, *served):
        batch["sample_ids"] = batch["sample_ids"].indices.tolist()
    assert_same_batches(local, served)
    # MixUp needs the label the daemon's layout lacks: refused when the loader is made.
    unlabelled = sources.TarShards(source.paths, fields={"image": "jpg;jpeg;png", "text": "txt"})
    mixing = [*AUGMENT, T.MixUp(num_classes=3)]
    with pytest.raises(ConfigError, match="fields= declares none"):
        FastLoader(unlabelled, batch_size=5, transform=mixing, normalize=((0.5,) * 3, (0.2,) * 3),
                   device="cpu", daemon=daemon.address)  # fmt: skip


def test_a_confined_daemon_refuses_shards_outside_its_roots(
    image_folder: Path, tmp_path: Path, daemon_pool: DaemonPool
) -> None:
    (tmp_path / "inside").mkdir()
    write_field_shards(tmp_path / "outside", image_folder)
    source = sources.TarShards(str(tmp_path / "outside" / "train-000000.tar"), fields=FIELDS)
    daemon = daemon_pool.start(workers=1, extra=["--root", str(tmp_path / "inside")])
    options: dict[str, Any] = {"batch_size": 5, "transform": AUGMENT, "device": "cpu"}
    with pytest.raises(FastloadError, match="outside the daemon's dataset roots"):
        FastLoader(source, daemon=daemon.address, **options)
