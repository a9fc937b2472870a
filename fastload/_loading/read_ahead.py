"""Read-ahead from the epoch plan: the chunks of an epoch's next batches fetched into the node
cache (NOTE [node cache]) by the trainer's process while the workers decode the current ones.

The order of an epoch is known from (seed, epoch), so nothing has to be guessed: a thread walks
the plan's batches at most `ahead` batches past the last one delivered and asks the source's index
to `prefetch` each (the chunks it touches that are not cached yet, claimed as any download is, so
a worker needing one waits for it instead of fetching it again). Only for indexes of remote
objects; a failed read-ahead is no error (the worker that needs the chunk fetches it, and says
why if it cannot).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

AHEAD_BATCHES = 32


class ReadAhead:
    """One epoch's read-ahead thread (`delivered` after each batch the trainer takes; `stop`)."""

    def __init__(self, index: Any, batches: Iterator[np.ndarray], ahead: int = AHEAD_BATCHES) -> None:
        self._index = index
        self._batches = batches
        self._ahead = ahead
        self._delivered = 0
        self._stopped = False
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="fastload-read-ahead", daemon=True)
        self._thread.start()

    def delivered(self) -> None:
        with self._wake:
            self._delivered += 1
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        for k, batch in enumerate(self._batches):
            with self._wake:
                while not self._stopped and k >= self._delivered + self._ahead:
                    self._wake.wait()
                if self._stopped:
                    return
            with contextlib.suppress(Exception):
                self._index.prefetch(batch)


def read_ahead(index: Any, batches: Iterator[np.ndarray]) -> ReadAhead | None:
    """A read-ahead for `index`'s epoch of `batches`, or None when its data is local."""
    if not getattr(index, "remote", False):
        return None
    return ReadAhead(index, batches)
