"""The HTTP servers: prometheus-client's own (its thread), one per address a process asked for.

A daemon serves its `DaemonCollector` on its `--metrics` address; the loaders of one process that
ask for the same address share one server (`export_loader`), which stops with the last of them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from fastload._diagnostics.metrics.collectors import ExportedLoader, LoaderCollector
from fastload._diagnostics.metrics.families import prometheus
from fastload._errors import ConfigError


class MetricsServer:
    """prometheus-client's HTTP server on (host, port), serving one collector."""

    def __init__(self, host: str, port: int, collector: Any) -> None:
        client = prometheus()
        registry = client.CollectorRegistry(auto_describe=False)
        registry.register(collector)
        try:
            self._server, self._thread = client.start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise ConfigError(f"cannot serve metrics on {_join(host, port)}: {e.strerror or e}") from None
        self.host, self.port = host, int(self._server.server_port)
        self.collector = collector

    @property
    def url(self) -> str:
        return f"http://{_join(self.host, self.port)}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_servers: dict[tuple[str, int], MetricsServer] = {}  # this process's loader exporters, by address asked
_servers_lock = threading.Lock()


@dataclass
class LoaderExport:
    """A loader's registration with its process's exporter; `close` when the loader closes."""

    key: tuple[str, int]
    entry: ExportedLoader
    server: MetricsServer
    closed: bool = False

    @property
    def url(self) -> str:
        return self.server.url

    def close(self) -> None:
        """Forget the loader; the server stops with the last loader exporting on it."""
        with _servers_lock:
            if self.closed:
                return
            self.closed = True
            if self.server.collector.remove(self.entry):
                _servers.pop(self.key, None)
                self.server.close()


def export_loader(loader: Any, address: tuple[str, int] | None, rank: int) -> LoaderExport | None:
    """Serve `loader`'s metrics on `address` (None: not at all), sharing the server of any other
    loader of this process that asked for the same address."""
    if address is None:
        return None
    with _servers_lock:
        server = _servers.get(address) if address[1] else None
        if server is None:
            server = MetricsServer(address[0], address[1], LoaderCollector())
            _servers[address if address[1] else (address[0], server.port)] = server
        key = next(k for k, s in _servers.items() if s is server)
        return LoaderExport(key, server.collector.add(loader, rank), server)


def servers() -> list[str]:
    """The URLs this process's loaders serve metrics on."""
    with _servers_lock:
        return [s.url for s in _servers.values()]
