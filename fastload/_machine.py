"""What this process may use of its machine, and whether another process still lives: the cores
it may run on, the shared-memory directory, `pid_alive`; the one place every part (loader,
daemon, diagnostics) reads them from."""

from __future__ import annotations

import os

# Where shared-memory segments live (POSIX shm on Linux): tmpfs, sized by the host or container.
SHM_DIR = "/dev/shm"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or taskset's cpuset),
    not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (someone else's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
