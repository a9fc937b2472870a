"""The daemon's allowlist: a source is served only when every file it names lies under the
configured dataset roots, links followed.

`Roots` resolves paths (`os.path.realpath`, a directory's resolution cached, so a million-file
index costs one `lstat` per file) and says whether each lands under a root. `check_before_open`
runs before a source reads anything, on the files the source says it opens, one at a time
(`Source.files_before_open`: this module knows no source kind). For the package's kinds: a
list, a shard pattern's matches (once the names of all its patterns are counted against
`sources._storage.bounds`, a glob's directory before it is listed), a pack's directory, an HDF5 file and
every file HDF5 may open for it, recursively and wherever HDF5 may look: external storage,
virtual datasets' sources, external links, and each reached file's own; only regular files, so
no FIFO holds an opening slot. `check_index` runs after, on every file the opened index will
make a worker read, as the index says (`files_read`: each sample of a folder or a file list,
each shard, each data file of a pack, the file that holds an HDF5 source's data).

NOTE [object-storage roots]: a root may be a URL prefix (`s3://bucket/datasets/`): it allows the
objects whose URL starts with it, compared as text (`url_root`: the root's scheme lowercase, and
its prefix ending in `/`, so `s3://bucket/pre` allows nothing of `s3://bucket/prefix-other/`). A
root with a query, a fragment, credentials, a `.` or `..` segment (or one escaped as `%2e`) is
refused at start; a URL with any of them is never allowed, nor is another spelling of an allowed
one (an uppercase host, a default port written out). A local root never allows a URL. The
process opening a peer's source checks every request it makes against the roots before sending
it (`remote.confine`): an object a file list names outside them is refused without a request
reaching the store.

NOTE [refusals carry no content]: a refusal names the source as the client sent it and which of
its parts is outside (the list's sample number, the shard's number, the HDF5 object's name inside
a file that is itself under the roots), never the outside path: that path may be a line of a
file the peer should not read. The daemon's log gets the path (`Refused.detail`).

A file under a root replaced by a link to one outside *after* the check (an index is kept for
later hellos) is not followed: a confined session's workers open every file beneath the roots
(`sources/_storage/beneath`), and `check_identities` holds each scanned shard or pack file to the file
now beneath them; an HDF5 file's external links are not followed by the workers at all (NOTE [a
daemon's workers follow no external link]). Not covered: the source's own files (a file list,
an HDF5 file, a manifest, a folder's listing) swapped for a link out between
`check_before_open` and the open that reads them, in the opening child; an HDF5 file's virtual
sources and external storage, which the library opens by name. Roots should still be
directories that peers cannot write to.
"""

from __future__ import annotations

import errno
import os
import stat
import urllib.parse
from typing import Any

from fastload._errors import ConfigError, DatasetError
from fastload.sources import Source
from fastload.sources._base import FileToOpen, UnboundedFiles
from fastload.sources._indexes.extents import ExtentIndex
from fastload.sources._storage.beneath import Beneath
from fastload.sources._storage.bounds import identity
from fastload.sources._storage.remote import is_url


class Refused(DatasetError):
    """A source names a file outside the daemon's dataset roots; `detail` (the path) is for the log."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


def _plain_url(url: str) -> str | None:
    """`url` itself, or None when it has a query, a fragment, credentials, no bucket or host, a
    backslash, a control character, or a `.` or `..` segment (escaped or not). Nothing else is
    normalized: two spellings of one object (an uppercase scheme or host, a default port) are
    not taken as one, so a peer's odd spelling is refused, never allowed."""
    if any(c in url for c in "?#\\") or any(ord(c) < 0x20 for c in url):
        return None
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or "@" in parts.netloc:
        return None
    path = urllib.parse.unquote(parts.path)
    if any(s in (".", "..") for s in path.split("/")) or "\\" in path:
        return None
    return url


def url_root(root: str) -> str:
    """A URL root as `Roots` compares it (NOTE [object-storage roots]); ConfigError for one
    that cannot be a plain prefix."""
    scheme, sep, rest = root.partition("://")
    plain = _plain_url(f"{scheme.lower()}{sep}{rest}")
    if plain is None:
        raise ConfigError(
            f"dataset root {root!r} is not a plain URL prefix (s3://bucket/prefix/): no query, fragment, "
            "credentials or '.'/'..' segments"
        )
    return plain if plain.endswith("/") else plain + "/"


