"""Datasets in object storage (issue 23): a pack and tar shards read from an S3-compatible server
(moto's, on localhost) and from an HTTP server, through a proxy that injects faults. The batches
equal the local copy's, for any worker count; one download per chunk per node; a second epoch
reads the node cache only; the cache stays under its limit; 404 and 403 fail at once naming the
URL; resets, 503s and stalls are retried and lose nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import build_folder, wait_until, write_tar_shards
from remote_helpers import (
    FaultProxy,
    env_without_remote_state,
    moto_server,
    range_http_server,
    s3_environment,
    upload,
)

from fastload import ConfigError, DatasetError, FastLoader, SampleError, SettingsWarning
from fastload import transforms as T
from fastload.sources import FileList, Packed, TarShards, pack
from fastload.sources._storage import remote as _remote
from fastload.sources._storage.node_cache import NodeCache

pytest.importorskip("s3fs", reason="object storage needs fastload[remote] (s3fs)")
pytestmark = pytest.mark.timeout(180)

KW: dict[str, Any] = {"batch_size": 4, "transform": [T.RandomResizedCrop(32)], "device": "cpu", "seed": 3}
SHARDS = "train-{000000..000002}.tar"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of 24 images, its pack (several data files) and its tar shards (3)."""
    base = tmp_path_factory.mktemp("remote-data")
    folder = build_folder(base / "folder", classes=3, per_class=8)
    pack(str(folder), str(base / "pack"), shard_bytes=40_000)
    write_tar_shards(folder, base / "shards", per_shard=10)
    return base


@pytest.fixture(scope="module")
def s3(local: Path) -> Iterator[str]:
    """moto's server holding the pack and the shards under s3://data-bucket/, and the folder's
    images under images/ with file lists of them; its endpoint."""
    with moto_server() as endpoint:
        upload(endpoint, "data-bucket", local / "pack", "pack")
        upload(endpoint, "data-bucket", local / "shards", "shards")
        for name, kind in _LISTS:  # beside the images (paths relative to its prefix), and apart
            _write_list(local / name, local / "folder", kind)
        for klass in sorted((local / "folder").iterdir()):
            upload(endpoint, "data-bucket", klass, f"images/{klass.name}")
        upload(endpoint, "data-bucket", local / "lists", "lists")
        yield endpoint


_LISTS = (("lists/train.csv", "header"), ("lists/train.txt", "plain"))


def _write_list(path: Path, folder: Path, kind: str) -> None:
    """A list of the folder's images, relative to it, with class-name labels (a header line)
    or integer labels separated by whitespace."""
    path.parent.mkdir(exist_ok=True)
    images = sorted(p.relative_to(folder).as_posix() for p in folder.glob("*/*"))
    if kind == "header":
        lines = ["path,label", *(f"{image},{image.split('/')[0]}" for image in images)]
    else:
        lines = [f"{image} {int(image[1:3])}" for image in images]
    path.write_text("\n".join(lines) + "\n")


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


def _epoch(source: Any, workers: int, **kw: Any) -> list[list[torch.Tensor]]:
    with FastLoader(source, num_workers=workers, **{**KW, **kw}) as loader:
        return [[t.clone() for t in batch] for batch in loader]


