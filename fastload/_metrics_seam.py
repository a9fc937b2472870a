"""Where a loader's Prometheus metrics go: the `metrics=` setting, and the seam to the exporter.

`metrics_setting` checks `FastLoader(metrics=...)` (or a launcher's FASTLOAD_METRICS) into a
(host, port); `parse_address` is the one reading of PORT / HOST:PORT, the daemon's `--metrics`
included.

NOTE [the exporter seam]: serving a loader's counters is the exporters' room
(`_diagnostics.metrics`), which sits above the loader (docs/ARCHITECTURE.md, "Layers"): the
loader may not import it, not even lazily. The loader calls `export_loader` here instead, and the
package's `__init__` (the composition root, executed before any of fastload's modules) plugs the
exporter in with `plug_exporter`, as a function that imports `_diagnostics.metrics` only when a
loader asks for metrics: `import fastload` still imports no diagnostics.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from typing import Any

from fastload._errors import ConfigError

ENV = "FASTLOAD_METRICS"  # a launcher's way to turn metrics on: PORT or HOST:PORT, + LOCAL_RANK
LOOPBACK = "127.0.0.1"

# (loader, (host, port), rank) -> a handle with close(), or None
Exporter = Callable[[Any, tuple[str, int], int], Any]
_exporter: list[Exporter] = []  # NOTE [the exporter seam]: the one the package plugged in


def parse_address(value: str | int) -> tuple[str, int]:
    """`9400` or "9400" -> (127.0.0.1, 9400): loopback unless a host is named ("0.0.0.0:9400",
    "[::]:9400", "node7:9400"); ConfigError for anything else."""
    text = str(value).strip()
    host, sep, port_text = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if not sep:
        host = LOOPBACK
    elif bracketed:
        host = host[1:-1]
    valid_host = bool(host) and (_ipv6(host) if bracketed else ":" not in host and "/" not in host)
    if not (port_text.isdigit() and int(port_text) <= 65535 and valid_host):
        raise ConfigError(
            f"metrics address {value!r} is not PORT or HOST:PORT (e.g. 9400, 127.0.0.1:9400, 0.0.0.0:9400, "
            "[::1]:9400); a port is 0..65535"
        )
    return host, int(port_text)


def _ipv6(host: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address)
    except ValueError:
        return False


def metrics_setting(metrics: str | int | None) -> tuple[str, int] | None:
    """FastLoader's `metrics=` checked, or else the launcher's FASTLOAD_METRICS (its port plus
    LOCAL_RANK, so that each rank of a machine serves its own)."""
    if metrics is not None:
        return parse_address(metrics)
    value = os.environ.get(ENV, "").strip()
    if not value:
        return None
    host, port = parse_address(value)
    local_rank = os.environ.get("LOCAL_RANK", "0")
    if port and local_rank.isdigit():
        port += int(local_rank)
    return host, port


def plug_exporter(exporter: Exporter) -> None:
    """Make `exporter` the one that serves loaders' metrics (the package's `__init__` does)."""
    _exporter[:] = [exporter]


def export_loader(loader: Any, address: tuple[str, int] | None, rank: int) -> Any:
    """Serve `loader`'s metrics on `address` through the plugged exporter; None when not asked for."""
    if address is None:
        return None
    if not _exporter:
        raise ConfigError("no metrics exporter is plugged in: import fastload (its __init__ plugs it in)")
    return _exporter[0](loader, address, rank)
