"""What a daemon session's trainer tells its daemon about its need (NOTE [need reports] in
`daemon_link`): the fraction of time it waited for the daemon's batches, and how many it holds
decoded and not yet taken, at most every NEED_EVERY_S and only when they changed.

The wait is measured where the trainer waits for the daemon: the session's `poll`, which only
`next()` calls with a timeout, while its batch is not ready. It is the part of the statistics
block's `trainer_wait` the daemon can shorten (not the trainer's own copy or normalize).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastload._loading.link.daemon_link import NEED_EVERY_S

_STEPS = 20  # the wait is reported in steps of 1/20: a change smaller than that is no news


class NeedReport:
    """One session's waits and ready slots, and the `need` message when one is due."""

    def __init__(self, clock: Callable[[], float], every_s: float = NEED_EVERY_S) -> None:
        self.enabled = False  # until the daemon's status shows it reads `need` (NOTE [need reports])
        self._clock = clock
        self._every_s = every_s
        self._since = clock()
        self._waited_s = 0.0
        self._open: dict[str, int] = {}  # slot -> its tasks not yet done
        self._slot_of: dict[int, str] = {}  # seq -> its slot
        self._ready: set[str] = set()  # slots whose tasks are all done, not yet sent into again
        self._sent: tuple[float, int] | None = None

    def enable_if_read(self, status: dict[str, Any], session: int) -> None:
        """Report from now on if `status` (a `status_reply`) shows `need` in our session's row."""
        rows = status.get("sessions")
        rows = rows if isinstance(rows, list) else []
        mine = [r for r in rows if isinstance(r, dict) and r.get("session") == session]
        enabled = bool(mine) and "need" in mine[0]
        if enabled and not self.enabled:  # the first report covers the time from now
            self._since, self._waited_s = self._clock(), 0.0
        self.enabled = enabled

    def waited(self, seconds: float) -> None:
        self._waited_s += max(0.0, seconds)

    def sent(self, seq: int, slot: str) -> None:
        """A task into `slot` was sent: the slot's batch is no longer ready."""
        self._slot_of[seq] = slot
        self._open[slot] = self._open.get(slot, 0) + 1
        self._ready.discard(slot)

    def finished(self, seq: int) -> None:
        slot = self._slot_of.pop(seq, None)
        if slot is None:
            return
        self._open[slot] -= 1
        if not self._open[slot]:
            del self._open[slot]
            self._ready.add(slot)

    @property
    def ready(self) -> int:
        """Slots decoded and not yet sent into again (a slot the trainer took and has not reused,
        at an epoch's end, still counts: the figure is a hint, the wait is the measure)."""
        return len(self._ready)

    def due(self) -> dict[str, Any] | None:
        """The `need` fields to send now, or None (not enabled, too soon, or nothing changed)."""
        now = self._clock()
        elapsed = now - self._since
        if not self.enabled or elapsed < self._every_s:
            return None
        wait = round(min(1.0, self._waited_s / elapsed) * _STEPS) / _STEPS
        self._since, self._waited_s = now, 0.0
        figures = (wait, self.ready)
        if figures == self._sent:
            return None
        self._sent = figures
        return {"wait": wait, "ready": self.ready}
