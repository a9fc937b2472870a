"""The seam every source sits behind: `Source` (what a user names), its config (what a daemon is
sent), and `as_source` (what a plain path means).

A source is a small frozen description (a path and a few options). `open()` reads what it must
(scans a folder, parses a list, reads a shard's headers or a packed index) into a `SampleIndex`
in the trainer, once, before any worker starts; the sequential-read shuffles live in the plan,
not in the source (DESIGN: "sources as seams").
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from abc import ABC, abstractmethod
from typing import Any, ClassVar, cast

from fastload._errors import ConfigError, DatasetError
from fastload._sizes import parse_optional_size, shown
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.sample_index import SampleIndex
from fastload.sources._storage.bounds import field_text_problem
from fastload.sources._storage.remote import is_url

_REGISTRY: dict[str, type[Source]] = {}

# What a daemon serves: sources of encoded images whose index its workers attach from shared memory
# (an HDF5 file of numeric arrays is refused when the daemon opens it: nothing there to decode).
# Compressed tar names, with the compressor that undoes them: `as_source` sends them to `TarShards`,
# which refuses them saying so (it reads samples at byte offsets).
COMPRESSED_TAR_SUFFIXES = {
    ".tar.gz": "gzip", ".tgz": "gzip", ".tar.bz2": "bzip2", ".tbz2": "bzip2",
    ".tar.xz": "xz", ".txz": "xz", ".tar.zst": "zstd", ".tzst": "zstd",
}
_TAR_SUFFIXES = (".tar", *COMPRESSED_TAR_SUFFIXES)
DAEMON_SOURCE_KINDS = frozenset({"folder", "file_list", "tar", "packed", "hdf5"})


class Source(ABC):
    """A dataset that fastload reads itself: encoded images (or an HDF5 file's fixed-shape rows)
    with targets.

    Subclasses are frozen dataclasses; `FastLoader(source, ...)` opens one in the trainer's
    process. Targets are class indices (int64) or, for multi-label sources, float32 multi-hot rows
    of `num_classes`.
    """

    kind: ClassVar[str]  # the name in a config ("folder", "file_list", "tar", "packed", "hdf5")
    path_fields: ClassVar[tuple[str, ...]] = ()  # fields naming files: made absolute by `resolved`
    # Fields added after configs were first recorded (a pack's manifest, a state's fingerprint): left
    # out of `to_config` at their default, so that what identifies a source does not change.
    quiet_defaults: ClassVar[tuple[str, ...]] = ()
    # Fields holding a size in bytes, given as an int or a string ("12MiB", `_sizes.parse_size`):
    # made ints by `_parse_sizes`, which a subclass's `__post_init__` calls first.
    size_fields: ClassVar[tuple[str, ...]] = ()
    # Fields that choose the reading machine's resources, not the dataset (a node cache's directory
    # and limit): a daemon refuses a peer's source that names them, and reads with its own
    # settings (NOTE [the daemon's cache] in `_daemon/sessions.py`).
    machine_fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            _REGISTRY[cls.kind] = cls

    def _parse_sizes(self) -> None:
        """Each of `size_fields` as bytes (None stays None: the default), so that a bad one is a
        ConfigError naming it where the source is made, not at the first batch."""
        for name in self.size_fields:
            value = parse_optional_size(getattr(self, name), f"{name} of {type(self).__name__}")
            object.__setattr__(self, name, value)

    def size(self, name: str) -> int | None:
        """The size field `name` in bytes, None for its default (`_parse_sizes` made it an int)."""
        return cast(int | None, getattr(self, name))

    @abstractmethod
    def open(self) -> SampleIndex | ArrayIndex:
        """Read the source's index (paths or places, and targets): a `SampleIndex` of encoded
        samples, or an `ArrayIndex` of rows delivered as stored; DatasetError saying what is
        wrong when it cannot."""

    @property
    @abstractmethod
    def where(self) -> str:
        """What iostat and error messages call this source (its main path)."""

    def resolved(self) -> Source:
        """This source with its paths absolute (what a daemon, whose working directory is not
        ours, is sent)."""
        changes: dict[str, Any] = {}
        for name in self.path_fields:
            value = getattr(self, name)
            if isinstance(value, str):
                changes[name] = absolute(value)
            elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
                changes[name] = tuple(absolute(v) for v in value)
            elif value is not None:
                raise ConfigError(
                    f"{self.kind} source field {name} must be a path (a str, or a tuple of them for "
                    f"several), got {shown(value)}"
                )
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def to_json(self) -> str:
        """`to_config` as canonical JSON text (sorted keys): what identifies the source."""
        return json.dumps(self.to_config(), sort_keys=True, separators=(",", ":"))

    def to_config(self) -> dict[str, Any]:
        """This source as JSON-able data (`source_from_config` rebuilds it)."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        fields = {
            k: (list(v) if isinstance(v, tuple) else v)
            for k, v in vars(self).items()
            if not (k in self.quiet_defaults and v == defaults.get(k))
        }
        return {"kind": self.kind, **fields}


