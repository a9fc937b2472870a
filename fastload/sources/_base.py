"""The seam every source sits behind: `Source` (what a user names), its config (what a daemon is
sent), its declaration as a kind (what a plain path means, whether a daemon serves it, the files
it opens), and `as_source` (what a plain path means).

A source is a small frozen description (a path and a few options). `open()` reads what it must
(scans a folder, parses a list, reads a shard's headers or a packed index) into a `SampleIndex`
in the trainer, once, before any worker starts; the sequential-read shuffles live in the plan,
not in the source (DESIGN: "sources as seams").

NOTE [a source kind is declared once]: a kind is declared in its class statement,
`class TarShards(Source, kind="tar", named_by=Naming(...), served_by_daemon=True)`, which
registers it (`source_kinds()`): its name in a config (`source_from_config`), the plain paths
that mean it (`Naming`, read by `as_source`), whether a daemon may serve it
(`DAEMON_SOURCE_KINDS`, `check_served_by_daemon`); its methods say every file it would open
(`files_before_open`, which a daemon's allowlist checks before it opens anything:
`_daemon/confine.py` asks the source, it knows no kind) and how its open keeps to a daemon's
bounds (`open_bounded`). The package's kinds are registered when `fastload.sources` is imported,
which any import of this module does first; a kind defined elsewhere (a daemon's plugin,
`fastload serve --plugin`) when its module is imported. A declaration that contradicts another
(a kind or a suffix claimed twice) is a ConfigError at the class statement.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Set
from typing import Any, ClassVar, cast

from fastload._errors import ConfigError, DatasetError
from fastload._sizes import parse_optional_size, shown
from fastload.sources._indexes.arrays import ArrayIndex
from fastload.sources._indexes.sample_index import SampleIndex
from fastload.sources._storage.bounds import field_text_problem
from fastload.sources._storage.remote import is_url

_REGISTRY: dict[str, type[Source]] = {}
_KIND_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclasses.dataclass(frozen=True)
class Naming:
    """The plain paths that mean a source kind (`as_source`), as its class declares them.

    - `suffixes`: a local file whose name ends so (compared lowercase: ".tar", ".csv"); each
      suffix belongs to one kind, and the longest that matches wins.
    - `at_urls`: a URL ending in one of `suffixes` means this kind too; else such a URL is
      refused with `url_refusal` (default: the kind reads local files only).
    - `any_url`: any URL no kind's suffix claims (a pack's prefix); one kind at most.
    - `marker`: a directory holding a file of this name (a pack's "manifest.json"); one kind each.
    - `any_local`: any other local path, a directory without a marker among them (an image
      folder; a missing path then says so when opened); one kind at most.
    """

    suffixes: tuple[str, ...] = ()
    at_urls: bool = False
    any_url: bool = False
    marker: str = ""
    any_local: bool = False
    url_refusal: str = ""

    @property
    def empty(self) -> bool:
        """No plain path means this kind: it is made by name only."""
        return not (self.suffixes or self.any_url or self.marker or self.any_local)


@dataclasses.dataclass(frozen=True)
class FileToOpen:
    """A file a source will open (or a directory it will list), as a daemon's allowlist checks it
    before the source reads anything (`Source.files_before_open`)."""

    path: str
    # How a refusal names it ("its path", "match 2 of pattern 0"): never the path itself (NOTE
    # [refusals carry no content] in `_daemon/confine.py`: it may be a line of a file).
    what: str
    regular: bool = False  # where something is there, it must be a regular file (no FIFO, device)
    # It passes while nothing is there (HDF5's last resort, the working directory: NOTE [where HDF5
    # looks for a file] in `_hdf5_reach.py`), so the daemon's working directory need not be a root.
    passes_while_missing: bool = False


@dataclasses.dataclass(frozen=True)
class OpenBounds:
    """What a daemon lets one open take (`Source.open_bounded`): the files a scan may list, the
    bytes its index may hold, a `time.monotonic()` deadline."""

    max_files: int
    max_bytes: int
    deadline: float


class UnboundedFiles(DatasetError):
    """A source cannot name every file it would open within the bounds (an HDF5 file that reaches
    too many others, or names them by a printf pattern). Its message names only files already
    checked, so a daemon's refusal may quote it to its peer."""


class Source(ABC):
    """A dataset that fastload reads itself: encoded images (or an HDF5 file's fixed-shape rows)
    with targets.

    Subclasses are frozen dataclasses; `FastLoader(source, ...)` opens one in the trainer's
    process. Targets are class indices (int64) or, for multi-label sources, float32 multi-hot rows
    of `num_classes`.
    """

    # The declaration (NOTE [a source kind is declared once]), set by the class statement's
    # keywords: the name in a config ("folder", "file_list", "tar", "packed", "hdf5"), the plain
    # paths that mean it, whether a daemon may serve it.
    kind: ClassVar[str]
    named_by: ClassVar[Naming] = Naming()
    served_by_daemon: ClassVar[bool] = False
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

    def __init_subclass__(
        cls,
        *,
        kind: str | None = None,
        named_by: Naming | None = None,
        served_by_daemon: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """Declare and register a kind (`kind=`); a subclass without one (a base of kinds, a
        variant of one) registers nothing and inherits its parent's declaration."""
        super().__init_subclass__(**kwargs)
        if kind is None:
            if named_by is not None or served_by_daemon is not None:
                raise ConfigError(f"source class {cls.__qualname__} declares a kind's details without kind=")
            return
        cls.kind = kind
        cls.named_by = named_by if named_by is not None else Naming()
        cls.served_by_daemon = bool(served_by_daemon)
        _register(cls)

    def open_bounded(self, bounds: OpenBounds) -> SampleIndex | ArrayIndex:
        """`open()` within a daemon's bounds: a kind whose open walks what it cannot count first
        (a folder's tree) stops at them, saying so; by default `open()`, which the opening
        process's own deadline and memory limit bound."""
        return self.open()

    def files_before_open(self) -> Iterator[FileToOpen]:
        """Every file `open()` would read (or directory it would list) before it reads any: what
        a daemon's allowlist checks, one at a time, before the next is made (a kind that lists a
        directory yields the directory before its entries). By default each path field's value.
        A kind a daemon serves names here every file it opens itself; the files its index makes
        workers read are checked on the opened index (`_daemon/confine.check_index`)."""
        for name in self.path_fields:
            value = getattr(self, name)
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, str):
                    yield FileToOpen(v, f"its {name}")

    def check_served_by_daemon(self) -> None:
        """ConfigError unless a daemon may serve this kind (its declaration says so)."""
        if not self.served_by_daemon:
            raise ConfigError(f"a daemon does not serve {self.kind} sources: load them without daemon=")

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


def _register(cls: type[Source]) -> None:
    """Add a declared kind to the registry; ConfigError for a declaration that contradicts one
    already there (a reload of the same class replaces it)."""
    kind, naming = cls.kind, cls.named_by

    def clash(what: str, other: type[Source]) -> ConfigError:
        return ConfigError(
            f"source kind {kind!r} ({cls.__module__}.{cls.__qualname__}) declares {what}, already "
            f"declared by kind {other.kind!r} ({other.__module__}.{other.__qualname__}): give it another"
        )

    if not isinstance(kind, str) or not _KIND_NAME.fullmatch(kind):
        raise ConfigError(f"source kind {shown(kind)} must be a name of lowercase letters, digits and _")
    for suffix in naming.suffixes:
        if not (suffix.startswith(".") and suffix == suffix.lower() and len(suffix) > 1):
            raise ConfigError(f"source kind {kind!r}: suffix {suffix!r} must be lowercase and start with '.'")
    if cls.served_by_daemon and not cls.path_fields and "files_before_open" not in vars(cls):
        raise ConfigError(
            f"source kind {kind!r} is served by a daemon but names no file it opens: declare its "
            "path_fields or define files_before_open (the daemon's allowlist checks them)"
        )
    for other in _REGISTRY.values():
        if (other.__module__, other.__qualname__) == (cls.__module__, cls.__qualname__):
            continue
        if other.kind == kind:
            raise clash("its name", other)
        shared = set(naming.suffixes) & set(other.named_by.suffixes)
        if shared:
            raise clash(f"suffix {sorted(shared)[0]!r}", other)
        if naming.marker and naming.marker == other.named_by.marker:
            raise clash(f"marker {naming.marker!r}", other)
        if naming.any_url and other.named_by.any_url:
            raise clash("any_url", other)
        if naming.any_local and other.named_by.any_local:
            raise clash("any_local", other)
    _REGISTRY[kind] = cls


def source_kinds() -> dict[str, type[Source]]:
    """Every declared source kind, by name (a copy)."""
    return dict(_REGISTRY)


class _DaemonKinds(Set[str]):
    """The names of the kinds a daemon serves, read from the declarations whenever asked (a
    plugin's kind declared after import is one)."""

    def _kinds(self) -> frozenset[str]:
        return frozenset(k for k, cls in _REGISTRY.items() if cls.served_by_daemon)

    def __contains__(self, kind: object) -> bool:
        return kind in self._kinds()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._kinds()))

    def __len__(self) -> int:
        return len(self._kinds())

    def __repr__(self) -> str:
        return f"DAEMON_SOURCE_KINDS({sorted(self._kinds())})"


