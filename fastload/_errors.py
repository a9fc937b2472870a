"""The exception tree: every error fastload raises on purpose is one of these.

```
FastloadError
├── ConfigError (also ValueError)        bad arguments, unsupported transform chains
├── DatasetError                         the dataset cannot be indexed (bad path, no images)
├── SampleError                          loading one sample failed in a worker (names the file,
│                                        carries the worker's traceback)
├── WorkerError                          a worker process died and could not be replaced
├── SharedMemoryError                    /dev/shm too small or a segment cannot be created
├── DaemonError                          no daemon answers, it refused a session, or it went away
└── LoaderTimeout (also TimeoutError)    no batch arrived within the loader's `timeout`
```
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DaemonError",
    "DatasetError",
    "FastloadError",
    "LoaderTimeout",
    "SampleError",
    "SharedMemoryError",
    "WorkerError",
]


class FastloadError(Exception):
    """Base class of every error fastload raises on purpose."""


class ConfigError(FastloadError, ValueError):
    """An argument or a transform chain that fastload cannot run; the message says what to change."""


class DatasetError(FastloadError):
    """The dataset could not be indexed: a missing folder, no images, an unreadable tree."""


class SampleError(FastloadError):
    """Loading one sample failed inside a worker process.

    Attributes:
        path: the file being loaded when the error happened ("" when the sample is not a file).
        index: the sample's index in the dataset (-1 when unknown).
        exc_type: the name of the exception class raised in the worker.
        worker_traceback: the worker's formatted traceback.
    """

    def __init__(self, message: str, *, path: str, index: int, exc_type: str, worker_traceback: str) -> None:
        super().__init__(message)
        self.path = path
        self.index = index
        self.exc_type = exc_type
        self.worker_traceback = worker_traceback

    def __str__(self) -> str:
        return f"{self.args[0]}\n\nOriginal traceback in the worker process:\n{self.worker_traceback}"


class WorkerError(FastloadError):
    """A worker process died and the loader could not carry on (replacements kept dying)."""


class SharedMemoryError(FastloadError):
    """Shared memory for the batch ring could not be had: /dev/shm is too small or not writable."""


class DaemonError(FastloadError):
    """The loader daemon is not running, refused the session (e.g. over its memory budget), or
    went away; the message says which, and what to do."""


class LoaderTimeout(FastloadError, TimeoutError):
    """No batch arrived within the loader's `timeout` while its workers were alive."""
