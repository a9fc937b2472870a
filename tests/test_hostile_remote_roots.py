"""Object-storage roots (issue 29, item 11): a TCP daemon (CURVE) configured with
`roots = ["s3://bucket/prefix"]` serves a source in that prefix from moto's S3 server, refuses
one outside it (another prefix, a prefix that merely starts the same, `..`, escapes, a file list
naming an outside object) with no request for it reaching the store, and keeps its own cache:
a peer's `cache_dir` and `cache_limit` are not honoured.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import DaemonPool, RawClient, hello_fields, hello_reply, start_tcp_daemon
from helpers import build_folder, write_tar_shards
from remote_helpers import FaultProxy, moto_server, s3_environment, upload

from fastload import ConfigError
from fastload._daemon.confine import Roots
from fastload._daemon.control import load_config
from fastload.sources import FileList, Packed, Source, TarShards, pack

pytest.importorskip("s3fs", reason="object storage needs fastload[remote] (s3fs)")
pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

BUCKET = "data"
ROOT = f"s3://{BUCKET}/allowed"  # no trailing slash: still not a prefix of allowed-other/


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultProxy]:
    """moto's S3 holding a pack under allowed/ and copies outside it, shards under allowed/, and
    a file list under allowed/ naming an object outside; a proxy in front that sees each path."""
    base = tmp_path_factory.mktemp("remote-roots")
    folder = build_folder(base / "folder", classes=2, per_class=4)
    pack(str(folder), str(base / "pack"), shard_bytes=20_000)
    write_tar_shards(folder, base / "shards", per_shard=4)
    (base / "lists").mkdir()
    (base / "lists" / "outside.csv").write_text(f"path,label\ns3://{BUCKET}/secret/pack/data-00000.bin,a\n")
    with moto_server() as endpoint:
        for prefix in ("allowed/pack", "secret/pack", "allowed-other/pack"):
            upload(endpoint, BUCKET, base / "pack", prefix)
        upload(endpoint, BUCKET, base / "shards", "allowed/shards")
        upload(endpoint, BUCKET, base / "lists", "allowed/lists")
        proxy = FaultProxy(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
        try:
            yield proxy
        finally:
            proxy.close()


def _tcp_daemon(
    daemon_pool: DaemonPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: FaultProxy
) -> RawClient:
    """A TCP daemon with CURVE whose only root is ROOT and whose cache is tmp_path/daemon-cache;
    a client allowed to it."""
    for name, value in s3_environment(store.url).items():
        monkeypatch.setenv(name, value)  # the daemon's credentials and endpoint (the proxy)
    _, client_of = start_tcp_daemon(
        daemon_pool, tmp_path, roots=[ROOT], cache_dir=str(tmp_path / "daemon-cache"), cache_limit="64MiB"
    )
    return client_of()


def _hello(source: Source) -> dict[str, Any]:
    return hello_fields(Path("/unused"), source=json.dumps(source.to_config()))


def test_a_tcp_daemon_serves_objects_under_its_url_roots_and_asks_the_store_for_nothing_else(
    daemon_pool: DaemonPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: FaultProxy
) -> None:
    with _tcp_daemon(daemon_pool, tmp_path, monkeypatch, store) as client:
        op, fields = hello_reply(client, _hello(Packed(f"{ROOT}/pack")))
        assert op == "welcome" and fields["num_samples"] == 8, fields
        outside = [
            Packed(f"s3://{BUCKET}/secret/pack"),
            Packed(f"s3://{BUCKET}/allowed-other/pack"),  # starts like the root, is not under it
            Packed(f"{ROOT}/../secret/pack"),
            Packed(f"{ROOT}/%2e%2e/secret/pack"),
            Packed(f"{ROOT}/pack?x=/../../secret/pack"),
            Packed(f"S3://{BUCKET}/allowed/pack"),  # another spelling: refused, not normalized
            FileList(f"{ROOT}/lists/outside.csv"),  # inside, naming an object outside
        ]
        for source in outside:
            op, fields = hello_reply(client, _hello(source))
            assert op == "error", (source, fields)
            message = str(fields["message"])
            assert "outside the daemon's dataset roots" in message, message
            assert "data-00000.bin" not in message  # the list's line: content, never sent
    asked = " ".join(store.paths)
    assert "secret" not in asked and "allowed-other" not in asked, store.paths


def test_a_peer_source_cannot_choose_the_daemons_cache(
    daemon_pool: DaemonPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: FaultProxy
) -> None:
    """Tar shards in the root, named with the peer's `cache_dir` (a directory the daemon's user
    would create and write) and a `cache_limit` of one byte (which would evict every session's
    chunks): refused, nothing made; the same shards without them are read through the daemon's
    own cache, under its own limit."""
    peer_cache = tmp_path / "peer" / "cache"
    pattern = f"{ROOT}/shards/train-{{000000..000001}}.tar"
    with _tcp_daemon(daemon_pool, tmp_path, monkeypatch, store) as client:
        for chosen in ({"cache_dir": str(peer_cache)}, {"cache_limit": 1}):
            op, fields = hello_reply(client, _hello(TarShards(pattern, **chosen)))  # type: ignore[arg-type]
            assert op == "error" and "its own node cache" in fields["message"], fields
        op, fields = hello_reply(client, _hello(TarShards(pattern)))
        assert op == "welcome" and fields["num_samples"] == 8, fields
    assert not (tmp_path / "peer").exists()
    kept = [p for p in (tmp_path / "daemon-cache").rglob("*") if p.is_file() and "tar-index" not in str(p)]
    assert len(kept) >= 2, kept  # both shards, downloaded whole, kept under the daemon's limit


def test_url_roots_are_plain_prefixes() -> None:
    """`roots` (and `--root`) take URL prefixes; one that is not plain is refused at start, and
    a URL is allowed only under a root, spelled as the root spells it."""
    config, _ = load_config(None, {"roots": ["s3://bucket/pre", "/"], "workers": 1})
    assert config.roots == ("s3://bucket/pre", "/")
    roots = Roots(config.roots)
    assert roots.allows("s3://bucket/pre/pack/manifest.json") and roots.allows("s3://bucket/pre")
    for url in (
        "s3://bucket/prefix-other/x", "s3://bucket/pre/../x", "s3://bucket/pre/%2E%2E/x",
        "s3://bucket/pre/x?versionId=1", "s3://bucket/pre/x#y", "s3://other/pre/x", "gs://bucket/pre/x",
        "s3://user@bucket/pre/x", "s3://bucket/pre/.\\x",
    ):
        assert not roots.allows(url), url
    for bad in ("s3://bucket/pre/../x", "s3://bucket/p?q=1", "s3://bucket/p#f", "s3:///p", "https://u:p@host/p"):
        with pytest.raises(ConfigError, match="is not a plain URL prefix"):
            load_config(None, {"roots": [bad], "workers": 1})
    assert Roots(("S3://bucket/pre",)).roots == ("s3://bucket/pre/",)
    with pytest.raises(ConfigError, match=r"cache_dir .* must be an absolute path"):
        load_config(None, {"roots": ["/"], "workers": 1, "cache_dir": "relative/cache"})
