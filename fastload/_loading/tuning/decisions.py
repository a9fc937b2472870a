"""What a tuner decides, and why: the one list of reasons, whose codes the statistics block
stores (`tuner_reason`), `fastload iostat` words (`REASON_WORDS`, and `REASON_CHANGES`: what each
moved) and the metrics export (each reason's name in kebab case: `reason_tag`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Reason(enum.IntEnum):
    """Why the last change was made (its code is what the statistics block stores)."""

    NONE = 0  # nothing changed yet
    DECODE_BOUND = 1  # +1 worker: the trainer waits, workers are busy, and a core is idle
    TRAINER_BOUND = 2  # -1 worker: the trainer never waits; its cores go back to its own threads
    OVERSUBSCRIBED = 3  # -1 worker: runnable processes wait for a CPU (a run-queue storm)
    BURSTY = 4  # +in flight: the trainer waits while workers idle between tasks
    WINDOW_UNUSED = 5  # -in flight: batches sit ready, the window is larger than needed
    NO_GAIN = 6  # the last change bought no throughput: undone, and not tried again for a while
    WINDOW_DEEP = 7  # -in flight: workers are the bottleneck; a shallower window feeds them as well


REASON_WORDS = {
    Reason.NONE: "no change yet",
    Reason.DECODE_BOUND: "decode-bound and a core idle: added a worker",
    Reason.TRAINER_BOUND: "the trainer does not wait: retired a worker",
    Reason.OVERSUBSCRIBED: "processes wait for a CPU: retired a worker",
    Reason.BURSTY: "the trainer waits while workers idle: more batches in flight",
    Reason.WINDOW_UNUSED: "batches sit ready: fewer batches in flight",
    Reason.NO_GAIN: "the last change bought nothing: undone",
    Reason.WINDOW_DEEP: "the workers are the bottleneck: fewer batches in flight feed them as well",
}

# What each change moved, as `fastload iostat`'s tuner column shows it: +w/-w a worker, +f/-f the
# batches in flight, "undo" back to the setting before the last change.
REASON_CHANGES = {
    Reason.NONE: "",
    Reason.DECODE_BOUND: "+w",
    Reason.TRAINER_BOUND: "-w",
    Reason.OVERSUBSCRIBED: "-w",
    Reason.BURSTY: "+f",
    Reason.WINDOW_UNUSED: "-f",
    Reason.NO_GAIN: "undo",
    Reason.WINDOW_DEEP: "-f",
}


@dataclass(frozen=True)
class Decision:
    """The setting a tuner moves to (`workers`, `in_flight` batches), and why."""

    workers: int
    in_flight: int
    reason: Reason
    detail: str = ""  # the figures behind it, for the debug log


def reason_tag(reason: Reason) -> str:
    """A reason in a word or two, as iostat's column and the metrics' label show it: "decode-bound"."""
    return reason.name.lower().replace("_", "-")
