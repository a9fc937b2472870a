"""The metric families of one scrape, and the one import of prometheus-client.

`prometheus()` imports the optional package (`pip install fastload[metrics]`), or says how to
get it; `Families` gathers a scrape's series, family by family, as the collectors add them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fastload._errors import ConfigError

if TYPE_CHECKING:
    from prometheus_client.core import Metric


def prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core  # the metric families a collector yields
    except ImportError:
        raise ConfigError(
            "metrics need prometheus-client: pip install fastload[metrics] (or prometheus-client)"
        ) from None
    return prometheus_client


class Families:
    """The metric families of one scrape, filled series by series."""

    def __init__(self) -> None:
        self.core = prometheus().core
        self._families: dict[str, Any] = {}

    def _family(self, kind: str, name: str, doc: str, labels: tuple[str, ...], unit: str = "") -> Any:
        if name not in self._families:
            cls = {"counter": self.core.CounterMetricFamily, "gauge": self.core.GaugeMetricFamily}[kind]
            self._families[name] = cls(name, doc, labels=list(labels), unit=unit)
        return self._families[name]

    def counter(self, name: str, doc: str, labels: Mapping[str, str], value: float) -> None:
        self._family("counter", name, doc, tuple(labels)).add_metric(list(labels.values()), value)

    def gauge(self, name: str, doc: str, labels: Mapping[str, str], value: float) -> None:
        self._family("gauge", name, doc, tuple(labels)).add_metric(list(labels.values()), value)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())
