"""The bad-sample policy: `on_error`, the deterministic replacement of a sample that cannot be
loaded, and the trainer's account of what was skipped (warned once, capped by `max_skipped`).

NOTE [bad samples]: with `on_error="raise"` (the default) a sample that cannot be read or decoded
fails its whole batch (`SampleError`; the batch's other samples are not delivered). With
`on_error="skip"` the worker loading it puts another sample in its row instead, so every batch
stays full and every rank of a distributed run takes the same number of steps (a rank that lost
a batch would wait forever in the next all-reduce). The replacement is drawn from (seed, epoch,
the bad sample's index, attempt) alone: the same for any number of workers, through a daemon and
after a resume. A replacement that fails too is skipped in turn, up to `MAX_ATTEMPTS` draws. The
replacement gets its own label and its own augmentation draws (as if it had been drawn itself);
its row's `SampleIds` name it. Every broken sample met is reported with its batch (`Done.skipped`)
and counted; `max_skipped` bounds how many distinct broken samples a loader accepts before it
raises: a dataset that is mostly broken must not train on repeats.
"""

from __future__ import annotations

import hashlib
import math
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._errors import ConfigError, DatasetError

ON_ERROR = ("raise", "skip")
MAX_ATTEMPTS = 8  # replacements drawn for one row before its batch fails
DEFAULT_MAX_SKIPPED = 0.05  # of the source's samples (rounded up: at least one of any source)
_MAX_REASON_CHARS = 300
_KEY = struct.Struct("<qqqq")


@dataclass(frozen=True)
class SkippedSample:
    """A sample that could not be loaded: its index, what it is (a file, a key), why, and the row
    of its batch that took `replacement` instead (-1: none did, the batch failed)."""

    index: int
    name: str
    reason: str
    row: int
    replacement: int

    def to_json(self) -> list[Any]:
        return [self.index, self.name, self.reason, self.row, self.replacement]

    @classmethod
    def from_json(cls, item: Any) -> SkippedSample:
        """From `to_json` data (a worker's or a daemon's): ValueError if it is not that."""
        if not isinstance(item, list) or len(item) != 5:
            raise ValueError(f"a skipped-sample record is not a list of 5: {item!r:.100}")
        index, name, reason, row, replacement = item
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (index, row, replacement)):
            raise ValueError("a skipped-sample record's index, row and replacement must be integers")
        if not isinstance(name, str) or not isinstance(reason, str):
            raise ValueError("a skipped-sample record's name and reason must be strings")
        return cls(index, name[:4096], reason[:_MAX_REASON_CHARS], row, replacement)


def reason_of(exc: BaseException, words: str = "") -> str:
    """What went wrong, in a line, bounded: `words` where a backend said it (`undecodable`: "empty
    file (0 bytes)", ...), else the exception's type and message."""
    text = (words or f"{type(exc).__name__}: {exc}").replace("\n", " ")
    return text[:_MAX_REASON_CHARS]


def replacement(
    seed: int, epoch: int, index: int, attempt: int, num_samples: int, keep: np.ndarray | None = None
) -> int:
    """The sample that takes bad sample `index`'s row at `attempt` (0, 1, ...): uniform over the
    source's other samples (those in `keep`, sorted, when an `exclude=` list left some out), a
    function of its arguments only (NOTE [bad samples])."""
    pool = num_samples if keep is None else len(keep)
    if pool < 2:
        raise DatasetError("a source of one sample has nothing to replace a broken sample with")
    key = _KEY.pack(seed & (2**63 - 1), epoch, index, attempt)
    draw = int.from_bytes(hashlib.blake2b(key, digest_size=8, person=b"fl-skip").digest(), "little")
    if keep is None:
        other = draw % (num_samples - 1)
        return other + 1 if other >= index else other  # never the bad sample itself
    at = int(np.searchsorted(keep, index))
    held = at < pool and int(keep[at]) == index  # the bad sample is one of `keep`: never itself
    other = draw % (pool - 1) if held else draw % pool
    return int(keep[other + 1 if held and other >= at else other])


def stand_ins(indices: np.ndarray, skipped: Sequence[SkippedSample]) -> np.ndarray:
    """A batch's samples as loaded: `indices` with each replaced row's last stand-in."""
    held = indices.copy()
    for sample in skipped:  # in the order drawn: a stand-in that failed too is replaced after
        if 0 <= sample.row < len(held) and sample.replacement >= 0:
            held[sample.row] = sample.replacement
    return held


def check_policy(on_error: str, max_skipped: float | int) -> None:
    """ConfigError for an `on_error` or `max_skipped` FastLoader does not take."""
    if on_error not in ON_ERROR:
        raise ConfigError(f"on_error={on_error!r}: it takes 'raise' (the default) or 'skip'")
    if isinstance(max_skipped, bool) or not isinstance(max_skipped, (int, float)) or max_skipped < 0:
        raise ConfigError(
            f"max_skipped={max_skipped!r}: give a fraction of the samples (0.01: 1%) as a float, or a "
            "count as an int, >= 0"
        )
    if isinstance(max_skipped, float) and max_skipped > 1:
        raise ConfigError(f"max_skipped={max_skipped!r}: a float is a fraction of the samples, at most 1.0")


class SkipAccount:
    """The trainer's account of skipped samples: each named once in a warning, counted, and
    held to the cap (`max_skipped`: a float is a fraction of `num_samples`, an int a count)."""

    def __init__(self, max_skipped: float | int, num_samples: int) -> None:
        self.limit = math.ceil(max_skipped * num_samples) if isinstance(max_skipped, float) else max_skipped
        self.max_skipped = max_skipped
        self.num_samples = num_samples
        self.samples: dict[int, SkippedSample] = {}  # distinct broken samples met, by index

    def __len__(self) -> int:
        return len(self.samples)

    def record(self, skipped: Sequence[SkippedSample]) -> int:
        """Take a batch's skipped samples; return how many were new. DatasetError past the cap."""
        new = [s for s in skipped if s.index not in self.samples]
        for sample in new:
            self.samples[sample.index] = sample
            warnings.warn(
                f"skipped a sample that cannot be loaded (on_error='skip'): {sample.name or sample.index}: "
                f"{sample.reason}; `fastload verify` lists every such sample, and `exclude=` leaves them out",
                stacklevel=4,
            )
        if len(self.samples) > self.limit:
            cap = f"{self.max_skipped:g} of {self.num_samples}" if isinstance(self.max_skipped, float) else ""
            raise DatasetError(
                f"{len(self.samples)} samples could not be loaded, more than max_skipped={self.max_skipped!r}"
                f"{f' ({cap} = {self.limit})' if cap else ''}: the dataset looks broken, and training on "
                "the replacements would repeat samples; check it with `fastload verify PATH`, or raise "
                "max_skipped"
            )
        return len(new)
