"""Errors keep their type: code written for DataLoader catches what it caught there.

Protects users' `except` clauses (issue 9): an exception raised by a Dataset's `__getitem__` or
met reading a folder's file arrives in the trainer as an instance of its own class (`except
KeyError`, `except FileNotFoundError`, `except MyError` still catch it) and of SampleError (the
file or index and the worker's traceback), inline, in worker processes and from a daemon; a
type the trainer cannot find among the modules it has imported, or cannot combine with
SampleError, falls back to a plain SampleError, and a daemon (a network peer) can only name
builtin types; resolving a name never imports anything; LoaderTimeout is a RuntimeError, as
DataLoader's timeout is.
"""

from __future__ import annotations

import errno
import pickle
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from daemon_helpers import RESIZE, DaemonPool
from torch.utils.data import Dataset

from fastload import FastLoader, FastloadError, LoaderTimeout, SampleError
from fastload import _errors as errors
from fastload._loading.link import daemon_link as wire

pytestmark = pytest.mark.timeout(60)  # a regression here tends to be a hang


class ShelfMissing(LookupError):
    """A user's own exception class, defined at a module's top level."""


class NeedsTwo(Exception):
    """A user's exception whose constructor needs two arguments (the trainer has neither)."""

    def __init__(self, shelf: str, slot: int) -> None:
        super().__init__(shelf, slot)
        self.shelf = shelf
        self.slot = slot


