"""The executor contract (`_loading.jobs.executor.Executor`), held against all three executors: a pool
of worker processes (`Engine`), the trainer's own process (`InlineExecutor`) and a loader daemon's
session (`DaemonSession`). Each is given the same image-folder tasks.

Contract: every submitted task yields exactly one event, with its seq; a slot task's batch is
written into its slot, bit for bit the same whoever ran it (from row `row` on, for a split batch);
a sample that cannot be loaded is a `Failure` naming its file, and the executor goes on; `in_flight`
counts what was submitted and not yet returned; `poll` with nothing in flight returns nothing;
`close` may be called twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import numpy as np
import pytest
from daemon_helpers import DaemonProcess, hello_fields

from fastload import transforms as T
from fastload._loading.jobs.executor import Done, Event, Executor, Failure, Task
from fastload._loading.jobs.image_job import ImageJob
from fastload._loading.link.daemon_client import DaemonSession
from fastload._loading.running.engine import Engine
from fastload._loading.running.inline import InlineExecutor
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring import Ring
from fastload.sources._formats.folder import scan_image_folder

pytestmark = pytest.mark.timeout(120)

SIZE = 24
SLOTS = 6

Setup = tuple[Executor, Ring, BatchLayout]


def _job(folder: Path) -> ImageJob:
    plan = T.compile_transforms([T.Resize((SIZE, SIZE))])
    return ImageJob(scan_image_folder(folder), plan, "native", 1, 4)  # seed 1, batches of 4


@contextmanager
def _engine(folder: Path, daemon: DaemonProcess) -> Iterator[Setup]:
    job = _job(folder)
    assert job.layout is not None
    engine = Engine({0: job}, num_workers=2, mp_context=None, worker_init_fn=None)
    ring = Ring(job.layout.slot_bytes, SLOTS)
    try:
        engine.set_layout(job.layout)
        yield engine, ring, job.layout
    finally:
        engine.close()
        ring.close()


@contextmanager
def _inline(folder: Path, daemon: DaemonProcess) -> Iterator[Setup]:
    job = _job(folder)
    assert job.layout is not None
    ring = Ring(job.layout.slot_bytes, SLOTS)
    inline = InlineExecutor(job, ring.buffer)
    try:
        yield inline, ring, job.layout
    finally:
        inline.close()
        ring.close()


@contextmanager
def _daemon_session(folder: Path, daemon: DaemonProcess) -> Iterator[Setup]:
    session = DaemonSession(daemon.address, hello_fields(folder, prefetch=SLOTS - 2))
    ring = session.attach_ring()
    try:
        yield session, ring, session.layout
    finally:
        session.close()
        ring.close()


EXECUTORS: dict[str, Callable[[Path, DaemonProcess], AbstractContextManager[Setup]]] = {
    "engine": _engine,
    "inline": _inline,
    "daemon": _daemon_session,
}


def _collect(executor: Executor, want: int, timeout_s: float = 60.0) -> list[Event]:
    events: list[Event] = []
    deadline = time.monotonic() + timeout_s
    while len(events) < want and time.monotonic() < deadline:
        events += executor.poll(0.2)
    return events


def _slot_batch(ring: Ring, layout: BatchLayout, slot: int, rows: int) -> list[np.ndarray]:
    return [a[:rows].copy() for a in layout.arrays(ring.buffer(ring.name(slot)))]


def _run_batches(executor: Executor, ring: Ring, layout: BatchLayout) -> list[list[np.ndarray]]:
    """Batches 0..2 of epoch 0 (samples 0-3, 4-7, 8-11); batch 2 split in two tasks at row 2."""
    tasks = [
        Task(10, 0, 0, np.arange(0, 4), ring.name(0)),
        Task(11, 0, 1, np.arange(4, 8), ring.name(1)),
        Task(12, 0, 2, np.arange(8, 10), ring.name(2)),
        Task(13, 0, 2, np.arange(10, 12), ring.name(2), row=2),
    ]
    for task in tasks:
        executor.submit(task)
    assert executor.in_flight == len(tasks)
    events = _collect(executor, len(tasks))
    assert sorted(e.seq for e in events) == [10, 11, 12, 13], events
    assert all(isinstance(e, Done) and e.count == 2 + 2 * (e.seq < 12) for e in events), events
    assert executor.in_flight == 0
    assert executor.poll(0.05) == []  # nothing in flight: nothing comes
    return [_slot_batch(ring, layout, slot, 4) for slot in range(3)]


@pytest.fixture(scope="module")
def reference(image_folder: Path, shared_daemon: DaemonProcess) -> list[list[np.ndarray]]:
    with _inline(image_folder, shared_daemon) as (executor, ring, layout):
        return _run_batches(executor, ring, layout)


@pytest.mark.parametrize("kind", sorted(EXECUTORS))
def test_every_task_yields_one_event_and_the_same_batch(
    kind: str, image_folder: Path, shared_daemon: DaemonProcess, reference: list[list[np.ndarray]]
) -> None:
    with EXECUTORS[kind](image_folder, shared_daemon) as (executor, ring, layout):
        got = _run_batches(executor, ring, layout)
        assert executor.worker_pids == [] or len(executor.worker_pids) == 2
    for batch, want in zip(got, reference, strict=True):
        for array, expected in zip(batch, want, strict=True):
            np.testing.assert_array_equal(array, expected)


@pytest.mark.parametrize("kind", sorted(EXECUTORS))
def test_a_missing_file_is_a_failure_naming_it_and_work_goes_on(
    kind: str, make_folder: Callable[..., Path], shared_daemon: DaemonProcess
) -> None:
    folder = make_folder(classes=2, per_class=4)
    with EXECUTORS[kind](folder, shared_daemon) as (executor, ring, _layout):
        victim = sorted(folder.glob("*/*"))[5]
        os.unlink(victim)  # after indexing: sample 5 is gone
        executor.submit(Task(1, 0, 0, np.arange(4, 8), ring.name(0)))
        executor.submit(Task(2, 0, 1, np.arange(0, 4), ring.name(1)))
        events = {e.seq: e for e in _collect(executor, 2)}
    assert sorted(events) == [1, 2]
    failure = events[1]
    assert isinstance(failure, Failure) and failure.path == str(victim) and failure.index == 5, failure
    assert "FileNotFoundError" in failure.exc_type
    assert isinstance(events[2], Done) and events[2].count == 4


@pytest.mark.parametrize("kind", sorted(EXECUTORS))
def test_close_twice_is_safe(kind: str, image_folder: Path, shared_daemon: DaemonProcess) -> None:
    with EXECUTORS[kind](image_folder, shared_daemon) as (executor, _ring, _layout):
        executor.close()
    executor.close()
