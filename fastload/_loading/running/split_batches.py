"""Split batches: a batch cut into row ranges of its slot, one task per worker, and the parts'
outcomes joined back into the batch's.

NOTE [split batches]: one worker decoding a whole batch makes a batch take batch-time
(256 x 2 ms = 0.5 s) to exist, and batches complete in bursts, out of plan order; so every
batch is split into row ranges of its slot, one per worker, and is ready in about
batch-time / workers, in plan order (the first batch of an epoch too). Per-sample seeds make the
result identical to one task's; parts report into the same slot, which stays taken until every
part has stopped writing into it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fastload._bad_samples import SkippedSample
from fastload._batch_counters import BatchCounters
from fastload._loading.jobs.executor import Done, Failure

# A cold batch is split so that each part keeps at least this many rows.
_MIN_SPLIT_ROWS = 4


def part_count(rows: int, workers: int) -> int:
    """How many tasks to make of a batch of `rows`: one per worker, each of at least
    `_MIN_SPLIT_ROWS` rows."""
    return max(1, min(workers, rows // _MIN_SPLIT_ROWS))


@dataclass
class _Parts:
    """The joined outcome of a batch split across workers (see NOTE [split batches])."""

    left: int
    counters: BatchCounters = dataclasses.field(default_factory=BatchCounters)
    skipped: tuple[SkippedSample, ...] = ()
    failure: Failure | None = None


class SplitBatches:
    """The batches in flight as parts: which batch each part belongs to, and what its parts
    reported so far."""

    def __init__(self) -> None:
        self._part_of: dict[int, int] = {}  # seq of a part of a split batch -> the batch's seq
        self._split: dict[int, _Parts] = {}  # batch seq -> its parts' joined outcome so far

    def split(
        self, seq: int, indices: np.ndarray, parts: int, next_seq: Callable[[], int]
    ) -> list[tuple[int, int, np.ndarray]]:
        """Cut batch `seq` into `parts` row ranges: (the part's own seq, its first row, its samples)."""
        n = len(indices)
        self._split[seq] = _Parts(left=parts)
        cut = []
        for row, end in itertools.pairwise([n * k // parts for k in range(parts + 1)]):
            part = next_seq()
            self._part_of[part] = seq
            cut.append((part, row, indices[row:end]))
        return cut

    def holds(self, seq: int) -> bool:
        """Whether `seq` is a part of a split batch (its outcome is to be joined)."""
        return seq in self._part_of

    def join(self, event: Done | Failure) -> Done | Failure | None:
        """Fold one part's outcome into its batch's; the batch's outcome once every part is in."""
        seq = self._part_of.pop(event.seq)
        parts = self._split[seq]
        parts.left -= 1
        if isinstance(event, Done):
            parts.counters += event.counters
            parts.skipped += event.skipped
        elif parts.failure is None:
            parts.failure = dataclasses.replace(event, seq=seq)
        if parts.left:
            return None  # the slot stays taken until every part has stopped writing into it
        del self._split[seq]
        if parts.failure is not None:
            return parts.failure
        return Done(seq, parts.counters, skipped=parts.skipped)
