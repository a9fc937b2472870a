"""A user's private directory under a parent others may share, opened so that nobody else can
redirect what is done in it: `open_private_dir`, for the tar scan cache and the node cache.

NOTE [private directory]: a cache root (`FASTLOAD_CACHE_DIR`, or a source's `cache_dir`) may be a
directory other users can write, so each user's cache is a directory of its own in it (named
after the uid). Another user can make that name first: as a link (into the victim's home: the
owner and mode of the link's target pass every check, chunks land there and eviction removes
files there), or as a directory of their own (whose files they choose); or swap the name for a
link after the check. So:

- the root and the directory are opened `O_DIRECTORY|O_NOFOLLOW` (the directory relative to the
  root's descriptor, made there 0700 when missing): a link at either name is refused, never
  followed (links in the path above the root are the user's own choice, and followed);
- the directory's owner and mode are checked on its descriptor (`fstat`): this user's, with no
  group or other permission, else it is refused;
- every later operation (create, rename, read, utime, unlink, listing) is relative to that
  descriptor (`dir_fd=`, `os.scandir` of a descriptor), so renaming or replacing any component
  of the path after the check redirects nothing: the descriptor stays on the directory checked.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotPrivate(OSError):
    """The directory exists but is not this user's private one (a link, a file, another user's,
    or open to others): `str()` says which and what to do."""


def open_private_dir(root: str, name: str) -> int:
    """A descriptor of the directory `name` in `root` (both made, 0700, when missing), when it is
    this user's and private (NOTE [private directory]); `NotPrivate` when it is not, another
    OSError when it cannot be made or opened. The caller closes it."""
    where = os.path.join(root, name)
    os.makedirs(root, mode=0o700, exist_ok=True)
    root_fd = _open_directory(
        root, None, "not a directory (not followed: another user may have planted it): name the directory it "
        "leads to",
    )
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=root_fd)
        fd = _open_directory(
            name, root_fd, "not a directory of yours (not followed: another user may have planted it): "
            "remove it, or use a cache directory of your own", shown=where,
        )
    finally:
        os.close(root_fd)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        os.close(fd)
        raise NotPrivate(
            f"{where} is not private (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}; it must "
            "be yours, mode 0700): remove it, or use a cache directory of your own"
        )
    return fd


def _open_directory(path: str, dir_fd: int | None, instead: str, shown: str | None = None) -> int:
    """`path` (relative to `dir_fd`) opened as a directory, never through a link: `NotPrivate`
    saying what is there `instead` when it is a link or no directory."""
    try:
        return os.open(path, _DIRECTORY, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            shown = shown or path
            raise NotPrivate(f"{shown} is {_what_instead(shown)}, {instead}") from None
        raise


def _what_instead(path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "not there any more"
    return "a symbolic link" if stat.S_ISLNK(mode) else "not a directory"
