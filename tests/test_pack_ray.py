"""`pack --ray` (`sources.pack(ray=...)`, issue 23): the samples read and re-encoded by Ray tasks.

Protects: a pack made on Ray holds the same files, byte for byte, as `pack` of the same source,
shuffle seed, shard size and re-encoding; a range whose task failed ends the run with an error
saying to run it again, and the run again makes only the ranges neither written nor staged (counted
by the tasks themselves) and finishes identical; a plain pack interrupted between ranges finishes
on Ray identical; a sample that cannot be re-encoded is named; the command line with a local Ray
of its own packs to S3 (moto) the same bytes; Ray missing is a ConfigError saying what to install.

One local Ray (2 CPUs) serves the module's in-process tests; its two workers are started before
the first test, so that the per-test check for leftover processes sees no new ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import build_folder
from remote_helpers import list_objects, moto_server, s3_environment
from test_sources_packed import interrupted_pack

from fastload import ConfigError, DatasetError, sources
from fastload.sources._packing import data_files
from fastload.sources._packing import ray_pack as _ray_pack
from fastload.sources._packing import writer as _pack_writer

ray = pytest.importorskip("ray", reason="pack --ray needs fastload[ray]")
pytestmark = pytest.mark.timeout(180)

SHARD = 40_000  # several data files
RANGES = 4  # samples a Ray task makes: the 40 images are 10 ranges
MAX_SIDE = 64
OPTIONS: list[dict[str, Any]] = [{}, {"max_side": MAX_SIDE, "shuffle_seed": 7}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes x 10 images of mixed sizes (grayscale JPEGs and a PNG among them)."""
    return build_folder(tmp_path_factory.mktemp("ray-folder"), classes=4, per_class=10)


@pytest.fixture(scope="module")
def plain(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """`pack` without Ray of `folder` with each of OPTIONS, by their position."""
    base = tmp_path_factory.mktemp("plain-packs")
    for k, options in enumerate(OPTIONS):
        sources.pack(folder, base / str(k), shard_bytes=SHARD, progress=False, **options)
    return {k: base / str(k) for k in range(len(OPTIONS))}


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray of 2 CPUs, its two workers started; shut down (every process gone) after."""
    saved = os.environ.get("RAY_USAGE_STATS_ENABLED")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must fit 107 bytes
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp)
    try:

        def pause() -> None:  # a local function: Ray sends it by value (the workers cannot import tests/)
            time.sleep(0.5)

        ray.get([ray.remote(pause).remote() for _ in range(2)])  # both workers up, before any test
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        if saved is None:
            os.environ.pop("RAY_USAGE_STATS_ENABLED", None)
        else:
            os.environ["RAY_USAGE_STATS_ENABLED"] = saved


@pytest.fixture
def ranges_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Ranges of RANGES samples; the file each Ray task logs its range's first position to."""
    monkeypatch.setattr(_ray_pack, "RANGE_SAMPLES", RANGES)
    monkeypatch.setenv(_ray_pack._LOG_ENV, str(tmp_path / "ranges.log"))
    return tmp_path / "ranges.log"


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _ranges_made(log: Path) -> list[int]:
    """The first positions of the ranges the Ray tasks made, as they logged them (a test hook)."""
    return sorted(int(line) for line in log.read_text().split()) if log.exists() else []


def test_the_command_line_on_its_own_local_ray_packs_to_s3_the_same_bytes(
    folder: Path, plain: dict[int, Path], tmp_path: Path
) -> None:
    """First in the module: `fastload pack SRC s3://... --ray` starts a local Ray of --workers
    CPUs, stages and uploads as `pack` does, and leaves no process (its Ray's) behind."""
    pytest.importorskip("s3fs", reason="object storage needs fastload[remote] (s3fs)")
    env = {**os.environ, "FASTLOAD_CACHE_DIR": str(tmp_path / "cache"), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray-")  # Ray's session files; short, for its sockets
    with moto_server() as endpoint, contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, env["RAY_TMPDIR"], ignore_errors=True)
        env.update(s3_environment(endpoint))
        import boto3

        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                     aws_secret_access_key="testing", region_name="us-east-1").create_bucket(Bucket="out")
        done = subprocess.run(
            [sys.executable, "-m", "fastload", "pack", str(folder), "s3://out/packed", "--shard-size",
             str(SHARD), "--max-side", str(MAX_SIDE), "--shuffle", "7", "--workers", "2", "--ray"],
            capture_output=True, text=True, timeout=150, env=env,
        )
        assert done.returncode == 0, done.stderr
        stored = list_objects(endpoint, "out", "packed/")
    assert stored == _files(plain[1])
    assert "fastload pack: on Ray (2 CPUs), 1 of 1 ranges" in done.stderr
    assert "fastload pack: 40/40 samples" in done.stderr
    assert not list((tmp_path / "cache").glob(f"remote-{os.geteuid()}/pack-staging/*"))  # removed


