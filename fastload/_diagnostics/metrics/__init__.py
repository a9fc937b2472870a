"""Prometheus metrics: a daemon's sessions and a local loader's stages, read from the stats blocks.

Served by prometheus-client's own HTTP server (its thread, `pip install fastload[metrics]`) through
a custom collector that reads, at each scrape, only what the loop that produces batches has
already published; a scrape takes no lock of the loop's and never waits for it.

The room, one job a module:
    families.py       prometheus-client's import, and a scrape's families (`Families`)
    loader_series.py  a loader's series (its counters from `_batch_counters`), VERDICTS, STAGES
    daemon_series.py  a daemon's series: totals, health, each session's
    windows.py        each loader's rates and verdict over at least a second (`RateWindows`)
    collectors.py     what a scrape calls: `DaemonCollector`, `LoaderCollector`
    servers.py        the HTTP servers; `export_loader` (the loader's seam, `_metrics_seam`)

It may import the foundations, the loader's statistics blocks (`_loading.running.stats`), the
tuner's reasons (`_loading.tuning.decisions`) and iostat's rates and verdict
(`_diagnostics.loader_rates`, `_diagnostics.verdict`); nothing imports it but the daemon's server,
the package's composition root and `_diagnostics.scalars`.
"""

from fastload._diagnostics.metrics.collectors import DaemonCollector, LoaderCollector
from fastload._diagnostics.metrics.loader_series import STAGES, VERDICTS
from fastload._diagnostics.metrics.servers import MetricsServer, export_loader, servers

__all__ = [
    "STAGES",
    "VERDICTS",
    "DaemonCollector",
    "LoaderCollector",
    "MetricsServer",
    "export_loader",
    "servers",
]
