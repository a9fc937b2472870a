"""What a `FastLoader.state_dict` records beside its position, and how `load_state_dict` checks it.

A position (epoch, batches yielded) means something only under the settings it was taken with:
the same batch count is another sample under another batch size, another order under another
shuffle, another sample under another dataset. A state (version 2) therefore records what the
position depends on (`settings`) and the position counted in samples, and `convert`
either converts it (another batch size or world size, where the plan's order does not depend on
them: NOTE [elastic resume]) or refuses with a `ConfigError` naming what changed, old → new.
The seed is not matched here: the state's seed wins (`FastLoader.load_state_dict`).

`check_state` comes first (NOTE [checked states]): a state is read from a checkpoint file, which
may be damaged, edited or crafted, so every field is checked before the loader changes anything.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sized
from typing import Any

import numpy as np

from fastload._errors import ConfigError
from fastload._loading.jobs.iterable import IterablePlan
from fastload._loading.order.plan import OwnOrder, SamplerPlan
from fastload._loading.settings.arguments import COUNT_LIMIT, SEED_LIMIT

STATE_VERSION = 2  # 2: what the position depends on, and the position in samples
OLD_VERSIONS = (1,)  # {version, seed, epoch, batches_yielded}: still loaded, settings unchecked

# Settings that must match to resume mid-epoch: the order and the samples a position points at
# depend on them. (batch_size, rank and world_size are recorded too, but converted or accepted: see
# below.) The transform chain is recorded but never matched: transforms change what a sample looks
# like, not which samples come next, and a run changes them between stages on purpose (progressive
# resizing, a new augmentation strength). At an epoch's end the next epoch starts afresh under any
# order settings, so only the source is matched there (`AT_EPOCH_END`): another dataset is a mistake.
# A state records `sampler` only under a sampler of `fastload.samplers` (its kind and parameters):
# absent is no such sampler, so states saved without one keep their keys.
MATCHED = ("shuffle", "shuffle_block", "shuffle_window", "drop_last", "source", "excluded", "sampler")
_OPTIONAL = ("sampler",)
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
        mixture = f", mixture {value['mixture']}" if "mixture" in value else ""
        return f"{value.get('num_samples')} samples, targets {value.get('targets')}{mixture}"
    if name == "transforms" and isinstance(value, list):
        return "[" + ", ".join(str(t.get("type")) if isinstance(t, dict) else str(t) for t in value) + "]"
    return repr(value)


def check_settings(saved: dict[str, Any], current: dict[str, Any], *, epoch_over: bool = False) -> None:
    """ConfigError naming each setting in `MATCHED` (`AT_EPOCH_END` for a state taken when its epoch
    was over) that differs between the state and the loader."""
    changed = []
    for name in AT_EPOCH_END if epoch_over else MATCHED:
        if name not in saved and name not in _OPTIONAL:
            continue
        if name == "shuffle_window" and saved.get("shuffle_block") is current.get("shuffle_block") is None:
            continue  # the window only orders a block shuffle
        old, new = plain(saved.get(name)), plain(current.get(name))
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
    """The smallest divisors of `n` (from those up to 2**16 and their cofactors: a hint, bounded
    in time whatever `n` is)."""
    small = [d for d in range(1, min(math.isqrt(n), 1 << 16) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})[:limit]


# NOTE [elastic resume]: an unblocked plan (`ShuffledPlan` without `block`, and the samplers'
# plans in `order.sampling`) orders the epoch from (seed, epoch) alone, then deals it to the ranks
# interleaved (`order[rank::world]`) and each rank into batches. With every rank at batch b (ranks
# of one run stay in step), the samples delivered are exactly the first b * batch_size *
# world_size of the epoch's order, whichever rank's state is loaded: so a state converts to any
# batch size B and world size W whose B * W divides that count, resuming each rank at batch count
# / (B * W), which delivers the rest of the order, each sample once, as MosaicML Streaming's
# elastic resumption does. A block shuffle permutes windows of `window * batch_size` per rank
# (from the rank), so its order depends on both: it does not convert. Within one (batch size,
# world size) a rank may load another rank's state (a checkpoint saved by rank 0 alone): the count
# is the same on every rank.
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


# NOTE [checked states]: `load_state_dict` takes a dict from a checkpoint file, which may be
# damaged, edited by hand, or crafted. Every field is checked against what `state_dict` could have
# written (`check_state`), before anything of the loader changes: its type exactly (an int is not
# a bool, a float or a string of digits), its range (a position within its epoch, a rank within
# its world, sizes >= 1, epochs and counts within int64 with room to add one: workers carry them
# as int64), the nested dicts' keys, no key unknown or missing; then the position against the
# epoch it names: `epoch_batches` must be what an epoch of this loader's samples has under the
# state's batch layout (a smaller one would declare the epoch over and skip its rest), and
# `samples_yielded` what that many batches hold (another layout resumes from it). A negative
# position replayed samples, a negative world size repeated them, -2**63 ran for ever.
_COUNT_LIMIT = COUNT_LIMIT  # epochs and counts (`arguments`: one range for arguments and states)
_SEED_LIMIT = SEED_LIMIT
_POSITION = ("version", "seed", "epoch", "batches_yielded")  # a version-1 state: these alone
_SETTINGS = (
    "shuffle", "shuffle_block", "shuffle_window", "drop_last", "source", "transforms", "excluded",
    "batch_size", "rank", "world_size",
)
_PLANNED = ("epoch_batches", "samples_yielded")  # a plan of indices
_STREAMED = ("stream_batches",)  # an IterableDataset's streams
_SOURCE_KEYS = {"num_samples", "classes", "targets"}  # and "mixture" for a Mix (`MixturePlan.recipe`)


def _refuse(field: str, value: Any, allowed: str) -> ConfigError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ConfigError(
        f"this state's {field} is {shown}, but {field} must be {allowed}: the state is damaged or was "
        "not saved by FastLoader.state_dict(); load one that was, or leave it unloaded to start afresh"
    )


def _is_int(value: Any) -> bool:
    return type(value) is int  # not a bool, nor an int subclass or a float that equals one


def _int(state: dict[str, Any], field: str, low: int, high: int, what: str = "", none: bool = False) -> None:
    """`state[field]` is an int in low..high (or None where `none`)."""
    value = state[field]
    if none and value is None:
        return
    if not (_is_int(value) and low <= value <= high):
        allowed = f"an integer {low}..{high}" if high < _COUNT_LIMIT else f"an integer >= {low}"
        raise _refuse(field, value, allowed + (f" ({what})" if what else "") + (" or None" if none else ""))


def _check_types(state: dict[str, Any], streams: int | None) -> None:
    """Each field's type and range on its own, and the nested dicts' shapes."""
    _int(state, "seed", 0, _SEED_LIMIT - 1, "a seed")
    _int(state, "epoch", 0, _COUNT_LIMIT)
    if state["version"] == STATE_VERSION and streams is None:
        _int(state, "epoch_batches", 0, _COUNT_LIMIT, none=True)
    batches = state.get("epoch_batches")
    if batches is None:
        _int(state, "batches_yielded", 0, _COUNT_LIMIT)
    else:
        _int(state, "batches_yielded", 0, batches, "the batches of its epoch")
    if state["version"] != STATE_VERSION:
        return
    for flag in ("shuffle", "drop_last"):
        if type(state[flag]) is not bool:
            raise _refuse(flag, state[flag], "true or false")
    _int(state, "shuffle_block", 1, _COUNT_LIMIT, "samples per run", none=True)
    _int(state, "shuffle_window", 1, _COUNT_LIMIT, "batches mixed together")
    _int(state, "batch_size", 1, _COUNT_LIMIT, none=True)
    _int(state, "world_size", 1, _COUNT_LIMIT)
    _int(state, "rank", 0, state["world_size"] - 1, "within world_size")
    source = state["source"]
    shaped = isinstance(source, dict) and (
        (source == {} and streams is not None)
        or (
            set(source) - {"mixture"} == _SOURCE_KEYS
            and isinstance(source.get("mixture", ""), str)
            and _is_int(source["num_samples"]) and 0 <= source["num_samples"] <= _COUNT_LIMIT
            and isinstance(source["classes"], str)
            and (source["targets"] is None or isinstance(source["targets"], str))
        )
    )
    if not shaped:
        raise _refuse(
            "source", source, "a fingerprint {num_samples, classes, targets[, mixture]} (state_dict()'s)"
        )
    transforms = state["transforms"]
    if transforms is not None and not (
        isinstance(transforms, list) and all(isinstance(t, dict) for t in transforms)
    ):
        raise _refuse("transforms", transforms, "None or a list of transform configurations")
    if state["excluded"] is not None and not isinstance(state["excluded"], str):
        raise _refuse("excluded", state["excluded"], "None or the digest of an exclusion")
    sampler = state.get("sampler", {})
    if not (isinstance(sampler, dict) and all(
        isinstance(k, str) and (v is None or type(v) in (str, int, bool)) for k, v in sampler.items()
    )):
        raise _refuse("sampler", sampler, "a sampler's description (state_dict()'s)")
    if streams is not None:
        counts = state["stream_batches"]
        if not (
            isinstance(counts, list)
            and len(counts) == streams
            and all(_is_int(c) and 0 <= c <= _COUNT_LIMIT for c in counts)
            and sum(counts) <= state["batches_yielded"]
        ):
            raise _refuse(
                "stream_batches", counts, f"a list of {streams} batch counts >= 0, one per worker's "
                f"stream, together at most batches_yielded ({state['batches_yielded']})",
            )
        return
    _int(state, "samples_yielded", 0, _COUNT_LIMIT, none=True)


def _keys(state: dict[str, Any], streams: int | None) -> None:
    """No key unknown, none missing, for the state's version and this loader's kind of plan."""
    version = state.get("version")
    if not (_is_int(version) and (version == STATE_VERSION or version in OLD_VERSIONS)):
        raise ConfigError(
            f"unknown FastLoader state version {version!r} (this fastload loads versions "
            f"{', '.join(map(str, (*OLD_VERSIONS, STATE_VERSION)))}): load a state saved by state_dict()"
        )
    if version != STATE_VERSION and streams is not None:
        raise ConfigError(
            f"a version-{version} state holds no stream positions, which an IterableDataset's loader "
            "resumes from: load a state this fastload saved, or leave it unloaded to start afresh"
        )
    want = set(_POSITION)
    if version == STATE_VERSION:
        want |= {*_SETTINGS, *(_STREAMED if streams is not None else _PLANNED)}
    unknown = sorted(map(repr, set(state) - want - (set(_OPTIONAL) if version == STATE_VERSION else set())))
    missing = sorted(want - set(state))
    if unknown or missing:
        kind = "an IterableDataset's" if streams is not None else "a"
        parts = [f"unknown to {kind} loader's version-{version} state: {', '.join(unknown)}"] * bool(unknown)
        wrong = "; ".join(parts + [f"missing: {', '.join(missing)}"] * bool(missing))
        raise ConfigError(
            f"this state does not hold what FastLoader.state_dict() writes ({wrong}): load a state "
            "saved by state_dict() for this kind of dataset, or leave it unloaded to start afresh"
        )


def _epoch_length(state: dict[str, Any], plan: Any, excluded: str | None) -> int | None:
    """The batches an epoch of `plan`'s samples has under the state's batch layout (batch_size,
    world_size, drop_last), or None where that is not known here."""
    batch_size, drop_last, world_size = state["batch_size"], state["drop_last"], state["world_size"]
    if isinstance(plan, OwnOrder):
        if batch_size is None or state["excluded"] != excluded:  # other samples: their count is not here
            return None
        return plan.batches_under(batch_size, world_size, drop_last)
    if isinstance(plan, SamplerPlan):
        sampler, batch_sampler = plan.user_sampler, plan.user_batch_sampler
        if isinstance(sampler, Sized) and batch_size is not None:
            n = len(sampler)
            return int(n // batch_size if drop_last else -(-n // batch_size))
        if isinstance(batch_sampler, Sized) and batch_size is None:
            return int(len(batch_sampler))
    return None


def _check_position(state: dict[str, Any], plan: Any, excluded: str | None) -> None:
    """The position against the epoch it names (NOTE [checked states])."""
    yielded = state["batches_yielded"]
    if state["version"] != STATE_VERSION:  # a position in this loader's batches
        try:
            batches: int | None = len(plan)
        except TypeError:
            batches = None
        if batches is not None:
            _int(state, "batches_yielded", 0, batches, "the batches of an epoch of this loader")
        return
    if isinstance(plan, IterablePlan):
        if state["batch_size"] != plan.batch_size:
            raise ConfigError(
                f"this state was saved by an IterableDataset loader with other batches (batch_size: "
                f"{state['batch_size']} -> {plan.batch_size}), and its streams' positions are counted in "
                f"batches: build the loader with batch_size={state['batch_size']} to resume"
            )
        return
    epoch_batches, expected = state["epoch_batches"], _epoch_length(state, plan, excluded)
    if expected is not None and epoch_batches != expected:
        raise _refuse(
            "epoch_batches", epoch_batches, f"{expected}, the batches of an epoch of these samples under "
            f"the state's batch_size={state['batch_size']}, world_size={state['world_size']}, "
            f"drop_last={state['drop_last']}",
        )
    batch_size, samples = state["batch_size"], state["samples_yielded"]
    if (batch_size is None) != (samples is None):
        raise _refuse("samples_yielded", samples, "None exactly when batch_size is None (a batch_sampler's)")
    if batch_size is None:
        return
    full = yielded * batch_size
    if epoch_batches is not None and yielded == epoch_batches and yielded > 0:
        low = full - batch_size + 1  # the epoch is over: its last batch may be short
        _int(state, "samples_yielded", low, full, f"what {yielded} batches of {batch_size} hold")
    elif samples != full:
        raise _refuse("samples_yielded", samples, f"{full}, what {yielded} batches of {batch_size} hold")


def check_state(state: Any, plan: Any, current: dict[str, Any]) -> bool:
    """Refuse, with a ConfigError naming the field and what it may be, a state that
    `FastLoader.state_dict` could not have saved for a loader of `plan` (NOTE [checked states]),
    or one whose settings differ where they matter (`check_settings`); else whether its epoch
    was over when it was saved. `current`: the loader's settings (`position.recorded_settings`)."""
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise ConfigError(
            "a FastLoader state is a dict of named fields (what state_dict() returns), "
            f"got {type(state).__name__}"
        )
    streams = plan.streams if isinstance(plan, IterablePlan) else None
    _keys(state, streams)
    _check_types(state, streams)
    epoch_batches = state.get("epoch_batches")
    epoch_over = epoch_batches is not None and state["batches_yielded"] >= epoch_batches
    if state["version"] == STATE_VERSION:
        check_settings(state, current, epoch_over=epoch_over)
    _check_position(state, plan, current["excluded"])
    return epoch_over
