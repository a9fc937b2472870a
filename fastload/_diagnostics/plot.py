"""`fastload iostat --plot`: draw a recorded iostat history as a PNG (matplotlib, optional).

The history is a list of per-interval records:
`{"time": s since start, "loaders": [{"name", "samples_per_s", "ms_per_sample": {stage: ms},
"trainer_wait_percent", "tuner": {"workers", ...} or None}], "cpu": {"user", "system", "iowait"}}`.
The figure has throughput per loader on top (with the workers a tuned loader's tuner ran, dotted),
one stacked per-stage ms-per-sample panel per loader in the middle, and CPU use at the bottom.
It is drawn on an Agg canvas without pyplot, so no global backend state is touched.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from fastload._errors import ConfigError

STAGES = ("read", "decode", "augment", "wait_slot", "h2d")  # drawn bottom-up; unknown stages follow, sorted
PARTS_OF_READ = ("read_cpu", "read_runq")  # inside "read": stacking them would count them twice
CPU_PARTS = ("user", "system", "iowait")
_PANEL_HEIGHT = 2.4  # inches
_WIDTH = 10.0


def plot_history(history: list[dict[str, Any]], path: str) -> None:
    """Write the history's figure to `path` as a PNG.

    Raises:
        ConfigError: matplotlib is not installed, the history is empty, or `path` cannot be written.
    """
    figure_cls, canvas_cls = _matplotlib()
    if not history:
        raise ConfigError("--plot has nothing to draw: no interval was recorded; let iostat run longer")
    names = loader_names(history)
    times = [float(record["time"]) for record in history]
    fig = figure_cls(figsize=(_WIDTH, _PANEL_HEIGHT * (len(names) + 2)), layout="constrained")
    canvas_cls(fig)
    axes = fig.subplots(len(names) + 2, 1, sharex=True, squeeze=False)[:, 0]
    _throughput_panel(axes[0], history, times, names)
    for ax, name in zip(axes[1:-1], names, strict=True):
        _stage_panel(ax, history, times, name)
    _cpu_panel(axes[-1], history, times)
    axes[-1].set_xlabel("time (s)")
    try:
        fig.savefig(path, format="png", dpi=100)
    except OSError as e:
        raise ConfigError(f"cannot write the plot to {path}: {e}; choose a writable --plot path") from e


def loader_names(history: list[dict[str, Any]]) -> list[str]:
    """Every loader's name, in order of first appearance."""
    names: dict[str, None] = {}
    for record in history:
        for loader in record.get("loaders", ()):
            names.setdefault(str(loader["name"]), None)
    return list(names)


def _matplotlib() -> tuple[Any, Any]:
    """matplotlib's Figure and Agg canvas classes, or a ConfigError saying how to install it."""
    try:
        importlib.import_module("matplotlib")
        figure = importlib.import_module("matplotlib.figure")
        agg = importlib.import_module("matplotlib.backends.backend_agg")
    except ImportError as e:
        raise ConfigError("--plot needs matplotlib: pip install matplotlib") from e
    return figure.Figure, agg.FigureCanvasAgg


def check_matplotlib() -> None:
    """ConfigError saying how to install matplotlib when it is missing (before a run is recorded)."""
    _matplotlib()


Getter = Callable[[dict[str, Any]], float]


def _loader(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    for loader in record.get("loaders", ()):
        if loader["name"] == name:
            return dict(loader)
    return None


def _series(history: list[dict[str, Any]], name: str, get: Getter) -> list[float]:
    """One figure of loader `name` per interval; NaN (a gap) where the loader is absent."""
    values = []
    for record in history:
        loader = _loader(record, name)
        values.append(math.nan if loader is None else float(get(loader)))
    return values


def _throughput_panel(ax: Any, history: list[dict[str, Any]], times: list[float], names: list[str]) -> None:
    for name in names:
        ax.plot(times, _series(history, name, lambda d: d["samples_per_s"]), label=name)
    ax.set_ylabel("samples/s")
    ax.set_title("throughput")
    ax.set_ylim(bottom=0)
    if names:
        ax.legend(loc="upper left", fontsize="small")
    tuned = tuned_loaders(history)
    if tuned:  # the workers each tuner ran, beside the throughput they bought
        ax.set_title("throughput; dotted: the workers the tuner ran")
        workers = ax.twinx()
        for name in tuned:
            workers.step(times, _series(history, name, _tuner_workers), where="post", linestyle=":")
        workers.set_ylabel("workers (tuned)")
        workers.set_ylim(bottom=0)


def tuned_loaders(history: list[dict[str, Any]]) -> list[str]:
    """The loaders a tuner ran at some point of the history, in order of first appearance."""
    return [
        name
        for name in loader_names(history)
        if any(not math.isnan(w) for w in _series(history, name, _tuner_workers))
    ]


def _tuner_workers(loader: dict[str, Any]) -> float:
    tuner = loader.get("tuner")
    return float(tuner["workers"]) if tuner else math.nan


def _stage_panel(ax: Any, history: list[dict[str, Any]], times: list[float], name: str) -> None:
    stages = stage_names(history, name)
    rows = [_series(history, name, _stage_getter(stage)) for stage in stages]  # NaN: a gap
    if rows:
        ax.stackplot(times, rows, labels=stages)
        ax.legend(loc="upper left", fontsize="small")
    ax.set_ylabel("ms / sample")
    ax.set_title(f"{name}: time per sample by stage; dashed: trainer waiting")
    ax.set_ylim(bottom=0)
    wait = ax.twinx()
    wait.plot(times, _series(history, name, _trainer_wait), color="black", linestyle="--", linewidth=1)
    wait.set_ylabel("trainer wait %")
    wait.set_ylim(0, 100)


def stage_names(history: list[dict[str, Any]], name: str) -> list[str]:
    """The stages recorded for loader `name`: the known ones in pipeline order, then the others."""
    seen: set[str] = set()
    for record in history:
        loader = _loader(record, name)
        if loader is not None:
            seen.update(loader.get("ms_per_sample", {}))
    return [s for s in STAGES if s in seen] + sorted(seen - set(STAGES) - set(PARTS_OF_READ))


def _stage_getter(stage: str) -> Getter:
    return lambda d: float(d.get("ms_per_sample", {}).get(stage, 0.0))


def _trainer_wait(loader: dict[str, Any]) -> float:
    return float(loader.get("trainer_wait_percent", math.nan))


def _cpu_panel(ax: Any, history: list[dict[str, Any]], times: list[float]) -> None:
    rows = [[float(record.get("cpu", {}).get(part, 0.0)) for record in history] for part in CPU_PARTS]
    ax.stackplot(times, rows, labels=CPU_PARTS)
    ax.set_ylabel("CPU %")
    ax.set_title("CPU (all cores)")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper left", fontsize="small")
