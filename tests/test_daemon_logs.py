"""`fastload serve --log-format json`: one JSON object a line, and one structured line per session
start and end, worker replacement and refusal, which a log pipeline filters by `event`."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from daemon_helpers import RESIZE, DaemonPool, RawClient, hello_fields, hello_reply
from helpers import wait_until

from fastload import FastLoader


def events(log: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines), lines
    return [line for line in lines if "event" in line]


def test_json_log_has_one_line_per_session_start_end_replacement_and_refusal(
    daemon_pool: DaemonPool, image_folder: Path
) -> None:
    daemon = daemon_pool.start(workers=2, extra=["--log-format", "json", "--hang-timeout", "0"])
    with FastLoader(
        image_folder, batch_size=4, transform=RESIZE, device="cpu", num_workers=1, daemon=daemon.address
    ) as loader:
        assert sum(len(labels) for _, labels in loader) == 24
        session = daemon.sessions()[0]["session"]
    with RawClient(daemon.address) as client:  # a batch larger than the whole budget: refused
        op, reply = hello_reply(client, hello_fields(image_folder, batch_size=4096,
                                                     transforms=[{"type": "Resize", "size": [224, 224]}]))
    assert op == "error"
    victim = daemon.worker_pids[0]
    daemon.signal_workers(signal.SIGKILL)
    assert wait_until(lambda: len([e for e in events(daemon.log()) if e["event"] == "worker_replaced"]) == 2,
                      30.0), daemon.log()
    daemon.worker_pids = []  # replaced: the new ones are the daemon's to stop
    log = events(daemon.log())
    by_name: dict[str, list[dict[str, Any]]] = {}
    for line in log:
        by_name.setdefault(line["event"], []).append(line)
    (start,) = by_name["session_start"]
    assert start["session"] == session and start["dataset"] == str(image_folder) and start["rank"] == 0
    (end,) = by_name["session_end"]
    # 24 delivered, and the next epoch's first batches decoded ahead (NOTE [no drain]).
    assert end["session"] == session and end["images"] >= 24 and end["reason"] == "bye"
    (refusal,) = by_name["refusal"]
    assert refusal["request"] == "hello" and refusal["reason"] == reply["message"]
    replaced = by_name["worker_replaced"]
    assert {r["cause"] for r in replaced} == {"external"} and victim in {r["pid"] for r in replaced}
    assert by_name["serving"][0]["workers"] == 2
