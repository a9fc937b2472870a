"""Read-ahead from the epoch plan (NOTE [read-ahead]): requests stay in flight across batches,
each chunk is asked for once, and the walk stops where the batch and byte bounds say."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from fastload._loading.order import read_ahead as ra

CHUNK = 1000


class _SlowStore:
    """A node cache stand-in whose downloads take `delay_s`; it records what was asked, when."""

    def __init__(self, limit: int, delay_s: float = 0.5) -> None:
        self.limit = limit
        self.delay_s = delay_s
        self.asked: list[int] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self._lock = threading.Lock()

    def fetch(self, url: str, version: str, size: int, chunk: int, chunk_bytes: int) -> int:
        with self._lock:
            self.asked.append(chunk)
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(self.delay_s)
        with self._lock:
            self.in_flight -= 1
        return chunk_bytes


class _ChunkedIndex:
    """Samples 0..n-1, ten to a chunk of one remote object: a `RemoteCapable` index (every member
    of the protocol, as an index must have to be read ahead)."""

    remote = True

    def __init__(self, store: _SlowStore, samples: int) -> None:
        self.store = store
        self.size = samples // 10 * CHUNK
        self.remote_bytes = self.size
        self.remote_chunk_count = samples // 10

    def node_cache(self) -> _SlowStore:
        return self.store

    def remote_chunks(self, indices: np.ndarray) -> list[tuple[tuple[str, int, str, int], int]]:
        remote = ("s3://bucket/data", self.size, "etag", CHUNK)
        return [(remote, c) for c in sorted({int(i) // 10 for i in indices})]


def _wait_for(condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_requests_stay_in_flight_across_batches_and_each_chunk_is_asked_once() -> None:
    store = _SlowStore(limit=1 << 30)
    # Batches of a block shuffle: each touches one chunk, some chunks touched by two batches.
    batches = [np.arange(10 * c, 10 * c + 10) for c in range(40)] + [np.arange(0, 10)]
    reader = ra.ReadAhead(_ChunkedIndex(store, 400), iter(batches), ahead=32)
    try:
        _wait_for(lambda: len(store.asked) == 32 and store.in_flight == 0)
        assert store.asked == list(range(32))  # in the plan's order, 32 batches ahead, no further
        assert store.most_in_flight == ra.DEFAULT_REQUESTS  # not one batch's chunk at a time
        for _ in range(10):
            reader.delivered()
        _wait_for(lambda: len(store.asked) == 40 and store.in_flight == 0)
        time.sleep(0.2)
        assert store.asked == list(range(40))  # the last batch's chunk 0 was asked for already
    finally:
        reader.stop()


def test_the_walk_stops_at_its_byte_budget() -> None:
    store = _SlowStore(limit=20 * CHUNK, delay_s=0.0)  # budget: a quarter of the limit, 5 chunks
    batches = [np.arange(10 * c, 10 * c + 10) for c in range(40)]
    reader = ra.ReadAhead(_ChunkedIndex(store, 400), iter(batches), ahead=32)
    try:
        _wait_for(lambda: len(store.asked) == 5)
        time.sleep(0.2)
        assert len(store.asked) == 5
        reader.delivered()
        _wait_for(lambda: len(store.asked) == 6)
        time.sleep(0.2)
        assert store.asked == list(range(6))
    finally:
        reader.stop()


def test_a_daemon_session_reads_ahead_of_its_tasks_as_they_arrive() -> None:
    store = _SlowStore(limit=1 << 30, delay_s=0.0)
    reader = ra.task_read_ahead(_ChunkedIndex(store, 400))
    assert reader is not None
    try:
        for c in (3, 1, 3, 7):  # tasks in the trainer's order; chunk 3 asked for once
            reader.ask(np.arange(10 * c, 10 * c + 10))
        _wait_for(lambda: len(store.asked) == 3)
        assert store.asked == [3, 1, 7]
        reported: list[int] = []

        def all_reported() -> bool:
            reported.append(reader.delivered())  # an event: the bytes fetched since the last one
            return sum(reported) == 3 * CHUNK

        _wait_for(all_reported)  # each fetch's bytes reported once, by whichever event came next
        assert reader.delivered() == 0
    finally:
        reader.stop()
    assert not reader._thread.is_alive()


def test_local_data_has_no_read_ahead() -> None:
    class Local:
        remote = False

    assert ra.read_ahead(Local(), iter([])) is None
