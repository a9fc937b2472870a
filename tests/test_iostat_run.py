"""`fastload iostat`'s command loop: --plot without matplotlib is refused before anything is
recorded (the run was lost after it), and --json rows carry wall-clock time."""

from __future__ import annotations

import io
import json
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
