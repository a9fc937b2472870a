"""Transforms as plain JSON-able data and back: how a chain crosses a socket to the daemon (data,
never pickles). A transform's entry is its declared name and parameters (`_declare`); every name,
field and value read back is checked, then the transform's own checks run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fastload._errors import ConfigError
from fastload.transforms._base import Transform
from fastload.transforms._declare import declaration_of, declared_transforms

_MAX_ENTRIES = 32
_MAX_DEPTH = 2  # a RandomChoice holds transforms, which hold none; a Views' chains may hold one


def _entry_value(value: object) -> object:
    if isinstance(value, tuple):  # numbers, transforms, or (Views) chains of transforms
        return [_entry_value(v) for v in value]
    if isinstance(value, Transform):
        return _entry(value)
    return value


def _entry(t: Transform) -> dict[str, object]:
    declared = declaration_of(type(t))
    entry: dict[str, object] = {"type": type(t).__name__ if declared is None else declared.name}
    for field in dataclasses.fields(t):  # type: ignore[arg-type]
        entry[field.name] = _entry_value(getattr(t, field.name))
    return entry


def to_config(transforms: Sequence[Transform]) -> list[dict[str, object]]:
    """The chain as plain JSON-able data: [{"type": name, field: value, ...}, ...]."""
    return [_entry(t) for t in transforms]


def _field_value(kind: str, name: str, value: object, depth: int) -> object:
    """Check one field read from configuration: numbers, short strings, up to 4 numbers, None,
    (for RandomChoice) a list of transforms, or (for Views) a list of such lists."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str) and len(value) <= 32:
        return value
    if isinstance(value, list) and 1 <= len(value) <= 4 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    ):
        return tuple(value)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return _chain(value, depth + 1)
    if isinstance(value, list) and 1 <= len(value) <= _MAX_ENTRIES and all(
        isinstance(chain, list) and chain and all(isinstance(v, dict) for v in chain) for chain in value
    ):
        return tuple(_chain(chain, depth + 1) for chain in value)
    raise ConfigError(f"{kind}.{name}: {value!r} is not a valid value")


def _chain(config: object, depth: int) -> tuple[Transform, ...]:
    if depth > _MAX_DEPTH:
        raise ConfigError("transforms nest too deep")
    if not isinstance(config, list) or len(config) > _MAX_ENTRIES:
        raise ConfigError(f"transforms must be a list of at most {_MAX_ENTRIES} entries")
    chain: list[Transform] = []
    for entry in config:
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            raise ConfigError(f"a transform entry must be an object with a 'type': {entry!r}"[:200])
        kind = entry["type"]
        declared = declared_transforms().get(kind)
        if declared is None:
            known = ", ".join(sorted(declared_transforms()))
            raise ConfigError(f"unknown transform {kind[:40]!r}; known: {known}")
        cls, fields = declared.cls, set(declared.parameters)
        kwargs = {}
        for name, value in entry.items():
            if name == "type":
                continue
            if name not in fields:
                raise ConfigError(f"{kind} has no parameter {name[:40]!r}")
            kwargs[name] = _field_value(kind, name, value, depth)
        try:
            chain.append(cls(**kwargs))
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{kind}: {e}") from e
    return tuple(chain)


def from_config(config: object) -> tuple[Transform, ...]:
    """Rebuild a chain from `to_config` data, validating every name, field and value.

    This is how transforms cross a socket (the daemon's clients): data, never pickles.
    """
    return _chain(config, 0)
