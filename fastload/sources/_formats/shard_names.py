"""Shard names: what a `TarShards` pattern names (WebDataset's braces, globs), bounded before any
name is made, and the files a daemon's allowlist checks before the shards are scanned.

`expand_braces` expands `{000..099}` and `{a,b}`; `check_shard_patterns` counts what patterns
expand to before anything is expanded or listed (NOTE [source bounds]); `files_named` yields
each file (and each directory a glob lists, before it is listed) for `Source.files_before_open`.
Compressed tar names (`COMPRESSED_TAR_SUFFIXES`) are tar names too: `TarShards` decompresses the
gzip, xz and bzip2 ones into its cache (NOTE [decompressed shards]) and refuses the others by
name, saying what to do.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
from collections.abc import Iterator

from fastload._errors import DatasetError
from fastload.sources._base import FileToOpen
from fastload.sources._storage.bounds import MAX_SHARD_GLOBS, MAX_SHARDS, clip
from fastload.sources._storage.remote import is_url

# Compressed tar names, with the compressor that undoes them: they name a `TarShards`, which
# reads a gzip, xz or bzip2 one through its decompressed copy, or refuses it saying why (NOTE [decompressed
# shards]: samples are read at byte offsets).
COMPRESSED_TAR_SUFFIXES = {
    ".tar.gz": "gzip", ".tgz": "gzip", ".tar.bz2": "bzip2", ".tbz2": "bzip2",
    ".tar.xz": "xz", ".txz": "xz", ".tar.zst": "zstd", ".tzst": "zstd",
}
TAR_SUFFIXES = (".tar", *COMPRESSED_TAR_SUFFIXES)
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^([0-9]{1,18})\.\.([0-9]{1,18})$")


def files_named(patterns: list[str]) -> Iterator[FileToOpen]:
    """Every file `patterns` name, for the allowlist: all their names counted first; a glob's
    directory (the part before its first wildcard) before it is listed, then each match."""
    check_shard_patterns(patterns)  # every pattern's names counted before any is walked
    for p, pattern in enumerate(patterns):
        for expanded in expand_braces(pattern):
            if glob.has_magic(expanded):
                literal = expanded[: min(expanded.index(c) for c in "*?[" if c in expanded)]
                yield FileToOpen(os.path.dirname(literal) or "/", f"the directory of pattern {p}")
                for s, shard in enumerate(sorted(glob.glob(expanded))):
                    yield FileToOpen(shard, f"match {s} of pattern {p}")
            else:
                yield FileToOpen(expanded, f"a shard of pattern {p}")


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's brace notation: `{000..099}` (zero-padded as written) and `{a,b,c}`, every
    brace expanded, in order; at most `MAX_SHARDS` names, counted before any is made."""
    check_shard_patterns([pattern])
    parts = _BRACE.split(pattern)  # literal, brace body, literal, ...
    choices: list[list[str]] = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            choices.append([part])
            continue
        numbers = _RANGE.match(part)
        if numbers is None:
            choices.append(part.split(","))
            continue
        lo, hi = numbers.group(1), numbers.group(2)
        if int(hi) < int(lo):
            raise DatasetError(f"brace range {{{clip(part)}}} in {clip(pattern)} counts down")
        width = len(lo) if lo.startswith("0") else 0
        choices.append([str(k).zfill(width) for k in range(int(lo), int(hi) + 1)])
    return ["".join(combination) for combination in itertools.product(*choices)]


def _brace_count(pattern: str) -> int:
    """How many names `pattern`'s braces expand to, counted without making any (at most just
    over MAX_SHARDS: counting stops there)."""
    parts = _BRACE.split(pattern)
    total = 1
    for part in parts[1::2]:
        numbers = _RANGE.match(part)
        total *= max(0, int(numbers.group(2)) - int(numbers.group(1)) + 1) if numbers else part.count(",") + 1
        if total > MAX_SHARDS:
            return MAX_SHARDS + 1
    return total


def check_shard_patterns(patterns: list[str]) -> None:
    """DatasetError when `patterns`, all together, expand to over MAX_SHARDS names, or to over
    MAX_SHARD_GLOBS names with a wildcard (each a directory to list): counted before any name is
    made or any directory listed (NOTE [source bounds])."""
    names = globs = 0
    for pattern in patterns:
        count = _brace_count(pattern)
        names += count
        if not is_url(pattern) and glob.has_magic(_BRACE.sub("", pattern)):  # URLs are never listed
            globs += count
        if names > MAX_SHARDS:
            what = "expands" if len(patterns) == 1 else f"with the other {len(patterns) - 1} patterns expands"
            raise DatasetError(
                f"{clip(pattern)} {what} to over {MAX_SHARDS:,} shard names (NOTE [source bounds]): "
                "check its braces"
            )
        if globs > MAX_SHARD_GLOBS:
            raise DatasetError(
                f"{clip(pattern)} makes over {MAX_SHARD_GLOBS:,} wildcard patterns, each a directory to "
                "list (NOTE [source bounds]): put the wildcard outside the braces, or name the shards"
            )
