"""Progress for people (issue 28): redrawn in place with `\\r` on a terminal only; in a file, a CI
log or a pipe, plain lines at a modest rate and the final one, never one endless line
(NOTE [progress lines])."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from fastload import _progress
from fastload._progress import ProgressLine


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(_progress.time, "monotonic", fake)
    return fake


def test_in_a_log_progress_is_plain_lines_at_a_modest_rate(clock: _Clock) -> None:
    out = io.StringIO()
    line = ProgressLine(out)
    for i in range(1, 101):  # 10 s of updates, ten a second
        clock.now += 0.1
        line.update(f"{i} done")
    line.done("100 done, finished")
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 2 <= len(lines) <= 3 and lines[-1] == "100 done, finished", lines  # every 5 s, then the last


def test_on_a_terminal_progress_is_one_line_redrawn(clock: _Clock) -> None:
    out = _Terminal()
    line = ProgressLine(out)
    for text in ("a long first line", "short"):
        clock.now += 1.0
        line.update(text)
    line.done("end")
    assert out.getvalue() == "\ra long first line\rshort            \rend  \n"


def _stderr_of(command: list[str], tmp_path: Path) -> str:
    """The command's stderr written to a file, as a log or `tools/test.sh > log` gets it."""
    log = tmp_path / "stderr.log"
    with log.open("w") as err:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=err, timeout=300)
    text = log.read_bytes().decode()  # not read_text(): it would turn each \r into a newline
    assert done.returncode == 0, text
    return text


def test_pack_and_verify_write_plain_lines_to_a_log(image_folder: Path, tmp_path: Path) -> None:
    fastload = [sys.executable, "-m", "fastload"]
    packed = _stderr_of([*fastload, "pack", str(image_folder), str(tmp_path / "pack")], tmp_path)
    assert "\r" not in packed and packed.splitlines()[-1].startswith("fastload pack: "), packed
    verified = _stderr_of([*fastload, "verify", str(tmp_path / "pack"), "--workers", "1"], tmp_path)
    assert "\r" not in verified and "verified " in verified, verified
