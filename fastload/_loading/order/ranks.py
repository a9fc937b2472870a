"""Which shard this process loads: its rank and the world size, from the arguments, an initialized
torch.distributed process group, or the launcher's environment (torchrun, Lightning, SLURM-style
node and local ranks); never a guessed rank 0 when there is more than one process.
"""

from __future__ import annotations

import os

import torch

from fastload._errors import ConfigError

__all__ = ["process_position", "processes_around"]


def process_position(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's (rank, world size) for sharding a folder.

    Each one not given comes from torch.distributed when its process group is initialized, else
    from the launcher's environment (`_environment_position`); with no world size anywhere this
    is the only process. More than one process and no rank is an error: defaulting to rank 0 would
    make every rank train on rank 0's shard.
    """
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{name} must be an int or None, got {value!r}")
    if rank is not None and world_size is not None:
        return _checked_position(rank, world_size, "")
    if rank is None and world_size == 1:
        return 0, 1
    found_rank, found_world, source = _found_position()
    if world_size is not None:  # and rank is None
        if found_rank is None:
            raise ConfigError(
                f"world_size={world_size} was given without rank=, and {source} gives no rank: "
                "pass rank= too, or call torch.distributed.init_process_group() first"
            )
        if found_world != world_size:
            raise ConfigError(
                f"world_size={world_size} was given without rank=, and the rank {source} gives "
                f"({found_rank}) is one of {found_world} processes: pass rank= too (e.g. the "
                "data-parallel rank)"
            )
        return _checked_position(found_rank, world_size, "")
    if found_world is None:  # one process, unless rank= says otherwise
        return _checked_position(0 if rank is None else rank, 1, "; pass world_size= with rank=")
    if rank is not None:
        return _checked_position(rank, found_world, f" ({source})")
    if found_rank is None and found_world > 1:
        raise ConfigError(
            f"{source} says there are {found_world} processes but gives no rank for this one, so "
            "its shard is unknown (rank 0 everywhere would repeat one shard on every rank). Call "
            "torch.distributed.init_process_group() before making the FastLoader, set RANK, or "
            "pass rank= and world_size="
        )
    return _checked_position(0 if found_rank is None else found_rank, found_world, f" ({source})")


def processes_around() -> int:
    """How many processes this one trains beside (1 when alone): from torch.distributed's process
    group when it is initialized, else the launcher's WORLD_SIZE (1 when that is unreadable)."""
    try:
        return _found_position()[1] or 1
    except ConfigError:
        return 1


def _checked_position(rank: int, world_size: int, hint: str) -> tuple[int, int]:
    if world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {world_size}{hint}")
    if not 0 <= rank < world_size:
        raise ConfigError(
            f"rank {rank} is not within world_size {world_size} (ranks run from 0 to world_size - 1)"
            + hint
        )
    return rank, world_size


_LAUNCHER_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")


def _found_position() -> tuple[int | None, int | None, str]:
    """(rank, world size, where they come from): torch.distributed's process group when it is
    initialized, else the environment; None for what neither gives."""
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return distributed.get_rank(), distributed.get_world_size(), "torch.distributed's process group"
    seen = ", ".join(f"{name}={os.environ[name]}" for name in _LAUNCHER_VARIABLES if name in os.environ)
    return (*_environment_position(), f"the environment ({seen or 'no launcher variables'})")


def _environment_position() -> tuple[int | None, int | None]:
    """(rank, world size) from a launcher's variables. torchrun sets RANK; Lightning's launcher sets
    only WORLD_SIZE, NODE_RANK and LOCAL_RANK, from which the rank follows on the first node (ranks
    are numbered node by node) or, given LOCAL_WORLD_SIZE, on any node."""
    world_size = _env_int("WORLD_SIZE")
    if world_size is None:
        return None, None
    rank = _env_int("RANK")
    if rank is not None:
        return rank, world_size
    local_rank = _env_int("LOCAL_RANK")
    if local_rank is None:
        return None, world_size
    node_rank = _env_int("GROUP_RANK") if "GROUP_RANK" in os.environ else _env_int("NODE_RANK")
    local_world_size = _env_int("LOCAL_WORLD_SIZE")
    if node_rank == 0 or (node_rank is None and local_world_size == world_size):
        return local_rank, world_size
    if node_rank is not None and local_world_size is not None:
        return node_rank * local_world_size + local_rank, world_size
    return None, world_size


def _env_int(name: str) -> int | None:
    """The integer in environment variable `name`, or None when it is unset or empty."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} is not an integer") from None
