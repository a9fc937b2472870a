"""Opening a source's files only beneath a set of root directories, whatever links lie (or are
swapped in) on the way: how a confined daemon's workers open samples (`Beneath`).

The daemon's allowlist (`_daemon/confine`) checks every file an index names when the index is
made; a worker opens each file later, by path, and the daemon keeps an index for later hellos.
A file under a root replaced by a link to one outside after the check would be followed. So a
confined session's job carries the roots, and its index opens every file through `Beneath`:

- `openat2(root_fd, path below the root, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` (Linux 5.6+),
  each root opened once per process (`O_PATH | O_DIRECTORY`). The kernel refuses (EXDEV) a
  resolution that leaves the root at any step: `..` above it, an absolute link, a link out.
  Relative links that stay inside are followed as by `open`.
- Where openat2 fails with EXDEV (an absolute link, which may well point back inside a root), or
  is missing (ENOSYS, or EPERM from a seccomp filter), the file is opened by path and
  `/proc/self/fd/N` says which file that is: the descriptor is closed and the open refused unless
  it lies under a root. The descriptor's link names what was opened, so no swap can slip between
  the check and the read.

A refusal is an OSError (EXDEV) naming the path as the index has it (the peer's own name for the
sample), never where the link led (NOTE [refusals carry no content] in `_daemon/confine`).
Roots that are URLs hold no local files. An index given no `Beneath` opens files as before.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading

from fastload.sources._storage.bounds import clip
from fastload.sources._storage.remote import is_url

READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO does not wait (NOTE [source bounds])

_SYS_OPENAT2 = 437  # the same number on every architecture (it postdates the unified table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS
_MISSING = (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG)  # no openat2 here, or not allowed
_MAX_DIRS = 1 << 16  # resolved directories one process remembers (then it starts over)


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = (ctypes.c_long, ctypes.c_long, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
_HOW_SIZE = ctypes.sizeof(_OpenHow)
_READ_HOW = _OpenHow(READ_FLAGS, 0, _RESOLVE)  # every sample's: made once, never written


def _openat2(dir_fd: int, path: str, flags: int, resolve: int) -> int:
    """openat2(2): a descriptor, or OSError with the kernel's errno."""
    how = _READ_HOW if flags == READ_FLAGS and resolve == _RESOLVE else _OpenHow(flags, 0, resolve)
    fd = _syscall(_SYS_OPENAT2, dir_fd, os.fsencode(path), ctypes.addressof(how), _HOW_SIZE)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(fd)


def outside_roots(path: str) -> OSError:
    """The refusal of `path` (as the index names it; never what a link made of it)."""
    return OSError(
        errno.EXDEV,
        f"{clip(path)} leads outside the daemon's dataset roots (a link to a file outside them, "
        "made after the source was checked?): the daemon reads only files under its roots; "
        "replace the link by the file itself, under a root",
    )


