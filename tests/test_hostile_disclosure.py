"""What the daemon tells its peers and writes to its log (issue 29, item 9).

Attacks reproduced, over TCP with CURVE where the issue says a TCP client: a second client's
`status` listed every session (dataset, pid, peer; local trainers too); a hello naming
`/proc/self/cwd` or an in-root link to an outside directory made the daemon resolve it before
the allowlist, and `status` showed the resolved path (the daemon's working directory, the link's
target); a newline in a hello's dataset label forged a whole line of the text log; a 60 KB label
was repeated in every log line and in the metrics scrape.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from daemon_helpers import (
    REPLY_TIMEOUT_S,
    DaemonPool,
    DaemonProcess,
    RawClient,
    curve_client,
    hello_fields,
    hello_reply,
)
from helpers import build_folder, wait_until

from fastload._loading.link import daemon_link as wire

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} fastload [A-Z]+ ")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TcpDaemon:
    """A daemon on loopback TCP with CURVE, two allowed client keys, and `roots` for its datasets."""

    def __init__(self, pool: DaemonPool, tmp_path: Path, roots: Path, extra: tuple[str, ...] = ()) -> None:
        self.server_public, server_secret = zmq.curve_keypair()
        self.keys = [zmq.curve_keypair(), zmq.curve_keypair()]
        self.port = _free_port()
        table = {
            "curve_public_key": self.server_public.decode(), "curve_secret_key": server_secret.decode(),
            "curve_clients": [k[0].decode() for k in self.keys], "roots": [str(roots)],
        }
        config = tmp_path / "fastload.toml"
        config.write_text("[daemon]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
        self.daemon: DaemonProcess = pool.start(
            workers=1, extra=["--listen", f"tcp://127.0.0.1:{self.port}", "--config", str(config), *extra]
        )

    def client(self, which: int) -> RawClient:
        return curve_client(self.port, self.server_public, self.keys[which])


def _welcome(client: RawClient, fields: dict[str, Any]) -> dict[str, Any]:
    """Say hello and wait past the `indexing` notes for the welcome; the session stays open."""
    client.send(wire.encode("hello", **fields))
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while time.monotonic() < deadline:
        reply = client.reply(timeout_s=REPLY_TIMEOUT_S)
        assert reply is not None, "no answer to a hello"
        if reply[0] != "indexing":
            assert reply[0] == "welcome", reply
            return reply[1]
    raise AssertionError("no welcome")


def _status(client: RawClient) -> dict[str, Any]:
    reply = client.call(wire.encode("status"))
    assert reply is not None and reply[0] == "status_reply", reply
    return reply[1]


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    root = tmp_path / "roots"
    build_folder(root / "data", classes=2, per_class=4)
    return root


def test_a_tcp_peers_status_shows_only_its_own_sessions(
    daemon_pool: DaemonPool, tmp_path: Path, roots: Path
) -> None:
    tcp = TcpDaemon(daemon_pool, tmp_path, roots)
    with tcp.client(0) as first, tcp.client(1) as second, RawClient(tcp.daemon.address) as local:
        mine = _welcome(first, hello_fields(roots / "data", pid=4242))["session"]
        theirs = _welcome(local, hello_fields(roots / "data"))["session"]
        everyone = tcp.daemon.status()  # the local socket: every session, as iostat and `status` need
        assert {s["session"] for s in everyone["sessions"]} == {mine, theirs}
        assert everyone["datasets"][0]["path"] == str(roots / "data")

        seen = _status(second)  # another key: no session, pid, peer or dataset of anyone
        assert seen["sessions"] == [] and seen["datasets"] == [], seen
        text = json.dumps(seen)
        assert str(roots) not in text and str(os.getpid()) not in text and "4242" not in text

        own = _status(first)  # its own session only, not the local trainer's
        assert [s["session"] for s in own["sessions"]] == [mine], own
        assert str(os.getpid()) not in json.dumps(own)
        assert [d["path"] for d in own["datasets"]] == [str(roots / "data")]
        for client in (first, local):
            client.send(wire.encode("bye"))


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TcpDaemon, Path]]:
    """One TCP daemon (and its roots) for the probe tests, which only send it hellos and status."""
    base = tmp_path_factory.mktemp("probed")
    pool = DaemonPool(base)
    try:
        roots = base / "roots"
        build_folder(roots / "data", classes=2, per_class=4)
        yield TcpDaemon(pool, base, roots), roots
    finally:
        problems = pool.close()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _probe(tcp: TcpDaemon, dataset: str) -> list[Any]:
    """Every reply a TCP peer gets while a hello for `dataset` is answered: its own notes and
    answer, and what a second peer's `status` says meanwhile."""
    seen: list[Any] = []
    answer = None
    with tcp.client(0) as prober, tcp.client(1) as watcher:
        prober.send(wire.encode("hello", **hello_fields(Path("/"), dataset=dataset)))
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while answer is None:
            seen.append(_status(watcher))
            prober.send(wire.encode("status"))
            while (reply := prober.reply()) is not None:  # its status, after any note or answer
                seen.append(reply)
                if reply[0] not in ("indexing", "status_reply"):
                    answer = reply
                if reply[0] == "status_reply":
                    break
            assert time.monotonic() < deadline, "no answer to the probe"
    assert answer is not None and answer[0] == "error", answer
    return [*seen, answer]


