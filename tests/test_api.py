"""The public API: what `import fastload` offers, the exception tree, and the loader's lifecycle.

Protects users' imports and `except` clauses: `__all__` is sorted, complete and importable with
no private module leaking into it; every error fastload raises on purpose derives from
FastloadError (ConfigError is also a ValueError, LoaderTimeout a TimeoutError and a
RuntimeError); FastLoader is a context manager, and close() is idempotent and final.
"""

from __future__ import annotations

import gc
import importlib.metadata
import os
import types
from pathlib import Path

import numpy as np
import pytest
from helpers import fastload_segments, pid_alive, wait_until
from torch.utils.data import Dataset

import fastload
from fastload import FastLoader
from fastload import transforms as T

ERRORS = [
    "ConfigError", "DatasetError", "LoaderTimeout", "SampleError", "SharedMemoryError", "SourceChanged",
    "WorkerError",
]


class Tiny(Dataset[np.ndarray]):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(2, i, np.float32)


@pytest.mark.parametrize("module", [fastload, T], ids=["fastload", "fastload.transforms"])
def test_all_is_sorted_importable_and_has_no_private_names(module: types.ModuleType) -> None:
    names = module.__all__
    # ruff's order (RUF022, which CI runs): CONSTANTS, then Classes, then functions, each sorted.
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    assert len(set(names)) == len(names)
    for name in names:
        value = getattr(module, name)  # importable
        assert not name.startswith("_") or name == "__version__"
        if isinstance(value, types.ModuleType):
            assert not any(part.startswith("_") for part in value.__name__.split(".")), name


def test_package_all_is_complete() -> None:
    # Every public attribute of the package is in __all__: nothing leaks in by accident.
    public = {n for n in dir(fastload) if not n.startswith("_")}
    assert public == set(fastload.__all__) - {"__version__"}


def test_transforms_all_is_the_transforms() -> None:
    # Exactly the transforms (every one the configuration knows, so a new one cannot be left out),
    # their base, and two functions, `from_torchvision` and `three_augment` (a recipe: a chain of
    # two transforms); the compile/config machinery stays out of `import *`.
    exported = {getattr(T, n) for n in T.__all__}
    own = {d.cls for d in T.declared_transforms().values() if d.cls.__module__.startswith("fastload.")}
    assert exported == {*own, T.Transform, T.from_torchvision, T.three_augment}
    classes = exported - {T.from_torchvision, T.three_augment}
    assert all(isinstance(cls, type) and issubclass(cls, T.Transform) for cls in classes)
    assert len(exported) == len(T.__all__)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from fastload import *", namespace)
    assert {n for n in namespace if n != "__builtins__"} == set(fastload.__all__)


def test_version_matches_the_installed_distribution() -> None:
    assert fastload.__version__ == importlib.metadata.version("fastload")


@pytest.mark.parametrize("name", ERRORS)
def test_every_error_is_a_fastload_error(name: str) -> None:
    error = getattr(fastload, name)
    assert issubclass(error, fastload.FastloadError)
    assert issubclass(fastload.FastloadError, Exception)


def test_errors_are_also_the_builtin_they_mean() -> None:
    assert issubclass(fastload.ConfigError, ValueError)
    assert issubclass(fastload.LoaderTimeout, TimeoutError)
    assert issubclass(fastload.LoaderTimeout, RuntimeError)  # as DataLoader's timeout


def test_sample_error_carries_its_context() -> None:
    error = fastload.SampleError(
        "failed to load image /x.jpg", path="/x.jpg", index=3, exc_type="OSError", worker_traceback="TB"
    )
    assert (error.path, error.index, error.exc_type, error.worker_traceback) == ("/x.jpg", 3, "OSError", "TB")
    assert str(error).startswith("failed to load image /x.jpg") and str(error).endswith("TB")


def test_context_manager_closes_and_close_is_idempotent() -> None:
    with fastload.FastLoader(Tiny(), batch_size=2, num_workers=1) as loader:
        assert isinstance(loader, fastload.FastLoader)
        assert len(list(loader)) == 3
        assert len(loader.worker_pids) == 1
    assert loader.worker_pids == []
    loader.close()
    loader.close()
    with pytest.raises(fastload.ConfigError, match="closed"):
        iter(loader)


def test_context_manager_closes_on_error() -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        fastload.FastLoader(Tiny(), batch_size=2, num_workers=1) as loader,
    ):
        next(iter(loader))
        raise RuntimeError("boom")
    assert loader.worker_pids == []


def test_loader_attributes_like_dataloader() -> None:
    dataset = Tiny()
    with fastload.FastLoader(dataset, batch_size=4, drop_last=True, num_workers=0, seed=5) as loader:
        assert loader.dataset is dataset
        assert (loader.batch_size, loader.drop_last, loader.num_workers, loader.seed) == (4, True, 0, 5)
        assert len(loader) == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_dropped_without_close_is_cleaned_up_when_collected(
    image_folder: Path, num_workers: int
) -> None:
    # DataLoader users often just drop a loader: its workers and shared memory must not outlive it.
    loader = FastLoader(image_folder, batch_size=4, num_workers=num_workers, device="cpu",
                        transform=[T.CenterCrop(32)])
    batch = next(iter(loader))
    pids = loader.worker_pids
    del loader, batch
    gc.collect()
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 10.0)
    assert not fastload_segments(os.getpid())
