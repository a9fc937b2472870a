"""Shared-memory segments: create (0600, unguessable names), attach, unlink, reap, pre-flight.

Segments are files in /dev/shm named `fastload_<owner pid>_<128 random bits>`, created with
O_EXCL and mode 0600 and mapped with mmap. Only the creating process unlinks them (on close, on
an exception, on SIGINT/SIGTERM through `install_signal_cleanup`); a process killed with SIGKILL
cannot, so every new owner first reaps the segments of owners that no longer exist.

NOTE [no multiprocessing.shared_memory]: its resource_tracker unlinks segments it did not create
(CPython bpo-39959) and starts a tracker process per interpreter; plain files in /dev/shm give the
same mapping with ownership rules we control.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import signal
import stat
import threading
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

from fastload._errors import SharedMemoryError

SHM_DIR = "/dev/shm"
PREFIX = "fastload_"
_NAME_RE = re.compile(r"^fastload_(\d+)_(?:stats_)?[0-9a-f]{32}$")
STATS_TAG = "stats_"  # marks a loader's statistics block (see fastload._stats), found by iostat
# Head-room kept free in /dev/shm beyond what the ring needs (other users of shm, page rounding).
_SHM_MARGIN_BYTES = 64 << 20


class Segment:
    """One shared-memory mapping; the creator owns (and eventually unlinks) its file."""

    def __init__(self, name: str, size: int, mapping: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.size = size
        self.buf = mapping
        self.owner = owner
        self._closed = False
        if owner:
            _live_segments.add(self)

    @classmethod
    def create(cls, size: int, tag: str = "") -> Segment:
        """Create a new 0600 segment of `size` bytes, zero-filled, and map it.

        `tag` ("" or STATS_TAG) goes before the random part of the name, so readers can find
        segments of one kind without opening the others.
        """
        name = f"{PREFIX}{os.getpid()}_{tag}{secrets.token_hex(16)}"
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise SharedMemoryError(f"cannot create shared memory {path}: {e}") from e
        try:
            os.fchmod(fd, 0o600)  # umask cannot widen it, but make the mode explicit
            os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise SharedMemoryError(
                f"cannot size shared memory {path} to {size} bytes: {e}; "
                "is /dev/shm full? (see `df -h /dev/shm`)"
            ) from e
        os.close(fd)
        return cls(name, size, mapping, owner=True)

    @classmethod
    def attach(cls, name: str, populate: bool = False) -> Segment:
        """Map an existing segment by name (never unlinks it).

        `populate` faults every page in now, in one call (MAP_POPULATE): what a writer wants
        before writing a whole slot, rather than one trap per page mid-batch.
        """
        if not _NAME_RE.match(name):
            raise SharedMemoryError(f"{name!r} is not a fastload shared-memory segment name")
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            raise SharedMemoryError(f"cannot attach shared memory {path}: {e}") from e
        try:
            size = os.fstat(fd).st_size
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            mapping = mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(name, size, mapping, owner=False)

    def close(self) -> None:
        """Unmap (when no exported buffer is alive) and, if this process created it, unlink."""
        if self._closed:
            return
        self._closed = True
        if self.owner:
            unlink(self.name)
            _live_segments.discard(self)
        # Views (numpy arrays, tensors) handed out may still be alive; then the mapping stays
        # until they die and the garbage collector frees it.
        with contextlib.suppress(BufferError):
            self.buf.close()


def unlink(name: str) -> None:
    """Remove a segment's file; a missing file is not an error."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (someone else's counts too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def own_segments() -> Iterator[tuple[os.DirEntry[str], int]]:
    """This user's fastload segments in /dev/shm, each with the pid of the process that made it."""
    try:
        entries = list(os.scandir(SHM_DIR))
    except OSError:
        return
    uid = os.getuid()
    for entry in entries:
        match = _NAME_RE.match(entry.name)
        if not match:
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        yield entry, int(match.group(1))


def reap_orphans() -> list[str]:
    """Unlink this user's segments whose creating process is gone; return their names."""
    reaped: list[str] = []
    for entry, owner in own_segments():
        if not pid_alive(owner):
            unlink(entry.name)
            reaped.append(entry.name)
    return reaped


def _in_container() -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    try:
        with open("/proc/1/cgroup", encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return False
    return any(word in text for word in ("docker", "kubepods", "containerd", "lxc"))


def preflight(required_bytes: int) -> None:
    """Raise SharedMemoryError, saying how big /dev/shm must be, if the ring cannot fit."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError as e:
        raise SharedMemoryError(f"{SHM_DIR} is not available ({e}); fastload needs it") from e
    free = st.f_bavail * st.f_frsize
    total = st.f_blocks * st.f_frsize
    if free >= required_bytes + _SHM_MARGIN_BYTES:
        return
    need_mib = (required_bytes + _SHM_MARGIN_BYTES + (1 << 20) - 1) >> 20
    hint = (
        f"run the container with --shm-size={max(need_mib, (total >> 20) + need_mib)}m"
        if _in_container()
        else "free space in /dev/shm or remount it larger (mount -o remount,size=...)"
    )
    raise SharedMemoryError(
        f"the batch ring needs {required_bytes / 2**20:.0f} MiB of shared memory "
        f"(plus {_SHM_MARGIN_BYTES >> 20} MiB head-room) but {SHM_DIR} has "
        f"{free / 2**20:.0f} MiB free of {total / 2**20:.0f} MiB: {hint}, "
        "or lower batch_size / prefetch"
    )


def is_private(name: str) -> bool:
    """True when the segment's file is mode 0600 (no group or other access)."""
    mode = os.stat(os.path.join(SHM_DIR, name)).st_mode
    return stat.S_IMODE(mode) == 0o600


# Segments this process created and has not yet unlinked: the signal handler's work list.
_live_segments: weakref.WeakSet[Segment] = weakref.WeakSet()
_handler_lock = threading.Lock()
_previous_handlers: dict[int, Any] = {}


def _cleanup_and_reraise(signum: int, frame: FrameType | None) -> None:
    for segment in list(_live_segments):
        unlink(segment.name)
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    if signum == signal.SIGINT and previous == signal.default_int_handler:
        raise KeyboardInterrupt
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_signal_cleanup() -> None:
    """Unlink this process's segments on SIGTERM (and SIGINT), then behave as before.

    Installed once, lazily, from the main thread only; a handler the program already set is
    chained, not replaced.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    with _handler_lock:
        for signum in (signal.SIGTERM, signal.SIGINT):
            if signum in _previous_handlers:
                continue
            previous = signal.getsignal(signum)
            if previous == signal.SIG_IGN:
                continue
            _previous_handlers[signum] = previous
            signal.signal(signum, _cleanup_and_reraise)
