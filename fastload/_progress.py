"""Progress lines for people: redrawn in place on a terminal, plain lines at a modest rate
anywhere else.

NOTE [progress lines]: a `\r` redraw is for a terminal only. Written to a file, a CI log or a
pipe (`tools/test.sh | tee`), every redraw of a line lands in one endless line. So a
`ProgressLine` asks its stream once whether it is a TTY: there it redraws at most every
`tty_every` seconds; elsewhere it writes an ordinary line at most every `plain_every` seconds
(and `done` always writes the final one). Every progress report of fastload (pack, its
upload, verify, the demo) goes through one.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

TTY_EVERY_S = 0.25
PLAIN_EVERY_S = 5.0


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (False for anything that cannot say)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


class ProgressLine:
    """One progress line on `stream` (default: stderr), see NOTE [progress lines]."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty_every: float = TTY_EVERY_S,
        plain_every: float = PLAIN_EVERY_S,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = is_terminal(self.stream)
        self.every = tty_every if self.tty else plain_every
        self._last = time.monotonic()
        self._width = 0  # of the line drawn now on a terminal (0: none)

    def due(self) -> bool:
        """Whether `update` would show a line now (so a caller may skip composing one)."""
        return time.monotonic() - self._last >= self.every

    def update(self, line: str) -> None:
        """Show `line` as the progress so far, if the last one was shown long enough ago."""
        if not self.due():
            return
        self._last = time.monotonic()
        if self.tty:
            self.stream.write("\r" + line.ljust(self._width))
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self, line: str) -> None:
        """Show `line` now as a line that stays (the final figure, or a note such as "resuming");
        the next `update` starts a new line."""
        if self.tty:
            self.stream.write("\r" + line.ljust(self._width) + "\n")
            self._width = 0
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self._last = time.monotonic()
