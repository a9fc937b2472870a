"""Exclusion lists: the broken samples `fastload verify` writes, and what `exclude=` leaves out.

A list is UTF-8 text, one sample a line: its name as the source names it (a file's path, a
shard's `shard:key`, an HDF5 row), a tab, and why it was listed; `#` starts a comment line. A
name holding a tab or a line break is written as a JSON string. `exclude=` takes such a file's
path, or the names themselves, or sample indices (ints, the only way to name a Dataset's samples).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from fastload._errors import ConfigError

ExcludeArg = str | os.PathLike[str] | Iterable[str | int] | None


def write_list(path: str | os.PathLike[str], broken: Iterable[tuple[str, str]], header: str) -> int:
    """Write (name, why) pairs as an exclusion list under a `#` header; return how many."""
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for line in header.splitlines():
            out.write(f"# {line}\n")
        for name, why in broken:
            shown = json.dumps(name) if any(c in name for c in "\t\n\r") or name.startswith('"') else name
            out.write(f"{shown}\t{' '.join(why.split())}\n")
            count += 1
    return count


def read_list(path: str | os.PathLike[str]) -> list[str]:
    """The sample names an exclusion list holds (`write_list`'s format; a bare name a line too)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"exclude={os.fspath(path)!r}: cannot read it as an exclusion list: {e}") from None
    names = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith('"'):
            decoder = json.JSONDecoder()
            try:
                name, _ = decoder.raw_decode(line)
            except ValueError:
                where = f"exclude={os.fspath(path)!r}"
                raise ConfigError(f"{where}: a quoted name is not valid JSON: {line[:80]}") from None
            names.append(str(name))
        else:
            names.append(line.split("\t", 1)[0])
    return names


def kept_indices(
    exclude: ExcludeArg, num_samples: int, name_of: Callable[[int], str] | None
) -> np.ndarray | None:
    """The samples an epoch draws from (sorted int64), or None when `exclude` leaves out none.
    Names are matched against `name_of(i)` for every sample (one pass); a name or an index the
    source does not hold is a ConfigError (a list made for another dataset would exclude nothing)."""
    if exclude is None:
        return None
    entries = read_list(exclude) if isinstance(exclude, (str, os.PathLike)) else list(exclude)
    indices = {int(e) for e in entries if isinstance(e, (int, np.integer)) and not isinstance(e, bool)}
    names = {e for e in entries if isinstance(e, str)}
    if len(indices) + len(names) != len(set(entries)):
        raise ConfigError("exclude= takes a list's path, or sample names (str) or indices (int)")
    bad = [i for i in indices if not 0 <= i < num_samples]
    if bad:
        raise ConfigError(f"exclude= names indices outside 0..{num_samples - 1}: {sorted(bad)[:5]}")
    if names:
        if name_of is None:
            raise ConfigError("exclude= names samples by name, but this dataset has no names: give indices")
        found = {i for i in range(num_samples) if name_of(i) in names}
        missing = names - {name_of(i) for i in found}
        if missing:
            raise ConfigError(
                f"exclude= names {len(missing)} samples this source does not hold, e.g. "
                f"{sorted(missing)[:3]}: a list made for another dataset, or another root?"
            )
        indices |= found
    if not indices:
        return None
    keep = np.setdiff1d(np.arange(num_samples, dtype=np.int64), np.fromiter(indices, np.int64))
    if len(keep) == 0:
        raise ConfigError("exclude= leaves out every sample of the source")
    return keep


def digest(keep: np.ndarray | None) -> str | None:
    """What a state_dict records of an exclusion: a hash of the samples kept (None: all)."""
    return None if keep is None else hashlib.blake2b(keep.tobytes(), digest_size=8).hexdigest()
