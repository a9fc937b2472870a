"""What this process may use of its machine: the cores it may run on and the shared-memory
directory; the one place every part (loader, daemon, diagnostics) reads them from."""

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
