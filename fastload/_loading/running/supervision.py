"""Why a worker died, whom to blame, and how long a task may run before it counts as hung.

NOTE [blame]: a task is blamed (and after `MAX_STRIKES` failed on purpose, so that a sample that
crashes the decoder cannot loop forever) only for deaths it can have caused:
- the worker *crashed*: a crash signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS,
  SIGTRAP), an exit status of its own (`os._exit`, `sys.exit` in a Dataset), or a SIGKILL while
  the kernel's OOM-kill counter (/proc/vmstat `oom_kill`) went up: the OOM killer;
- the worker *hung*: the engine killed it because its task ran past the hang bound.
A SIGKILL or SIGTERM from outside (an operator, a job scheduler, a chaos test) is *external*: the
tasks the worker held are simply run again, nobody is blamed. And a task is only charged when it
ran alone on its worker, so that a death among several tasks never condemns the wrong one (they
are re-run one per worker first: "suspects").

NOTE [hang bound]: a task may run for max(floor, 20 x the slowest per-sample time seen in the
last 256 tasks x its samples), doubled for each earlier hang of the same task. The floor is
`hang_timeout` (default 120 s); 0 turns hang detection off. Generous on purpose: killing a worker
that was merely slow costs a batch, missing a hang costs the run.
"""

from __future__ import annotations

import enum
import signal
from collections import deque

from fastload._errors import WorkerError
from fastload._loading.jobs.executor import Failure, Task

MAX_STRIKES = 3
DEFAULT_HANG_FLOOR_S = 120.0
_HANG_FACTOR = 20.0
_RECENT_TASKS = 256

_CRASH_SIGNALS = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGILL,
        signal.SIGFPE,
        signal.SIGABRT,
        signal.SIGSYS,
        signal.SIGTRAP,
    }
)


class Cause(enum.Enum):
    """Why a worker process ended (see NOTE [blame])."""

    CRASH = "crashed"
    HANG = "hung"
    EXTERNAL = "was killed from outside"


def oom_kill_count() -> int:
    """The kernel's count of OOM kills since boot (-1 where /proc/vmstat does not say)."""
    try:
        with open("/proc/vmstat", encoding="ascii") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return -1


def classify(exitcode: int, *, hung: bool, oom_kills_before: int, oom_kills_now: int) -> Cause:
    """The cause of a worker's death from its exit code and what the engine knows."""
    if hung:
        return Cause.HANG
    if exitcode >= 0:
        return Cause.CRASH  # it exited by itself: nothing outside makes a process call exit()
    signum = -exitcode
    if signum in _CRASH_SIGNALS:
        return Cause.CRASH
    if signum == signal.SIGKILL and 0 <= oom_kills_before < oom_kills_now:
        return Cause.CRASH  # the OOM killer: the sample being loaded may well be the reason
    return Cause.EXTERNAL


def describe_exit(exitcode: int) -> str:
    """'exit code 3' or 'signal SIGKILL'."""
    if exitcode >= 0:
        return f"exit code {exitcode}"
    try:
        return f"signal {signal.Signals(-exitcode).name}"
    except ValueError:
        return f"signal {-exitcode}"


class HangBound:
    """Per-sample run times of recent tasks, and the time a task may run before it is hung."""

    def __init__(self, floor_s: float | None) -> None:
        self.floor_s = DEFAULT_HANG_FLOOR_S if floor_s is None else float(floor_s)
        self._per_sample: deque[float] = deque(maxlen=_RECENT_TASKS)

    @property
    def enabled(self) -> bool:
        return self.floor_s > 0

    def record(self, seconds: float, samples: int) -> None:
        """A task of `samples` samples ran `seconds` on its worker."""
        self._per_sample.append(seconds / max(1, samples))

    def limit_s(self, samples: int, earlier_hangs: int) -> float:
        slowest = max(self._per_sample, default=0.0)
        return max(self.floor_s, _HANG_FACTOR * slowest * samples) * 2.0**earlier_hangs


def charge(lost: list[Task], code: int, cause: Cause) -> tuple[Failure | None, list[Task]]:
    """Charge the tasks a dead worker held (in its order) with its death, only the one that can
    have caused it (NOTE [blame]). Returns the Failure of a task out of strikes (or None), and
    the tasks to run again, in order."""
    if lost and cause is Cause.HANG:
        running = lost[0]  # a worker runs its tasks in order: the first one hung
        running.hangs += 1
        running.strikes += 1
        running.suspect = True
    elif lost and cause is Cause.CRASH:
        for task in lost:
            task.suspect = True
        if len(lost) == 1:  # it held nothing else: this task killed it
            lost[0].strikes += 1
    if lost and lost[0].strikes >= MAX_STRIKES:
        return _failed(lost[0], code, cause), lost[1:]
    return None, lost


def _failed(task: Task, code: int, cause: Cause) -> Failure:
    if cause is Cause.HANG:
        what = f"hung {task.hangs} worker processes in a row (no reply within the hang bound)"
        hint = (
            "a sample may block forever (a stalled network filesystem?); "
            "raise hang_timeout if it is merely slow"
        )
    else:
        what = f"killed {task.strikes} worker processes in a row (last: {describe_exit(code)})"
        hint = "a sample probably crashes the decoder, or needs more memory than there is"
    return Failure(
        seq=task.seq,
        message=f"batch {task.batch_index} (samples {task.indices[:8].tolist()}...) {what}; {hint}",
        path="",
        index=int(task.indices[0]) if len(task.indices) else -1,
        exc_type=WorkerError.__name__,
        traceback="",
    )
