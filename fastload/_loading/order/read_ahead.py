"""Read-ahead from the epoch plan: the chunks of an epoch's next batches fetched into the node
cache (NOTE [node cache]) by the trainer's process while the workers decode the current ones.

NOTE [read-ahead]: the order of an epoch is known from (seed, epoch), so nothing has to be
guessed. A thread walks the plan's batches in order and hands each chunk they touch (once per
epoch) to a pool of download threads (`FASTLOAD_REMOTE_REQUESTS`, 16 by default), without
waiting for one batch's chunks before asking for the next's: the requests stay in flight back to
back, which is what hides a store's latency (a block shuffle's window of batches lies in a few
chunks, the next window in others; fetched a batch at a time, every window would wait out a
round trip). The walk stops `AHEAD_BATCHES` batches past the last one delivered, and sooner
where the chunks it asked for past that one add up to `budget` bytes (a quarter of the cache's
limit, at most `AHEAD_BYTES`): under a full shuffle of a dataset much larger than a chunk, every
sample of a batch lies in another chunk, and 32 batches would be thousands of chunks. A chunk is
claimed like any download, so a worker that needs it waits for it instead of fetching it again.
Only for indexes of remote objects; a failed read-ahead is no error (the worker that needs the
chunk fetches it, and says why if it cannot). A daemon reads ahead the same way, from each
session's tasks as they arrive (`TaskReadAhead`): what a trainer asks for is its plan, as far
ahead as its ring.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from fastload._errors import ConfigError
from fastload.sources._indexes.sample_index import RemoteCapable, remote_reads

# How many batches past the last one delivered the walk runs (NOTE [what "prefetch" names] in
# `slots.ring_plan`). Not the in-flight window: read-ahead holds no slot, only node-cache space,
# and a store's round trip is longer than a decode, so it runs past a typical window (workers + 1
# to two per worker); under a full shuffle the byte budget, not this count, usually stops it.
AHEAD_BATCHES = 32
AHEAD_BYTES = 2 << 30
DEFAULT_REQUESTS = 16
REMEMBERED_CHUNKS = 4096  # chunks asked for, not asked again (then forgotten: `fetch` skips cached ones)


def max_requests() -> int:
    """Downloads one read-ahead keeps in flight: `FASTLOAD_REMOTE_REQUESTS`, else 16."""
    chosen = os.environ.get("FASTLOAD_REMOTE_REQUESTS", "")
    if not chosen:
        return DEFAULT_REQUESTS
    if not chosen.isdigit() or int(chosen) < 1:
        raise ConfigError(f"FASTLOAD_REMOTE_REQUESTS must be a positive integer, got {chosen!r}")
    return int(chosen)


class ReadAhead:
    """One epoch's read-ahead (`delivered` after each batch the trainer takes, which says the
    bytes it downloaded since the previous call; `stop`)."""

    def __init__(
        self, index: RemoteCapable, batches: Iterator[np.ndarray], ahead: int = AHEAD_BATCHES
    ) -> None:
        self._index = index
        self._cache = index.node_cache()
        self._batches = batches
        self._ahead = ahead
        self._budget = max(1, min(AHEAD_BYTES, self._cache.limit // 4))
        self._delivered = 0
        self._asked: dict[int, int] = {}  # bytes asked for by each batch walked and not yet delivered
        self._stopped = False
        self._downloaded = 0  # bytes, not yet reported by `delivered`
        self._wake = threading.Condition()
        requests = max_requests()
        self._pool = ThreadPoolExecutor(requests, "fastload-read-ahead")
        self._slots = threading.BoundedSemaphore(requests)  # requests in flight, not queued
        self._thread = threading.Thread(target=self._run, name="fastload-read-ahead", daemon=True)
        self._thread.start()

    def delivered(self) -> int:
        with self._wake:
            self._asked.pop(self._delivered, None)
            self._delivered += 1
            self._wake.notify()
            downloaded, self._downloaded = self._downloaded, 0
        return downloaded

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        seen: set[tuple[str, str, int, int]] = set()
        for k, batch in enumerate(self._batches):
            with self._wake:
                while not self._stopped and (
                    k >= self._delivered + self._ahead or sum(self._asked.values()) >= self._budget
                ):
                    self._wake.wait()
                if self._stopped:
                    return
            asked = 0
            with contextlib.suppress(Exception):
                for (url, size, version, chunk_bytes), chunk in self._index.remote_chunks(batch):
                    key = (url, version, chunk_bytes, chunk)
                    if key in seen:
                        continue
                    if len(seen) >= REMEMBERED_CHUNKS:  # a daemon session's many epochs: bounded
                        seen.clear()  # (asking again for a cached chunk costs a stat)
                    seen.add(key)
                    if not self._request(url, size, version, chunk_bytes, chunk):
                        return
                    asked += min(chunk_bytes, size - chunk * chunk_bytes)
            with self._wake:
                if k >= self._delivered:
                    self._asked[k] = asked

    def _request(self, url: str, size: int, version: str, chunk_bytes: int, chunk: int) -> bool:
        """Start one chunk's download once a request slot is free; False once stopped."""
        while not self._slots.acquire(timeout=0.1):
            if self._stopped:
                return False
        if self._stopped:
            self._slots.release()
            return False
        job = self._pool.submit(self._cache.fetch, url, version, size, chunk, chunk_bytes)
        job.add_done_callback(self._finished)
        return True

    def _finished(self, job: Future[int]) -> None:
        self._slots.release()
        if not job.cancelled() and job.exception() is None:
            with self._wake:
                self._downloaded += job.result()


class _Arriving:
    """Batches handed over as they arrive (a daemon session's tasks), iterated by a read-ahead's
    thread until `close`; past `MAX_WAITING` not yet walked, more are dropped (best effort)."""

    MAX_WAITING = 1024

    def __init__(self) -> None:
        self._queue: queue.Queue[np.ndarray] = queue.Queue(self.MAX_WAITING)
        self._closed = threading.Event()

    def put(self, batch: np.ndarray) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(batch)

    def close(self) -> None:
        self._closed.set()

    def __iter__(self) -> Iterator[np.ndarray]:
        while not self._closed.is_set():
            with contextlib.suppress(queue.Empty):
                yield self._queue.get(timeout=0.1)


class TaskReadAhead(ReadAhead):
    """A daemon session's read-ahead: its trainer's tasks are the plan, in the order they arrive
    (`ask`, never blocking the daemon's loop); `delivered` as each task's event goes back. The
    trainer sends tasks as far ahead as its ring's slots, so that is how far this reads ahead."""

    def __init__(self, index: RemoteCapable) -> None:
        self._arriving = _Arriving()
        super().__init__(index, iter(self._arriving))

    def ask(self, batch: np.ndarray) -> None:
        self._arriving.put(batch)

    def stop(self) -> None:
        self._arriving.close()
        super().stop()


def task_read_ahead(index: Any) -> TaskReadAhead | None:
    """A daemon session's read-ahead over `index`, or None when its data is local."""
    remote = remote_reads(index)
    return None if remote is None else TaskReadAhead(remote)


def read_ahead(index: Any, batches: Iterator[np.ndarray]) -> ReadAhead | None:
    """A read-ahead for `index`'s epoch of `batches`, or None when its data is local."""
    remote = remote_reads(index)
    return None if remote is None else ReadAhead(remote, batches)
