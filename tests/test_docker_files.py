"""docker/: the compose files' commands are ones `fastload` accepts, the health check is the one
whose exit status means healthy, Prometheus scrapes the address the daemon serves on, and each
image installs the extras its commands and the daemon need (Docker is not here: the Dockerfiles
are parsed and their install line resolved in a throwaway venv)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from fastload.__main__ import _build_parser
from fastload._metrics_seam import parse_address

yaml = pytest.importorskip("yaml")
DOCKER = Path(__file__).resolve().parent.parent / "docker"


def _load(name: str) -> Any:
    class Loader(yaml.SafeLoader):
        pass

    # compose's `!reset` (drop what a file before set): null here
    Loader.add_constructor("!reset", lambda loader, node: None)
    return yaml.load((DOCKER / name).read_text(), Loader=Loader)  # a SafeLoader


def test_the_health_check_is_fastload_status() -> None:
    check = _load("compose.yaml")["services"]["daemon"]["healthcheck"]["test"]
    assert check[:3] == ["CMD", "fastload", "status"]
    args = _build_parser().parse_args(check[2:])
    assert args.command == "status" and args.json


def test_prometheus_scrapes_where_the_metrics_daemon_serves() -> None:
    metrics = _load("compose.metrics.yaml")
    command = metrics["services"]["daemon"]["command"]
    args = _build_parser().parse_args(command[1:])
    host, port = parse_address(args.metrics)
    assert host == "0.0.0.0" and args.log_format == "json"
    scrape = _load("prometheus.yml")["scrape_configs"][0]["static_configs"][0]["targets"]
    assert scrape == [f"daemon:{port}"]
    assert metrics["services"]["daemon"]["networks"] == ["metrics"]
    assert metrics["networks"]["metrics"]["internal"] is True
    base = _load("compose.yaml")["services"]["daemon"]["command"]
    assert [c for c in command if not c.startswith(("--metrics", "--log-format"))] == base


# What the images install, and what what they run needs (issue 28): compose.metrics.yaml's
# `--metrics` exited for want of prometheus-client, and no image could read s3://.

_EXTRA = re.compile(r"fastload\[(\w+)\]")
_INSTALL = re.compile(r'pip install "\.\[([\w,-]+)\]"')
ROOT = DOCKER.parent


def _pyproject_extras() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        extras: dict[str, list[str]] = tomllib.load(f)["project"]["optional-dependencies"]
    return extras


def _image_extras(dockerfile: str) -> set[str]:
    """The extras the Dockerfile's `pip install ".[...]"` line installs fastload with."""
    (line,) = _INSTALL.findall((DOCKER / dockerfile).read_text())
    return set(line.split(","))


def _needed_by_flags(command: list[str]) -> set[str]:
    """The extras the options of a `fastload ...` command need, as the CLI's own help for each
    option says ("needs fastload[metrics]"): derived, not a second list to keep."""
    parser = _build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen = sub.choices[command[1]]
    given = {arg.split("=", 1)[0] for arg in command[2:] if arg.startswith("--")}
    needed: set[str] = set()
    for action in chosen._actions:
        if given & set(action.option_strings):
            needed |= set(_EXTRA.findall(action.help or ""))
    return needed


def _needed_to_serve() -> set[str]:
    """The extras `fastload serve` needs for what it serves: every source kind a daemon serves
    (each source's module names the extra it needs to open, "pip install fastload[hdf5]"), at a
    URL too (the storage layer's module names its extra)."""
    from fastload.sources import DAEMON_SOURCE_KINDS, _base
    from fastload.sources._storage import remote as _remote

    modules = {sys.modules[_base._REGISTRY[kind].__module__] for kind in DAEMON_SOURCE_KINDS} | {_remote}
    return {extra for m in modules for extra in _EXTRA.findall(Path(str(m.__file__)).read_text())}


def _compose_commands() -> list[list[str]]:
    commands = []
    for name in ("compose.yaml", "compose.metrics.yaml"):
        for service in _load(name)["services"].values():
            command = service.get("command") or []
            if command[:1] == ["fastload"]:
                commands.append(command)
    return commands


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cuda"])
def test_each_image_has_the_extras_its_commands_and_the_daemon_need(dockerfile: str) -> None:
    """Either image runs the daemon (compose.yaml builds docker/Dockerfile and names
    Dockerfile.cuda for trainers; a daemon may run in either): each must install every extra
    that a compose command's options need and that the daemon needs to open what it serves."""
    installed = _image_extras(dockerfile)
    assert installed <= set(_pyproject_extras()), f"{dockerfile} names an extra pyproject.toml lacks"
    needed = set().union(*(_needed_by_flags(c) for c in _compose_commands())) | _needed_to_serve()
    assert {"metrics", "remote"} <= needed  # the derivation finds what the issue names
    assert needed <= installed, f"{dockerfile} lacks {sorted(needed - installed)}"


def test_the_install_line_resolves_in_a_fresh_venv(tmp_path: Path) -> None:
    """docker/Dockerfile's `pip install ".[...]"` run in a throwaway venv with `--dry-run`: pip
    builds fastload's metadata from a copy of what the Dockerfile copies and resolves every
    requirement of the extras against the package index (metadata only: downloading and
    installing torch, s3fs, h5py... would take minutes for what resolution already shows); each
    extra's requirements must be in the resolution. Without Docker this is the nearest to a
    build; skipped, with the reason, where no package index answers."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--dry-run"]
    pip += ["--quiet", "--timeout", "20", "--retries", "1"]
    probe = subprocess.run([*pip, "--no-deps", "setuptools"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"no package index answers here: {probe.stderr.strip()[-300:]}")
    src = tmp_path / "src"  # what the Dockerfile copies: pyproject.toml setup.py README.md native/ fastload/
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignored = shutil.ignore_patterns("*.so", "__pycache__", "*.pyc")
    for name in ("native", "fastload"):
        shutil.copytree(ROOT / name, src / name, ignore=ignored)
    extras = _image_extras("Dockerfile")
    report = tmp_path / "report.json"
    done = subprocess.run(
        [*pip, "--report", str(report), f"{src}[{','.join(sorted(extras))}]"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = {_name(i["metadata"]["name"]) for i in json.loads(report.read_text())["install"]}
    for extra in extras:
        wanted = {_name(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in _pyproject_extras()[extra]}
        assert wanted <= resolved, f"extra {extra}: {sorted(wanted - resolved)} not resolved"


def _name(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()