class Beneath:
    """Opens files only beneath `roots` (see the module docstring); one per confined job, safe
    to use from several threads and across a fork (each process opens the roots again)."""

    def __init__(self, roots: tuple[str, ...], use_openat2: bool = True) -> None:
        self.roots = tuple(os.path.realpath(r) for r in roots if not is_url(r))
        self._prefixes = tuple(r if r.endswith("/") else r + "/" for r in self.roots)
        self._use_openat2 = use_openat2
        self._lock = threading.Lock()
        self._pid = -1
        self._root_fds: tuple[int, ...] = ()
        self._openat2 = False  # whether this process's kernel lets us use it (probed with the roots)
        # A directory as named -> (its root's number, its path below that root + "/"), or None
        # when it is under no root.
        self._dirs: dict[str, tuple[int, str] | None] = {}

    def __reduce__(self) -> tuple[type[Beneath], tuple[tuple[str, ...], bool]]:
        return Beneath, (self.roots, self._use_openat2)  # descriptors stay in their process

    def open(self, path: str, flags: int = READ_FLAGS) -> int:
        """A descriptor of `path`, opened with `flags`, when the file it leads to lies under a
        root; OSError otherwise (EXDEV: outside, or what `open` would raise: ENOENT, ...)."""
        root_fds = self._roots_here()
        below = self._below(path)
        if below is not None and self._openat2 and root_fds[below[0]] >= 0:
            k, relative = below
            try:
                return _openat2(root_fds[k], relative, flags, _RESOLVE)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise OSError(e.errno, e.strerror, path) from None
                # A link leaving the root on the way: where it lands is checked below.
        return self._open_checked(path, flags)

    def holds(self, real: str) -> bool:
        """Whether the real path `real` is a root or lies under one."""
        return real in self.roots or real.startswith(self._prefixes)

    def close(self) -> None:
        """Close this process's descriptors of the roots (opened again when next needed)."""
        with self._lock:
            if self._pid == os.getpid():
                for fd in self._root_fds:
                    if fd >= 0:
                        os.close(fd)
            self._pid, self._root_fds = -1, ()

    def __del__(self) -> None:
        if getattr(self, "_pid", -1) == os.getpid():
            for fd in self._root_fds:
                if fd >= 0:
                    os.close(fd)

    def _roots_here(self) -> tuple[int, ...]:
        """This process's descriptors of the roots, opened (and openat2 probed) on first use."""
        if self._pid == os.getpid():
            return self._root_fds
        with self._lock:
            if self._pid != os.getpid():
                # After a fork the parent's descriptors are the parent's to close: open our own.
                fds = tuple(_open_root(r) for r in self.roots)
                opened = [fd for fd in fds if fd >= 0]
                self._openat2 = self._use_openat2 and bool(opened) and _openat2_works(opened[0])
                self._root_fds, self._dirs = fds, {}
                self._pid = os.getpid()
        return self._root_fds

    def _below(self, path: str) -> tuple[int, str] | None:
        """(root number, the path below that root) of `path`, its directory resolved (and
        remembered: openat2 checks every step again), or None when it is under no root."""
        if not path.startswith("/"):
            path = os.path.abspath(path)
        head, _, tail = path.rpartition("/")
        try:
            place = self._dirs[head]
        except KeyError:
            if len(self._dirs) >= _MAX_DIRS:
                self._dirs = {}
            place = self._dirs[head] = self._place(os.path.realpath(head or "/"))
        return None if place is None else (place[0], place[1] + (tail or "."))

    def _place(self, real: str) -> tuple[int, str] | None:
        """(root number, the path below it + "/", "" for the root itself) of a real directory."""
        for k, (root, prefix) in enumerate(zip(self.roots, self._prefixes, strict=True)):
            if real == root:
                return k, ""
            if real.startswith(prefix):
                return k, real[len(prefix) :] + "/"
        return None

    def _open_checked(self, path: str, flags: int) -> int:
        """Open `path` as `open` does, then keep the descriptor only if /proc says the file is
        under a root (the fallback: see the module docstring)."""
        fd = os.open(path, flags)
        try:
            self.check_opened(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def check_opened(self, fd: int, path: str) -> None:
        """OSError (EXDEV) unless descriptor `fd`, opened by `path`, is of a file under a root:
        for files a library opens by path itself (HDF5), and the fallback of `open`."""
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            raise OSError(
                errno.EXDEV,
                f"cannot tell where {clip(path)} leads (no /proc/self/fd): the daemon reads only "
                "files it can tell are under its dataset roots",
            ) from None
        if not self.holds(real):
            raise outside_roots(path)


def _open_root(root: str) -> int:
    """A descriptor of the root directory, -1 when it is gone (nothing beneath it opens)."""
    try:
        return os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return -1


def _openat2_works(dir_fd: int) -> bool:
    """Whether openat2 runs here (a kernel before 5.6, or a seccomp filter, refuses it)."""
    try:
        os.close(_openat2(dir_fd, ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, _RESOLVE))
    except OSError as e:
        if e.errno in _MISSING:
            return False
        raise
    return True


def open_file(path: str, beneath: Beneath | None, flags: int = READ_FLAGS) -> int:
    """`path` opened through `beneath` when given (a confined daemon's job), else as `os.open`."""
    return os.open(path, flags) if beneath is None else beneath.open(path, flags)
