"""The daemon against greedy and careless clients: sessions, message sizes, folders to index.

Protects issue 8's second to fourth items: a session belongs to the connection and the process
the kernel names (SO_PEERCRED), not to the pid a hello claims, and ends when that connection
closes; one process may hold only `max_sessions_per_peer` sessions; a frame larger than any legal
one drops the connection instead of filling the daemon's memory; a folder with a directory loop
is indexed once per real file while the daemon keeps answering; index bounds (files, time) give
the hello a clear error; an index no session uses is evicted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest
from daemon_helpers import RESIZE, DaemonPool, DaemonProcess, RawClient, answer, hello_fields, take
from helpers import wait_until

from fastload import FastLoader
from fastload._loading.link import daemon_link as wire

pytestmark = pytest.mark.timeout(90)


def _config(tmp_path: Path, **settings: object) -> list[str]:
    path = tmp_path / "daemon.toml"
    lines = ["[daemon]"] + [f"{k} = {v!r}" for k, v in settings.items()]
    path.write_text("\n".join(lines) + "\n")
    return ["--config", str(path)]


def test_sessions_belong_to_the_connection_and_the_real_pid(
    daemon_pool: DaemonPool, image_folder: Path, tmp_path: Path
) -> None:
    daemon = daemon_pool.start(extra=_config(tmp_path, max_sessions_per_peer=4))
    clients = [RawClient(daemon.address) for _ in range(6)]
    try:
        replies = [answer(c, wire.encode("hello", **hello_fields(image_folder, pid=1))) for c in clients]
        ops = [r[0] if r else None for r in replies]
        assert ops == ["welcome"] * 4 + ["error"] * 2, replies
        assert replies[4] is not None and "max_sessions_per_peer" in replies[4][1]["message"]
        sessions = daemon.sessions()
        assert {s["pid"] for s in sessions} == {os.getpid()}, "the daemon believed the claimed pid 1"
    finally:
        for c in clients:
            c.close()
    # The connections are gone (this process lives on): every session ends, and its ring with it.
    assert wait_until(lambda: daemon.sessions() == [], 30.0), daemon.sessions()  # a hang guard
    assert daemon.status()["used_bytes"] < 1 << 20  # the dataset's index only
    kwargs = {"batch_size": 4, "transform": RESIZE, "device": "cpu", "daemon": daemon.address}
    with FastLoader(image_folder, **kwargs) as loader:
        assert len(take(loader)) == 6


def test_oversized_frames_drop_the_connection_not_the_daemon(shared_daemon: DaemonProcess) -> None:
    rss_before = psutil.Process(shared_daemon.pid).memory_info().rss
    with RawClient(shared_daemon.address) as attacker:
        for _ in range(3):
            attacker.send(b"x" * (64 << 20))
        assert attacker.reply(timeout_s=2.0) is None, "an oversized frame was read and answered"
    with RawClient(shared_daemon.address) as other:
        reply = other.call(wire.encode("status"))
        assert reply is not None and reply[0] == "status_reply"
    grown = psutil.Process(shared_daemon.pid).memory_info().rss - rss_before
    assert grown < 32 << 20, f"the daemon grew by {grown >> 20} MiB"
    # The largest legal frame still goes through (an index frame of MAX_BATCH samples): it is read
    # and answered (a ping carries none, so the answer is an error), not dropped with the connection.
    with RawClient(shared_daemon.address) as legal:
        reply = legal.call(wire.encode("ping"), b"\0" * (8 * wire.MAX_BATCH))
        assert reply is not None and reply[0] == "error" and "no frames after" in reply[1]["message"]
        assert legal.call(wire.encode("ping")) == ("pong", {})


def _looping_folder(root: Path, image_folder: Path) -> tuple[Path, int]:
    """A copy of `image_folder` where every class folder links back to the root and to itself."""
    root.mkdir()
    count = 0
    for class_dir in sorted(p for p in image_folder.iterdir() if p.is_dir()):
        target = root / class_dir.name
        target.mkdir()
        for image in class_dir.iterdir():
            (target / image.name).write_bytes(image.read_bytes())
            count += 1
        (target / "up").symlink_to("..")
        (target / "self").symlink_to(".")
    return root, count


def test_a_folder_with_directory_loops_is_indexed_once_and_the_daemon_keeps_answering(
    shared_daemon: DaemonProcess, image_folder: Path, tmp_path: Path
) -> None:
    folder, count = _looping_folder(tmp_path / "loops", image_folder)
    with RawClient(shared_daemon.address) as trainer, RawClient(shared_daemon.address) as watcher:
        trainer.send(wire.encode("hello", **hello_fields(folder)))
        reply = None
        deadline = time.monotonic() + 60
        while reply is None or reply[0] == "indexing":
            start = time.monotonic()  # a loop stalled by the scan would not answer for its length
            status = watcher.call(wire.encode("status"), timeout_s=5.0)
            assert status is not None and time.monotonic() - start < 5.0, "the daemon stopped answering"
            reply = trainer.reply(timeout_s=0.2)
            assert time.monotonic() < deadline, "no answer to the hello"
        assert reply[0] == "welcome", reply
        assert reply[1]["num_samples"] == count


def test_index_bounds_refuse_the_hello_with_the_reason(
    daemon_pool: DaemonPool, image_folder: Path, tmp_path: Path
) -> None:
    daemon = daemon_pool.start(extra=_config(tmp_path, index_max_files=5, index_idle=0))
    with RawClient(daemon.address) as client:
        reply = answer(client, wire.encode("hello", **hello_fields(image_folder)))
    assert reply is not None and reply[0] == "error", reply
    assert "5" in reply[1]["message"] and "files" in reply[1]["message"], reply
    assert daemon.status()["datasets"] == []


def test_an_index_no_session_uses_is_evicted(
    daemon_pool: DaemonPool, image_folder: Path, tmp_path: Path
) -> None:
    daemon = daemon_pool.start(extra=_config(tmp_path, index_idle=0))
    kwargs = {"batch_size": 4, "transform": RESIZE, "device": "cpu", "daemon": daemon.address}
    with FastLoader(image_folder, **kwargs) as loader:
        take(loader)
        (dataset,) = daemon.status()["datasets"]
        assert dataset["sessions"] == 1 and dataset["images"] == 24
    assert wait_until(lambda: daemon.status()["datasets"] == [], 5), daemon.status()["datasets"]
    assert wait_until(lambda: not daemon.segments(), 5), daemon.segments()


@pytest.mark.parametrize(
    ("transform", "named"),
    [
        ({"type": "RandomResizedCrop", "size": [24, 24], "scale": [float("nan"), 1.0]}, "scale"),
        ({"type": "RandomResizedCrop", "size": [24, 24], "ratio": [0, 1]}, "ratio"),
        ({"type": "RandomHorizontalFlip", "p": float("inf")}, "p"),
        ({"type": "Resize", "size": [10**9, 24]}, "size"),
    ],
)
def test_absurd_transform_parameters_are_refused_at_hello(
    shared_daemon: DaemonProcess, image_folder: Path, transform: dict[str, object], named: str
) -> None:
    transforms = (
        [transform]
        if transform["type"] != "RandomHorizontalFlip"
        else [{"type": "Resize", "size": [24, 24]}, transform]
    )
    with RawClient(shared_daemon.address) as client:
        reply = answer(client, wire.encode("hello", **hello_fields(image_folder, transforms=transforms)))
    assert reply is not None and reply[0] == "error", reply
    assert named in reply[1]["message"], reply
    # No session from it (an earlier test's may still be ending: its bye comes after its close()).
    assert wait_until(lambda: shared_daemon.sessions() == [], 30.0), shared_daemon.sessions()
