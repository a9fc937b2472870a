"""DataLoader's contract where it used to fail silently: worker info, a second iterator, argument
checks made at construction (device, normalize units, start method), the default ring size, and a
worker's signals and garbage collector leaving the trainer's shared memory alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import torch
from helpers import fastload_segments, wait_until
from torch.utils.data import DataLoader, Dataset, get_worker_info

from fastload import ConfigError, FastLoader
from fastload import transforms as T
from fastload._loading.settings.build import default_workers as _default_workers
from fastload._loading.slots.ring_plan import DEFAULT_RING_BUDGET_BYTES, MAX_IN_FLIGHT, default_in_flight

pytestmark = pytest.mark.timeout(120)


class WhoLoads(Dataset[np.ndarray]):
    """Each sample says which worker loaded it, as get_worker_info() tells it there."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> np.ndarray:
        info = get_worker_info()
        if info is None:
            return np.array([i, -1, -1, -1, 0], np.int64)
        same_class = int(type(info.dataset) is WhoLoads)
        return np.array([i, info.id, info.num_workers, info.seed % 2**62, same_class], np.int64)


class Indices(Dataset[int]):
    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_a_generator_gives_dataloaders_order_and_leaves_it_where_dataloader_does(
    num_workers: int, persistent: bool
) -> None:
    """DataLoader(ds, shuffle=True, generator=g) and FastLoader(ds, shuffle=True, generator=g), from
    the same generator state: the same batches every epoch, and the generator in the same state."""
    theirs, ours = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    kw: dict[str, Any] = {"batch_size": 4, "shuffle": True, "num_workers": num_workers}
    reference = DataLoader(Indices(), generator=theirs, persistent_workers=persistent, **kw)
    expected = [[b.tolist() for b in reference] for _ in range(3)]
    with FastLoader(Indices(), generator=ours, persistent_workers=persistent, **kw) as loader:
        assert [[b.tolist() for b in loader] for _ in range(3)] == expected
    assert torch.equal(ours.get_state(), theirs.get_state())
    assert len({str(epoch) for epoch in expected}) == 3  # a new order each epoch


@pytest.mark.parametrize("num_workers", [0, 2])
def test_get_worker_info_answers_as_in_a_dataloader(num_workers: int) -> None:
    with FastLoader(WhoLoads(), batch_size=2, num_workers=num_workers, seed=100) as loader:
        rows = torch.cat(list(loader)).tolist()
    assert [r[0] for r in rows] == list(range(16))
    if num_workers == 0:
        assert all(r[1:] == [-1, -1, -1, 0] for r in rows), "the trainer's own process is no worker"
        return
    assert {r[1] for r in rows} <= {0, 1}
    assert all(r[2] == 2 and r[4] == 1 for r in rows)
    assert all(r[3] == 100 + r[1] for r in rows), "seed: the loader's seed plus the worker id"


