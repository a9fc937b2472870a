"""The trainer<->daemon wire format: versioned JSON headers, validated on arrival; never pickles.

Every message is one JSON object (the header, at most 64 KiB from a trainer) and, for tasks, one
frame of raw little-endian int64 sample indices. A header that is not valid JSON, has the wrong
version, an unknown `op`, fields of the wrong type or integers beyond 64 bits raises `WireError`;
the daemon answers it with an `error` reply and keeps serving. The daemon's sockets refuse any
frame larger than `MAX_FRAME_BYTES` (ZMQ_MAXMSGSIZE: the connection is dropped), which is the
largest legal frame, an index frame of `MAX_BATCH` samples, plus room.

    trainer -> daemon                                daemon -> trainer
    hello  {dataset, transforms, backend, seed,      welcome {session, daemon_pid, slots,
            batch_size, prefetch, pid, rank,                 slot_bytes, layout, num_samples,
            world_size[, source, on_error, repeats,          classes, workers}
            priority]}
    task   {seq, epoch, batch_index, slot, row}      done    {seq, count, read_ns, decode_ns,
           + indices                                          bytes, read_cpu_ns[, read_runq_ns,
                                                              augment_ns, net_bytes, net_wait_ns,
                                                              cache_hits, cache_misses, skipped]}
    grow   {}                                        failed  {seq, message, path, index,
    ping   {}                                                 exc_type, traceback[, exc_class]}
    bye    {}                                        slot    {name}      (reply to grow)
    need   {wait, ready}   (no reply; only to a      pong    {}
            daemon whose status rows show `need`)
    status {}
    stop   {}          (local socket only)           status_reply {sessions, workers, budget_bytes,
                                                              used_bytes, pid, draining,
                                                              datasets, worker_deaths,
                                                              [metrics, totals]}
                                                     indexing {path, seconds} (hello waits
                                                              while the folder is indexed)
                                                     error   {message}   (anything refused)

Fields in [brackets] may be absent (sent by newer versions only); every other field is required.

NOTE [need reports]: a trainer tells its daemon how much it waits (`need`: `wait`, the fraction
0..1 of the last interval its trainer spent waiting for the daemon's batches; `ready`, batches
decoded and not yet taken), at most every NEED_EVERY_S and only when the figures changed, and only
to a daemon that understands it: an older daemon refuses an unknown op with an `error`, which a
trainer takes as fatal, and an older trainer refuses an unknown welcome field. So the trainer asks
`status` once after its welcome, and reports only when its own session's row there has a `need`
(rows of `status_reply` are not checked field by field: an older client reads the keys it knows).
`priority` (a session's weight, PRIORITY_RANGE) is sent only when it is not 1, so a trainer
that leaves it alone still attaches to an older daemon; one that sets it is refused there.

NOTE [counters on the link]: `done`'s counters are `BatchCounters`' fields, under their `wire`
names (`count`, `bytes`: the names of version 1). Those declared `required` are always sent; every
other counter, version 1's later additions and any declared since, is optional: sent only when not
zero and read as zero when absent, so a trainer and a daemon of different versions still agree on
every batch that does not use a counter one of them lacks. Either side refuses a field it does not
know (`decode`): a counter is never silently dropped.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fastload._bad_samples import SkippedSample
from fastload._batch_counters import BatchCounters, declared, wire_name
from fastload._errors import WireError as WireError  # raised by the checks here; `wire.WireError` to callers
from fastload._loading.jobs.executor import Done, Failure

VERSION = 1
MAX_HEADER_BYTES = 64 << 10
MAX_BATCH = 1 << 16
PRIORITY_RANGE = (0.01, 100.0)  # a session's `priority`, as a daemon accepts it
NEED_EVERY_S = 0.5  # NOTE [need reports]: the most often a trainer reports
MAX_FRAME_BYTES = 8 * MAX_BATCH + MAX_HEADER_BYTES
# What a trainer accepts from its daemon: a welcome lists every class name (ImageNet-21k: ~260 KB).
MAX_REPLY_HEADER_BYTES = 64 << 20
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # every integer crosses to the workers as int64

# op -> {field: accepted types}; fields not listed are refused.
_INT = (int,)
_SCHEMAS: dict[str, dict[str, tuple[type, ...]]] = {
    "hello": {
        "dataset": (str,),
        "transforms": (list,),
        "backend": (str,),
        "seed": _INT,
        "batch_size": _INT,
        "prefetch": _INT,
        "pid": _INT,
        "rank": _INT,
        "world_size": _INT,
        "source": (str,),
        "on_error": (str,),
        "repeats": _INT,  # RepeatedAugmentation's: NOTE [augmentation of repeats]
        "priority": (float, int),  # the session's weight in the daemon's shares (NOTE [need reports])
    },
    "task": {"seq": _INT, "epoch": _INT, "batch_index": _INT, "slot": (str,), "row": _INT},
    "grow": {},
    "need": {"wait": (float, int), "ready": _INT},  # NOTE [need reports]
    "ping": {},
    "bye": {},
    "status": {},
    "stop": {},
    "welcome": {
        "session": _INT,
        "daemon_pid": _INT,
        "slots": (list,),
        "slot_bytes": _INT,
        "layout": (str,),
        "num_samples": _INT,
        "classes": (list,),
        "workers": _INT,
    },
    # One field per `BatchCounters` counter (its `wire` name): NOTE [counters on the link].
    "done": {
        "seq": _INT,
        **{wire_name(n, c): _INT for n, c in declared()},
        "skipped": (list,),  # [[index, name, reason, row, replacement]] (NOTE [bad samples])
    },
    "failed": {
        "seq": _INT,
        "message": (str,),
        "path": (str,),
        "index": _INT,
        "exc_type": (str,),
        "traceback": (str,),
        "exc_class": (str,),  # "module:qualname"; a trainer only uses builtins ones (`daemon_client`)
    },
    "slot": {"name": (str,)},
    "pong": {},
    "status_reply": {
        "sessions": (list,),
        "workers": _INT,
        "budget_bytes": _INT,
        "used_bytes": _INT,
        "pid": _INT,
        "draining": (bool,),
        "datasets": (list,),
        "worker_deaths": (dict,),
        "metrics": (str, type(None)),  # its Prometheus endpoint's URL, None when not served
        "totals": (dict,),  # every session's counters, summed and kept past the session's end
    },
    "indexing": {"path": (str,), "seconds": (float, int)},
    "error": {"message": (str,)},
}
# op -> fields of its schema that may be absent (added later; an older peer does not send them).
_OPTIONAL: dict[str, frozenset[str]] = {
    "failed": frozenset({"exc_class"}),
    "done": frozenset({"skipped", *(wire_name(n, c) for n, c in declared() if not c.required)}),
    # absent: an image folder; on_error="raise"; no repeats
    "hello": frozenset({"source", "on_error", "repeats", "priority"}),
    "status_reply": frozenset({"metrics", "totals"}),
}


def encode(op: str, **fields: Any) -> bytes:
    """One header frame."""
    return json.dumps({"v": VERSION, "op": op, **fields}, separators=(",", ":")).encode()


def decode(frame: bytes, max_bytes: int = MAX_HEADER_BYTES) -> tuple[str, dict[str, Any]]:
    """Parse and validate a header frame; return (op, fields)."""
    if len(frame) > max_bytes:
        raise WireError(f"header of {len(frame)} bytes exceeds {max_bytes}")
    try:
        message = json.loads(frame)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WireError(f"header is not JSON: {e}") from None
    if not isinstance(message, dict):
        raise WireError("header is not a JSON object")
    if message.get("v") != VERSION:
        raise WireError(f"protocol version {message.get('v')!r} is not {VERSION}: upgrade the older side")
    op = message.get("op")
    schema = _SCHEMAS.get(op) if isinstance(op, str) else None
    if schema is None or not isinstance(op, str):
        raise WireError(f"unknown op {op!r}")
    fields = {k: v for k, v in message.items() if k not in ("v", "op")}
    for name, value in fields.items():
        types = schema.get(name)
        if types is None:
            raise WireError(f"{op}: unexpected field {name!r}")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise WireError(f"{op}.{name}: {type(value).__name__} is not allowed")
        if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            raise WireError(f"{op}.{name}: {value} does not fit in 64 bits")
    missing = set(schema) - set(fields) - _OPTIONAL.get(op, frozenset())
    if missing:
        raise WireError(f"{op}: missing {', '.join(sorted(missing))}")
    return op, fields


def decode_indices(frame: bytes, num_samples: int) -> np.ndarray:
    """Validate a task's index frame: 1..MAX_BATCH int64 values, each within the dataset."""
    if len(frame) == 0 or len(frame) % 8 or len(frame) > 8 * MAX_BATCH:
        raise WireError(f"index frame of {len(frame)} bytes is not 1..{MAX_BATCH} int64 values")
    indices = np.frombuffer(frame, dtype="<i8")
    if int(indices.min()) < 0 or int(indices.max()) >= num_samples:
        raise WireError(f"sample index out of range 0..{num_samples - 1}")
    return indices.astype(np.int64, copy=False)


