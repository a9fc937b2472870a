"""Every file the HDF5 library may open when it reads an HDF5 file, found the way the library
finds them: external links, virtual datasets' sources and datasets' external storage, and, in
each HDF5 file reached, its own links and datasets in turn.

`files_reached(path)` yields each `Candidate` (a path HDF5 may try, what names it) and walks an
HDF5 file only once its caller has let the candidate pass (the daemon's allowlist refuses by
raising: `fastload._daemon.confine`). Nothing is opened before it is approved, and only regular
files are probed as HDF5 (a FIFO would block the open).

NOTE [where HDF5 looks for a file]: verified against HDF5 2.0 (`H5F_prefix_open_file`,
`H5D__build_file_prefix`) and by tests. An external link's or a virtual source's file name is
tried
  1. as written, when absolute; if that fails, only its base name is kept for the steps below;
  2. under each directory of `HDF5_EXT_PREFIX` (links) or `HDF5_VDS_PREFIX` (sources),
     colon-separated;
  3. under the access list's prefix (`${ORIGIN}`: the file's directory; fastload sets none,
     but HDF5 passes `HDF5_VDS_PREFIX` here too);
  4. in the directory of the file as it was opened (its "extpath");
  5. relative to the process's working directory;
  6. in the directory of the file's real path (links resolved).
The first that opens as HDF5 wins, so a link to `/gone/secret.h5` reads `secret.h5` from the
working directory when neither the absolute path nor the file's directory has it. External
storage has no fallback: an absolute name as written; a relative one under
`HDF5_EXTFILE_PREFIX` (`${ORIGIN}`: the file's directory), or else relative to the working
directory. Every candidate is yielded, not only the first that exists: which one HDF5 takes
changes as files come and go.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fastload._errors import DatasetError

# HDF5 files walked for one source, at most (a visited set stops cycles; this stops fans).
MAX_FILES = 1024
_ORIGIN = "${ORIGIN}"


@dataclass(frozen=True)
class Candidate:
    """A path HDF5 may open; `what` names the object that makes it (never the path itself)."""

    path: str  # absolute, as HDF5 would open it (not normalized: `..` after a link is the link's)
    what: str
    in_working_dir: bool = False  # tried relative to the working directory (step 5 above)
    storage: bool = False  # raw bytes (external storage), never opened as HDF5


def files_reached(path: str) -> Iterator[Candidate]:
    """The HDF5 file at `path` (as `its file`), then every file it may make HDF5 open,
    recursively (see the module docstring). DatasetError when it reaches more than MAX_FILES
    HDF5 files, or names its sources with a printf pattern (which files it reads is unbounded)."""
    from fastload.sources._formats.hdf5_files import _h5py

    h5py = _h5py()
    start = os.path.abspath(path)
    yield Candidate(start, "its file")
    pending = [start]
    walked: set[tuple[str, str]] = set()  # (directory as opened, real path): what HDF5 resolves from
    while pending:
        opened = pending.pop()
        key = (os.path.dirname(opened), os.path.realpath(opened))
        if key in walked or not _is_hdf5(h5py, opened):
            continue
        walked.add(key)
        if len(walked) > MAX_FILES:
            raise DatasetError(f"{start} reaches more than {MAX_FILES} HDF5 files through its links")
        for candidate in _named_in(h5py, opened, start):
            yield candidate  # returns only if the caller lets it pass
            if not candidate.storage:
                pending.append(candidate.path)


def _is_hdf5(h5py: Any, path: str) -> bool:
    try:
        return os.path.isfile(path) and bool(h5py.is_hdf5(path))
    except OSError:
        return False


def _named_in(h5py: Any, opened: str, start: str) -> list[Candidate]:
    """The candidates for every file the HDF5 file `opened` names (not recursive)."""
    links: list[tuple[str, str]] = []  # (file name, what names it)
    sources: list[tuple[str, str]] = []
    storage: list[tuple[str, str]] = []
    where = "" if opened == start else f" of {opened}"  # a file under the roots: it passed

    def on_link(obj_name: str, link: Any) -> None:
        if isinstance(link, h5py.ExternalLink):
            links.append((str(link.filename), f"the external link {obj_name!r}{where}"))

    def on_object(obj_name: str, obj: Any) -> None:
        if not isinstance(obj, h5py.Dataset):
            return
        for target, _, _ in obj.external or ():
            storage.append((os.fsdecode(target), f"the external storage of dataset {obj_name!r}{where}"))
        if obj.is_virtual:
            for vds in obj.virtual_sources():
                if vds.file_name != ".":
                    sources.append((str(vds.file_name), f"a source of virtual dataset {obj_name!r}{where}"))

    try:
        f = h5py.File(opened, "r")
    except OSError:
        return []  # not HDF5 after all (it changed): HDF5 would try the next candidate
    with f:
        # NOTE: an exception raised inside h5py's visit callbacks comes out as a SystemError,
        # so the visit only collects; the candidates are made (and may raise) after it.
        f.visititems_links(on_link)
        f.visititems(on_object)
    found: list[Candidate] = []
    for name, what in links:
        found += _searched(name, what, opened, "HDF5_EXT_PREFIX")
    for name, what in sources:
        if "%b" in name.replace("%%", ""):
            raise DatasetError(
                f"{what} names its files with a printf pattern (%b): the files it reads cannot be listed"
            )
        found += _searched(name.replace("%%", "%"), what, opened, "HDF5_VDS_PREFIX")
    for name, what in storage:
        found.append(_external_storage(name, what, opened))
    return found


def _searched(name: str, what: str, opened: str, prefix_var: str) -> list[Candidate]:
    """Where HDF5 looks for the file `name` of a link or a virtual source in the file `opened`."""
    extpath = os.path.dirname(opened)
    found: list[Candidate] = []
    if os.path.isabs(name):
        found.append(Candidate(name, what))
        name = os.path.basename(name)
    for prefix in _prefixes(os.environ.get(prefix_var, ""), extpath):
        found.append(Candidate(os.path.join(prefix, name), f"{what} (under {prefix_var})"))
    for directory in (extpath, os.path.dirname(os.path.realpath(opened))):
        found.append(Candidate(os.path.join(directory, name), what))
    found.append(Candidate(os.path.join(os.getcwd(), name), f"{what} (in the working directory)", True))
    return found


def _prefixes(value: str, extpath: str) -> list[str]:
    """The directories of a prefix variable as HDF5 may use them: each colon-separated part as
    written and with `${ORIGIN}` made the file's directory, and the whole value so (step 3)."""
    if not value:
        return []
    found: list[str] = []
    for part in [*value.split(":"), value]:
        for form in (part, extpath + part[len(_ORIGIN) :] if part.startswith(_ORIGIN) else part):
            if form and os.path.join(os.getcwd(), form) not in found:
                found.append(os.path.join(os.getcwd(), form))
    return found


def _external_storage(name: str, what: str, opened: str) -> Candidate:
    """The one file HDF5 reads for external storage named `name` in the file `opened`."""
    if os.path.isabs(name):
        return Candidate(name, what, storage=True)
    prefix = os.environ.get("HDF5_EXTFILE_PREFIX", "")
    if prefix.startswith(_ORIGIN):
        prefix = os.path.dirname(opened) + prefix[len(_ORIGIN) :]
    if prefix:
        path = os.path.join(os.getcwd(), prefix, name)
        return Candidate(path, f"{what} (under HDF5_EXTFILE_PREFIX)", storage=True)
    return Candidate(os.path.join(os.getcwd(), name), f"{what} (in the working directory)", True, True)