def _record_worker_info(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None and info.id == worker_id and info.num_workers == 2
    os.environ["FASTLOAD_TEST_INIT_SAW"] = f"{info.id}/{info.num_workers}"


class InitSeen(Dataset[int]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return int(os.environ.get("FASTLOAD_TEST_INIT_SAW", "x/x").split("/")[1])


def test_worker_init_fn_sees_the_worker_info() -> None:
    with FastLoader(InitSeen(), batch_size=2, num_workers=2, worker_init_fn=_record_worker_info) as loader:
        assert torch.cat(list(loader)).tolist() == [2, 2, 2, 2]


def test_folder_workers_have_worker_info_too(image_folder: Path) -> None:
    seen: list[Any] = []

    def init(worker_id: int) -> None:
        info = get_worker_info()
        if info is None or info.dataset != os.path.abspath(image_folder):
            raise RuntimeError(f"worker {worker_id}: get_worker_info() gave {info}")

    with FastLoader(
        image_folder, batch_size=4, num_workers=2, transform=[T.Resize((8, 8))], device="cpu",
        worker_init_fn=init,
    ) as loader:
        seen = list(loader)
    assert len(seen) == 6


class Numbers(Dataset[int]):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_second_iter_makes_the_first_iterator_say_why_it_ended(num_workers: int) -> None:
    with FastLoader(Numbers(), batch_size=2, num_workers=num_workers) as loader:
        first = iter(loader)
        assert next(first).tolist() == [0, 1]
        second = iter(loader)
        assert next(second).tolist() == [0, 1]
        with pytest.raises(ConfigError, match="newer iter"):
            next(first)
        assert torch.cat([next(second), *second]).tolist() == list(range(2, 12))
        # An iterator that had run to its end simply stays ended.
        third = iter(loader)
        assert len(list(third)) == 6
        fourth = iter(loader)
        with pytest.raises(StopIteration):
            next(third)
        assert len(list(fourth)) == 6


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": 0, "persistent_workers": True},
        {"num_workers": 0, "multiprocessing_context": "spawn"},
        {"num_workers": 2, "multiprocessing_context": "bogus"},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_worker_arguments_are_checked_as_dataloader_checks_them(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        DataLoader(Numbers(), **kwargs)
    with pytest.raises(ConfigError):
        FastLoader(Numbers(), **kwargs)


def test_a_start_method_is_honoured(tmp_path: Path) -> None:
    import multiprocessing

    with FastLoader(
        Numbers(), batch_size=4, num_workers=1, multiprocessing_context=multiprocessing.get_context("fork")
    ) as loader:
        assert torch.cat(list(loader)).tolist() == list(range(12))
    # spawn starts multiprocessing's resource tracker, which lives as long as its process: run
    # it in a process of its own.
    script = tmp_path / "spawned.py"
    script.write_text(_SPAWNED.format(tests=str(Path(__file__).parent)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["spawn", str(list(range(12))).replace(" ", "")]


_SPAWNED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    import torch
    from fastload import FastLoader
    from test_dropin import Numbers

    if __name__ == "__main__":
        with FastLoader(Numbers(), batch_size=4, num_workers=1, multiprocessing_context="spawn") as loader:
            got = torch.cat(list(loader)).tolist()
            print(loader._runs.pipeline.executor._mp.get_start_method())
        print(str(got).replace(" ", ""))
    """
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_cuda_fails_at_construction(image_folder: Path, device: str) -> None:
    with pytest.raises(ConfigError, match="CUDA is not available"):
        FastLoader(image_folder, batch_size=4, num_workers=0, transform=[T.Resize((8, 8))], device=device)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        FastLoader(Numbers(), batch_size=4, device=device)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks a device index beyond the GPUs")
def test_a_gpu_index_beyond_the_visible_gpus_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match="GPU"):
        FastLoader(Numbers(), batch_size=4, device=f"cuda:{torch.cuda.device_count()}")


def test_an_unsupported_device_type_fails_at_construction() -> None:
    with pytest.raises(ConfigError, match="'cpu' or 'cuda"):
        FastLoader(Numbers(), batch_size=4, device="meta")


@pytest.mark.parametrize(
    ("mean", "std", "match"),
    [
        ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375), "0-255 units"),
        ((0.485, 0.456, 0.406), (58.395, 57.12, 57.375), "0-255 units"),
        ((0.5, 0.5, 0.5), (0.0, 0.5, 0.5), r"stds in \(0, 1\]"),
        ((-0.1, 0.5, 0.5), (0.5, 0.5, 0.5), r"means in \[0, 1\]"),
        ((float("nan"), 0.5, 0.5), (0.5, 0.5, 0.5), "torchvision"),
    ],
)
def test_normalize_outside_fastloads_units_is_refused(
    image_folder: Path, mean: tuple[float, ...], std: tuple[float, ...], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        FastLoader(
            image_folder, batch_size=4, num_workers=0, transform=[T.Resize((8, 8))], device="cpu",
            normalize=(mean, std),
        )


def test_default_in_flight_keeps_workers_busy_within_a_byte_budget() -> None:
    imagenet_batch = 256 * 224 * 224 * 3
    # 2 per worker (DataLoader's prefetch_factor) while it fits the budget...
    assert default_in_flight(4, 64 * 32 * 32 * 3) == 8
    # ...fewer when batches are big, but every worker keeps a slot to write into...
    assert default_in_flight(16, imagenet_batch) == 17
    assert default_in_flight(8, imagenet_batch) == (DEFAULT_RING_BUDGET_BYTES // imagenet_batch) - 2 == 11
    # ...and never more than a daemon accepts, however many cores.
    assert default_in_flight(64, 1024) == MAX_IN_FLIGHT
    assert default_in_flight(0, 1024) == 2


def test_a_folder_loaders_ring_is_sized_by_the_default(image_folder: Path) -> None:
    with FastLoader(
        image_folder, batch_size=4, num_workers=2, transform=[T.Resize((8, 8))], device="cpu"
    ) as loader:
        next(iter(loader))
        assert loader._runs.pipeline is not None and loader._runs.pipeline.ring is not None
        assert len(loader._runs.pipeline.ring) == default_in_flight(2, 4 * 8 * 8 * 3 + 4 * 8) + 2


class BigSamples(Dataset[np.ndarray]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full((16 << 20,), i, np.uint8)  # 16 MiB: a batch of 4 is 64 MiB


def test_a_dataset_loaders_ring_is_sized_once_a_sample_is_probed() -> None:
    with FastLoader(BigSamples(), batch_size=4, num_workers=6) as loader:
        assert [int(b[0, 0]) for b in loader] == [0, 4]
        assert loader._runs.pipeline is not None and loader._runs.pipeline.ring is not None
        # 2 x 6 workers would be 14 slots = 896 MiB; the budget allows 6, workers need 7.
        assert len(loader._runs.pipeline.ring) == 7 + 2


@pytest.mark.parametrize("prefetch", [0, MAX_IN_FLIGHT + 1])
def test_prefetch_out_of_range_is_refused(prefetch: int) -> None:
    with pytest.raises(ConfigError, match="prefetch"):
        FastLoader(Numbers(), batch_size=4, num_workers=1, prefetch=prefetch)


def test_ranks_on_one_machine_share_its_cores_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert _default_workers() == 8
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert _default_workers() == 64


class Sleepy(Dataset[int]):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        import time

        time.sleep(0.02)
        return i


def test_sigterm_to_a_worker_leaves_the_trainers_segments_alone() -> None:
    """A worker inherits the trainer's SIGTERM cleanup handler; one forked after the ring was made
    (a replacement) must not unlink it: the next replacement could no longer attach its slots."""
    with FastLoader(Sleepy(), batch_size=4, num_workers=2) as loader:
        it = iter(loader)
        got = next(it).tolist()
        ours = fastload_segments(os.getpid())
        first = set(loader.worker_pids)
        os.kill(min(first), signal.SIGKILL)
        while not set(loader.worker_pids) - first:  # replaced while the loader waits for batches
            got += next(it).tolist()
        (replacement,) = set(loader.worker_pids) - first
        assert wait_until(lambda: psutil.Process(replacement).status() == "sleeping", 10)
        os.kill(replacement, signal.SIGTERM)
        for batch in it:
            got += batch.tolist()
        assert fastload_segments(os.getpid()) >= ours
    assert sorted(got) == list(range(40))


_DROPPED_LOADER = textwrap.dedent(
    """
    import gc, sys
    sys.path.insert(0, {tests!r})
    from fastload import FastLoader
    from test_dropin import Numbers

    class Collecting(Numbers):
        def __getitem__(self, i):
            gc.collect()  # in the worker: collects its copy of the dropped loader
            return i

    gc.disable()
    first = FastLoader(Numbers(), batch_size=4, num_workers=2)
    next(iter(first))
    cycle = [first]
    cycle.append(cycle)
    del first, cycle  # dropped without close(), in a reference cycle: garbage, not yet collected
    with FastLoader(Collecting(), batch_size=4, num_workers=2) as second:
        assert sum(len(b) for b in second) == 12
    gc.collect()
    print("ok")
    """
)


def test_a_dropped_loader_collected_in_a_later_loaders_worker_prints_nothing(tmp_path: Path) -> None:
    script = tmp_path / "dropped.py"
    script.write_text(_DROPPED_LOADER.format(tests=str(Path(__file__).parent)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert "Traceback" not in result.stderr, result.stderr


def test_a_datasets_imagefolder_attributes_are_its_own() -> None:
    """Over a Dataset the loader names no classes and leaves `targets` to the dataset."""
    with FastLoader(Indices(), batch_size=4, num_workers=0) as loader:
        assert loader.classes == () and loader.class_to_idx == {}
        with pytest.raises(ConfigError, match=r"loader\.dataset\.targets"):
            loader.targets  # noqa: B018
        # As on a DataLoader, which has no `targets`: code that probes for them falls back.
        assert not hasattr(loader, "targets") and getattr(loader, "targets", None) is None
