"""`fastload iostat`'s command loop: --plot without matplotlib is refused before anything is
recorded (the run was lost after it), --json rows carry wall-clock time, and SIGTERM or SIGHUP
ends a recording as Ctrl-C does."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastload import ConfigError
from fastload._diagnostics.iostat import run


def test_plot_without_matplotlib_is_refused_before_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    out = io.StringIO()
    started = time.monotonic()
    with pytest.raises(ConfigError, match="pip install matplotlib"):
        run(None, None, False, False, str(tmp_path / "run.png"), out=out)
    assert out.getvalue() == "" and time.monotonic() - started < 0.9


def test_json_rows_carry_wall_clock_time() -> None:
    out = io.StringIO()
    before = time.time()
    assert run(None, None, False, True, None, out=out) == 0
    (row,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert before <= row["wall_time"] <= time.time() + 0.01
    assert row["time"] > 0 and "loaders" in row


def test_the_plot_names_loaders_by_pid_and_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image_folder: Path
) -> None:
    """A running loader appears in the plot's history as "pid N folder", not by its segment name."""
    import os

    from fastload import FastLoader
    from fastload import transforms as T
    from fastload._diagnostics import plot

    drawn: list[list[dict[str, object]]] = []
    monkeypatch.setattr(plot, "plot_history", lambda history, path: drawn.append(history))
    kw: dict[str, object] = {"batch_size": 4, "num_workers": 1, "device": "cpu"}
    kw["transform"] = [T.CenterCrop(8)]
    with FastLoader(image_folder, **kw) as loader:  # type: ignore[arg-type]
        next(iter(loader))
        run(None, None, False, False, str(tmp_path / "run.png"), out=io.StringIO())
    (history,) = drawn
    names = {str(entry["name"]) for record in history for entry in record["loaders"]}  # type: ignore[attr-defined]
    assert f"pid {os.getpid()} {image_folder.name}" in names, names


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_termination_signal_ends_the_recording_and_draws_it(tmp_path: Path, signum: int) -> None:
    """`timeout`, `kill`, `docker stop` or a scheduler end iostat with SIGTERM (a closed terminal
    with SIGHUP): the recording ends as with Ctrl-C and the plot is written (it was lost)."""
    pytest.importorskip("matplotlib")
    png = tmp_path / "run.png"
    command = [sys.executable, "-m", "fastload", "iostat", "0.2", "--plot", str(png)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # blocks until the first report: an interval recorded
            assert first, proc.stderr.read() if proc.stderr else ""
            proc.send_signal(signum)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", err
