"""docker/: the compose files' commands are ones `fastload` accepts, the health check is the one
whose exit status means healthy, and Prometheus scrapes the address the daemon serves on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fastload.__main__ import _build_parser
from fastload._diagnostics.metrics import parse_address

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