def _same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    pairs = zip(a, b, strict=False)
    return len(a) == len(b) and all(torch.equal(x, y) for p, q in pairs for x, y in zip(p, q, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pack_in_s3_gives_the_local_batches_and_a_second_epoch_reads_the_cache(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    proxy = FaultProxy(("127.0.0.1", int(s3.rsplit(":", 1)[1])))
    try:
        _use(monkeypatch, proxy.url)
        expected = _epoch(str(local / "pack"), 1, shuffle=True)
        with FastLoader("s3://data-bucket/pack", num_workers=workers, shuffle=True, **KW) as loader:
            first = [[t.clone() for t in batch] for batch in loader]
            after_first = sum(proxy.ranges.values())
            cold = loader.stats()
            loader.set_epoch(0)
            again = [[t.clone() for t in batch] for batch in loader]
            warm = loader.stats()
        assert _same(first, expected) and _same(again, expected)
        # What iostat and the metrics show: every data byte fetched once, in the first epoch.
        assert cold is not None and warm is not None
        data_bytes = sum(p.stat().st_size for p in (local / "pack").glob("data-*"))
        assert cold.net_bytes == data_bytes and warm.net_bytes == data_bytes
        assert warm.cache_misses == cold.cache_misses and warm.cache_hits > cold.cache_hits
        assert after_first > 0 and sum(proxy.ranges.values()) == after_first  # epoch 2: the cache only
        repeated = {r: n for r, n in proxy.ranges.items() if n > 1}
        assert not repeated, f"chunks downloaded twice on one node: {repeated}"
    finally:
        proxy.close()


def test_tar_shards_by_url_from_s3_and_from_http(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, s3)
    expected = _epoch(str(local / "shards" / SHARDS), 1, shuffle=True)
    assert _same(_epoch(f"s3://data-bucket/shards/{SHARDS}", 2, shuffle=True), expected)
    with range_http_server(local) as base:
        assert _same(_epoch(TarShards(f"{base}/shards/{SHARDS}"), 1, shuffle=True), expected)
        packed = _epoch(str(local / "pack"), 0, shuffle=True)
        assert _same(_epoch(Packed(f"{base}/pack"), 1, shuffle=True), packed)


def test_file_lists_in_s3_name_objects_and_give_the_local_lists_batches(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, s3)
    for name, _ in _LISTS:
        expected = _epoch(FileList(str(local / name), root=str(local / "folder")), 1, shuffle=True)
        remote = FileList(f"s3://data-bucket/{name}", root="s3://data-bucket/images")
        assert _same(_epoch(remote, 2, shuffle=True), expected), name
    index = FileList("s3://data-bucket/lists/train.csv", root="s3://data-bucket/images").open()
    assert index.classes == ("n00", "n01", "n02") and len(index) == 24  # the header line skipped
    assert index.name(0) == "n00/img_000.JPEG" and index.remote
    # A list beside its images takes its prefix as root; a URL is a file list by its suffix.
    (local / "beside").mkdir()
    (local / "beside" / "train.csv").write_text((local / "lists" / "train.csv").read_text())
    upload(s3, "data-bucket", local / "beside", "images")
    assert _same(_epoch("s3://data-bucket/images/train.csv", 1, shuffle=True), expected)
    # An image that is not there is named with its line; a local root for a remote list refused.
    (local / "broken").mkdir()
    (local / "broken" / "bad.csv").write_text("n00/img_000.JPEG,0\nn00/nope.jpg,1\n")
    upload(s3, "data-bucket", local / "broken", "images")
    with pytest.raises(DatasetError, match=r"bad\.csv line 2: image n00/nope\.jpg cannot be read.*404"):
        FileList("s3://data-bucket/images/bad.csv").open()
    with pytest.raises(ConfigError, match="root must be a URL prefix"):
        FileList("s3://data-bucket/lists/train.csv", root=str(local / "folder")).open()


def test_a_state_dict_resumes_a_remote_epoch_where_the_local_one_would(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, s3)
    expected = _epoch(str(local / "pack"), 1, shuffle=True)
    with FastLoader("s3://data-bucket/pack", num_workers=2, shuffle=True, **KW) as saver:
        it = iter(saver)
        head = [[t.clone() for t in next(it)] for _ in range(2)]
        state = saver.state_dict()
    with FastLoader("s3://data-bucket/pack", num_workers=1, shuffle=True, **KW) as restored:
        restored.load_state_dict(state)
        rest = [[t.clone() for t in batch] for batch in restored]
    assert _same(head + rest, expected)


def test_missing_and_denied_fail_at_once_naming_the_url(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, s3)
    started = time.monotonic()
    with pytest.raises(DatasetError, match=r"s3://data-bucket/nothing-here is not a packed dataset"):
        FastLoader("s3://data-bucket/nothing-here", **KW)
    with pytest.raises(DatasetError, match=r"s3://no-such-bucket/x\.tar does not exist \(404\)"):
        FastLoader("s3://no-such-bucket/x.tar", **KW)
    denied = r"denied/x\.tar.*access denied \(403\)"
    with range_http_server(local) as base, pytest.raises(DatasetError, match=denied):
        FastLoader(f"{base}/denied/x.tar", **KW)
    assert time.monotonic() - started < 20  # no retries for what retrying cannot mend
    with pytest.raises(DatasetError, match="HDF5 files are read from local disk only"):
        FastLoader("s3://data-bucket/train.h5", **KW)


def test_gs_without_gcsfs_says_what_to_install(remote_env: Path) -> None:
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed here: gs:// would reach for Google Cloud Storage")
    said = r"gs://bucket/pack.*needs gcsfs.*pip install 'fastload\[remote\] gcsfs'"
    with pytest.raises(DatasetError, match=said):
        FastLoader("gs://bucket/pack", **KW)


def test_resets_503s_and_stalls_are_retried_and_lose_nothing(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_remote, "REQUEST_TIMEOUT_S", 1.0)  # a stalled read is given up after 1 s
    faults = ["reset", "503", "stall", "reset", "503"] * 3
    proxy = FaultProxy(("127.0.0.1", int(s3.rsplit(":", 1)[1])), faults=faults, latency_s=0.02, stall_s=3.0)
    try:
        _use(monkeypatch, proxy.url)
        expected = _epoch(str(local / "pack"), 1, shuffle=True)
        got = _epoch("s3://data-bucket/pack", 2, shuffle=True)
        assert _same(got, expected)
        assert proxy.faulted["reset"] and proxy.faulted["503"] and proxy.faulted["stall"], proxy.faulted
    finally:
        proxy.close()


def test_an_unreachable_store_fails_the_batch_naming_the_url(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opened, then the store goes away: past the retry deadline the batch fails with the URL."""
    proxy = FaultProxy(("127.0.0.1", int(s3.rsplit(":", 1)[1])))
    _use(monkeypatch, proxy.url)
    try:
        with FastLoader("s3://data-bucket/pack", num_workers=1, **KW) as loader:
            # The open reads the manifest under the default deadline (a loaded host's first answer
            # from moto can take seconds); the workers, forked at the first iteration, get 2 s.
            monkeypatch.setattr(_remote, "REQUEST_DEADLINE_S", 2.0)
            proxy.faults = ["reset"] * 10_000  # from now on every new connection is dropped
            env_without_remote_state()  # the worker's own filesystem opens new connections
            with pytest.raises(SampleError, match=r"s3://data-bucket/pack/.*attempts"):
                list(loader)
    finally:
        proxy.close()


OUTAGE_S = 12.0  # long enough for each request's own backoff (before: 0.1 s doubling to 10 s) to reach 6 s
RESUMED_WITHIN_S = 1.5  # a probe gap (at most 0.75 s) and a batch: 0.1-0.3 s measured beside two busy cores


@pytest.mark.parametrize("store", ["s3", "http"])
def test_loading_resumes_as_soon_as_the_store_is_back(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    """An outage at the start of an epoch (every connection cut, every new one refused): the
    reads wait it out, and the first batch comes within a probe gap of the store's return, not
    after the retries' own backoffs (which had grown to seconds); nothing is lost."""
    with contextlib.ExitStack() as stack:
        upstream = s3 if store == "s3" else stack.enter_context(range_http_server(local))
        proxy = FaultProxy(("127.0.0.1", int(upstream.rsplit(":", 1)[1])))
        stack.callback(proxy.close)
        _use(monkeypatch, proxy.url)
        source: Any = "s3://data-bucket/pack" if store == "s3" else Packed(f"{proxy.url}/pack")
        expected = _epoch(str(local / "pack"), 1, shuffle=True)
        back_at: list[float] = []

        def outage() -> None:
            assert wait_until(lambda: proxy.faulted["reset"] > 0, 60), "no read reached the store"
            time.sleep(OUTAGE_S)  # how long the store is away: the scenario, not a synchronisation
            back_at.append(time.monotonic())
            proxy.up()

        with FastLoader(source, num_workers=1, shuffle=True, **KW) as loader:
            proxy.down()
            taking_down = threading.Thread(target=outage, daemon=True)
            taking_down.start()
            batches = iter(loader)
            got = [[t.clone() for t in next(batches)]]
            arrived = time.monotonic()
            got += [[t.clone() for t in batch] for batch in batches]
            taking_down.join(60)
        assert back_at, "the first batch came while the store was away"
        assert arrived - back_at[0] < RESUMED_WITHIN_S, f"resumed {arrived - back_at[0]:.1f} s after"
        assert _same(got, expected)


def test_the_cache_stays_under_its_limit(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, s3)
    data_bytes = sum(p.stat().st_size for p in (local / "pack").glob("data-*"))
    limit = data_bytes // 3
    source = Packed("s3://data-bucket/pack", cache_dir=str(remote_env), cache_limit=limit)
    expected = _epoch(str(local / "pack"), 1, shuffle=True)
    for _ in range(2):
        # A full shuffle of data three times the cache downloads it over and over: said, with the
        # block shuffle that fits (24 samples in 6 data files of one chunk each: 4 a chunk).
        said = r"full shuffle .* shuffle_block=4 \(the samples of one of its 6"
        with pytest.warns(SettingsWarning, match=said):
            batches = _epoch(source, 1, shuffle=True)
        assert _same(batches, expected)
        assert 0 < NodeCache(str(remote_env), limit).size() <= limit
    blocks = _epoch(source, 1, shuffle=True, shuffle_block=4)  # no warning (warnings are errors here)
    labels = [sorted(torch.cat([b[1] for b in epoch]).tolist()) for epoch in (blocks, expected)]
    assert labels[0] == labels[1]


def test_a_cache_limit_with_a_unit_is_bytes_from_the_start(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cache_limit="12KiB" (as "12MiB" in the issue) is 12288 bytes when the source is made: the
    batches load (it used to fail at the first batch), and the thrash warning writes both sizes
    in a unit that shows them (it used to say "0.0 GiB")."""
    _use(monkeypatch, s3)
    source = Packed("s3://data-bucket/pack", cache_dir=str(remote_env), cache_limit="12KiB")
    assert source.cache_limit == 12 << 10 and source.to_config()["cache_limit"] == 12 << 10
    with pytest.warns(SettingsWarning, match=r"KiB\) through a node cache of 12 KiB: "):
        batches = _epoch(source, 1, shuffle=True)
    assert _same(batches, _epoch(str(local / "pack"), 1, shuffle=True))
    said = r'cache_limit of TarShards must be a size, .*"8GiB".*got "12 MiBs"'
    with pytest.raises(ConfigError, match=said):
        TarShards(f"s3://data-bucket/shards/{SHARDS}", cache_limit="12 MiBs")


def test_urls_are_sources_and_configs_keep_them(
    s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, s3)
    source = Packed("s3://data-bucket/pack")
    assert source.where == "s3://data-bucket/pack" and source.resolved() == source
    assert source.to_config() == {"kind": "packed", "path": "s3://data-bucket/pack"}
    third = TarShards(f"s3://data-bucket/shards/{SHARDS}").shard_paths()[2]
    assert third == "s3://data-bucket/shards/train-000002.tar"
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in repr(source.open())


def test_pack_writes_to_s3_and_reads_back_the_same(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fastload pack SRC s3://...`: staged on local disk, uploaded (the manifest last); the
    same bytes as a local pack of the same source, and the same batches."""
    import subprocess
    import sys

    from remote_helpers import list_objects

    _use(monkeypatch, s3)
    done = subprocess.run(
        [sys.executable, "-m", "fastload", "pack", str(local / "folder"), "s3://data-bucket/packed-by-cli",
         "--shard-size", "40000", "--quiet"],
        capture_output=True, text=True, timeout=120, env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    stored = list_objects(s3, "data-bucket", "packed-by-cli/")
    assert stored == {p.name: p.read_bytes() for p in (local / "pack").iterdir()}
    assert not list((remote_env / f"remote-{os.geteuid()}" / "pack-staging").glob("*"))  # staging removed
    expected = _epoch(str(local / "pack"), 1, shuffle=True)
    assert _same(_epoch("s3://data-bucket/packed-by-cli", 1, shuffle=True), expected)


def test_a_daemon_serves_a_pack_in_s3_as_a_local_loader_reads_it(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch, daemon_pool: Any
) -> None:
    proxy = FaultProxy(("127.0.0.1", int(s3.rsplit(":", 1)[1])))
    try:
        _use(monkeypatch, proxy.url)  # the daemon inherits the endpoint, the credentials and the cache
        daemon = daemon_pool.start(workers=2)
        expected = _epoch(str(local / "pack"), 1, shuffle=True)
        with FastLoader("s3://data-bucket/pack", daemon=daemon.address, shuffle=True, **KW) as loader:
            got = [[t.clone() for t in batch] for batch in loader]
            stats = loader.stats()
        assert _same(got, expected)
        # Its workers and its read-ahead of the session's tasks share the node cache: one download
        # a chunk; what they fetched reaches the trainer's statistics.
        repeated = {r: n for r, n in proxy.ranges.items() if n > 1}
        assert not repeated, f"chunks downloaded twice on one node: {repeated}"
        assert stats is not None and stats.net_bytes > 0
    finally:
        proxy.close()


def test_daemon_roots_confine_urls_to_their_prefixes() -> None:
    """A TCP peer's source is checked against the roots: a URL only under a URL root."""
    from fastload._daemon.confine import Roots
    from fastload.sources._storage.remote_file import remote_file

    local_only = Roots(("/data",))
    assert not local_only.allows("s3://bucket/datasets/pack/manifest.json")
    in_bucket = Roots(("s3://bucket/datasets",))
    assert in_bucket.allows("s3://bucket/datasets/pack")
    assert in_bucket.allows(remote_file("s3://bucket/datasets/pack/data-00000.bin", 10, "etag", 8))
    assert not in_bucket.allows("s3://bucket/datasets-private/pack")
    assert not in_bucket.allows("s3://bucket/datasets/../secret/pack")
    assert not in_bucket.allows("s3://other/datasets/pack") and not in_bucket.allows("/data/x")


def test_pack_to_s3_without_s3fs_fails_before_any_work(local: Path, tmp_path: Path) -> None:
    """The command says what to install at once, and neither reads a sample nor stages a pack."""
    import subprocess
    import sys

    code = "import sys; sys.modules['s3fs'] = None; from fastload.__main__ import main; sys.exit(main())"
    env = {**os.environ, "FASTLOAD_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", code, "pack", str(local / "folder"), "s3://data-bucket/nowhere", "--quiet"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 1
    assert "s3://data-bucket/nowhere/manifest.json: reading s3:// needs s3fs (s3fs is missing)" in done.stderr
    assert "pip install 'fastload[remote]'" in done.stderr
    assert not list(tmp_path.glob("cache/*/pack-staging/*"))


def test_pack_to_an_unreachable_store_fails_before_any_work(
    local: Path, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remote_helpers import free_port

    monkeypatch.setattr(_remote, "REQUEST_DEADLINE_S", 1.0)
    _use(monkeypatch, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    said = r"cannot pack to s3://data-bucket/p: .*unreachable.*nothing was packed"
    with pytest.raises(DatasetError, match=said):
        pack(str(local / "folder"), "s3://data-bucket/p", progress=False)
    assert not list(remote_env.glob("*/pack-staging/*"))


def test_a_failed_upload_says_where_the_pack_is_and_the_rerun_uploads_it(
    local: Path, s3: str, remote_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from remote_helpers import list_objects

    _use(monkeypatch, s3)
    real = _remote.upload

    def refused(path: str, url: str) -> None:
        if url.endswith("manifest.json"):
            raise OSError(f"{url}: the store refused the request (500)")
        real(path, url)

    dst = "s3://data-bucket/upload-fails"
    with monkeypatch.context() as patch:
        patch.setattr(_remote, "upload", refused)
        said = r"uploading the pack to .* failed .*kept in (\S+): run the same command again"
        with pytest.raises(DatasetError, match=said) as e:
            pack(str(local / "folder"), dst, shard_bytes=40_000, progress=False)
    staging = Path(str(e.value).split("kept in ")[1].split(":")[0])
    assert staging.is_relative_to(remote_env) and (staging / "manifest.json").exists()
    pack(str(local / "folder"), dst, shard_bytes=40_000, progress=False)  # uploads; packs nothing again
    stored = list_objects(s3, "data-bucket", "upload-fails/")
    assert stored == {p.name: p.read_bytes() for p in (local / "pack").iterdir()}
    assert not staging.exists()