DAEMON_SOURCE_KINDS: Set[str] = _DaemonKinds()


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
    """A source for `dataset`: a `Source` as is; a path by what it is, as the kinds declare
    (`Naming`): a directory holding a packed dataset's manifest is packed, any other directory an
    image folder; `.h5`/`.hdf5` an HDF5 file; `.tar` a tar shard (and a compressed tar, `.tar.gz`
    ...: `TarShards` says it cannot be read and what to do); `.csv`, `.tsv`, `.txt` a file list;
    any other URL a pack's prefix."""
    if isinstance(dataset, Source):
        return dataset
    path = absolute(os.fspath(dataset))
    return _kind_named(path)(path)  # type: ignore[call-arg]


def _kind_named(path: str) -> type[Source]:
    """The kind a plain (absolute) path means (see `as_source`)."""
    lower = path.lower()
    ending = [(len(s), cls) for cls in _REGISTRY.values() for s in cls.named_by.suffixes if lower.endswith(s)]
    by_suffix = max(ending, key=lambda e: e[0])[1] if ending else None
    if is_url(path):  # a pack's prefix, a shard (or a brace pattern of shards), a file list
        if by_suffix is not None:
            naming = by_suffix.named_by
            if not naming.at_urls:
                why = naming.url_refusal or f"{by_suffix.kind} sources are read from local disk only"
                raise DatasetError(f"{path}: {why}")
            return by_suffix
        return _the_one(lambda n: n.any_url, path)
    if os.path.isdir(path):
        for cls in _REGISTRY.values():
            if cls.named_by.marker and os.path.exists(os.path.join(path, cls.named_by.marker)):
                return cls
        return _the_one(lambda n: n.any_local, path)
    return by_suffix or _the_one(lambda n: n.any_local, path)  # the latter says "does not exist" on open


def _the_one(claims: Callable[[Naming], bool], path: str) -> type[Source]:
    for cls in _REGISTRY.values():
        if claims(cls.named_by):
            return cls
    raise DatasetError(f"{path}: no source kind reads it; known: {', '.join(sorted(_REGISTRY))}")