@pytest.mark.parametrize("which", range(len(OPTIONS)))
def test_a_ray_pack_is_the_pack_byte_for_byte(
    cluster: None,
    folder: Path,
    plain: dict[int, Path],
    tmp_path: Path,
    ranges_log: Path,
    capsys: pytest.CaptureFixture[str],
    which: int,
) -> None:
    made = sources.pack(folder, tmp_path / "ray", shard_bytes=SHARD, ray=True, **OPTIONS[which])
    assert _files(tmp_path / "ray") == _files(plain[which])  # staging and checkpoint gone too
    assert _ranges_made(ranges_log) == list(range(0, 40, RANGES))
    err = capsys.readouterr().err
    assert "fastload pack: on Ray (2 CPUs), 10 of 10 ranges of 4 samples to make\n" in err
    assert "fastload pack: 40/40 samples" in err
    assert len(made.open()) == 40


@pytest.mark.parametrize("failing", [16, 36])
def test_a_failed_range_ends_the_run_and_the_rerun_makes_only_what_is_missing(
    cluster: None,
    folder: Path,
    plain: dict[int, Path],
    tmp_path: Path,
    ranges_log: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failing: int,
) -> None:
    log, dst = ranges_log, tmp_path / "ray"
    with monkeypatch.context() as patch:
        patch.setenv(_ray_pack._FAIL_ENV, str(failing))
        with pytest.raises(DatasetError, match=rf"samples {failing}\.\.{failing + 3} .*failed.*run the same"):
            sources.pack(folder, dst, shard_bytes=SHARD, ray=True, progress=False, **OPTIONS[1])
    with pytest.raises(DatasetError, match="incomplete pack"):
        sources.Packed(str(dst)).open()
    assert failing in _ranges_made(log)
    # What the first run finished: the samples written (checkpointed at the error) and the ranges
    # staged; the rerun must make exactly the others, the failed one among them.
    written = len(np.load(dst / data_files.CHECKPOINT))
    staged = {int(p.name.split("-")[1]) for p in (dst / _pack_writer.STAGING).glob("range-*.bin")}
    missing = [first for first in range(0, 40, RANGES) if first + RANGES > written and first not in staged]
    assert failing in missing and len(missing) < 10
    log.unlink()
    sources.pack(folder, dst, shard_bytes=SHARD, ray=True, **OPTIONS[1])
    assert _ranges_made(log) == missing
    assert f"{len(missing)} of " in capsys.readouterr().err
    assert _files(dst) == _files(plain[1])


def test_a_plain_pack_interrupted_mid_range_finishes_on_ray(
    cluster: None, folder: Path, plain: dict[int, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ray_pack, "RANGE_SAMPLES", 5)
    dst = tmp_path / "mixed"
    interrupted_pack(monkeypatch, folder, dst, shard_bytes=SHARD)
    written = len(np.load(dst / data_files.CHECKPOINT))
    assert written % 5 != 0  # the Ray run starts inside a range
    sources.pack(folder, dst, shard_bytes=SHARD, progress=False, ray=True)
    assert _files(dst) == _files(plain[0])


def test_a_sample_that_cannot_be_reencoded_is_named(cluster: None, tmp_path: Path) -> None:
    broken = build_folder(tmp_path / "broken", classes=1, per_class=6)
    bad = sorted((broken / "n00").iterdir())[4]
    bad.write_bytes(b"\xff\xd8\xff not a JPEG")
    with pytest.raises(DatasetError, match=rf"{bad.name} is not a whole image \(truncated JPEG"):
        sources.pack(broken, tmp_path / "out", progress=False, ray=True, max_side=MAX_SIDE)


def test_samples_skipped_on_ray_are_the_plain_packs_staged_or_not(
    cluster: None, tmp_path: Path, ranges_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """on_error="skip" on Ray leaves out what the plain pack leaves out, with the same reasons,
    also for ranges staged by a run that failed and read back by the next."""
    dirty = build_folder(tmp_path / "dirty", classes=2, per_class=8)
    images = sorted(dirty.glob("*/*.jpg"))
    images[2].write_bytes(b"")
    images[9].write_bytes(images[9].read_bytes()[:300])
    plain, dst = tmp_path / "plain", tmp_path / "ray"
    options: dict[str, Any] = {"shard_bytes": SHARD, "progress": False, "on_error": "skip", **OPTIONS[1]}
    with pytest.warns(UserWarning, match="left out 2 samples"):
        sources.pack(dirty, plain, **options)
    with monkeypatch.context() as patch:
        patch.setenv(_ray_pack._FAIL_ENV, "0")  # the first range fails; the others are staged
        with pytest.raises(DatasetError, match="run the same"):
            sources.pack(dirty, dst, ray=True, **options)
    assert list((dst / _pack_writer.STAGING).glob("range-*.bin"))
    with pytest.warns(UserWarning, match="left out 2 samples"):
        sources.pack(dirty, dst, ray=True, **options)
    assert _files(dst) == _files(plain)


def test_ray_missing_or_a_bad_address_is_a_config_error(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="ray must be True or a Ray cluster's address"):
        sources.pack(folder, tmp_path / "a", progress=False, ray=5)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails
    with pytest.raises(ConfigError, match=r"needs Ray.*pip install 'fastload\[ray\]'"):
        sources.pack(folder, tmp_path / "b", progress=False, ray=True)
    assert not (tmp_path / "b").exists()  # said before any work
