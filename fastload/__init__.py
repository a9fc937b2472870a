"""fastload: the fastest dependable way to feed PyTorch training.

Worker processes decode and augment samples straight into a shared-memory ring; the trainer
receives small descriptors over ZeroMQ and copies batches to the GPU asynchronously.

    from fastload import FastLoader, transforms as T
    loader = FastLoader("data/train", batch_size=256, shuffle=True, num_workers=8,
                        transform=[T.RandomResizedCrop(224), T.RandomHorizontalFlip()])

NOTE [lazy package]: the loader, the sources and the transforms (and with them torch) are imported
on first use of their names, so that `fastload status` (a container's health check, every few
seconds) does not pay torch's import: 2 s of CPU before, on a 2-vCPU VM (docs/BENCHMARKS.md).
"""

import importlib as _importlib
import typing as _typing

from fastload._errors import (
    ConfigError,
    DaemonError,
    DatasetError,
    FastloadError,
    LoaderTimeout,
    SampleError,
    SettingsWarning,
    SharedMemoryError,
    SourceChanged,
    TargetsUnavailable,
    WireError,
    WorkerError,
)
from fastload._metrics_seam import plug_exporter as _plug_exporter


def _export_loader(loader: object, address: tuple[str, int], rank: int) -> object:
    """The loaders' Prometheus exporter, imported only when a loader asks for metrics (NOTE [the
    exporter seam] in `_metrics_seam`): `import fastload` imports no diagnostics."""
    from fastload._diagnostics.metrics import export_loader

    return export_loader(loader, address, rank)


_plug_exporter(_export_loader)

if _typing.TYPE_CHECKING:
    from fastload import samplers, sources, transforms
    from fastload._diagnostics.scalars import ScalarLogger
    from fastload._loading.loader import FastLoader
    from fastload._loading.slots.identity import SampleIds

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DaemonError",
    "DatasetError",
    "FastLoader",
    "FastloadError",
    "LoaderTimeout",
    "SampleError",
    "SampleIds",
    "ScalarLogger",
    "SettingsWarning",
    "SharedMemoryError",
    "SourceChanged",
    "TargetsUnavailable",
    "WireError",
    "WorkerError",
    "__version__",
    "samplers",
    "sources",
    "transforms",
]

# Name -> (module, attribute; "" for the module itself), imported on first access.
_LAZY = {
    "FastLoader": ("fastload._loading.loader", "FastLoader"),
    "SampleIds": ("fastload._loading.slots.identity", "SampleIds"),
    "ScalarLogger": ("fastload._diagnostics.scalars", "ScalarLogger"),
    "samplers": ("fastload.samplers", ""),
    "sources": ("fastload.sources", ""),
    "transforms": ("fastload.transforms", ""),
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'fastload' has no attribute {name!r}")
    module_name, attribute = _LAZY[name]
    module = _importlib.import_module(module_name)
    value = getattr(module, attribute) if attribute else module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | {n for n in globals() if n.startswith("_")})
