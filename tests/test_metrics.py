"""Prometheus metrics (issue 24): a daemon's endpoint and a local loader's, scraped over HTTP and
parsed with prometheus-client's own parser.

What a user relies on: every family is there; counters never fall between scrapes (not even when
a session ends); the figures are `fastload status`'s; a bad address is a clear error at start;
nothing listens beyond loopback unless asked; a scrape gets an answer while the daemon works.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from daemon_helpers import RESIZE, DaemonPool, refused_serve, serve_command
from helpers import wait_until

from fastload import ConfigError, FastLoader
from fastload._daemon.shares import NEED_GAIN
from fastload._diagnostics.metrics import VERDICTS, DaemonCollector, MetricsServer, servers
from fastload._machine import SHM_DIR
from fastload._metrics_seam import parse_address
from fastload._shm import STATS_TAG

prometheus_parser = pytest.importorskip("prometheus_client.parser")

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]

DAEMON_FAMILIES = {
    "fastload_daemon_samples", "fastload_daemon_tasks", "fastload_daemon_read_bytes",
    "fastload_daemon_failures", "fastload_daemon_sessions_started", "fastload_daemon_refusals",
    "fastload_daemon_worker_restarts", "fastload_daemon_sessions", "fastload_daemon_workers",
    "fastload_daemon_memory_budget_bytes", "fastload_daemon_memory_used_bytes", "fastload_daemon_draining",
}
SESSION_FAMILIES = {
    "fastload_session_info", "fastload_session_samples", "fastload_session_tasks",
    "fastload_session_read_bytes", "fastload_session_stage_seconds", "fastload_session_failures",
    "fastload_session_samples_per_second", "fastload_session_queued_tasks", "fastload_session_memory_bytes",
    "fastload_session_priority", "fastload_session_need", "fastload_session_pool_share",
}
LOADER_FAMILIES = {
    "fastload_samples", "fastload_batches", "fastload_read_bytes", "fastload_stage_seconds",
    "fastload_trainer_wait_seconds", "fastload_failures", "fastload_skipped_samples", "fastload_epochs",
    "fastload_ring_ready_batches", "fastload_ring_in_flight_batches", "fastload_samples_per_second",
    "fastload_batches_per_second", "fastload_stage_seconds_per_sample", "fastload_trainer_wait_ratio",
    "fastload_worker_busy_ratio", "fastload_verdict",
}


def scrape(url: str) -> tuple[dict[str, Any], Series]:
    """The endpoint's families (name -> type) and every sample (name, labels) -> value."""
    with urllib.request.urlopen(url, timeout=30) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    kinds: dict[str, Any] = {}
    series: Series = {}
    for family in prometheus_parser.text_string_to_metric_families(text):
        kinds[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in series, f"duplicate series {key}"
            series[key] = sample.value
    return kinds, series


def value(series: Series, name: str, **labels: str) -> float:
    return series[(name, tuple(sorted(labels.items())))]


def counters(kinds: dict[str, Any], series: Series) -> Series:
    return {k: v for k, v in series.items() if kinds.get(k[0].removesuffix("_total")) == "counter"}


def assert_monotonic(before: Series, after: Series) -> None:
    """Every counter of `before` is in `after` (the daemon's) or gone (an ended session's), and not lower."""
    for key, old in before.items():
        if not key[0].endswith("_total"):
            continue
        # daemon-wide: always present; a session's or loader's: while it exists; never lower
        if key[0].startswith("fastload_daemon_") or key in after:
            assert after[key] >= old, key


def test_parse_address_is_loopback_unless_a_host_is_named() -> None:
    assert parse_address(9400) == ("127.0.0.1", 9400)
    assert parse_address("9400") == ("127.0.0.1", 9400)
    assert parse_address("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_address("[::1]:9400") == ("::1", 9400)
    for bad in ("", "http://x:1", "host:", ":80", "70000", "a:b", "::1:80", "-1"):
        with pytest.raises(ConfigError, match="not PORT or HOST:PORT"):
            parse_address(bad)


def test_daemon_metrics_equal_status_and_never_fall(
    daemon_pool: DaemonPool, image_folder: Path
) -> None:
    daemon = daemon_pool.start(workers=2, extra=["--metrics", "0"])
    url = daemon.status()["metrics"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics"), url
    kinds, first = scrape(url)
    assert set(kinds) >= DAEMON_FAMILIES, DAEMON_FAMILIES - set(kinds)
    assert value(first, "fastload_daemon_workers") == 2
    assert value(first, "fastload_daemon_samples_total") == 0
    assert kinds["fastload_daemon_samples"] == "counter" and kinds["fastload_daemon_workers"] == "gauge"

    with FastLoader(
        image_folder, batch_size=4, transform=RESIZE, device="cpu", num_workers=2,
        daemon=daemon.address, rank=1, world_size=2, seed=0,
    ) as loader:
        images = sum(len(labels) for _, labels in loader)
        # The session decodes the next epoch's first batches ahead (NOTE [no drain]) until its
        # window is full; then it is idle and its session open: the scrape and status describe the
        # same moment once the loop has published (every 0.1 s).
        def idle() -> bool:
            rows = daemon.status()["sessions"]
            return len(rows) == 1 and rows[0]["epoch"] == 1 and rows[0]["queued"] == rows[0]["running"] == 0

        assert wait_until(idle, 30.0), daemon.status()
        status = daemon.status()
        session = status["sessions"][0]
        decoded = session["images"]
        assert decoded >= images
        wait_until(lambda: value(scrape(url)[1], "fastload_daemon_samples_total") == decoded, 10.0)
        kinds, during = scrape(url)
        assert set(kinds) >= (DAEMON_FAMILIES | SESSION_FAMILIES | LOADER_FAMILIES), (
            (DAEMON_FAMILIES | SESSION_FAMILIES | LOADER_FAMILIES) - set(kinds)
        )
        labels = {"session": str(session["session"]), "rank": "1"}
        assert value(during, "fastload_session_info", **labels, pid=str(session["pid"]), world_size="2",
                     dataset=str(image_folder)) == 1
        assert value(during, "fastload_session_samples_total", **labels) == decoded
        assert value(during, "fastload_session_tasks_total", **labels) == session["tasks"]
        assert value(during, "fastload_session_read_bytes_total", **labels) == session["bytes_read"] > 0
        for stage in ("read", "decode", "augment"):
            got = value(during, "fastload_session_stage_seconds_total", **labels, stage=stage)
            assert got == pytest.approx(session[f"{stage}_s"]), stage
        assert value(during, "fastload_session_memory_bytes", **labels) == session["memory_bytes"]
        # Its place in the pool's shares (NOTE [shares by need]): the need and share move with the
        # trainer's reports and the pool's last interval, so they are bounded here, not equated.
        assert value(during, "fastload_session_priority", **labels) == session["priority"] == 1.0
        assert 1.0 <= value(during, "fastload_session_need", **labels) <= 1.0 + NEED_GAIN
        assert 0.0 <= value(during, "fastload_session_pool_share", **labels) <= 1.0
        assert value(during, "fastload_daemon_memory_used_bytes") == status["used_bytes"]
        assert value(during, "fastload_daemon_memory_budget_bytes") == status["budget_bytes"]
        assert value(during, "fastload_daemon_tasks_total") == status["totals"]["tasks"]
        assert value(during, "fastload_daemon_sessions") == 1
        for cause, count in status["worker_deaths"].items():
            assert value(during, "fastload_daemon_worker_restarts_total", cause=cause) == count
        # The trainer's own figures, from its statistics block: the same counters loader.stats() has.
        stats = loader.stats()
        assert stats is not None
        # What the trainer has heard of: every batch it took, and what finished ahead of it since.
        assert value(during, "fastload_samples_total", **labels) == stats.samples
        assert images <= stats.samples <= decoded
        waited = value(during, "fastload_trainer_wait_seconds_total", **labels)
        assert waited == pytest.approx(stats.trainer_wait_s)
        verdicts = {v: value(during, "fastload_verdict", **labels, verdict=v) for v in VERDICTS}
        assert sorted(verdicts.values()) == [0.0] * (len(VERDICTS) - 1) + [1.0], verdicts
        assert_monotonic(first, during)
    # The session ended: its series go, the daemon's counters stay where they were.
    wait_until(lambda: value(scrape(url)[1], "fastload_daemon_sessions") == 0, 10.0)
    kinds, after = scrape(url)
    assert not [k for k in after if k[0].startswith("fastload_session_")]
    assert value(after, "fastload_daemon_samples_total") == decoded
    assert value(after, "fastload_daemon_sessions_started_total") == 1
    assert_monotonic(during, after)
    assert counters(kinds, after)


def test_a_scrape_is_answered_while_the_daemon_serves(daemon_pool: DaemonPool, image_folder: Path) -> None:
    # Scrapes in a loop while a trainer loads: each is answered promptly, and the trainer's batches
    # keep coming (the collector reads a published snapshot; it never waits for the loop).
    daemon = daemon_pool.start(workers=2, extra=["--metrics", "127.0.0.1:0"])
    url = daemon.status()["metrics"]
    seen: list[float] = []
    slowest = [0.0]
    stop = threading.Event()

    failed: list[BaseException] = []

    def scraper() -> None:
        try:
            while not stop.is_set():
                started = time.monotonic()
                seen.append(value(scrape(url)[1], "fastload_daemon_samples_total"))
                slowest[0] = max(slowest[0], time.monotonic() - started)
        except BaseException as e:  # said by the test, not lost with this thread
            failed.append(e)

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        with FastLoader(
            image_folder, batch_size=4, transform=RESIZE, device="cpu", num_workers=2, daemon=daemon.address
        ) as loader:
            for _ in range(3):
                assert sum(len(labels) for _, labels in loader) == 24
        # The loop publishes its totals every 0.1 s: a later scrape shows the last batches.
        def shown_all() -> bool:
            return bool(seen) and seen[-1] == daemon.status()["totals"]["samples"]

        wait_until(lambda: bool(failed) or shown_all(), 30)
    finally:
        stop.set()
        thread.join(60)
    assert not failed, f"a scrape failed: {failed[0]!r}"
    # 3 epochs of 24, and what was decoded ahead of the next (NOTE [no drain]): the daemon's total.
    total = daemon.status()["totals"]["samples"]
    assert len(seen) >= 3 and seen == sorted(seen) and seen[-1] == total >= 72, (seen[-5:], total)
    assert slowest[0] < 5.0, slowest


def test_a_loader_starting_during_a_scrape_does_not_fail_it() -> None:
    """A daemon's scrape reads every trainer's statistics block; one just made by a loader that is
    starting (its file created, not yet sized) is skipped, not an HTTP 500 (seen under -n 12)."""
    status = {
        "totals": dict.fromkeys(("samples", "tasks", "bytes_read", "failures", "sessions", "refusals"), 0),
        "worker_deaths": {}, "sessions": [], "workers": 1, "budget_bytes": 1, "used_bytes": 0,
        "draining": False,
    }
    starting = os.path.join(SHM_DIR, f"fastload_{os.getpid()}_{STATS_TAG}{secrets.token_hex(16)}")
    os.close(os.open(starting, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    server = MetricsServer("127.0.0.1", 0, DaemonCollector(lambda: status))
    try:
        assert value(scrape(server.url)[1], "fastload_daemon_samples_total") == 0
    finally:
        server.close()
        os.unlink(starting)


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("nonsense:port", "metrics address 'nonsense:port' is not PORT or HOST:PORT"),
        ("192.0.2.1:9400", "cannot serve metrics on 192.0.2.1:9400: Cannot assign requested address"),
    ],
    ids=["unparsable", "not-an-address-here"],
)
def test_a_bad_metrics_address_stops_serve_with_a_clear_error(
    tmp_path: Path, address: str, message: str
) -> None:
    socket_dir = tmp_path / "s"
    socket_dir.mkdir(mode=0o700)
    code, stderr = refused_serve(serve_command(socket_dir, workers=1, extra=["--metrics", address]))
    assert code == 1, stderr
    assert f"fastload: error: {message}" in stderr
    assert not (socket_dir / "daemon.sock").exists() and not (socket_dir / "daemon.pid").exists()


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"
        with pytest.raises(ConfigError, match=in_use):
            FastLoader(build_dataset(), batch_size=2, metrics=port)


def test_the_daemon_listens_on_loopback_only_unless_asked(daemon_pool: DaemonPool) -> None:
    daemon = daemon_pool.start(workers=1, extra=["--metrics", "0"])
    listening = listeners(daemon.pid)
    assert [c.laddr.ip for c in listening] == ["127.0.0.1"], listening
    assert daemon.status()["metrics"] == f"http://127.0.0.1:{listening[0].laddr.port}/metrics"
    wide = daemon_pool.start(workers=1, extra=["--metrics", "0.0.0.0:0"])
    listening = listeners(wide.pid)
    assert [c.laddr.ip for c in listening] == ["0.0.0.0"], listening


def listeners(pid: int) -> list[Any]:
    return [c for c in psutil.Process(pid).net_connections("inet") if c.status == psutil.CONN_LISTEN]


class Squares:
    """A small map-style Dataset (fixed-shape arrays: the fast path)."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> Any:
        import numpy as np

        return np.full(4, i * i, np.float32)


def build_dataset() -> Any:
    import torch.utils.data

    class Data(Squares, torch.utils.data.Dataset[Any]):
        pass

    return Data()


def test_a_local_loader_exports_its_stages_per_rank(image_folder: Path) -> None:
    with FastLoader(
        image_folder, batch_size=4, transform=RESIZE, device="cpu", num_workers=2, metrics=0, rank=1,
        world_size=2, seed=0,
    ) as loader, FastLoader(
        build_dataset(), batch_size=8, num_workers=1, metrics=port_of(servers()[0])
    ) as second:
        url = servers()[0]
        assert servers() == [url]  # one server for the process
        _, before = scrape(url)
        assert not [k for k in before if k[0] == "fastload_samples_total"]  # no batches yet, no block
        images = sum(len(labels) for _, labels in loader)
        rows = sum(len(batch) for batch in second)
        kinds, after = scrape(url)
        assert LOADER_FAMILIES | {"fastload_loader_info"} <= set(kinds)
        stats = loader.stats()
        assert stats is not None and images == 12 and rows == 32
        # Decoded samples (the next epoch's first batches are decoded ahead), as loader.stats() counts.
        assert value(after, "fastload_samples_total", rank="1", loader="0") == stats.samples >= images
        assert value(after, "fastload_samples_total", rank="0", loader="1") >= rows
        stages = {"read": stats.read_s, "decode": stats.decode_s, "slot_wait": stats.slot_wait_s}
        for stage, seconds in stages.items():
            got = value(after, "fastload_stage_seconds_total", rank="1", loader="0", stage=stage)
            assert got == pytest.approx(seconds), stage
        info = [k for k in after if k[0] == "fastload_loader_info" and ("loader", "0") in k[1]]
        assert dict(info[0][1])["dataset"] == str(image_folder) and dict(info[0][1])["mode"] == "local"
    assert servers() == []  # the last loader closed: its server stopped
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def test_a_launcher_turns_metrics_on_per_rank(image_folder: Path) -> None:
    # FASTLOAD_METRICS=PORT: each rank of a machine serves on PORT + LOCAL_RANK.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        "import json; from fastload import FastLoader, transforms as T; "
        "from fastload._diagnostics.metrics import servers; "
        f"loader = FastLoader({str(image_folder)!r}, batch_size=4, device='cpu', num_workers=1, "
        "transform=[T.Resize((24, 24))]); print(json.dumps(servers())); loader.close()"
    )
    env = {"FASTLOAD_METRICS": str(port - 1), "LOCAL_RANK": "1", "PATH": "", "HOME": str(image_folder.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [f"http://127.0.0.1:{port}/metrics"]