class Final(Exception):
    """An exception class that refuses to be subclassed, so it cannot be combined."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError(f"{cls.__name__}: Final cannot be subclassed")


class Raising(Dataset[np.ndarray]):
    """Sample i is [i, i]; sample `bad` raises what `make_error()` returns."""

    def __init__(self, n: int, bad: int, make_error: Callable[[], BaseException]) -> None:
        self.n = n
        self.bad = bad
        self.make_error = make_error

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.bad:
            raise self.make_error()
        return np.full(2, i, np.float32)


def _first_error(loader: FastLoader) -> BaseException:
    """Iterate until the loader raises; return what it raised."""
    with pytest.raises(Exception) as info:  # the caller checks the type
        for _ in loader:
            pass
    return info.value


def _no_sample(i: int) -> Callable[[], BaseException]:
    return lambda: KeyError(f"no sample {i}")


# ---------------------------------------------------------------------------------------------
# A Dataset's exception keeps its type (inline and in worker processes)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_key_error_is_caught_by_except_key_error_and_is_a_sample_error(num_workers: int) -> None:
    with FastLoader(Raising(12, 5, _no_sample(5)), batch_size=4, num_workers=num_workers) as loader:
        it = iter(loader)
        assert next(it).tolist() == [[i, i] for i in range(4)]
        with pytest.raises(KeyError) as info:
            next(it)
        error = info.value
        assert isinstance(error, SampleError) and isinstance(error, FastloadError)
        assert error.index == 5 and error.path == "" and error.exc_type == "KeyError"
        text = str(error)  # SampleError's: the message, then the worker's traceback
        assert text.startswith("failed to load sample at index 5: KeyError: 'no sample 5'")
        assert "Original traceback in the worker process" in text and "in __getitem__" in text
        assert "no sample 5" in error.worker_traceback
        # A traceback reads as what it is.
        assert type(error).__qualname__ == "SampleError[KeyError]" and type(error).__module__ == "fastload"
        assert traceback.format_exception_only(error)[0].startswith("fastload.SampleError[KeyError]: ")
        # The loop goes on past it, as with DataLoader.
        assert next(it).tolist() == [[i, i] for i in range(8, 12)]


CATCHABLE: list[tuple[str, Callable[[], BaseException], tuple[type[BaseException], ...]]] = [
    ("IndexError", lambda: IndexError("out of range"), (IndexError, LookupError)),
    ("ValueError", lambda: ValueError("bad value"), (ValueError,)),
    (
        "FileNotFoundError",
        lambda: FileNotFoundError(errno.ENOENT, "No such file", "/data/x.npy"),
        (FileNotFoundError, OSError),
    ),
    (
        "PermissionError",
        lambda: PermissionError(errno.EACCES, "Permission denied"),
        (PermissionError, OSError),
    ),
    ("OSError", lambda: OSError(errno.EIO, "Input/output error"), (OSError,)),
    (
        "UnicodeDecodeError",
        lambda: UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        (UnicodeDecodeError, UnicodeError, ValueError),
    ),
    ("ShelfMissing", lambda: ShelfMissing("shelf 3"), (ShelfMissing, LookupError)),
    ("NeedsTwo", lambda: NeedsTwo("shelf", 3), (NeedsTwo,)),
]


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize(("name", "make_error", "catchers"), CATCHABLE, ids=[c[0] for c in CATCHABLE])
def test_each_except_clause_still_catches_its_exception(
    num_workers: int,
    name: str,
    make_error: Callable[[], BaseException],
    catchers: tuple[type[BaseException], ...],
) -> None:
    with FastLoader(Raising(8, 2, make_error), batch_size=4, num_workers=num_workers) as loader:
        error = _first_error(loader)
    for catcher in (*catchers, SampleError, FastloadError):
        assert isinstance(error, catcher), f"`except {catcher.__name__}` does not catch {type(error)}"
    assert isinstance(error, SampleError)
    assert error.exc_type == name and error.index == 2
    assert name in str(error) and "Original traceback in the worker process" in str(error)


# ---------------------------------------------------------------------------------------------
# What cannot keep its type falls back to a plain SampleError, never to a failure while raising


def _local_error() -> BaseException:
    class Local(Exception):  # defined in a function: no module attribute names it
        pass

    return Local("defined inside a function")


FALLBACKS: list[tuple[str, Callable[[], BaseException]]] = [
    ("subclassing-refused", lambda: Final("cannot combine")),
    ("exception-group", lambda: ExceptionGroup("several", [KeyError(1), ValueError(2)])),
    ("not-findable", _local_error),
    # A StopIteration re-raised from next() would end the trainer's for-loop without a word.
    ("stop-iteration", lambda: StopIteration("the dataset ran out")),
]


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize(("case", "make_error"), FALLBACKS, ids=[c[0] for c in FALLBACKS])
def test_types_that_cannot_be_kept_fall_back_to_a_plain_sample_error(
    num_workers: int, case: str, make_error: Callable[[], BaseException]
) -> None:
    with FastLoader(Raising(8, 5, make_error), batch_size=4, num_workers=num_workers) as loader:
        it = iter(loader)
        next(it)
        with pytest.raises(SampleError) as info:
            next(it)
    assert type(info.value) is SampleError
    assert info.value.index == 5 and info.value.exc_type in str(info.value)


# ---------------------------------------------------------------------------------------------
# A folder's missing file is a FileNotFoundError (locally and from a daemon)


@pytest.mark.parametrize("num_workers", [0, 1])
def test_file_deleted_after_indexing_is_a_file_not_found_error(
    make_folder: Callable[..., Path], num_workers: int
) -> None:
    root = make_folder(classes=1, per_class=4)
    victim = root / "n00" / "img_002.jpg"
    with FastLoader(root, batch_size=2, num_workers=num_workers, transform=RESIZE, device="cpu") as loader:
        victim.unlink()
        it = iter(loader)
        next(it)
        with pytest.raises(FileNotFoundError) as info:
            next(it)
    error = info.value
    assert isinstance(error, SampleError) and isinstance(error, OSError)
    assert error.path == str(victim) and error.filename == str(victim) and error.index == 2
    assert error.exc_type == "FileNotFoundError" and str(victim) in str(error)


@pytest.mark.timeout(90)
def test_daemon_failures_keep_builtin_types_only(
    daemon_pool: DaemonPool, make_folder: Callable[..., Path]
) -> None:
    root = make_folder(classes=1, per_class=6)
    missing = root / "n00" / "img_001.jpg"
    corrupt = root / "n00" / "img_004.jpg"
    corrupt.write_bytes(b"this is not an image at all" * 20)  # Pillow: PIL.UnidentifiedImageError
    kwargs: dict[str, Any] = {"batch_size": 2, "transform": RESIZE, "device": "cpu", "backend": "pil"}

    # Locally the decoder's own type is kept: the trainer has imported PIL.
    with FastLoader(root, num_workers=1, **kwargs) as loader:
        (local,) = _errors_of_an_epoch(loader)
    assert type(local).__qualname__ == "SampleError[PIL.UnidentifiedImageError]"

    daemon = daemon_pool.start(workers=1)
    with FastLoader(root, num_workers=1, daemon=daemon.address, **kwargs) as loader:
        missing.unlink()
        found = _errors_of_an_epoch(loader)
    not_found, undecodable = found
    assert isinstance(not_found, FileNotFoundError) and not_found.path == str(missing)
    # A daemon is a network peer: a type outside builtins that it names is not looked up.
    assert type(undecodable) is SampleError and undecodable.path == str(corrupt)
    assert undecodable.exc_type == "UnidentifiedImageError"


def test_a_failed_reply_may_name_the_type_or_not() -> None:
    # A daemon of the version before `exc_class` existed still talks to this trainer.
    fields: dict[str, Any] = {
        "seq": 1, "message": "m", "path": "/d/x.jpg", "index": 3, "exc_type": "KeyError", "traceback": "TB",
    }
    assert wire.decode(wire.encode("failed", **fields)) == ("failed", fields)
    named = {**fields, "exc_class": "builtins:KeyError"}
    assert wire.decode(wire.encode("failed", **named)) == ("failed", named)
    with pytest.raises(wire.WireError, match="exc_class"):
        wire.decode(wire.encode("failed", **{**fields, "exc_class": 5}))
    with pytest.raises(wire.WireError, match="missing traceback"):
        wire.decode(wire.encode("failed", **{k: v for k, v in fields.items() if k != "traceback"}))


def _errors_of_an_epoch(loader: FastLoader) -> list[SampleError]:
    found: list[SampleError] = []
    it = iter(loader)
    while True:
        try:
            next(it)
        except StopIteration:
            return found
        except SampleError as e:
            found.append(e)


# ---------------------------------------------------------------------------------------------
# Resolving a type name: already-imported modules only, Exception subclasses only


def test_resolving_a_name_never_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "tabnanny", raising=False)
    assert errors.find_exception_type("tabnanny:NannyNag") is None
    assert "tabnanny" not in sys.modules
    import tabnanny

    assert errors.find_exception_type("tabnanny:NannyNag") is tabnanny.NannyNag

    lazy = types.ModuleType("fastload_test_lazy")

    def module_getattr(name: str) -> Any:
        raise AssertionError(f"the lookup ran the module's __getattr__ for {name}")

    lazy.__getattr__ = module_getattr  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "fastload_test_lazy", lazy)
    assert errors.find_exception_type("fastload_test_lazy:Anything") is None


@pytest.mark.parametrize(
    "name",
    [
        "", "KeyError", "builtins:", ":KeyError", "builtins:len", "builtins:object", "builtins:int",
        "os:path", "builtins:KeyboardInterrupt", "builtins:SystemExit", "builtins:GeneratorExit",
        "builtins:StopIteration", "builtins:BaseExceptionGroup", "builtins:KeyError.__class__",
        "no.such.module:KeyError", f"{__name__}:_local_error.<locals>.Local",
    ],
)
def test_names_that_are_not_exception_classes_resolve_to_nothing(name: str) -> None:
    assert errors.find_exception_type(name) is None


def test_names_that_resolve() -> None:
    assert errors.find_exception_type("builtins:KeyError") is KeyError
    assert errors.find_exception_type(f"{__name__}:ShelfMissing") is ShelfMissing
    assert errors.find_exception_type("fastload._errors:DaemonError") is errors.DaemonError
    assert errors.exception_type_name(ShelfMissing) == f"{__name__}:ShelfMissing"
    assert errors.exception_type_name(FileNotFoundError) == "builtins:FileNotFoundError"


def test_one_class_per_original_type_and_errors_survive_pickling() -> None:
    def make(original: str) -> SampleError:
        return errors.sample_error(
            "failed to load image /d/x.jpg: FileNotFoundError: gone",
            path="/d/x.jpg", index=7, exc_type="FileNotFoundError", worker_traceback="TB", original=original,
        )

    first, second = make("builtins:FileNotFoundError"), make("builtins:FileNotFoundError")
    assert type(first) is type(second) and isinstance(first, FileNotFoundError)
    for error in (first, make("")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert (copy.path, copy.index, copy.worker_traceback) == ("/d/x.jpg", 7, "TB")
        assert copy.exc_type == "FileNotFoundError"
        assert str(copy) == str(error)


# ---------------------------------------------------------------------------------------------
# LoaderTimeout is DataLoader's RuntimeError


class Slow(Dataset[np.ndarray]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        if i >= 4:
            time.sleep(2.0)
        return np.full(2, i, np.float32)


def test_loader_timeout_is_caught_by_except_runtime_error() -> None:
    assert issubclass(LoaderTimeout, RuntimeError) and issubclass(LoaderTimeout, TimeoutError)
    with FastLoader(Slow(), batch_size=4, num_workers=1, timeout=0.5) as loader:
        it = iter(loader)
        assert torch.equal(next(it)[:, 0], torch.arange(4, dtype=torch.float32))
        with pytest.raises(RuntimeError, match=r"0\.5 s") as info:
            next(it)
    assert isinstance(info.value, LoaderTimeout) and isinstance(info.value, FastloadError)
