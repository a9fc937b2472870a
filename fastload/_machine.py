"""What this process may use of its machine, and how it fares there: the cores it may use,
the shared-memory directory, whether another process still lives, and how long this thread has
waited for a CPU; the one place every part (loader, daemon, diagnostics) reads them from."""

from __future__ import annotations

import os

from fastload._cpu_quota import own_cpu_limit, quota_cores

# Where shared-memory segments live (POSIX shm on Linux): tmpfs, sized by the host or container.
SHM_DIR = "/dev/shm"


def usable_cores() -> int:
    """The cores this process may use: its CPU affinity (a container's or taskset's cpuset), not
    the machine's count, and no more than a cgroup's CPU quota allows, rounded down (NOTE [a
    container's CPU quota] in `_cpu_quota`)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    quota = quota_cores(own_cpu_limit())
    return cores if quota is None else min(cores, quota)


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (someone else's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def thread_run_delay_ns(path: str = "/proc/thread-self/schedstat") -> int | None:
    """Nanoseconds the calling thread has spent runnable but waiting for a CPU, so far.

    The second field of the kernel's per-task schedstat ("time spent waiting on a runqueue"):
    on a machine with more runnable tasks than cores it grows as fast as the wall clock while
    the task waits its turn. None where the kernel does not report it (no CONFIG_SCHED_INFO).
    Cheap enough to read twice per batch (one open, one read of a few bytes).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fields = os.read(fd, 128).split()
        return int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def run_delay_since(before: int | None) -> int:
    """The calling thread's run-queue delay since `before` (a `thread_run_delay_ns()`); 0 unknown."""
    after = thread_run_delay_ns() if before is not None else None
    return max(0, after - before) if after is not None and before is not None else 0
