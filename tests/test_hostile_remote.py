"""Hostile object stores (issue 29): an object rewritten in place under a running loader, an
answer dripped a byte at a time, a redirect to another host. Every byte read from a store is of
the version indexed, every request ends by its deadline, and no request leaves the URL's host.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import build_folder
from remote_helpers import (
    FaultProxy,
    drip_http_server,
    env_without_remote_state,
    moto_server,
    range_http_server,
    s3_environment,
    upload,
)

from fastload import DatasetError, FastLoader, SampleError, SourceChanged
from fastload import transforms as T
from fastload.sources import Packed, pack
from fastload.sources._storage import remote as _remote

pytest.importorskip("s3fs", reason="object storage needs fastload[remote] (s3fs)")
pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

KW: dict[str, Any] = {"batch_size": 4, "transform": [T.Resize((24, 24))], "device": "cpu"}
DEADLINE_S = 2.0
SLACK_S = 6.0  # a loaded machine's scheduling, the loop's cancellation and the error's way back


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack of 12 images in several data files."""
    base = tmp_path_factory.mktemp("hostile-remote")
    folder = build_folder(base / "folder", classes=2, per_class=6)
    pack(str(folder), str(base / "pack"), shard_bytes=20_000)
    return base / "pack"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def remote_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A private node cache for the test, and no filesystem made before (they keep endpoints)."""
    env_without_remote_state()
    monkeypatch.setenv("FASTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path / "cache"
    env_without_remote_state()


def _use(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    for name, value in s3_environment(endpoint).items():
        monkeypatch.setenv(name, value)


def _take(loader: FastLoader) -> list[list[torch.Tensor]]:
    return [[t.clone() for t in batch] for batch in loader]


CHUNK_NAME = re.compile(r"[0-9a-f]{40}\.\d+")  # the node cache's chunk files


def _evict_everything(cache: Path) -> None:
    """What eviction past the cache's limit (or another loader's data) does to these chunks."""
    chunks = [p for p in cache.glob("remote-*/*") if p.is_file() and CHUNK_NAME.fullmatch(p.name)]
    assert chunks, "no chunk cached: the test no longer sees the node cache's layout"
    for chunk in chunks:
        chunk.unlink()


@pytest.mark.parametrize("store", ["s3", "http"])
def test_an_object_rewritten_in_place_is_never_read_under_the_old_index(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, store: str
) -> None:
    """A pack is opened and read; its chunks are evicted; a data file is rewritten in place (the
    same size, other bytes). The next epoch's reads name the version indexed: S3 answers 412 to
    the If-Match, the HTTP server (which ignores If-Match) is caught by its answer's ETag. The
    batch fails with SourceChanged naming the object; the new bytes are never decoded under the
    old index's offsets and labels (before: they were, silently)."""
    import boto3

    rewritten = (local / "data-00000.bin").read_bytes()[::-1]
    with contextlib.ExitStack() as stack:
        if store == "s3":
            _use(monkeypatch, s3)
            upload(s3, "rewrites", local, "pack")
            url = "s3://rewrites/pack"
        else:
            served = tmp_path / "served"
            shutil.copytree(local, served / "pack")
            url = f"{stack.enter_context(range_http_server(served))}/pack"
        loader = stack.enter_context(FastLoader(Packed(url), num_workers=0, **KW))
        assert len(_take(loader)) == 3
        _evict_everything(remote_env)
        if store == "s3":
            keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
            client = boto3.client("s3", endpoint_url=s3, region_name="us-east-1", **keys)
            client.put_object(Bucket="rewrites", Key="pack/data-00000.bin", Body=rewritten)
        else:
            data_file = served / "pack" / "data-00000.bin"
            data_file.write_bytes(rewritten)
            later = data_file.stat().st_mtime_ns + 10**9  # its ETag (the mtime) changes for sure
            os.utime(data_file, ns=(later, later))
        said = r"pack/data-00000\.bin changed since it was opened"
        with pytest.raises(SampleError, match=said) as caught:
            _take(loader)
    assert isinstance(caught.value, SourceChanged)
    assert "make the loader again" in str(caught.value)


def test_an_answer_dripped_a_byte_at_a_time_fails_at_the_request_deadline(
    remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body at one byte per 0.5 s never stalls long enough for the read timeout (30 s between
    two reads of the socket): the request's deadline bounds the whole answer (before: 64 bytes
    took 32 s, and were returned)."""
    monkeypatch.setattr(_remote, "REQUEST_DEADLINE_S", DEADLINE_S)
    with drip_http_server(gap_s=0.5) as base:
        started = time.monotonic()
        with pytest.raises(OSError, match=rf"{base}/slow\.bin: .* in {DEADLINE_S:g} s"):
            _remote.read_range(f"{base}/slow.bin", 0, 64)
        took = time.monotonic() - started
    assert took < DEADLINE_S + SLACK_S, f"the read ended {took:.1f} s after it started"


def test_a_redirect_to_another_host_is_not_followed(local: Path, remote_env: Path) -> None:
    """A server that redirects to another host (an internal address, a metadata service): no
    request reaches it, for a size, a range or a whole pack; a redirect within the host is
    followed."""
    with range_http_server(local) as elsewhere:
        watched = FaultProxy(("127.0.0.1", int(elsewhere.rsplit(":", 1)[1])))
        try:
            with range_http_server(local, away=watched.url) as here:
                manifest = (local / "manifest.json").stat().st_size
                assert _remote.size_of(f"{here}/moved/manifest.json")[0] == manifest
                assert _remote.read_range(f"{here}/moved/data-00000.bin", 0, 4) == (
                    (local / "data-00000.bin").read_bytes()[:4]
                )
                said = r"/away/manifest\.json: the server redirects \(302\) to another host"
                with pytest.raises(OSError, match=said):
                    _remote.size_of(f"{here}/away/manifest.json")
                with pytest.raises(OSError, match=r"redirects \(302\) to another host"):
                    _remote.read_range(f"{here}/away/data-00000.bin", 0, 4)
                with pytest.raises(DatasetError, match=r"redirects \(302\) to another host"):
                    FastLoader(Packed(f"{here}/away"), **KW)
            assert watched.requests == 0, watched.paths
        finally:
            watched.close()
