"""The exception tree: every error fastload raises on purpose is one of these.

```
FastloadError
├── ConfigError (also ValueError)        bad arguments, unsupported transform chains
├── DatasetError                         the dataset cannot be indexed (bad path, no images)
│   └── SourceChanged                    a file or object changed since it was indexed (re-open)
├── SampleError                          loading one sample failed in a worker (names the file,
│   │                                    carries the worker's traceback)
│   └── SampleError[KeyError], ...       the same, also of the sample's own exception class
├── WorkerError                          a worker process died and could not be replaced
├── SharedMemoryError                    /dev/shm too small or a segment cannot be created
├── DaemonError                          no daemon answers, it refused a session, or it went away
├── WireError                            a message on the trainer<->daemon link breaks the protocol
└── LoaderTimeout                        no batch arrived within the loader's `timeout`
    (also TimeoutError and RuntimeError)
```

A sample's exception keeps its type, as with DataLoader: a KeyError raised by a Dataset's
`__getitem__` in a worker is caught by `except KeyError` in the trainer, and by `except
SampleError` (see NOTE [original exception types]).
"""

from __future__ import annotations

import sys
import types
from typing import Any, ClassVar, cast

__all__ = [
    "ConfigError",
    "DaemonError",
    "DatasetError",
    "FastloadError",
    "LoaderTimeout",
    "SampleError",
    "SharedMemoryError",
    "SourceChanged",
    "TargetsUnavailable",
    "WireError",
    "WorkerError",
]


class FastloadError(Exception):
    """Base class of every error fastload raises on purpose."""


class ConfigError(FastloadError, ValueError):
    """An argument or a transform chain that fastload cannot run; the message says what to change."""


class TargetsUnavailable(ConfigError, AttributeError):
    """`FastLoader.targets` where the loader has none to give (a daemon holds the index; a Dataset's
    are its own): a ConfigError saying where they are, and an AttributeError, so that
    `hasattr(loader, "targets")` is False as it is for a DataLoader."""


class DatasetError(FastloadError):
    """The dataset could not be indexed: a missing folder, no images, an unreadable tree."""


class SourceChanged(DatasetError):
    """A file or an object is not the one indexed: a local shard replaced or truncated, an object
    in a store rewritten in place (its ETag differs from the one seen at open, or the store
    refused the read's `If-Match`). Its samples' places and labels are not the new content's, so
    it is never read: make the loader again (re-open the source), or re-pack.

    Attributes:
        size: the file's size now in bytes (-1 when unknown: an object's new size is not asked).
    """

    def __init__(self, message: str, size: int = -1) -> None:
        super().__init__(message)
        self.size = size

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.args[0], self.size))


class SampleError(FastloadError):
    """Loading one sample failed inside a worker process.

    The error raised is also an instance of the exception's own class when the trainer can tell
    which it was (a class of a module the trainer has imported): a `FileNotFoundError` is caught
    by `except FileNotFoundError` and `except OSError`, a Dataset's `KeyError` by `except
    KeyError`, as with DataLoader. Its class is then named like `SampleError[KeyError]`; that
    class's own `__init__` has not run (the trainer does not have its arguments), so attributes it
    would set are missing, except OSError's `filename`, which is the sample's path. Otherwise (a
    class defined inside a function, an exception group, StopIteration, a type named by a daemon
    outside `builtins`) it is a plain SampleError.

    Attributes:
        path: the file being loaded when the error happened ("" when the sample is not a file).
        index: the sample's index in the dataset (-1 when unknown).
        exc_type: the name of the exception class raised in the worker.
        worker_traceback: the worker's formatted traceback.
    """

    # The exception class this one also derives from, in a SampleError[...] class.
    _original: ClassVar[type[Exception] | None] = None

    def __init__(self, message: str, *, path: str, index: int, exc_type: str, worker_traceback: str) -> None:
        # Not super().__init__: in a SampleError[T], that would run T's __init__, whose
        # arguments the trainer does not have (T may need several, or none).
        BaseException.__init__(self, message)
        self.path = path
        self.index = index
        self.exc_type = exc_type
        self.worker_traceback = worker_traceback

    def __str__(self) -> str:
        return f"{self.args[0]}\n\nOriginal traceback in the worker process:\n{self.worker_traceback}"

    def __reduce__(self) -> tuple[Any, ...]:
        # A SampleError[T] class has no module attribute naming it: pickle T, and rebuild.
        fields = (self.args[0], self.path, self.index, self.exc_type, self.worker_traceback)
        combined = self._original is not None
        return (_unpickle, (self._original if combined else type(self), combined, *fields), self.__dict__)


class WorkerError(FastloadError):
    """A worker process died and the loader could not carry on (replacements kept dying)."""


class SharedMemoryError(FastloadError):
    """Shared memory for the batch ring could not be had: /dev/shm is too small or not writable."""


class DaemonError(FastloadError):
    """The loader daemon is not running, refused the session (e.g. over its memory budget), or
    went away; the message says which, and what to do."""


class WireError(FastloadError):
    """A message on the trainer<->daemon link that does not follow the protocol (malformed, wrong
    version, unknown op, a field of the wrong type): the daemon answers it with an error reply; a
    trainer that receives one raises it (its daemon is not the version it speaks, or not fastload's)."""


