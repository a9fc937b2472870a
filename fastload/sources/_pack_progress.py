"""`fastload pack`'s progress on stderr: samples done, MB/s and the time left, as one line
updated in place on a terminal, else a line every few seconds."""

from __future__ import annotations

import time
from typing import TextIO


class Progress:
    """One stderr line updated in place on a terminal, else a line every few seconds."""

    def __init__(self, total: int, where: str, stream: TextIO) -> None:
        self.total = total
        self.where = where
        self.stream = stream
        self.tty = stream.isatty()
        self.every = 0.25 if self.tty else 5.0
        self.started = self.last = time.monotonic()
        self.first = 0
        self.done = 0
        self.bytes = 0
        self.width = 0

    def begin(self, done: int) -> None:
        self.first = self.done = done
        if done:
            self._emit(f"fastload pack: resuming {self.where} at sample {done:,} of {self.total:,}", True)

    def update(self, done: int, nbytes: int) -> None:
        self.done = done
        self.bytes += nbytes
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self._emit(self._line(now), False)

    def end(self) -> None:
        self._emit(self._line(time.monotonic()), True)

    def _line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = (self.done - self.first) / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta != float("inf") else "?"
        return (
            f"fastload pack: {self.done:,}/{self.total:,} samples, {self.bytes / elapsed / 1e6:.1f} MB/s, "
            f"ETA {eta_text}"
        )

    def _emit(self, line: str, final: bool) -> None:
        if self.tty:
            self.stream.write("\r" + line.ljust(self.width) + ("\n" if final else ""))
            self.width = 0 if final else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
