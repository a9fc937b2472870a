"""Shared-memory segments: create (0600, unguessable names), attach, unlink, reap, pre-flight.

Segments are files in /dev/shm named `fastload_<owner pid>_<128 random bits>`, created with
O_EXCL and mode 0600 and mapped with mmap. Only the creating process unlinks them (on close, on
an exception, on SIGINT/SIGTERM through `install_signal_cleanup`); a process killed with SIGKILL
cannot, so every new owner first reaps the segments of owners that no longer exist.

NOTE [no multiprocessing.shared_memory]: its resource_tracker unlinks segments it did not create
(CPython bpo-39959) and starts a tracker process per interpreter; plain files in /dev/shm give the
same mapping with ownership rules we control.

NOTE [one file descriptor per segment]: CPython's mmap object keeps a dup() of the file descriptor
it mapped for its whole life (for size() and resize()), so before Python 3.13 every mapped
segment -- every ring slot, in the trainer and in each worker that attached it -- holds one fd
open even though we close ours at once. A ring of 40 000 slots then needs 40 000 fds. From 3.13
`mmap.mmap(..., trackfd=False)` maps without the dup (we never call size() or resize()), and a
segment holds no fd. `ensure_fd_room` checks (and, up to the hard limit, raises) RLIMIT_NOFILE
before a ring is made; running out anyway is reported as "too many open files", not as a full
/dev/shm.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import resource
import secrets
import signal
import stat
import sys
import threading
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Any

from fastload._errors import SharedMemoryError
from fastload._machine import SHM_DIR, pid_alive

PREFIX = "fastload_"
_NAME_RE = re.compile(r"^fastload_(\d+)_(?:stats_)?[0-9a-f]{32}$")
STATS_TAG = "stats_"  # marks a loader's statistics block (_loading.running.stats), found by iostat
# Head-room kept free in /dev/shm beyond what the ring needs (other users of shm, page rounding):
# an eighth of the mount, at most 64 MiB, so Docker's default 64 MiB /dev/shm keeps 8 MiB and
# holds a ring of up to 56 MiB (issue 22: a fixed 64 MiB refused every loader there).
_SHM_MARGIN_MAX_BYTES = 64 << 20
_SHM_MARGIN_SHARE = 8


def shm_margin(total_bytes: int) -> int:
    """The head-room `preflight` keeps free in a /dev/shm of `total_bytes`."""
    return min(_SHM_MARGIN_MAX_BYTES, total_bytes // _SHM_MARGIN_SHARE)

# File descriptors a mapped segment keeps open for its whole life (see NOTE above).
FDS_PER_SEGMENT = 0 if sys.version_info >= (3, 13) else 1
# File descriptors kept free beyond what the ring needs (sockets, datasets' files, libraries).
FD_MARGIN = 64
_FD_ERRNOS = (errno.EMFILE, errno.ENFILE)


def _map(fd: int, size: int, flags: int) -> mmap.mmap:
    """Map `fd` read-write; from Python 3.13 the mapping keeps no duplicate of `fd`."""
    if sys.version_info >= (3, 13):
        return mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE, trackfd=False)
    return mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)


def _open_fd_count() -> int:
    """How many file descriptors this process has open now."""
    for fd_dir in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(len(os.listdir(fd_dir)) - 1, 0)  # listdir's own fd is in the listing
        except OSError:
            continue
    # No fd directory (an unusual /proc-less sandbox): probe the descriptors one by one.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = soft if 0 < soft < (1 << 20) else (1 << 20)
    count = 0
    for fd in range(top):
        try:
            os.fstat(fd)
        except OSError:
            continue
        count += 1
    return count


def _hard_ceiling(hard: int) -> int:
    """The highest soft RLIMIT_NOFILE this process may set (an unlimited hard limit still stops
    at the kernel's fs.nr_open)."""
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        with open("/proc/sys/fs/nr_open", encoding="ascii") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def _fmt_limit(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def _raise_soft_limit(want: int) -> bool:
    """Raise the soft RLIMIT_NOFILE to at least `want` (a little more, so that growing by one
    slot at a time does not call setrlimit every time), never above the hard limit. True when
    the soft limit is now at least `want`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return True
    ceiling = _hard_ceiling(hard)
    if want > ceiling:
        return False
    new_soft = min(ceiling, max(want, 2 * soft))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
    except (OSError, ValueError):
        try:  # a kernel ceiling we did not know of: ask for only what is needed
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (OSError, ValueError):
            return False
    return True


def ensure_fd_room(count: int) -> None:
    """Make sure this process can map `count` more segments without running out of file
    descriptors, raising the soft RLIMIT_NOFILE towards the hard limit if needed.

    Each mapped segment keeps FDS_PER_SEGMENT descriptors open (one before Python 3.13, none
    from 3.13, whose mmap does not keep a dup of the fd: creating or attaching a segment then
    only opens one fd for a moment, so there is nothing to reserve and this returns at once).
    Needed: the fds open now + count * FDS_PER_SEGMENT + FD_MARGIN. Processes forked or spawned
    afterwards inherit the raised limit. Counts /proc/self/fd, so call it once per ring or per
    batch of segments, not per batch of data.

    Raises SharedMemoryError ("too many open files ...") when even the hard limit is too small.
    """
    needed = count * FDS_PER_SEGMENT
    if needed <= 0:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return
    open_now = _open_fd_count()
    want = open_now + needed + FD_MARGIN
    if want <= soft or _raise_soft_limit(want):
        return
    raise SharedMemoryError(
        f"too many open files: the batch ring needs {needed} more file descriptors (one per "
        f"shared-memory slot on Python < 3.13; {open_now} are open already, plus {FD_MARGIN} "
        f"head-room: {want} in all) but this process may open at most {_fmt_limit(hard)} "
        f"(RLIMIT_NOFILE soft {_fmt_limit(soft)}, hard {_fmt_limit(hard)}): lower prefetch, "
        f"or raise the limit (`ulimit -n {want}` as root or with a higher hard limit; "
        "LimitNOFILE= for a systemd service, --ulimit nofile= for a container), "
        "or use Python >= 3.13, whose slots hold no file descriptor"
    )


def _fd_limit_error(action: str, path: str, e: OSError) -> SharedMemoryError:
    """The error for EMFILE / ENFILE: the fd limit, never a full /dev/shm."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    which = "this process's limit" if e.errno == errno.EMFILE else "the system's limit, fs.file-max"
    per_slot = (
        "each ring slot keeps one file descriptor open on Python < 3.13"
        if FDS_PER_SEGMENT
        else "each segment opens a file descriptor while it is being mapped"
    )
    return SharedMemoryError(
        f"cannot {action} shared memory {path}: too many open files ({which}; RLIMIT_NOFILE "
        f"soft {_fmt_limit(soft)}, hard {_fmt_limit(hard)}; {_open_fd_count()} open now): {per_slot}; "
        "lower prefetch, or raise the limit (`ulimit -n`, LimitNOFILE=, --ulimit nofile=)"
    )


def _retry_after_raising_limit(e: OSError) -> bool:
    """On EMFILE, try once to raise the soft limit (a worker started before its ring was made
    did not inherit the trainer's raised limit); True when a retry may succeed."""
    if e.errno != errno.EMFILE:
        return False
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return False
    return _raise_soft_limit(soft + max(FD_MARGIN, soft // 2))


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
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            fd = _open(path, flags, 0o600)
        except OSError as e:
            if e.errno in _FD_ERRNOS:
                raise _fd_limit_error("create", path, e) from e
            raise SharedMemoryError(f"cannot create shared memory {path}: {e}") from e
        try:
            os.fchmod(fd, 0o600)  # umask cannot widen it, but make the mode explicit
            os.ftruncate(fd, size)
            mapping = _map_retrying(fd, size, mmap.MAP_SHARED)
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            if e.errno in _FD_ERRNOS:
                raise _fd_limit_error("map", path, e) from e
            hint = "is /dev/shm full? (see `df -h /dev/shm`)"
            if e.errno == errno.ENOMEM:
                hint += " or are there too many mappings? (see `sysctl vm.max_map_count`)"
            raise SharedMemoryError(f"cannot size shared memory {path} to {size} bytes: {e}; {hint}") from e
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
            fd = _open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as e:
            if e.errno in _FD_ERRNOS:
                raise _fd_limit_error("attach", path, e) from e
            raise SharedMemoryError(f"cannot attach shared memory {path}: {e}") from e
        try:
            size = os.fstat(fd).st_size
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            mapping = _map_retrying(fd, size, flags)
        except OSError as e:
            if e.errno in _FD_ERRNOS:
                raise _fd_limit_error("map", path, e) from e
            raise
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


def _open(path: str, flags: int, mode: int = 0o777) -> int:
    """os.open, retried once after raising the soft fd limit when it fails with EMFILE."""
    try:
        return os.open(path, flags, mode)
    except OSError as e:
        if not _retry_after_raising_limit(e):
            raise
    return os.open(path, flags, mode)


def _map_retrying(fd: int, size: int, flags: int) -> mmap.mmap:
    """_map, retried once after raising the soft fd limit when its dup() fails with EMFILE."""
    try:
        return _map(fd, size, flags)
    except OSError as e:
        if not _retry_after_raising_limit(e):
            raise
    return _map(fd, size, flags)


def unlink(name: str) -> None:
    """Remove a segment's file; a missing file is not an error."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


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


def _shm_space() -> tuple[int, int]:
    """(free, total) bytes of /dev/shm; SharedMemoryError where it is not mounted."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError as e:
        raise SharedMemoryError(f"{SHM_DIR} is not available ({e}); fastload needs it") from e
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def shm_room() -> int:
    """The bytes `preflight` lets new segments take now: /dev/shm's free space less its
    head-room (0 when there is none)."""
    free, total = _shm_space()
    return max(0, free - shm_margin(total))


def preflight(required_bytes: int) -> None:
    """Raise SharedMemoryError, saying how big /dev/shm must be, if the ring cannot fit."""
    free, total = _shm_space()
    margin = shm_margin(total)
    if free >= required_bytes + margin:
        return
    mib = 1 << 20
    # What the mount must hold: what others use now, the ring, the head-room of a mount that size.
    others = total - free
    base = others + required_bytes
    size = base + min(_SHM_MARGIN_MAX_BYTES, -(-base // (_SHM_MARGIN_SHARE - 1)))  # m = (base + m) / 8
    grow = (
        f"run the container with --shm-size={-(-size // mib)}m"
        if _in_container()
        else f"free space in {SHM_DIR} or remount it larger (mount -o remount,size={-(-size // mib)}m)"
    )
    fits = free - margin
    shrink = (
        f", or lower batch_size or prefetch until the ring fits in {fits / mib:.0f} MiB"
        if fits >= mib
        else f" ({SHM_DIR} is nearly full: {others / mib:.0f} MiB in use by other segments)"
    )
    raise SharedMemoryError(
        f"the batch ring needs {required_bytes / mib:.0f} MiB of shared memory (plus "
        f"{margin / mib:.0f} MiB head-room) but {SHM_DIR} has {free / mib:.0f} MiB free of "
        f"{total / mib:.0f} MiB: {grow}{shrink}"
    )


def is_private(name: str) -> bool:
    """True when the segment's file is mode 0600 (no group or other access)."""
    mode = os.stat(os.path.join(SHM_DIR, name)).st_mode
    return stat.S_IMODE(mode) == 0o600


# Segments this process created and has not yet unlinked: the signal handler's work list.
_live_segments: weakref.WeakSet[Segment] = weakref.WeakSet()
_handler_lock = threading.Lock()


def _forget_parent_segments() -> None:
    """In a forked child (a worker): the parent's segments are the parent's to unlink, so neither
    a signal the worker receives nor its garbage collector may remove them."""
    for segment in list(_live_segments):
        segment.owner = False
    _live_segments.clear()


os.register_at_fork(after_in_child=_forget_parent_segments)
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
