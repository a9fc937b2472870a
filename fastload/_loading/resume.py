"""What a `FastLoader.state_dict` records beside its position, and how `load_state_dict` checks it.

A position (epoch, batches yielded) means something only under the settings it was taken with:
the same batch count is another sample under another batch size, another order under another
shuffle, another sample under another dataset. A state (version 2) therefore records what the
position depends on (`settings`) and the position counted in samples, and `convert`
either converts it (another batch size or world size, where the plan's order does not depend on
them: NOTE [elastic resume]) or refuses with a `ConfigError` naming what changed, old → new.
The seed is not checked here: the state's seed wins (`FastLoader.load_state_dict`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from fastload._errors import ConfigError

# Settings that must match to resume mid-epoch: the order and the samples a position points at
# depend on them. (batch_size, rank and world_size are recorded too, but converted or accepted: see
# below.) The transform chain is recorded but never matched: transforms change what a sample looks
# like, not which samples come next, and a run changes them between stages on purpose (progressive
# resizing, a new augmentation strength). At an epoch's end the next epoch starts afresh under any
# order settings, so only the source is matched there (`AT_EPOCH_END`): another dataset is a mistake.
MATCHED = ("shuffle", "shuffle_block", "shuffle_window", "drop_last", "source", "excluded")
AT_EPOCH_END = ("source",)


def fingerprint(num_samples: int, labels: np.ndarray | None, classes: tuple[str, ...]) -> dict[str, Any]:
    """A cheap fingerprint of a source's index: its sample count, a hash of its class names and
    one of its targets (one pass over the array's bytes, no per-sample Python; None where the
    targets are not here: a loader attached to a daemon holds no index)."""
    targets = None
    if labels is not None:
        labels = np.ascontiguousarray(labels)
        digest = hashlib.blake2b(f"{labels.dtype.str}{labels.shape}".encode(), digest_size=8)
        digest.update(labels.reshape(-1).view(np.uint8).data)
        targets = digest.hexdigest()
    names = hashlib.blake2b(json.dumps(list(classes)).encode(), digest_size=8).hexdigest()
    return {"num_samples": int(num_samples), "classes": names, "targets": targets}


def _same_source(old: Any, new: Any) -> bool:
    """Whether two fingerprints may be one source: targets are compared where both have them."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return bool(old == new)
    if old.get("targets") is None or new.get("targets") is None:
        old, new = {**old, "targets": None}, {**new, "targets": None}
    return bool(old == new)


def plain(value: Any) -> Any:
    """`value` as JSON would give it back (tuples as lists), so that a state saved as JSON compares
    equal to one saved with torch.save."""
    return json.loads(json.dumps(value, default=repr))


def _show(name: str, value: Any) -> str:
    if name == "source" and isinstance(value, dict):
        return f"{value.get('num_samples')} samples, targets {value.get('targets')}"
    if name == "transforms" and isinstance(value, list):
        return "[" + ", ".join(str(t.get("type")) if isinstance(t, dict) else str(t) for t in value) + "]"
    return repr(value)


def check_settings(saved: dict[str, Any], current: dict[str, Any], *, epoch_over: bool = False) -> None:
    """ConfigError naming each setting in `MATCHED` (`AT_EPOCH_END` for a state taken when its epoch
    was over) that differs between the state and the loader."""
    changed = []
    for name in AT_EPOCH_END if epoch_over else MATCHED:
        if name not in saved:
            continue
        if name == "shuffle_window" and saved.get("shuffle_block") is current.get("shuffle_block") is None:
            continue  # the window only orders a block shuffle
        old, new = plain(saved[name]), plain(current[name])
        if (not _same_source(old, new)) if name == "source" else old != new:
            show_old, show_new = _show(name, old), _show(name, new)
            if show_old == show_new:  # the same transform names: show their parameters
                show_old, show_new = json.dumps(old), json.dumps(new)
            changed.append(f"{name}: {show_old} -> {show_new}")
    if changed:
        raise ConfigError(
            "this state was saved by a loader with other settings, so its position names other "
            "samples here (" + "; ".join(changed) + "): build the loader with the state's settings "
            "to resume, or leave the state unloaded to start afresh"
        )


def _divisors(n: int, limit: int = 12) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})[:limit]


# NOTE [elastic resume]: an unblocked plan (`ShuffledPlan` without `block`) orders the epoch
# from (seed, epoch) alone, then deals it to the ranks interleaved (`order[rank::world]`) and each
# rank into batches. With every rank at batch b (ranks of one run stay in step), the samples
# delivered are exactly the first b * batch_size * world_size of the epoch's order, whichever
# rank's state is loaded: so a state converts to any batch size B and world size W whose
# B * W divides that count, resuming each rank at batch count / (B * W), which delivers the
# rest of the order, each sample once, as MosaicML Streaming's elastic resumption does. A block
# shuffle permutes windows of `window * batch_size` per rank (from the rank), so its order
# depends on both: it does not convert. Within one (batch size, world size) a rank may load
# another rank's state (a checkpoint saved by rank 0 alone): the count is the same on every rank.
def convert(
    saved: dict[str, Any],
    *,
    batch_size: int | None,
    world_size: int,
    convertible: str | None,
) -> int:
    """The first batch to resume at under (`batch_size`, `world_size`), from a saved mid-epoch
    position (`saved`: its batch_size, world_size, batches_yielded, samples_yielded).
    `convertible` is None when this loader's plan converts, else why it does not."""
    old_b, old_w = saved.get("batch_size"), int(saved.get("world_size", 1))
    yielded = int(saved["batches_yielded"])
    if old_b == batch_size and old_w == world_size:
        return yielded
    what = []
    if old_b != batch_size:
        what.append(f"batch_size: {old_b} -> {batch_size}")
    if old_w != world_size:
        what.append(f"world_size: {old_w} -> {world_size}")
    changed = "; ".join(what)
    if convertible is not None or batch_size is None or saved.get("samples_yielded") is None:
        reason = convertible or "a batch_sampler's batches are not counted in samples"
        raise ConfigError(
            f"this state was saved mid-epoch by a loader with another batch layout ({changed}) and "
            f"{reason}: build the loader with batch_size={old_b} and world_size={old_w} to resume, "
            "or resume at the epoch's end (the next epoch starts afresh under any layout)"
        )
    total = int(saved["samples_yielded"]) * old_w  # every rank's, all in step
    unit = batch_size * world_size
    if total % unit == 0:
        return total // unit
    if total % world_size:
        ways = f"world sizes that divide it: {_divisors(total)}"
    else:
        ways = f"batch sizes that work with world_size={world_size}: {_divisors(total // world_size)}"
    raise ConfigError(
        f"this state was saved mid-epoch after {total} samples of the epoch ({changed}); "
        f"batch_size={batch_size} x world_size={world_size} = {unit} samples a step does not divide "
        f"{total}, so no batch boundary falls there: resume with a batch size that does ({ways}; "
        f"batch_size={old_b} with world_size={old_w} always does), or at the epoch's end"
    )