def absolute(path: str) -> str:
    """A local path made absolute; a URL (`s3://`, `gs://`, `http(s)://`) as it is."""
    return path if is_url(path) else os.path.abspath(path)


def source_from_config(config: Any) -> Source:
    """The source `Source.to_config` described (ConfigError for an unknown kind or field); the
    config may come from a peer, so anything but a JSON object of known fields, each of the type
    its class declares (NOTE [fields from a peer]), is refused."""
    if not isinstance(config, dict):
        raise ConfigError(f"a source description is a JSON object, got {type(config).__name__}")
    fields = dict(config)
    kind = fields.pop("kind", None)
    cls = _REGISTRY.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ConfigError(f"unknown source kind {shown(kind)}; known: {', '.join(sorted(_REGISTRY))}")
    declared = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    hints = typing.get_type_hints(cls)
    for name, value in fields.items():
        if name not in declared:
            raise ConfigError(f"{kind} source has no field {shown(name)}; its fields: {', '.join(declared)}")
        _check_field(kind, name, hints.get(name), value)
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"bad {kind} source description: {e}") from e


# NOTE [fields from a peer]: a daemon rebuilds a hello's source from JSON a peer wrote, and every
# value then reaches path functions, the allowlist and the opening process. Each field must be of
# the type its class declares (a list of strings for a `tuple[str, ...]`; a bool is not an int),
# and every string in it a usable path (`bounds.field_text_problem`: at most MAX_FIELD_CHARS,
# PATH_MAX, no NUL, no lone surrogate), or the hello is refused naming the field. A declared
# type this check does not know is left to the class's own `__post_init__`.


def _check_field(kind: str, name: str, hint: Any, value: Any) -> None:
    if hint is not None and not _accepts(hint, value):
        raise ConfigError(f"{kind} source field {name} must be {_describe(hint)}, got {shown(value)}")
    for text in value if isinstance(value, list) else [value]:
        problem = field_text_problem(text) if isinstance(text, str) else ""
        if problem:
            raise ConfigError(f"{kind} source field {name} {problem}")


def _accepts(hint: Any, value: Any) -> bool:
    """Whether JSON `value` is of the declared type `hint` (a type it does not know: True)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_accepts(h, value) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint in (bool, int, str):
        return isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return isinstance(value, list) and all(_accepts(args[0], v) for v in value)
        return False
    return True


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return f"a list of {_describe(typing.get_args(hint)[0])[2:]}s"
    names = {type(None): "null", bool: "true or false", int: "an integer", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def as_source(dataset: str | os.PathLike[str] | Source) -> Source:
    """A source for `dataset`: a `Source` as is; a path by what it is. A directory holding a
    packed dataset's manifest is packed, any other directory an image folder; `.h5`/`.hdf5` an
    HDF5 file; `.tar` a tar shard (and a compressed tar, `.tar.gz` ...: `TarShards` says it cannot
    be read and what to do); `.csv`, `.tsv`, `.txt` a file list."""
    if isinstance(dataset, Source):
        return dataset
    path = absolute(os.fspath(dataset))
    lower = path.lower()
    if is_url(path):  # a pack's prefix, a shard (or a brace pattern of shards), a file list
        if lower.endswith((".h5", ".hdf5")):
            raise DatasetError(
                f"{path}: HDF5 files are read from local disk only; from object storage, read a pack "
                "(`fastload pack SRC s3://bucket/prefix`), tar shards or a file list"
            )
        if lower.endswith((".csv", ".tsv", ".txt")):
            return _REGISTRY["file_list"](path)  # type: ignore[call-arg]
        return _REGISTRY["tar" if lower.endswith(_TAR_SUFFIXES) else "packed"](path)  # type: ignore[call-arg]
    if os.path.isdir(path):
        packed = _REGISTRY.get("packed")
        if packed is not None and os.path.exists(os.path.join(path, "manifest.json")):
            return packed(path)  # type: ignore[call-arg]
        return _REGISTRY["folder"](path)  # type: ignore[call-arg]
    by_suffix = (((".h5", ".hdf5"), "hdf5"), (_TAR_SUFFIXES, "tar"), ((".csv", ".tsv", ".txt"), "file_list"))
    for suffixes, kind in by_suffix:
        if lower.endswith(suffixes) and kind in _REGISTRY:
            return _REGISTRY[kind](path)  # type: ignore[call-arg]
    return _REGISTRY["folder"](path)  # type: ignore[call-arg]  # says "does not exist" on open
