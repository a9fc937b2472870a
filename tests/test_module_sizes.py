"""Files that hold one job (issue 30): no module of the package over 450 lines, and FastLoader's
module a facade of at most 300. A module that grows past its bound is split by job (see
docs/ARCHITECTURE.md, "Rooms"), not allowed a larger bound here."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fastload"
MOST_LINES = 450
FACADE = PACKAGE / "_loading" / "loader.py"
FACADE_MOST_LINES = 300


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_holds_more_than_450_lines() -> None:
    sizes = {str(p.relative_to(PACKAGE.parent)): _lines(p) for p in PACKAGE.rglob("*.py")}
    long = {name: n for name, n in sizes.items() if n > MOST_LINES}
    assert not long, f"modules over {MOST_LINES} lines (split them by job): {long}"


def test_fastloaders_module_is_a_facade() -> None:
    assert _lines(FACADE) <= FACADE_MOST_LINES, "FastLoader's module is a facade over assembly and resume"
