"""What `num_workers="auto"`, `prefetch="auto"` and `autotune=` resolve to: which of the worker
count and the batches in flight a tuner moves while the loader runs, and where it starts.

NOTE [what is tuned]: a number the user gives is always obeyed; what is left to fastload is tuned.
- Sources (a folder, a file list, shards, ...) given neither `num_workers` nor `prefetch` (nor
  DataLoader's `prefetch_factor`) tune both; `"auto"` for one tunes that one (the other, if a
  number, is kept). `autotune=False` turns tuning off: `"auto"` then means the derived default
  (the cores this process may use; `ring_plan`'s batches in flight), as before tuning existed.
- A map-style `Dataset` keeps DataLoader's default (`num_workers=0`, in this process) unless told
  `"auto"`: its `__getitem__` runs in worker processes then, which are tuned like a source's.
- An `IterableDataset` is one stream per worker: its worker count is never tuned (a new worker
  would be a new stream, a retired one would end its stream early); `"auto"` there starts the
  default count and tunes only the batches in flight, and says so once (`SettingsWarning`).
- With `num_workers=0` (in this process), a daemon (the daemon divides its own pool among its
  sessions: `priority=` weighs this one) or a decoder in this process (backend "dali" or "nvjpeg"
  on CUDA) there are no workers of this loader's to tune, and its window is not tuned either.
- A user's sampler, batch_sampler or collate_fn runs where it runs today (the sampler in this
  process): the tuner sees its cost only as time the trainer waits, and cannot move it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from fastload._errors import ConfigError, SettingsWarning
from fastload._loading.link.daemon_link import PRIORITY_RANGE

AUTO = "auto"


@dataclass(frozen=True)
class Tuning:
    """The worker count and batches in flight to start with, and which of them a tuner moves."""

    num_workers: int | None  # None: the default (`build.default_workers` for a source, else 0)
    prefetch: int | None  # None: `ring_plan` derives it
    tune_workers: bool
    tune_in_flight: bool


def resolve_tuning(
    num_workers: int | str | None,
    prefetch: int | str | None,
    prefetch_factor: int | None,
    autotune: bool | None,
    *,
    is_source: bool,
    iterable: bool,
) -> Tuning:
    """NOTE [what is tuned]: the user's `num_workers`, `prefetch` and `autotune` as the numbers to
    start with and what to tune. Whether a daemon or a decoder in this process leaves nothing to
    tune is `tuned_here`'s, once the spec is known."""
    if autotune not in (None, True, False):
        raise ConfigError(f"autotune must be True, False or None (the default), got {autotune!r}")
    for name, value in (("num_workers", num_workers), ("prefetch", prefetch)):
        if isinstance(value, str) and value != AUTO:
            raise ConfigError(f"{name}={value!r}: pass a number, or 'auto' (tuned as the loader runs)")
    workers_auto = num_workers == AUTO or (num_workers is None and is_source)
    window_auto = prefetch == AUTO or (prefetch is None and prefetch_factor is None)
    if num_workers is None and prefetch is None and prefetch_factor is None:
        default_on = is_source  # neither given: a source tunes both, a Dataset keeps DataLoader's
    else:
        default_on = AUTO in (num_workers, prefetch)
    on = default_on if autotune is None else autotune
    tune_workers = on and workers_auto and (is_source or num_workers == AUTO)
    if on and iterable and num_workers == AUTO:
        warnings.warn(
            "num_workers='auto' with an IterableDataset: its worker count is not tuned (each worker "
            "is one stream of it; a new one would add a stream, a retired one end its stream "
            "early); it starts the default count and only the batches in flight are tuned — pass a "
            "number of workers to choose the streams",
            SettingsWarning,
            stacklevel=4,
        )
        tune_workers = False
    tune_in_flight = on and window_auto
    if autotune is True and not (tune_workers or tune_in_flight):
        raise ConfigError(
            "autotune=True, but num_workers and prefetch are both numbers, which are always obeyed: "
            "pass num_workers='auto' and/or prefetch='auto' (or leave them out) to tune them"
        )
    return Tuning(
        num_workers=None if num_workers == AUTO else num_workers,  # type: ignore[arg-type]
        prefetch=None if prefetch == AUTO else prefetch,  # type: ignore[arg-type]
        tune_workers=tune_workers,
        tune_in_flight=tune_in_flight,
    )


def check_priority(priority: float) -> float:
    """A daemon session's weight in its daemon's shares (NOTE [shares by need]): a number in the
    range a daemon takes (1 by default; 0.25 for a validation job beside training gives it a
    quarter of a trainer's weight)."""
    low, high = PRIORITY_RANGE
    if isinstance(priority, bool) or not isinstance(priority, (int, float)) or not (
        low <= priority <= high
    ):
        raise ConfigError(
            f"priority must be a number > 0, from {low:g} to {high:g} (1 by default), got {priority!r}"
        )
    return float(priority)
