"""fastload: the fastest dependable way to feed PyTorch training.

Worker processes decode and augment samples straight into a shared-memory ring; the trainer
receives small descriptors over ZeroMQ and copies batches to the GPU asynchronously.

    from fastload import FastLoader, transforms as T
    loader = FastLoader("data/train", batch_size=256, shuffle=True, num_workers=8,
                        transform=[T.RandomResizedCrop(224), T.RandomHorizontalFlip()])
"""

from fastload import sources, transforms
from fastload._errors import (
    ConfigError,
    DaemonError,
    DatasetError,
    FastloadError,
    LoaderTimeout,
    SampleError,
    SharedMemoryError,
    WireError,
    WorkerError,
)
from fastload._loading.identity import SampleIds
from fastload._loading.loader import FastLoader

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
    "SharedMemoryError",
    "WireError",
    "WorkerError",
    "__version__",
    "sources",
    "transforms",
]
