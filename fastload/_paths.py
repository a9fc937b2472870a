"""Private directories for sockets: the daemon's runtime directory and each engine's own.

- The daemon's directory is `$XDG_RUNTIME_DIR/fastload`, else `/tmp/fastload-UID`, made 0700.
  Someone else can pre-create that path in a shared /tmp (another uid, or a symlink): then the
  daemon uses a fresh private `fastload-UID.XXXXXXXX` beside it and says so, and trainers find
  it by looking for this user's private fallback directories holding a live daemon's pid file.
- Every `Engine` binds its workers' socket in a fresh 0700 `fastload-engine-PID-XXXXXXXX`
  directory. A process killed with SIGKILL cannot remove it, so, like shared-memory segments,
  the next fastload process of this user removes those whose owner pid is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import tempfile

from fastload._errors import DaemonError
from fastload._machine import pid_alive

log = logging.getLogger("fastload")

_ENGINE_PREFIX = "fastload-engine-"
_ENGINE_DIR_RE = re.compile(r"^fastload-engine-(\d+)-[A-Za-z0-9_]+$")


def _bases() -> list[str]:
    """Where private directories are made: $XDG_RUNTIME_DIR when it exists, and the temp dir."""
    bases = []
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        bases.append(xdg)
    bases.append(tempfile.gettempdir())
    return bases


def _is_private(path: str) -> bool:
    """A real directory (not a link) owned by this user that nobody else may enter."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def private_dir(path: str) -> str:
    """`path` as a directory only its owner can enter: made 0700 if missing, else checked."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise DaemonError(f"cannot create the directory {path}: {e}") from e
    if not _is_private(path):
        raise DaemonError(
            f"{path} must be a directory owned by you with mode 0700 (it is not): remove it and retry"
        )
    return path


def _standard_runtime_dir() -> str:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "fastload")
    return os.path.join(tempfile.gettempdir(), f"fastload-{os.getuid()}")


def _taken_by_someone_else(path: str) -> bool:
    """True when `path` exists but is not ours to use: another owner, a link, not a directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return st.st_uid != os.getuid() or not stat.S_ISDIR(st.st_mode)


def _fallback_dirs(standard: str) -> list[str]:
    """This user's private fallback directories beside `standard` (`<name>.XXXXXXXX`)."""
    parent, name = os.path.split(standard)
    try:
        entries = sorted(os.listdir(parent))
    except OSError:
        return []
    return [
        os.path.join(parent, e)
        for e in entries
        if e.startswith(name + ".") and _is_private(os.path.join(parent, e))
    ]


def runtime_dir() -> str:
    """The daemon's directory for this user (see the module docstring); made if missing.

    Raises DaemonError when the standard path is this user's own but open to others (the user
    should fix that), never because another user squats on it.
    """
    standard = _standard_runtime_dir()
    if not _taken_by_someone_else(standard):
        return private_dir(standard)
    fallbacks = _fallback_dirs(standard)
    chosen = (
        fallbacks[0]
        if fallbacks
        else tempfile.mkdtemp(prefix=os.path.basename(standard) + ".", dir=os.path.dirname(standard))
    )
    log.warning(
        "%s belongs to someone else (uid %d) or is not a directory: using %s instead; trainers "
        "of this user find it without configuration. Remove %s to get the usual place back.",
        standard,
        os.lstat(standard).st_uid,
        chosen,
        standard,
    )
    return chosen


def daemon_dir_candidates() -> list[str]:
    """Where a trainer looks for this user's daemon: the standard directory, or, when someone
    else holds that path, the private fallback directories a daemon may have made beside it."""
    standard = _standard_runtime_dir()
    if not _taken_by_someone_else(standard):
        return [standard]
    return _fallback_dirs(standard) or [standard]


def remove_if_fallback(path: str) -> None:
    """Remove a fallback runtime directory once the daemon using it is done (if it is empty)."""
    if path in _fallback_dirs(_standard_runtime_dir()):
        with contextlib.suppress(OSError):
            os.rmdir(path)


def engine_socket_dir() -> str:
    """A fresh 0700 directory for one engine's socket, named after this process."""
    return tempfile.mkdtemp(prefix=f"{_ENGINE_PREFIX}{os.getpid()}-", dir=_bases()[0])


def reap_engine_dirs() -> list[str]:
    """Remove this user's engine socket directories whose owning process is gone."""
    reaped = []
    for base in _bases():
        try:
            entries = list(os.scandir(base))
        except OSError:
            continue
        for entry in entries:
            match = _ENGINE_DIR_RE.match(entry.name)
            if not match or pid_alive(int(match.group(1))) or not _is_private(entry.path):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            reaped.append(entry.path)
    return reaped
