"""`fastload pack`'s progress on stderr: samples done, MB/s and the time left, as one line
updated in place on a terminal, else a plain line every few seconds (NOTE [progress lines])."""

from __future__ import annotations

import time
from typing import TextIO

from fastload._progress import ProgressLine


class Progress:
    """The pack's progress line: samples, MB/s and time left."""

    def __init__(self, total: int, where: str, stream: TextIO) -> None:
        self.total = total
        self.where = where
        self.line = ProgressLine(stream)
        self.started = time.monotonic()
        self.first = 0
        self.done = 0
        self.bytes = 0

    def begin(self, done: int) -> None:
        self.first = self.done = done
        if done:
            self.line.done(f"fastload pack: resuming {self.where} at sample {done:,} of {self.total:,}")

    def update(self, done: int, nbytes: int) -> None:
        self.done = done
        self.bytes += nbytes
        if self.line.due():
            self.line.update(self._line(time.monotonic()))

    def end(self) -> None:
        self.line.done(self._line(time.monotonic()))

    def _line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = (self.done - self.first) / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
        return (
            f"fastload pack: {self.done:,}/{self.total:,} samples, {self.bytes / elapsed / 1e6:.1f} MB/s, "
            f"ETA {eta_text}"
        )
