"""The daemon's allowlist: a source is served only when every file it names lies under the
configured dataset roots, links followed.

`Roots` resolves paths (`os.path.realpath`, a directory's resolution cached, so a million-file
index costs one `lstat` per file) and says whether each lands under a root. `check_before_open`
runs before a source reads anything (its own files: a list, a shard pattern's matches, once the
names of all its patterns are counted against `sources._bounds`, a pack's directory, an HDF5
file and everything that file points at: external storage, virtual datasets' sources, external
links); `check_index` after, on every file the opened index will make a worker read (each
sample of a folder or a file list, each shard, each data file of a pack).

NOTE [refusals carry no content]: a refusal names the source as the client sent it and which of
its parts is outside (the list's sample number, the shard's number, the HDF5 object's name inside
a file that is itself under the roots), never the outside path: that path may be a line of a
file the peer should not read. The daemon's log gets the path (`Refused.detail`).

Not covered: a file under a root replaced by a link to one outside *after* the check (workers
open by path). Roots should be directories that peers cannot write to.
"""

from __future__ import annotations

import glob
import os
import stat
from typing import Any

from fastload._errors import ConfigError, DatasetError
from fastload.sources import Source
from fastload.sources._remote import is_url
from fastload.sources._tar import check_shard_patterns, expand_braces

# HDF5's own prefixes for relative names (the workers' library reads the same environment).
_HDF5_PREFIX_VARS = ("HDF5_EXTFILE_PREFIX", "HDF5_VDS_PREFIX", "HDF5_EXT_PREFIX")


class Refused(DatasetError):
    """A source names a file outside the daemon's dataset roots; `detail` (the path) is for the log."""

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class Roots:
    """The configured dataset roots (real paths) and the resolution of paths against them."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        # A root at a URL (s3://bucket/datasets/) allows the objects under that prefix; a local
        # root never allows a URL (the daemon's credentials must not fetch what it was not told).
        self.roots = tuple(r if is_url(r) else os.path.realpath(r) for r in roots)
        self._prefixes = tuple(r if r.endswith("/") else r + "/" for r in self.roots)
        self._dirs: dict[str, str] = {}

    def resolve(self, path: str) -> str:
        """`path`'s real path (links followed), its directory's resolution cached; a URL as it is
        (a `remote_file` entry: its URL), unless it climbs with `..`."""
        if "\0" in path or is_url(path):
            url = path.split("\0", 1)[0]
            return "" if "/../" in url or url.endswith("/..") else url
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

    def allows(self, path: str) -> bool:
        real = self.resolve(path)
        return real in self.roots or real.startswith(self._prefixes)

    def check(self, path: str, source: str, what: str) -> None:
        """Refused (naming `source` and `what`, never `path`) when `path` is outside the roots."""
        if not self.allows(path):
            raise Refused(
                f"{source}: {what} is outside the daemon's dataset roots; it serves only files under "
                "the roots in its configuration (`roots`, `fastload serve --root DIR`)",
                f"{what}: {path} -> {self.resolve(path)}",
            )


def check_roots(listen: str | None, roots: tuple[str, ...] | None) -> None:
    """The allowlist's configuration: roots are existing directories, and a TCP listener has some."""
    if roots is not None:
        if not roots:
            raise ConfigError("roots is empty: name the directories the daemon may serve (or leave it out)")
        for root in roots:
            if not isinstance(root, str) or not os.path.isabs(root) or not os.path.isdir(root):
                raise ConfigError(f"dataset root {root!r} is not an absolute path of a directory")
    if listen and not roots:
        raise ConfigError(
            "--listen tcp://... needs dataset roots (`roots = [...]` in the [daemon] table, or --root DIR): "
            "a TCP peer is served only files under them"
        )


def source_name(source: Source) -> str:
    """The source as the client named it (its main path or pattern), for refusals."""
    return f"{source.kind} source {source.where}"


