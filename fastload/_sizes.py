"""Sizes in bytes as people write them: the one parser of every size-like setting and the one
formatter of every size a message shows.

`parse_size` takes what a user may write for any size (a `FastLoader` source's `cache_limit`, the
daemon's `memory_budget` and `index_memory` as flags or TOML, `fastload pack --shard-size` and
`pack(shard_bytes=)`, `FASTLOAD_CACHE_LIMIT`): an int of bytes, or a string, "1073741824",
"512KiB", "12MiB", "8GiB", "1.5TiB" (powers of 1024; "12m", "8g" too, as Docker writes them) or
"512MB", "8GB" (powers of 1000). Anything else is a `ConfigError` that names the setting, the
value and the forms accepted, raised where the setting is given, not where it is first used.

`format_size` writes a byte count with the largest binary unit under it, three figures at most:
"12 MiB", "1.5 GiB", "640 KiB", "100 B", never "0.0 GiB".
"""

from __future__ import annotations

import math
import re

from fastload._errors import ConfigError

__all__ = ["SIZE_FORMS", "format_size", "parse_optional_size", "parse_size", "shown"]

SIZE_FORMS = (
    'a number of bytes (an int, or a string such as "1073741824"), or a string with a unit: '
    '"512KiB", "12MiB", "8GiB" (powers of 1024; also "12m", "8g") or "512MB", "8GB" (powers of 1000)'
)

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")
_SHOWN_CHARS = 60  # of a bad value, in the message


def parse_size(value: object, name: str, *, minimum: int = 0) -> int:
    """`value` (an int, or a string like "12MiB") as bytes; a ConfigError naming the setting
    `name`, the value and `SIZE_FORMS` when it is not a size, or when it is under `minimum`."""
    n = _bytes(value)
    if n is None:
        raise ConfigError(f"{name} must be a size, {SIZE_FORMS}; got {shown(value)}")
    if n < minimum:
        raise ConfigError(f"{name} must be at least {format_size(minimum)}, got {shown(value)}")
    return n


def parse_optional_size(value: object, name: str, *, minimum: int = 0) -> int | None:
    """`parse_size`, with None (the setting's default) passed through."""
    return None if value is None else parse_size(value, name, minimum=minimum)


def format_size(n_bytes: float) -> str:
    """`n_bytes` for a person: "12 MiB", "1.5 GiB", "100 B" (binary units, three figures at most)."""
    value = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1000 or unit == "TiB":  # 1000..1023 KiB reads better as 0.98 MiB
            if unit == "B":
                return f"{value:.0f} B"
            return f"{_figures(value)} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _figures(value: float) -> str:
    """Three significant figures, no trailing zeros: 12, 1.5, 0.98, 478."""
    if value == 0 or abs(value) >= 100:
        return f"{value:.0f}"
    decimals = 2 - int(math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


def _bytes(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):  # 4e9 written in Python or TOML: whole numbers only
        return int(value) if value.is_integer() and value >= 0 else None
    if not isinstance(value, str):
        return None
    match = _SIZE.fullmatch(value)
    if match is None or match.group(2).lower() not in _UNITS:
        return None
    number, scale = match.group(1), _UNITS[match.group(2).lower()]
    if "." not in number:
        return int(number) * scale
    return int(float(number) * scale)


def shown(value: object) -> str:
    """A bad setting's value in a message, no repr: a string quoted (clipped), a number as
    written, anything else by its type ("a list")."""
    if isinstance(value, str):
        return f'"{value[:_SHOWN_CHARS]}"' + ("..." if len(value) > _SHOWN_CHARS else "")
    if isinstance(value, int | float):
        return str(value)
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"