class LoaderTimeout(FastloadError, TimeoutError, RuntimeError):
    """No batch arrived within the loader's `timeout` while its workers were alive.

    A RuntimeError too, as DataLoader's timeout is, so `except RuntimeError` still catches it.
    """


class SettingsWarning(UserWarning):
    """A loader setting that runs but is probably not what was meant (the message says why and
    what to pass instead); filter it by this class to silence a choice that is meant."""


# NOTE [original exception types]: DataLoader re-raises a worker's exception with its own type
# (ExceptionWrapper.reraise), and training code relies on it (`except KeyError`, `except
# FileNotFoundError`). A worker reports its exception's class as "module:qualname" beside the
# short name; the trainer raises an instance of a class deriving from both SampleError and that
# class, made once per class. The name is data from another process, never code to run: it is
# looked up only among modules the trainer has already imported (never importing one, never
# running a module's __getattr__) and must name an Exception subclass; a daemon is a network peer,
# so from it only `builtins` names are used (`_loading.link.daemon_client`). Refused, and raised as a plain
# SampleError: StopIteration and StopAsyncIteration (raised from next() they would end the
# trainer's for-loop silently), exception groups (their constructor needs the group), and any
# class that cannot be subclassed or instantiated this way. Raising never fails for a bad name.

_REFUSED = (StopIteration, StopAsyncIteration, BaseExceptionGroup)
_MAX_TYPE_NAME_CHARS = 512


def exception_type_name(cls: type[BaseException]) -> str:
    """The "module:qualname" a worker reports for an exception class ("" when it is too long)."""
    name = f"{cls.__module__}:{cls.__qualname__}"
    return name if len(name) <= _MAX_TYPE_NAME_CHARS else ""


def find_exception_type(name: str) -> type[Exception] | None:
    """The Exception subclass a "module:qualname" names among the modules already imported.

    Never imports: a module not in `sys.modules`, a name that is not a module's or class's own
    attribute, a class that is not an Exception (KeyboardInterrupt, SystemExit) or is refused
    (see NOTE [original exception types]) all give None.
    """
    module_name, sep, qualname = name.partition(":")
    if not sep or not qualname:
        return None
    if module_name == "__mp_main__":  # the main script, as a spawned worker names it
        module_name = "__main__"
    found: object = sys.modules.get(module_name)
    for part in qualname.split("."):
        if not isinstance(found, (types.ModuleType, type)):
            return None
        found = vars(found).get(part)  # the namespace itself: no __getattr__, no descriptor runs
    if isinstance(found, type) and issubclass(found, Exception) and not issubclass(found, _REFUSED):
        return found
    return None


# original class -> its SampleError[...] class, or None when it cannot be made (a cache: at most
# one class per exception class a dataset raises; a race at worst makes one twice).
_CLASSES: dict[type[Exception], type[SampleError] | None] = {}


def _sample_error_class(original: type[Exception]) -> type[SampleError] | None:
    """SampleError[original], deriving from both, made once; None when they cannot be combined."""
    if original not in _CLASSES:
        _CLASSES[original] = _make_sample_error_class(original)
    return _CLASSES[original]


def _make_sample_error_class(original: type[Exception]) -> type[SampleError] | None:
    if issubclass(original, SampleError):
        return None
    label = original.__qualname__
    if original.__module__ != "builtins":
        label = f"{original.__module__}.{label}"
    name = f"SampleError[{label}]"
    namespace = {
        "__module__": "fastload",  # where users meet SampleError
        "__qualname__": name,
        "__doc__": f"A SampleError that is also a {label}, as the sample raised in the worker.",
        "_original": original,
    }
    try:
        return cast(type[SampleError], type(name, (SampleError, original), namespace))
    except Exception:  # a layout or metaclass conflict, an __init_subclass__ that refuses
        return None


def _build(
    original: type[Exception] | None,
    message: str,
    path: str,
    index: int,
    exc_type: str,
    worker_traceback: str,
) -> SampleError:
    fields: dict[str, Any] = {
        "path": path, "index": index, "exc_type": exc_type, "worker_traceback": worker_traceback,
    }
    try:
        cls = _sample_error_class(original) if original is not None else None
        if cls is not None:
            error = cls(message, **fields)
            if isinstance(error, OSError) and path:
                error.filename = path
            return error
    except Exception:  # its __new__ wants other arguments, a property refuses `path`, ...
        pass
    return SampleError(message, **fields)


def sample_error(
    message: str, *, path: str, index: int, exc_type: str, worker_traceback: str, original: str = ""
) -> SampleError:
    """The error to raise in the trainer for a failed sample: a SampleError that is also of the
    class `original` ("module:qualname") names, or a plain one (NOTE [original exception types])."""
    try:
        found = find_exception_type(original) if original else None
    except Exception:  # a class whose metaclass misbehaves: raise the SampleError regardless
        found = None
    return _build(found, message, path, index, exc_type, worker_traceback)


def _unpickle(
    cls: type[Exception],
    combined: bool,
    message: str,
    path: str,
    index: int,
    exc_type: str,
    worker_traceback: str,
) -> SampleError:
    """A pickled SampleError back: `cls` is its class, or for a SampleError[T] (combined) T."""
    if combined or not issubclass(cls, SampleError):
        return _build(cls, message, path, index, exc_type, worker_traceback)
    return cls(message, path=path, index=index, exc_type=exc_type, worker_traceback=worker_traceback)