def event_message(event: Done | Failure, seq: int) -> tuple[str, dict[str, Any]]:
    """The `done` or `failed` reply (op, fields) for a batch's event, as the trainer knows it by `seq`."""
    if isinstance(event, Done):  # NOTE [counters on the link]
        return "done", {
            "seq": seq,
            **{wire_name(n, c): v for (n, c), v in zip(declared(), event.counters.values(), strict=True)
               if c.required or v},
            **({"skipped": [v.to_json() for v in event.skipped]} if event.skipped else {}),
        }
    return "failed", {
        "seq": seq, "message": event.message, "path": event.path, "index": event.index,
        "exc_type": event.exc_type, "exc_class": event.exc_class, "traceback": event.traceback,
    }


def event_from_message(op: str, fields: dict[str, Any]) -> Done | Failure:
    """The event a validated `done` or `failed` reply carries (the inverse of `event_message`)."""
    if op == "done":
        try:
            skipped = tuple(SkippedSample.from_json(v) for v in fields.get("skipped", ()))
        except ValueError as e:
            raise WireError(f"done.skipped: {e}") from None
        counters = BatchCounters(*(fields.get(wire_name(n, c), 0) for n, c in declared()))
        return Done(fields["seq"], counters, skipped=skipped)
    return Failure(
        fields["seq"], fields["message"], fields["path"], fields["index"], fields["exc_type"],
        fields["traceback"], fields.get("exc_class", ""),
    )
