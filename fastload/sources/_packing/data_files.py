"""A pack's data files as `pack` writes them (`writer.py`): samples appended at aligned offsets,
made durable, and checkpointed so that a run killed part way goes on where it stopped.

NOTE [pack checkpoints]: every few thousand samples `pack` fsyncs the data and then a checkpoint
(the sizes of the samples written so far, -1 for one left out, `pack-checkpoint.npy`, after why
they were left out, `pack-skipped.json`), and the same command run again after a kill truncates
what came after the checkpoint and goes on, when the source's index is still the one it started
from (`source_fingerprint` in the manifest: names, targets, extents); an error from the source's
side (a sample unreadable or broken, a Ray task failed) checkpoints first. The layout depends
only on the samples' sizes, and re-encoding is deterministic, so the result is byte-identical to
an uninterrupted run (a pack is finished only with the `max_side`, `quality` and `exclude` it was
started with).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
from typing import Any

import numpy as np

from fastload._errors import DatasetError
from fastload.sources._formats.pack_format import ALIGN, data_file_name
from fastload.sources._packing.reencode import Blob

CHECKPOINT = "pack-checkpoint.npy"
SKIPPED = "pack-skipped.json"


class DataFiles:
    """Appends samples to the data files at aligned offsets; knows each one's place, and which
    positions of the pack's order were left out (`skip`)."""

    def __init__(self, root: str, shard_bytes: int, done: np.ndarray, reasons: dict[int, str]) -> None:
        self.root = root
        self.shard_bytes = shard_bytes
        self.sizes = array.array("q")  # per position of the order: bytes written, -1 if left out
        self.skipped: dict[int, str] = {}  # position -> why it was left out
        self.lengths = array.array("q")  # per sample written: its size, offset and data file
        self.offsets = array.array("q")
        self.file_ids = array.array("i")
        self.file = 0
        self.length = 0  # of the current data file
        for position, size in enumerate(done.tolist()):  # replay the checkpoint's layout (sizes alone)
            if size < 0:
                self.sizes.append(-1)
                self.skipped[position] = reasons.get(position, "left out by on_error='skip'")
            else:
                self._place(size)
        self._truncate()
        self.unsynced = 0  # samples written since the last checkpoint
        self.unsynced_bytes = 0
        self.saved_skips = len(self.skipped)  # those `pack-skipped.json` holds
        path = os.path.join(root, data_file_name(self.file))
        self.out = open(path, "r+b" if os.path.exists(path) else "wb")  # noqa: SIM115  # closed by finish
        self.out.seek(self.length)

    def _place(self, size: int) -> int:
        """Record a sample of `size` bytes; return its padding (the zeros before it)."""
        start = -(-self.length // ALIGN) * ALIGN
        if self.length > 0 and start + size > self.shard_bytes:
            self.file, self.length, start = self.file + 1, 0, 0
        padding = start - self.length
        self.sizes.append(size)
        self.lengths.append(size)
        self.offsets.append(start)
        self.file_ids.append(self.file)
        self.length = start + size
        return padding

    def _truncate(self) -> None:
        """Cut what came after the checkpoint: the current file's tail, and any later file."""
        for name in os.listdir(self.root):
            if name.startswith("data-") and name.endswith(".bin") and name > data_file_name(self.file):
                os.unlink(os.path.join(self.root, name))
        expected = [0] * (self.file + 1)
        for file_id, offset, size in zip(self.file_ids, self.offsets, self.lengths, strict=True):
            expected[file_id] = offset + size
        for number, length in enumerate(expected):
            path = os.path.join(self.root, data_file_name(number))
            have = os.path.getsize(path) if os.path.exists(path) else 0
            if have < length:
                raise DatasetError(
                    f"{path} is shorter ({have} bytes) than the checkpoint says ({length}): the pack is "
                    f"damaged; remove {self.root} and pack again"
                )
            if number == self.file and have > length:
                os.truncate(path, length)

    def write(self, *parts: Blob) -> None:
        """Append one sample: `parts` (its image, then any members: NOTE [packed fields]) end to end."""
        file = self.file
        padding = self._place(sum(len(part) for part in parts))
        if self.file != file:
            self._sync()
            self.out.close()
            self.out = open(os.path.join(self.root, data_file_name(self.file)), "wb")  # noqa: SIM115
        elif padding:
            self.out.write(bytes(padding))
        for part in parts:
            self.out.write(part)
        self.unsynced += 1
        self.unsynced_bytes += self.lengths[-1] + padding

    def skip(self, reason: str) -> None:
        """Leave the next position of the order out, for `reason`."""
        self.skipped[len(self.sizes)] = reason
        self.sizes.append(-1)
        self.unsynced += 1

    def _sync(self) -> None:
        self.out.flush()
        os.fsync(self.out.fileno())

    def checkpoint(self) -> None:
        """Make what was written durable, and why samples were left out, then record it."""
        self._sync()
        if len(self.skipped) != self.saved_skips:
            write_json(os.path.join(self.root, SKIPPED), {str(k): v for k, v in self.skipped.items()})
            self.saved_skips = len(self.skipped)
        save_durably(os.path.join(self.root, CHECKPOINT), np.frombuffer(self.sizes, np.int64))
        self.unsynced = self.unsynced_bytes = 0

    def close(self) -> None:
        self._sync()
        self.out.close()


def load_checkpoint(root: str) -> tuple[np.ndarray, dict[int, str]]:
    """The checkpoint's sizes, and why the samples it says were left out were (by position)."""
    try:
        sizes = np.asarray(np.load(os.path.join(root, CHECKPOINT)), np.int64)
        with contextlib.suppress(FileNotFoundError), open(os.path.join(root, SKIPPED), encoding="utf-8") as f:
            return sizes, {int(k): str(v) for k, v in json.load(f).items()}
        return sizes, {}
    except FileNotFoundError:
        return np.empty(0, np.int64), {}
    except (OSError, ValueError, AttributeError) as e:
        raise DatasetError(f"cannot read {root}'s checkpoint ({e}): remove {root} and pack again") from e


def drop_checkpoint(root: str) -> None:
    """Remove the checkpoint and its list of samples left out (a finished pack needs neither)."""
    for name in (CHECKPOINT, SKIPPED):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, name))


def save_durably(path: str, values: np.ndarray) -> None:
    """np.save to `path` through a temporary file, synced, then renamed over it."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, values, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(os.path.dirname(path))


def write_json(path: str, value: dict[str, Any]) -> None:
    """JSON to `path` through a temporary file, synced, then renamed over it."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(os.path.dirname(path))


def _sync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