class Roots:
    """The configured dataset roots (real paths, normalized URL prefixes) and the resolution of
    paths against them."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        # A root at a URL (s3://bucket/datasets/) allows the objects under that prefix; a local
        # root never allows a URL (the daemon's credentials must not fetch what it was not told).
        self.roots = tuple(url_root(r) if is_url(r) else os.path.realpath(r) for r in roots)
        self._prefixes = tuple(r if r.endswith("/") else r + "/" for r in self.roots)
        self._dirs: dict[str, str] = {}

    def resolve(self, path: str) -> str:
        """`path`'s real path (links followed), its directory's resolution cached; a URL (or a
        `remote_file` entry: its URL) as it is, "" (allowed nowhere) when it is not a plain one
        (NOTE [object-storage roots])."""
        if "\0" in path or is_url(path):
            return _plain_url(path.split("\0", 1)[0]) or ""
        try:
            if "/../" in f"/{path}/":
                # The kernel takes `..` after the links before it (`root/link/../x` is beside the
                # link's target), `abspath` as text: resolved whole, never cut as text.
                return os.path.realpath(os.path.join(os.getcwd(), path))
            head, tail = os.path.split(os.path.abspath(path))
            real_head = self._dirs.get(head)
            if real_head is None:
                real_head = self._dirs[head] = os.path.realpath(head)
            full = os.path.join(real_head, tail)
            try:
                if not stat.S_ISLNK(os.lstat(full).st_mode):
                    return full
            except OSError:
                return full  # missing: its read fails later, under this name
            return os.path.realpath(full)
        except OSError:
            return ""  # a link it may not read (/proc/1/cwd): where it leads is unknown, so nowhere

    def allows(self, path: str) -> bool:
        real = self.resolve(path)
        if not real:
            return False
        return real in self.roots or real + "/" in self.roots or real.startswith(self._prefixes)

    def check(self, path: str, source: str, what: str) -> None:
        """Refused (naming `source` and `what`, never `path`) when `path` is outside the roots."""
        if not self.allows(path):
            raise Refused(
                f"{source}: {what} is outside the daemon's dataset roots; it serves only files under "
                "the roots in its configuration (`roots`, `fastload serve --root DIR`)",
                f"{what}: {path} -> {self.resolve(path)}",
            )


def check_roots(listen: str | None, roots: tuple[str, ...] | None) -> None:
    """The allowlist's configuration: roots are existing directories or plain URL prefixes (NOTE
    [object-storage roots]), and a TCP listener has some."""
    if roots is not None:
        if not roots:
            raise ConfigError("roots is empty: name the directories the daemon may serve (or leave it out)")
        for root in roots:
            if isinstance(root, str) and is_url(root):
                url_root(root)
            elif not isinstance(root, str) or not os.path.isabs(root) or not os.path.isdir(root):
                raise ConfigError(
                    f"dataset root {root!r} is not an absolute path of a directory, nor a URL prefix "
                    "(s3://bucket/prefix/)"
                )
    if listen and not roots:
        raise ConfigError(
            "--listen tcp://... needs dataset roots (`roots = [...]` in the [daemon] table, or --root DIR): "
            "a TCP peer is served only files under them"
        )


def source_name(source: Source) -> str:
    """The source as the client named it (its main path or pattern), for refusals."""
    return f"{source.kind} source {source.where}"


def check_before_open(source: Source, roots: Roots) -> None:
    """The files `source.open()` will read, checked before it reads any: each that the source
    names (`Source.files_before_open`; the module docstring), in its order, before the next is
    made. No kind is known here: a source says what it opens."""
    name = source_name(source)
    try:
        for file in source.files_before_open():
            check_file(file, roots, name)
    except UnboundedFiles as e:  # names only files it named before, each checked
        raise Refused(f"{name}: {e}", str(e)) from e


def check_file(file: FileToOpen, roots: Roots, name: str) -> None:
    """One file a source will open: under the roots, links followed, and a regular file where
    the source asks for one (no FIFO holds an opening slot)."""
    if not file.regular:
        roots.check(file.path, name, file.what)
        return
    real = os.path.realpath(file.path)
    try:
        mode: int | None = os.stat(real).st_mode
    except OSError:
        mode = None  # nothing there (now): it cannot be opened either
    if mode is None and file.passes_while_missing:
        return
    roots.check(real, name, file.what)
    if mode is not None and not stat.S_ISREG(mode):
        raise Refused(
            f"{name}: {file.what} is not a regular file (a FIFO, a device, a socket or a "
            "directory): the daemon reads only regular files",
            f"{file.what}: {file.path} -> {real} (mode {mode:o})",
        )


def check_index(index: Any, roots: Roots, name: str) -> None:
    """Every file an opened index makes workers read (`files_read`: samples of a folder or a list,
    shards, data files of a pack, the HDF5 file and the one holding its data), and each scanned
    container file held to its recorded identity."""
    for path, what in index.files_read():
        roots.check(path, name, what)
    if isinstance(index, ExtentIndex):
        check_identities(index.files, index.file_identities, roots, name)


def check_identities(files: tuple[str, ...], identities: Any, roots: Roots, name: str) -> None:
    """Each file scanned (a shard, a pack's data file) is the file now beneath the roots: opened
    there (`Beneath`: no link leading out followed), its identity is the one recorded when it was
    read (NOTE [extent file identity]). A file swapped for a link out while it was being scanned,
    and back before `check`, is refused here; workers then read only a file of that identity."""
    if identities is None:
        return
    beneath = Beneath(roots.roots)
    try:
        for k, file in enumerate(files):
            recorded = tuple(int(v) for v in identities[k])
            if recorded[0] == -1:
                continue  # read through the node cache (a remote object): not checked by inode
            try:
                fd = beneath.open(file)
            except OSError as e:
                raise Refused(
                    f"{name}: data file {k} cannot be opened beneath the daemon's dataset roots "
                    f"({'it leads outside them' if e.errno == errno.EXDEV else os.strerror(e.errno or 0)})",
                    f"data file {k}: {file}: {e}",
                ) from None
            try:
                now = identity(os.fstat(fd))
            finally:
                os.close(fd)
            if now != recorded:
                raise Refused(
                    f"{name}: data file {k} changed while it was indexed (another file, or a link, was "
                    "read in its place): ask again once it stays put",
                    f"data file {k}: {file}: identity {recorded} when read, {now} beneath the roots",
                )
    finally:
        beneath.close()

