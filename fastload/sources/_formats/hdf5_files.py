"""Opening HDF5 files and reaching a dataset in them: the h5py import, a process's reading handle
(with its chunk cache), and a dataset reached by a path that crosses no external link.

NOTE [a daemon's workers follow no external link]: a daemon checks, before it opens an HDF5
source, every file the source may make HDF5 open (`_formats/hdf5_reach.py`). Its workers then read the
dataset from the file that holds it (`located`, found by the checked open), by a path inside
that file (`dataset_within`): an external link met on the way is an error, not a file opened, so
a link the check did not see (a file changed since) is never followed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from fastload._errors import ConfigError
from fastload.sources._storage.beneath import Beneath
from fastload.sources._storage.bounds import open_regular

# HDF5's chunk cache hash table: a prime, many times the chunks a cache of cache_mb holds.
_CHUNK_CACHE_SLOTS = 100_003
# Soft links followed to reach one dataset, at most (HDF5's own limit is 16 by default).
_MAX_SOFT_LINKS = 16


def _h5py() -> Any:
    """The h5py module (the `hdf5` extra), imported only when an HDF5 source is opened or read."""
    try:
        import h5py
    except ImportError as e:
        raise ConfigError(
            f"HDF5 sources need h5py, which is not installed ({e}): pip install fastload[hdf5]"
        ) from e
    return h5py


def open_for_reading(path: str, cache_bytes: int, beneath: Beneath | None = None) -> Any:
    """A read-only handle with a chunk cache of `cache_bytes` (HDF5's default is 1 MiB). Through
    `beneath` (a confined daemon's job), the file is first opened beneath the roots (a link out,
    or a FIFO, is refused before HDF5 opens it by path), and HDF5's own descriptor is checked."""
    if beneath is not None:
        os.close(open_regular(path, sys.maxsize, "HDF5 file", beneath)[0])
    f = _h5py().File(path, "r", rdcc_nbytes=cache_bytes, rdcc_nslots=_CHUNK_CACHE_SLOTS)
    if beneath is not None:
        try:
            beneath.check_opened(f.id.get_vfd_handle(), path)  # a link swapped in since
        except BaseException:
            f.close()
            raise
    return f


def dataset_within(f: Any, name: str) -> Any:
    """The dataset at `name` in the open file `f`, soft links followed, external links not:
    OSError when the path meets one (or is missing, or is not a dataset)."""
    h5py = _h5py()
    hops = 0
    parts = [p for p in name.split("/") if p]
    node, at = f["/"], "/"
    while parts:
        part = parts.pop(0)
        link = node.get(part, getlink=True) if isinstance(node, h5py.Group) else None
        here = f"{at.rstrip('/')}/{part}"
        if link is None:
            raise OSError(f"{f.filename} has no {here}")
        if isinstance(link, h5py.ExternalLink):
            raise OSError(f"{f.filename}: {here} is an external link, which is not followed here")
        if isinstance(link, h5py.SoftLink):
            hops += 1
            if hops > _MAX_SOFT_LINKS:
                raise OSError(f"{f.filename}: more than {_MAX_SOFT_LINKS} soft links on the way to {name}")
            target = str(link.path)
            parts = [p for p in target.split("/") if p] + parts
            node, at = (f["/"], "/") if target.startswith("/") else (node, at)
            continue
        node, at = node[part], here
    if not isinstance(node, h5py.Dataset):
        raise OSError(f"{f.filename}: {name} is not a dataset")
    return node


def located(dset: Any) -> tuple[str, str] | None:
    """(the file that holds `dset`, as HDF5 opened it; a path to it in that file that crosses no
    external link): where a daemon's workers read it (NOTE above). None when the file has no
    such path (the dataset is reachable only through links out of it and back)."""
    h5py = _h5py()
    f = dset.file
    path = os.path.abspath(f.filename)
    try:
        if dataset_within(f, dset.name) == dset:
            return path, str(dset.name)
    except OSError:
        pass
    found: list[str] = []

    def same(name: str, obj: Any) -> bool | None:
        if isinstance(obj, h5py.Dataset) and obj == dset:
            found.append(name)
            return True
        return None

    f.visititems(same)
    return (path, "/" + found[0]) if found else None


class Reader:
    """A process's own handle on the file and dataset, and what it has decoded of it."""

    def __init__(
        self,
        path: str,
        dataset: str,
        cache_bytes: int,
        external_links: bool = True,
        beneath: Beneath | None = None,
    ) -> None:
        """OSError when the file or the dataset cannot be opened (anymore), or (without
        `external_links`) when reaching the dataset would follow an external link; the file
        opened through `beneath` when given (`open_for_reading`)."""
        self.file = open_for_reading(path, cache_bytes, beneath)
        try:
            self.dset = self.file[dataset] if external_links else dataset_within(self.file, dataset)
        except (KeyError, OSError) as e:
            self.file.close()
            raise OSError(f"{path} has no dataset {dataset} to read (anymore): {e}") from e
        self.decoded: np.ndarray | None = None  # the dataset, filled a block at a time
        self.have: np.ndarray | None = None  # bool, per block: decoded yet

    def close(self) -> None:
        self.file.close()
