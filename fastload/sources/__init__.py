"""Where samples come from: the sources fastload reads itself, at its own speed.

    from fastload import FastLoader, sources
    FastLoader("data/train")                                    # an ImageNet-layout folder
    FastLoader(sources.FileList("train.csv", root="images"))    # path,label lines
    FastLoader(sources.FileList("tags.tsv", multi_label=True))  # multi-hot targets
    FastLoader(sources.HDF5("train.h5", data="x", labels="y"))  # encoded images, or arrays as stored
    FastLoader(sources.TarShards("shards/train-{000000..000099}.tar"))  # WebDataset shards
    FastLoader(sources.Mix(["data/a", "packed/b"], weights=[0.7, 0.3]))  # sampled in set proportions
    sources.pack("data/train", "packed/train")                  # or `fastload pack SRC DST`
    FastLoader("packed/train")                                  # large files, sequential reads

A plain path means what it looks like (`as_source`). Every source gives the same batches for
every worker count, resumes with `state_dict`, and reports its reads to `fastload iostat`.

A new kind is a `Source` subclass that declares itself in its class statement (`kind=`,
`named_by=Naming(...)`, `served_by_daemon=`; NOTE [a source kind is declared once] in `_base`);
`source_kinds()` lists every kind declared. Importing this package registers its own kinds.
"""

from fastload.sources._base import (
    DAEMON_SOURCE_KINDS,
    FileToOpen,
    Naming,
    Source,
    as_source,
    source_from_config,
    source_kinds,
)
from fastload.sources._formats.file_list import FileList
from fastload.sources._formats.folder import ImageFolder
from fastload.sources._formats.hdf5 import HDF5
from fastload.sources._formats.mix import Mix
from fastload.sources._formats.packed import Packed
from fastload.sources._formats.tar import TarShards
from fastload.sources._packing.writer import pack

__all__ = [
    "DAEMON_SOURCE_KINDS",
    "HDF5",
    "FileList",
    "FileToOpen",
    "ImageFolder",
    "Mix",
    "Naming",
    "Packed",
    "Source",
    "TarShards",
    "as_source",
    "pack",
    "source_from_config",
    "source_kinds",
]