def check_before_open(source: Source, roots: Roots) -> None:
    """The files `source.open()` will read, checked before it reads any (see the module docstring)."""
    name = source_name(source)
    kind = source.kind
    if kind == "tar":
        patterns = [source.paths] if isinstance(source.paths, str) else list(source.paths)  # type: ignore[attr-defined]
        check_shard_patterns(patterns)  # every pattern's names counted before any is walked
        for p, pattern in enumerate(patterns):
            for expanded in expand_braces(pattern):
                if glob.has_magic(expanded):
                    # The directory part before any wildcard must be inside before it is listed.
                    literal = expanded[: min(expanded.index(c) for c in "*?[" if c in expanded)]
                    roots.check(os.path.dirname(literal) or "/", name, f"the directory of pattern {p}")
                    for s, shard in enumerate(sorted(glob.glob(expanded))):
                        roots.check(shard, name, f"match {s} of pattern {p}")
                else:
                    roots.check(expanded, name, f"a shard of pattern {p}")
        return
    for field in source.path_fields:
        value = getattr(source, field)
        values = value if isinstance(value, tuple) else (value,)
        for v in values:
            if isinstance(v, str):
                roots.check(v, name, f"its {field}")
    if kind == "packed":
        return  # its data files are named by its manifest: checked in the opened index
    if kind == "hdf5":
        check_hdf5(str(source.path), roots, name)  # type: ignore[attr-defined]


def _relative_candidates(name: str, base: str) -> list[str]:
    """Where HDF5 may look for a relative file `name` named inside a file in directory `base`:
    that directory, the working directory, and the prefixes of HDF5's environment variables."""
    if os.path.isabs(name):
        return [name]
    places = [base, os.getcwd()]
    for var in _HDF5_PREFIX_VARS:
        places += [p.replace("${ORIGIN}", base) for p in os.environ.get(var, "").split(":") if p]
    return [os.path.join(p, name) for p in places]


def check_hdf5(path: str, roots: Roots, name: str) -> None:
    """Every file the HDF5 file at `path` may make the library read: datasets' external storage,
    virtual datasets' source files and external links, each resolved as HDF5 may resolve it."""
    from fastload.sources._hdf5 import _h5py

    h5py = _h5py()
    base = os.path.dirname(os.path.realpath(path))
    try:
        f = h5py.File(path, "r")
    except OSError:
        return  # not HDF5: the source's own open says so
    named: list[tuple[str, str]] = []  # (file, what names it); checked after the visit (NOTE below)
    with f:

        def on_link(obj_name: str, link: Any) -> None:
            if isinstance(link, h5py.ExternalLink):
                named.append((str(link.filename), f"the external link {obj_name!r}"))

        def on_object(obj_name: str, obj: Any) -> None:
            if not isinstance(obj, h5py.Dataset):
                return
            for target, _, _ in obj.external or ():
                named.append((os.fsdecode(target), f"the external storage of dataset {obj_name!r}"))
            if obj.is_virtual:
                for vds in obj.virtual_sources():
                    if vds.file_name != ".":
                        named.append((str(vds.file_name), f"a source of virtual dataset {obj_name!r}"))

        # NOTE: an exception raised inside h5py's visit callbacks comes out as a SystemError.
        f.visititems_links(on_link)
        f.visititems(on_object)
    for target, what in named:
        for candidate in _relative_candidates(target, base):
            roots.check(candidate, name, what)


def check_index(index: Any, roots: Roots, name: str) -> None:
    """Every file an opened index makes workers read (samples of a folder or a list, shards,
    data files of a pack, the HDF5 file)."""
    files = getattr(index, "files", None)
    if isinstance(files, tuple):  # an ExtentIndex: shards, or a pack's data files
        for k, file in enumerate(files):
            roots.check(file, name, f"data file {k}")
        return
    path_of = getattr(index, "path", None)
    if callable(path_of) and hasattr(index, "path_offsets"):  # a PathIndex: one file per sample
        for i in range(len(index)):
            roots.check(path_of(i), name, f"sample {i}'s file")
        return
    root = getattr(index, "root", None)
    if isinstance(root, str):  # an HDF5 index: the file (checked with its links before opening)
        roots.check(root, name, "its file")
