"""The handles a tuner turns (issue 32), correct under faults and deterministic.

- Workers added and retired mid-epoch (`Pipeline.set_workers`, through `Engine.add_worker` /
  `retire_worker`): every sample exactly once, the batches bit for bit those of a fixed
  `num_workers=2` run, in the same order, for a Dataset whose `__getitem__` burns time and draws
  from the global random state, and for an image folder with random crops.
- A retiring worker killed while it holds tasks: they are run again, nothing is lost, no
  replacement is spawned; a retired worker's process is gone.
- The batches in flight moved up and down mid-epoch (`Pipeline.set_in_flight`): the ring grows
  and shrinks, slots the user holds are never unlinked, /dev/shm holds the ring's slots and no
  others, workers unmap the slots let go of, and the batches are unchanged.
- A worker added after a daemon-style `add_job` is told the job and its layout when READY.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import fastload_segments, pid_alive, wait_until
from torch.utils.data import Dataset

from fastload import FastLoader
from fastload import transforms as T
from fastload._loading.jobs.dataset_job import DatasetJob
from fastload._loading.jobs.executor import Done, Event, Probed, Task
from fastload._loading.jobs.image_job import ImageJob
from fastload._loading.running.engine import Engine
from fastload._loading.running.pipeline import Pipeline
from fastload._loading.running.supervision import Cause
from fastload._loading.slots.ring import Ring
from fastload._loading.slots.ring_plan import EXTRA_SLOTS, ring_ceiling_slots
from fastload.sources._formats.folder import scan_image_folder

pytestmark = pytest.mark.timeout(240)

WAIT_S = 60.0  # a hang guard for waits on events, never a target


class BurningDataset(Dataset[dict[str, Any]]):
    """A decode cost injected: each sample burns `burn_s` of CPU, then draws from the global
    random states (as augmentations in `__getitem__` do)."""

    def __init__(self, n: int = 96, burn_s: float = 0.002) -> None:
        self.n = n
        self.burn_s = burn_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        end = time.perf_counter() + self.burn_s
        while time.perf_counter() < end:
            pass
        return {
            "index": i,
            "noise": torch.rand(4),
            "pixels": np.random.randint(0, 255, (6, 6, 3), dtype=np.uint8),
        }


def _leaves(batch: Any) -> list[torch.Tensor]:
    values = batch.values() if isinstance(batch, dict) else batch
    return [v.clone() for v in values]


Turn = Callable[[Pipeline, int], None]


def _epochs(
    loader: FastLoader, epochs: int, each: Turn, keep: list[Any] | None = None
) -> list[list[torch.Tensor]]:
    """Every batch of `epochs` epochs (cloned), calling `each(pipeline, k)` before the k-th
    batch over all epochs is taken (from the training loop, as a tuner does); the first epoch's
    first two batches are kept as delivered in `keep` (the user holds them: views over slots)."""
    got: list[list[torch.Tensor]] = []
    for epoch in range(epochs):
        iterator = iter(loader)
        while True:
            pipeline = loader._runs.pipeline
            assert pipeline is not None
            each(pipeline, len(got))
            batch = next(iterator, None)
            if batch is None:
                break
            if keep is not None and epoch == 0 and len(keep) < 2:
                keep.append(batch)
            got.append(_leaves(batch))
    return got


def _assert_same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert len(x) == len(y)
        for u, v in zip(x, y, strict=True):
            assert u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v)


def _engine(pipeline: Pipeline) -> Engine:
    assert isinstance(pipeline.executor, Engine)
    return pipeline.executor


# 1 -> 3 -> 1 -> 2 from a start of 2, by the batch (over all epochs) before which it is set.
SCHEDULE = {1: 1, 3: 3, 5: 1, 7: 2}


def _source(kind: str, image_folder: Path) -> tuple[Any, dict[str, Any]]:
    if kind == "dataset":
        return BurningDataset(), {"batch_size": 8}
    return image_folder, {
        "batch_size": 8, "transform": [T.RandomResizedCrop(24), T.RandomHorizontalFlip()],
        "backend": "native" if kind == "folder" else kind,
    }


@pytest.mark.parametrize("kind", ["dataset", "folder"])
def test_workers_added_and_retired_mid_epoch_give_the_same_batches(kind: str, image_folder: Path) -> None:
    source, options = _source(kind, image_folder)
    common = {"shuffle": True, "seed": 5, "num_workers": 2, "device": "cpu", **options}
    epochs = 1 if kind == "dataset" else 3  # 12 batches; the folder's 24 images are 3 a epoch
    with FastLoader(source, **common) as loader:
        fixed = _epochs(loader, epochs, lambda pipeline, k: None)
    seen: list[tuple[int, int, int]] = []  # (batch, workers asked, active after)
    retired: list[int] = []

    def turn(pipeline: Pipeline, k: int) -> None:
        if k not in SCHEDULE or any(b == k for b, _, _ in seen):
            return
        engine = _engine(pipeline)
        before = set(engine.worker_pids)
        now = pipeline.set_workers(SCHEDULE[k])
        assert now == SCHEDULE[k] == engine.active_workers == pipeline.workers
        assert pipeline.window.ceiling is not None
        retired.extend(before - {w.process.pid for w in engine._workers.values() if not w.retiring})
        seen.append((k, SCHEDULE[k], now))

    with FastLoader(source, **common) as loader:
        tuned = _epochs(loader, epochs, turn)
        assert [s[1] for s in seen] == [1, 3, 1, 2]
        engine = _engine(loader._runs.pipeline)  # type: ignore[arg-type]
        assert retired, "no worker was retired"

        def reaped() -> bool:
            engine.supervise()  # reaps retired workers, never waiting on one
            return not set(retired) & set(engine.worker_pids)

        assert wait_until(reaped, WAIT_S), "a retired worker was never reaped"
        assert len(engine.worker_pids) == 2 and engine.active_workers == 2
        assert not any(pid_alive(pid) for pid in retired)
        assert sum(engine.deaths.values()) == 0, "a retirement was counted as a death"
    _assert_same(fixed, tuned)
    if kind == "dataset":
        indices = torch.cat([batch[0] for batch in tuned])
        assert sorted(indices.tolist()) == list(range(len(source)))  # each sample exactly once


class Streams(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(8))


def test_an_iterable_datasets_workers_are_its_streams_and_never_moved() -> None:
    with FastLoader(Streams(), batch_size=4, num_workers=2) as loader:
        iterator = iter(loader)
        next(iterator)
        pipeline = loader._runs.pipeline
        assert pipeline is not None
        assert pipeline.set_workers(1) == 2 == pipeline.set_workers(3)
        assert _engine(pipeline).active_workers == 2
        assert len(list(iterator)) == 3  # two streams of 8: four batches in all


class GatedDataset(Dataset[tuple[np.int64, np.ndarray]]):
    """Sample i is (i, [i, i]); every sample waits until the gate file exists (a worker holding
    its tasks for as long as the test needs)."""

    def __init__(self, gate: Path) -> None:
        self.gate = gate

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[np.int64, np.ndarray]:
        while not self.gate.exists():
            time.sleep(0.005)
        return np.int64(i), np.full(2, i, np.float32)


def _all_ready(engine: Engine) -> bool:
    engine.poll(0.01)
    return all(w.ready for w in engine._workers.values())


def _poll_until(engine: Engine, done: Callable[[list[Event]], bool]) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + WAIT_S
    while not done(events):
        assert time.monotonic() < deadline, f"the engine answered {len(events)} tasks only"
        events += engine.poll(0.05)
    return events


def test_a_retiring_worker_killed_with_tasks_has_them_redone_and_is_not_replaced(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    job = DatasetJob(GatedDataset(gate), None, seed=0, batch_size=4)
    engine = Engine({0: job}, num_workers=2, mp_context=None, worker_init_fn=None)
    try:
        assert wait_until(lambda: _all_ready(engine), WAIT_S)
        tasks = [Task(k, 0, k, np.asarray([k], np.int64), "", probe=True) for k in range(8)]
        for task in tasks:
            engine.submit(task)
        victim = max(engine._workers.values(), key=lambda w: w.worker_id)
        assert victim.tasks, "dispatch gave the second worker nothing"
        held = set(victim.tasks)
        assert engine.retire_worker() == victim.worker_id
        assert engine.active_workers == 1 and engine.retire_worker() is None  # one is left
        engine.submit(Task(8, 0, 8, np.asarray([8], np.int64), "", probe=True))
        assert set(victim.tasks) == held, "a retiring worker was given a new task"
        pid = victim.process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: (engine.supervise(), pid not in engine.worker_pids)[1], WAIT_S)
        gate.touch()
        events = _poll_until(engine, lambda ev: len(ev) >= 9)
        assert sorted(e.seq for e in events if isinstance(e, Probed)) == list(range(9))  # once each
        assert len(engine.worker_pids) == 1 and engine.active_workers == 1  # no replacement
        assert engine.deaths[Cause.EXTERNAL] == 1
        assert not pid_alive(pid)
    finally:
        gate.touch()
        engine.close()


def test_close_stops_a_retiring_worker_still_holding_tasks(tmp_path: Path) -> None:
    job = DatasetJob(GatedDataset(tmp_path / "never"), None, seed=0, batch_size=4)  # it never opens
    engine = Engine({0: job}, num_workers=2, mp_context=None, worker_init_fn=None)
    try:
        assert wait_until(lambda: _all_ready(engine), WAIT_S)
        for k in range(4):
            engine.submit(Task(k, 0, k, np.asarray([k], np.int64), "", probe=True))
        assert engine.retire_worker() == 1
        pids = engine.worker_pids
        assert len(pids) == 2 and engine.active_workers == 1
    finally:
        engine.close()  # STOP is not read by a worker stuck in a sample: it is killed
    assert not any(pid_alive(pid) for pid in pids)


class SecondWorkerGated(Dataset[dict[str, Any]]):
    """Worker 1's samples each take 20 ms and wait while the gate file is missing (so it holds
    the tasks it was given for as long as the test needs); worker 0's take 5 ms (so that it does
    not run the whole epoch before worker 1 is up on a loaded machine); sample i is i and random
    draws."""

    def __init__(self, gate: Path) -> None:
        self.gate = gate

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> dict[str, Any]:
        info = torch.utils.data.get_worker_info()
        cost_s = 0.005
        if info is not None and info.id == 1:
            while not self.gate.exists():
                time.sleep(0.005)
            cost_s = 0.02
        end = time.perf_counter() + cost_s
        while time.perf_counter() < end:
            pass
        return {"index": i, "noise": torch.rand(3)}


def test_a_loader_goes_on_when_its_retiring_worker_is_killed_holding_tasks(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.touch()
    options: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 9, "num_workers": 2, "prefetch": 2}
    with FastLoader(SecondWorkerGated(gate), **options) as loader:
        fixed = _epochs(loader, 1, lambda pipeline, k: None)
    killed: list[int] = []

    def turn(pipeline: Pipeline, k: int) -> None:
        if k < 1 or killed:
            return
        engine = _engine(pipeline)
        victim = next(w for w in engine._workers.values() if w.worker_id == 1)
        if not victim.tasks:  # not up yet (a loaded machine), or between tasks: a later batch
            return
        gate.unlink()  # worker 1 finishes the sample it is on, then holds its task
        assert pipeline.set_workers(1) == 1 and victim.retiring
        os.kill(victim.process.pid, signal.SIGKILL)
        killed.append(victim.process.pid)

    try:
        with FastLoader(SecondWorkerGated(gate), **options) as loader:
            tuned = _epochs(loader, 1, turn)
            engine = _engine(loader._runs.pipeline)  # type: ignore[arg-type]
            assert killed, "worker 1 never held a task at a batch boundary"
            assert killed[0] not in engine.worker_pids and not pid_alive(killed[0])
            assert engine.active_workers == 1 and len(engine.worker_pids) == 1  # not replaced
            assert engine.deaths[Cause.EXTERNAL] == 1
    finally:
        gate.touch()
    _assert_same(fixed, tuned)
    assert sorted(torch.cat([batch[0] for batch in tuned]).tolist()) == list(range(96))


def _slot_spans(ring: Ring) -> list[tuple[int, int]]:
    spans = []
    for segment in ring.segments.values():
        start = ctypes.addressof(ctypes.c_char.from_buffer(segment.buf))
        spans.append((start, start + segment.size))
    return spans


def _mapped_by(pid: int, names: set[str]) -> set[str]:
    with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
        text = f.read()
    return {name for name in names if name in text}


def test_batches_in_flight_moved_mid_epoch(image_folder: Path) -> None:
    options: dict[str, Any] = {
        "batch_size": 2, "shuffle": True, "seed": 3, "num_workers": 2, "device": "cpu",
        "transform": [T.RandomResizedCrop(24)], "backend": "native", "prefetch": 2,
    }
    with FastLoader(image_folder, **options) as loader:
        fixed = _epochs(loader, 2, lambda pipeline, k: None)
    held: list[Any] = []
    checked: list[str] = []

    def ring_is_the_shm(pipeline: Pipeline) -> None:
        assert pipeline.ring is not None
        mine = fastload_segments(os.getpid()) - {pipeline.stats.segment.name}
        assert mine == {s.name for s in pipeline.ring.segments.values()}

    def turn(pipeline: Pipeline, k: int) -> None:
        ring = pipeline.ring
        if ring is None or k not in (1, 12, 16) or f"at {k}" in checked:
            return
        checked.append(f"at {k}")
        if k == 1:  # grow
            wanted = min(8 + EXTRA_SLOTS, ring_ceiling_slots(ring.slot_bytes, len(ring)))
            resized = pipeline.set_in_flight(8)
            assert len(ring) == wanted and resized.limit == min(8, wanted - EXTRA_SLOTS)
            assert pipeline.window.limit == resized.limit
            ring_is_the_shm(pipeline)
        elif k == 12:  # shrink while the user holds batches, every slot written by now
            before = len(ring)
            names = {s.name for s in ring.segments.values()}
            mapped = set().union(*(_mapped_by(pid, names) for pid in pipeline.worker_pids))
            resized = pipeline.set_in_flight(1)
            assert resized.limit == 1 == pipeline.window.limit
            assert EXTRA_SLOTS + 1 <= len(ring) < before
            for batch in held:  # the slots under the user's batches are all still there
                ptr = batch[0].data_ptr()
                assert any(lo <= ptr < hi for lo, hi in _slot_spans(ring))
            ring_is_the_shm(pipeline)
            gone = names - {s.name for s in ring.segments.values()}
            assert gone & mapped, "no slot let go of was mapped by a worker"
            for pid in pipeline.worker_pids:  # the workers let go of them: memory comes back
                assert wait_until(lambda pid=pid: not _mapped_by(pid, gone), WAIT_S)
        elif k == 16:  # and up again
            assert pipeline.set_in_flight(4).limit == 4
            ring_is_the_shm(pipeline)

    with FastLoader(image_folder, **options) as loader:
        tuned = _epochs(loader, 2, turn, keep=held)
        assert checked == ["at 1", "at 12", "at 16"]
        assert sum(_engine(loader._runs.pipeline).deaths.values()) == 0  # type: ignore[arg-type]
        held.clear()
    _assert_same(fixed, tuned)


@pytest.fixture
def daemon_style_engine(image_folder: Path) -> Iterator[tuple[Engine, ImageJob, Ring, str]]:
    """An engine with no job forked in, as a daemon's: its job comes later, as JSON, its index
    shared through a segment (the name given with it)."""
    job = ImageJob(
        scan_image_folder(image_folder), T.compile_transforms([T.Resize((16, 16))]), "native", 1, 4
    )
    assert job.layout is not None
    index_segment = job.index.to_segment()
    engine = Engine({}, num_workers=1, mp_context=None, worker_init_fn=None)
    ring = Ring(job.layout.slot_bytes, 2)
    try:
        yield engine, job, ring, index_segment.name
    finally:
        engine.close()
        ring.close()
        index_segment.close()


def test_a_worker_added_after_add_job_is_told_the_job_and_its_layout(
    daemon_style_engine: tuple[Engine, ImageJob, Ring, str],
) -> None:
    engine, job, ring, index_name = daemon_style_engine
    assert job.layout is not None
    engine.add_job(7, job.to_config(index_name))
    engine.set_layout(job.layout, 7)
    added = engine.add_worker()
    assert added == 1 and engine.active_workers == 2
    indices = np.arange(4, dtype=np.int64)
    for seq, (worker, slot) in enumerate(zip((0, added), ring.segments, strict=True)):
        engine.submit(Task(seq, 0, 0, indices, ring.name(slot), job_id=7, worker=worker))
    events = _poll_until(engine, lambda ev: len(ev) >= 2)
    assert all(isinstance(e, Done) for e in events), events
    first, second = (bytes(ring.segments[s].buf) for s in ring.segments)
    assert any(first) and first == second  # the added worker ran the job, under its layout