def test_a_probe_of_the_daemons_working_directory_gets_no_resolved_path(
    probed: tuple[TcpDaemon, Path],
) -> None:
    tcp, _ = probed
    cwd = os.path.realpath(f"/proc/{tcp.daemon.pid}/cwd")
    for dataset in ("/proc/self/cwd", "/proc/self/cwd/."):
        text = json.dumps(_probe(tcp, dataset))
        assert cwd not in text, text
    assert "outside the daemon's dataset roots" in text


def test_an_in_root_link_to_an_outside_directory_gets_no_resolved_path(
    probed: tuple[TcpDaemon, Path], tmp_path: Path
) -> None:
    tcp, roots = probed
    secret = build_folder(tmp_path / "private-place", classes=2, per_class=2)
    (roots / "link").symlink_to(secret)
    replies = _probe(tcp, str(roots / "link"))
    text = json.dumps(replies)
    assert "private-place" not in text, text
    assert "outside the daemon's dataset roots" in replies[-1][1]["message"]
    # The operator's log says where it led (NOTE [refusals carry no content]: the log gets it).
    assert wait_until(lambda: "private-place" in tcp.daemon.log(), 10.0), tcp.daemon.log()


def test_a_newline_in_a_dataset_label_cannot_forge_a_log_line(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    forged = "2030-01-01 00:00:00,000 fastload INFO session 99: FORGED"
    named = tmp_path / f"data\n{forged}\n"  # a real folder: the session is admitted and logged
    named.mkdir()
    for child in image_folder.iterdir():
        (named / child.name).symlink_to(child)
    daemon = daemon_pool.start(workers=1)
    with RawClient(daemon.address) as trainer:
        _welcome(trainer, hello_fields(named))
        trainer.send(wire.encode("bye"))
        with RawClient(daemon.address) as other:  # and a refusal that names it
            other.send(wire.encode("hello", **hello_fields(named / f"missing\n{forged}")))
            while (reply := other.reply()) is not None and reply[0] == "indexing":
                pass
            assert reply is not None and reply[0] == "error"
    assert wait_until(lambda: daemon.log().count("FORGED") >= 2, 10.0), daemon.log()
    lines = daemon.log().splitlines()
    assert not [line for line in lines if "FORGED" in line and not line.startswith(" ") and
                not TIMESTAMPED.match(line)], daemon.log()
    assert not [line for line in lines if line.startswith(forged[:20])], daemon.log()
    assert any("\\n2030-01-01" in line for line in lines), daemon.log()


def test_a_long_label_is_bounded_in_the_log_and_the_scrape(
    daemon_pool: DaemonPool, image_folder: Path
) -> None:
    """A 60 KB label is refused at hello (a field's text is bounded: NOTE [fields from a peer]);
    one just under that bound is welcomed, and clipped in every log line and scrape."""
    daemon = daemon_pool.start(workers=1, extra=["--metrics", "0"])
    source = json.dumps({"kind": "folder", "root": str(image_folder)})
    with RawClient(daemon.address) as trainer:
        huge = hello_fields(image_folder, dataset="/" + "x" * 60_000, source=source)
        op, fields = hello_reply(trainer, huge)
        assert op == "error" and "over the limit" in fields["message"], (op, fields)
    label = "/" + "x" * 4_000 + "-end"
    with RawClient(daemon.address) as trainer:
        session = _welcome(trainer, hello_fields(image_folder, dataset=label, source=source))["session"]
        url = daemon.status()["metrics"]
        with urllib.request.urlopen(url, timeout=30) as reply:
            scrape = reply.read().decode()
        trainer.send(wire.encode("bye"))
    info = [line for line in scrape.splitlines() if line.startswith("fastload_session_info")]
    assert len(info) == 1 and f'session="{session}"' in info[0], info
    assert len(info[0]) < 600 and "xxxx" in info[0], info[0][:300]
    assert wait_until(lambda: f"session {session} ended" in daemon.log(), 10.0), daemon.log()
    log = daemon.log()
    assert len(log) < 8_000, f"the log holds {len(log)} characters"
    assert max(len(line) for line in log.splitlines()) < 600


def test_labels_are_one_bounded_line_and_distinct_labels_stay_distinct() -> None:
    from fastload._labels import label

    assert label("/data/train") == "/data/train" and label("/données/列") == "/données/列"
    assert label("a\nb\r\x1b[2J\u2028\u202e") == "a\\nb\\r\\x1b[2J\\u2028\\u202e"
    assert label("a\\nb") != label("a\nb")  # a backslash is escaped too
    long_a, long_b = "/" + "x" * 60_000 + "a", "/" + "x" * 60_000 + "b"
    assert len(label(long_a)) <= 200 and label(long_a) != label(long_b)
    assert label(long_a).startswith("/xxx") and "60002 chars" in label(long_a)
