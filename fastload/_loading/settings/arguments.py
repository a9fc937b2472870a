"""The checks of FastLoader's arguments, run once at construction: each refuses what the loader
cannot honour with a `ConfigError` that says what is accepted (DataLoader's rules and words where
DataLoader has the argument)."""

from __future__ import annotations

import math
import multiprocessing as mp
from collections.abc import Iterable, Sequence
from multiprocessing.context import BaseContext

import torch

from fastload._errors import ConfigError
from fastload._sizes import shown

# The ranges of a loader's seed and of an epoch (or a count of batches or samples), one place for
# the arguments and for resume states (NOTE [checked states] in `resume`): a seed is never
# negative (SeedSequence takes 128 bits of entropy); epochs and counts stay within int64 with room
# to add one (workers carry them as int64).
SEED_LIMIT = 2**128
COUNT_LIMIT = 2**62


def _integer(value: object) -> int | None:
    """`value` as an int when it is an integer (numpy's and torch's too; not a bool or a float)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        return None
    return int(value.__index__())


def check_seed(seed: object) -> None:
    """`seed` (None: drawn) is an integer 0..2**128-1."""
    value = _integer(seed)
    if seed is not None and (value is None or not 0 <= value < SEED_LIMIT):
        raise ConfigError(
            f"seed must be an integer 0..2**128-1 (or None: drawn as DataLoader does), got {shown(seed)}"
        )


def check_epoch(epoch: object) -> int:
    """`epoch` as `set_epoch` takes it: an integer 0..2**62, as an int."""
    value = _integer(epoch)
    if value is None or not 0 <= value <= COUNT_LIMIT:
        raise ConfigError(f"set_epoch takes an integer epoch 0..2**62, got {shown(epoch)}")
    return value


def check_workers(
    num_workers: object,  # as given to FastLoader: checked here to be an int
    timeout: float,
    hang_timeout: float | None,
    prefetch_factor: int | None,
    persistent_workers: bool,
) -> None:
    """Worker counts, timeouts and DataLoader's worker-only options."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int):
        raise ConfigError(
            f"num_workers={shown(num_workers)} is not a number of processes: pass an int (0 loads in "
            "this process), 'auto' (tuned as the loader runs), or None for the default"
        )
    if num_workers < 0:
        raise ConfigError(f"num_workers must be >= 0, got {num_workers}")
    if timeout < 0:
        raise ConfigError(f"timeout must be >= 0, got {timeout}")
    if hang_timeout is not None and not 0 <= hang_timeout < math.inf:
        raise ConfigError(f"hang_timeout must be a number of seconds >= 0 (0: off), got {hang_timeout}")
    if prefetch_factor is not None and num_workers == 0:
        raise ConfigError("prefetch_factor needs num_workers > 0, as in DataLoader")
    if persistent_workers and num_workers == 0:
        raise ConfigError("persistent_workers=True needs num_workers > 0, as in DataLoader")


def check_batching(
    batch_size: int | None,
    shuffle: bool | None,
    sampler: object,
    batch_sampler: Iterable[Sequence[int]] | None,
    drop_last: bool,
) -> None:
    """DataLoader's batching rules: batch_sampler excludes the rest; a positive batch size."""
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ConfigError(
                "batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last"
            )
    elif batch_size is None:
        raise ConfigError("batch_size=None (no batching) is not supported: give a batch size")
    elif batch_size <= 0:
        raise ConfigError(f"batch_size must be positive, got {batch_size}")
    if sampler is not None and shuffle:
        raise ConfigError("sampler is mutually exclusive with shuffle")


def check_iterable(
    shuffle: bool | None,
    sampler: object,
    batch_sampler: Iterable[Sequence[int]] | None,
    shuffle_block: int | None,
) -> None:
    """What DataLoader refuses with an IterableDataset: it orders its own samples."""
    if shuffle not in (None, False) or shuffle_block is not None:
        raise ConfigError(
            "an IterableDataset orders its own samples: expected shuffle unspecified or False "
            f"(and no shuffle_block), got shuffle={shuffle!r}"
        )
    if sampler is not None or batch_sampler is not None:
        raise ConfigError("an IterableDataset orders its own samples: sampler and batch_sampler do not apply")


def check_block_shuffle(block: int | None, window: int, shuffle: bool | None) -> None:
    """Block shuffle's sizes, and the shuffle it needs."""
    for name, value in (("shuffle_block", block), ("shuffle_window", window)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be an integer >= 1, got {shown(value)}")
    if block is not None and not shuffle:
        raise ConfigError(
            "shuffle_block orders a shuffled epoch by runs of consecutive samples: it needs shuffle=True"
        )


def check_device(device: torch.device) -> None:
    """Refuse, at construction, a device batches cannot be delivered to."""
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise ConfigError(f"device must be 'cpu' or 'cuda[:N]', got {str(device)!r}")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
        raise ConfigError(
            f"device={str(device)!r} but CUDA is not available to this process (torch {torch.__version__}, "
            f"{build}; no GPU visible): pass device='cpu', or run where a GPU and a CUDA build of torch are"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(
            f"device={str(device)!r} but this process sees {torch.cuda.device_count()} GPU(s) "
            "(CUDA_VISIBLE_DEVICES?): pick one of them"
        )


def check_mp_context(context: str | BaseContext | None, num_workers: int) -> None:
    """DataLoader's rules: a start method only with workers, and only one multiprocessing knows."""
    if context is None:
        return
    if num_workers == 0:
        raise ConfigError(
            "multiprocessing_context can only be used with multi-process loading (num_workers > 0), "
            "as in DataLoader"
        )
    if isinstance(context, BaseContext):
        return
    methods = mp.get_all_start_methods()
    if not isinstance(context, str) or context not in methods:
        raise ConfigError(
            f"multiprocessing_context must be one of {methods} (or a context), got {shown(context)}"
        )


def normalize_values(normalize: tuple[Sequence[float], Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """(mean, std) in torchvision's units, checked: fastload normalizes images scaled to [0, 1]."""
    mean, std = (tuple(float(v) for v in normalize[0]), tuple(float(v) for v in normalize[1]))
    if len(mean) != 3 or len(std) != 3:
        raise ConfigError("normalize takes (mean, std) with 3 values each (R, G, B)")
    if not all(0.0 <= v <= 1.0 for v in mean) or not all(0.0 < v <= 1.0 for v in std):
        scaled = max((*mean, *std)) > 1.0
        raise ConfigError(
            f"normalize=(mean={mean}, std={std}) is not in fastload's units: means in [0, 1] and stds "
            "in (0, 1], of pixels scaled to [0, 1] (torchvision's convention, e.g. mean=(0.485, 0.456, "
            "0.406), std=(0.229, 0.224, 0.225))"
            + ("; these look like 0-255 units (DALI's convention): divide them by 255" if scaled else "")
        )
    return mean, std
