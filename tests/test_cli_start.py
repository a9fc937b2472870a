"""The command line's health-check commands start fast: `fastload status`, `stop` and `iostat`
import neither torch nor the loader (NOTE [lazy package]), so a container's health check every
few seconds costs a fraction of a second of CPU, not the 2 s of torch's import.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import DaemonPool


def _imported(args: list[str], tmp_path: Path) -> set[str]:
    """The modules `python -m fastload ARGS` imports (no daemon runs on `tmp_path`)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "fastload", *args],
        capture_output=True, text=True, timeout=120, env={"XDG_RUNTIME_DIR": str(tmp_path), "PATH": ""},
    )
    return {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}


@pytest.mark.parametrize(
    "args",
    [["status"], ["status", "--json"], ["stop"], ["iostat", "0.01", "1"]],
    ids=["status", "status-json", "stop", "iostat"],
)
def test_health_commands_do_not_import_torch(args: list[str], tmp_path: Path) -> None:
    modules = _imported(args, tmp_path)
    assert "fastload._daemon.control" in modules or "fastload._diagnostics.iostat" in modules, modules
    heavy = {m for m in modules if m.split(".")[0] == "torch" or m == "fastload._loading.loader"}
    assert not heavy, sorted(heavy)[:10]


def test_the_package_still_offers_everything_on_first_use() -> None:
    code = (
        "import sys, fastload; assert 'torch' not in sys.modules; "
        "from fastload import FastLoader, transforms; assert 'torch' in sys.modules; "
        "print(FastLoader.__name__, transforms.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["FastLoader", "fastload.transforms"]


def _status_json(args: list[str]) -> tuple[int, dict[str, object]]:
    result = subprocess.run(
        [sys.executable, "-m", "fastload", "status", "--json", *args],
        capture_output=True, text=True, timeout=120,
    )
    return result.returncode, json.loads(result.stdout)


def test_status_json_is_a_health_check(daemon_pool: DaemonPool, tmp_path: Path) -> None:
    code, body = _status_json(["--address", f"ipc://{tmp_path / 'none' / 'daemon.sock'}"])
    assert code == 1 and body["healthy"] is False and "no fastload daemon" in str(body["reason"])
    daemon = daemon_pool.start(workers=1)
    code, body = _status_json(["--address", daemon.address])
    assert code == 0 and body["healthy"] is True, body
    assert body["pid"] == daemon.pid and body["workers"] == 1 and body["sessions"] == []
    daemon.proc.send_signal(signal.SIGSTOP)  # a daemon that does not answer is unhealthy, promptly
    try:
        started = time.monotonic()
        code, body = _status_json(["--address", daemon.address])
        assert code == 1 and "answers" in str(body["reason"]) and time.monotonic() - started < 30
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
