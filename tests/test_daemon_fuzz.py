"""Hostile sources sent in hellos: byte-mutated HDF5 files, tar shards, pack manifests and file
lists, each named in a hello to one real daemon (roots set, a short open deadline, a small
address-space limit), for a bounded time. Every hello gets an answer (welcome or error) within
the deadline, and at the end the daemon answers `status` and serves a correct epoch.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from daemon_helpers import RESIZE, DaemonPool, RawClient, hello_fields, hello_reply, local_epoch, take

from fastload import FastLoader
from fastload.sources import HDF5, FileList, Packed, Source, TarShards, pack

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(240)]

FUZZ_SECONDS = 15.0
OPEN_DEADLINE_S = 5


def _mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice((1, 2, 4, 16))):
        at = rng.randrange(len(buf))
        kind = rng.random()
        if kind < 0.6:
            buf[at] = rng.randrange(256)
        elif kind < 0.8:
            buf[at : at + 8] = rng.choice((b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff"))
        else:
            del buf[at : at + rng.randrange(1, 64)]
    return bytes(buf)


def _seeds(root: Path, image_folder: Path) -> dict[str, tuple[Path, Source]]:
    """One valid source of each kind under `root`: (the file to mutate, the source naming it)."""
    images = sorted(image_folder.glob("*/*.jpg"))[:6]
    h5 = root / "seed.h5"
    with h5py.File(h5, "w") as f:
        f.create_dataset(
            "images",
            data=[np.frombuffer(p.read_bytes(), np.uint8) for p in images],
            dtype=h5py.vlen_dtype(np.uint8),
        )
        f.create_dataset("labels", data=np.arange(len(images)) % 2)
    shard = root / "seed.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        for k, p in enumerate(images):
            for name, data in ((f"{k:04d}.jpg", p.read_bytes()), (f"{k:04d}.cls", str(k % 2).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    listing = root / "seed.txt"
    listing.write_text("".join(f"{p} {k % 2}\n" for k, p in enumerate(images)))
    packed = root / "packed"
    pack(image_folder, packed, progress=False)
    return {
        "hdf5": (h5, HDF5(str(h5))),
        "tar": (shard, TarShards(str(shard))),
        "file_list": (listing, FileList(str(listing))),
        "packed": (packed / "manifest.json", Packed(str(packed))),
    }


def test_mutated_sources_in_hellos_never_take_the_daemon_down(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    seeds = _seeds(root, image_folder)
    config = tmp_path / "daemon.toml"
    table = {
        "roots": [str(root), str(image_folder)],
        "index_timeout": OPEN_DEADLINE_S,
        "index_memory": "512MiB",
    }
    config.write_text("[daemon]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    daemon = daemon_pool.start(workers=1, extra=["--config", str(config)])
    rng = random.Random(20)
    answers: dict[str, int] = {}
    tried = 0
    deadline = time.monotonic() + FUZZ_SECONDS
    with RawClient(daemon.address) as client:
        while time.monotonic() < deadline:
            kind = rng.choice(sorted(seeds))
            original, source = seeds[kind]
            # Each try its own copy (a new key: never an index already made), mutated.
            where = root / f"t{tried}"
            if kind == "packed":
                shutil.copytree(original.parent, where)
                target = where / "manifest.json"
                source = Packed(str(where))
            else:
                where.mkdir()
                target = where / original.name
                source = type(source)(str(target))  # type: ignore[call-arg]
            target.write_bytes(_mutate(original.read_bytes(), rng))
            fields = hello_fields(Path(source.where), source=json.dumps(source.resolved().to_config()))
            started = time.monotonic()
            op, reply = hello_reply(client, fields, timeout_s=OPEN_DEADLINE_S + 30)
            assert op in ("welcome", "error"), reply
            assert time.monotonic() - started < OPEN_DEADLINE_S + 30
            assert op == "welcome" or len(reply["message"]) <= 4000
            answers[f"{kind} {op}"] = answers.get(f"{kind} {op}", 0) + 1
            tried += 1
    print(f"fuzzed hellos: {tried}, answers: {dict(sorted(answers.items()))}")
    assert tried >= 10
    assert daemon.status(timeout_s=5.0)["pid"] == daemon.pid
    kw: dict[str, Any] = {"batch_size": 4, "transform": RESIZE, "device": "cpu", "seed": 5}
    with FastLoader(image_folder, daemon=daemon.address, **kw) as loader:
        got = take(loader)
    expected = local_epoch(image_folder, **kw)
    assert all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(got, expected, strict=True))
