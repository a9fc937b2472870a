"""`pack(..., ray=...)` (`fastload pack --ray [ADDRESS]`): a pack's samples read, and re-encoded
when `max_side` asks, by Ray tasks spread over a cluster, and handed to `pack`'s writer in order.

Its one responsibility is that stage; everything else is `pack`'s own (`_packing/writer.py`): the checks,
the layout of samples into aligned data files (it depends on the samples' sizes alone), the
checkpoints, the index and the manifest. So the pack is byte-identical to `pack` without Ray.

NOTE [ray ranges]: the pack's order is cut into ranges of `RANGE_SAMPLES` positions, fixed by the
count alone (range k is [k * RANGE_SAMPLES, (k + 1) * RANGE_SAMPLES)), and one Ray task reads and
re-encodes one range and returns its samples as (sizes, bytes). The driver keeps at most two
tasks per CPU in flight and writes in order: the range the writer waits for goes to it directly;
one that finishes out of order is written to `ray-staging/range-FIRST-STOP.bin` in the pack
(a temporary synced, then renamed: present means whole) and read back, then removed, when its
turn comes. Ray retries a task whose node or worker died (`max_retries`); a task that fails
(a sample that cannot be read or decoded, unless `on_error="skip"` left it out: NOTE [skipped in
a range]; retries spent) ends the run, after the tasks in flight
have finished and been staged, with `pack`'s writer checkpointed. The same command run again
goes on from the checkpoint and runs only the ranges that are neither written nor staged.
Ranges, not one task per sample: a task's overhead (~1 ms of scheduling and a result object) is
paid per 256 samples, and a staged file per range keeps the staging directory small.

Every node reads the source itself: it must be at the same path on every node (a shared file
system) or in object storage; fastload must be installed on every node.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from fastload._errors import ConfigError, DatasetError
from fastload.sources._indexes.sample_index import SampleIndex
from fastload.sources._packing.reencode import Made, Reencoding, Skipped, _checked, _Failure, _Job, _run_task
from fastload.sources._storage.bounds import clip

RANGE_SAMPLES = 256  # positions of the pack's order one task makes (tests make it small)
MAX_RETRIES = 3  # of a task whose worker or node died (Ray's own retry)
# Test hooks, read by the driver (not public): the task of the range starting at this position
# raises, and every task appends its range's first position to this file.
_FAIL_ENV = "_FASTLOAD_TEST_RAY_PACK_FAIL"
_LOG_ENV = "_FASTLOAD_TEST_RAY_PACK_LOG"

_Range = tuple[int, int]
_Result = tuple[np.ndarray, np.ndarray]  # (int64 sizes, uint8 bytes) of a range's samples


def ray_batches(
    index: SampleIndex,
    order: np.ndarray,
    start: int,
    setting: Reencoding | None,
    address: str | None,
    workers: int | None,
    staging: str,
    say: Callable[[str], object] | None,
    skip: bool = False,
) -> Generator[Sequence[Made], None, None]:
    """The samples `order[start:]` as the pack stores them, a range at a time, in order, made by
    Ray tasks (NOTE [ray ranges]). The cluster: the one this process is connected to, else the
    one at `address`, else `RAY_ADDRESS`'s, else a new local Ray of `workers` CPUs (disconnected
    after, when this connected). `say`: where a line on the ranges goes. `skip`: a sample that
    cannot be made is `Skipped` (`reencode.made_batches`). Errors: ConfigError when Ray is
    missing or the cluster cannot be reached, DatasetError (or ConfigError) naming what failed."""
    ray = import_ray()
    connected = _connect(ray, address, workers)
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        window = 2 * max(1, workers if workers is not None else cpus)
        yield from _Ranges(ray, index, order, setting, staging, window, skip).batches(start, cpus, say)
    finally:
        if connected:
            ray.shutdown()


def import_ray() -> ModuleType:
    """The `ray` module; ConfigError saying what to install when it is missing."""
    try:
        return importlib.import_module("ray")
    except ImportError as e:
        raise ConfigError(
            f"pack --ray needs Ray, which is not installed ({e}): pip install 'fastload[ray]'"
        ) from None


def _connect(ray: ModuleType, address: str | None, workers: int | None) -> bool:
    """Connect to the cluster (see `ray_batches`); whether this call did (and must disconnect)."""
    if ray.is_initialized():  # the caller's own connection: a notebook, a Ray job, a test
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        if address is None:
            ray.init(address="local", num_cpus=workers, include_dashboard=False)
        else:
            ray.init(address=address)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = "a local Ray" if address is None else f"the Ray cluster at {address}"
        raise ConfigError(
            f"cannot start or reach {where}: {clip(str(e))} (start a cluster with `ray start --head` "
            "and give its address, or leave the address out for a local Ray)"
        ) from None
    return True


@dataclass(frozen=True)
class _TestHook:
    """What a test asked of one task (`_FAIL_ENV`, `_LOG_ENV`): log `first` to `log`, then fail."""

    first: int
    fail: bool
    log: str | None


def _range_task(
    index: SampleIndex, indices: np.ndarray, setting: Reencoding | None, hook: _TestHook | None, skip: bool
) -> _Result | _Failure:
    """In a Ray worker: read samples `indices` of `index`, check them and re-encode them
    (`setting`); their sizes and bytes (NOTE [skipped in a range]), or the `_Failure` of the first
    that could not be made."""
    if hook is not None:
        if hook.log is not None:
            with open(hook.log, "a", encoding="utf-8") as f:
                f.write(f"{hook.first}\n")
        if hook.fail:
            raise RuntimeError("a failure injected by a test")
    made = _run_task(_Job(index, indices, setting, 0, skip), 0, len(indices), keep_views=True)
    if isinstance(made, _Failure):
        return made
    blobs = [m.reason.encode() if isinstance(m, Skipped) else m for m in made]
    sizes = np.fromiter(
        (-1 - len(b) if isinstance(m, Skipped) else len(b) for m, b in zip(made, blobs, strict=True)),
        np.int64,
        len(blobs),
    )
    return sizes, np.frombuffer(b"".join(blobs), np.uint8)


# NOTE [skipped in a range]: a range's result (and its staged file) is its samples' sizes, then
# their bytes end to end; a sample `on_error="skip"` left out is there as its reason's UTF-8
# bytes, its size -1 - their length (so the range stays one self-describing blob).


def _lengths(sizes: np.ndarray) -> np.ndarray:
    """The bytes each entry of a range's `sizes` takes (NOTE [skipped in a range])."""
    return np.where(sizes >= 0, sizes, -1 - sizes)


def _samples(sizes: np.ndarray, data: np.ndarray) -> list[Made]:
    """A range's samples from its (sizes, bytes): views, and `Skipped` for those left out."""
    ends = np.cumsum(_lengths(sizes)).tolist()
    view = memoryview(data.data)
    made: list[Made] = []
    for size, a, b in zip(sizes.tolist(), [0, *ends[:-1]], ends, strict=True):
        made.append(view[a:b] if size >= 0 else Skipped(bytes(view[a:b]).decode()))
    return made


class _Ranges:
    """One run over the ranges from the writer's position on (NOTE [ray ranges])."""

    def __init__(
        self,
        ray: ModuleType,
        index: SampleIndex,
        order: np.ndarray,
        setting: Reencoding | None,
        staging: str,
        window: int,
        skip: bool,
    ) -> None:
        self.ray, self.index, self.order, self.setting = ray, index, order, setting
        self.staging, self.window, self.skip = staging, window, skip
        self.task = ray.remote(max_retries=MAX_RETRIES)(_range_task)
        self.running: dict[Any, _Range] = {}  # Ray ObjectRef -> its range
        self.index_ref: Any = None  # the index in Ray's object store, put there once
        self.fail, self.log = os.environ.get(_FAIL_ENV), os.environ.get(_LOG_ENV)

    def batches(
        self, start: int, cpus: int, say: Callable[[str], object] | None
    ) -> Generator[Sequence[Made], None, None]:
        count, step = len(self.order), RANGE_SAMPLES
        ranges = [(first, min(first + step, count)) for first in range(start - start % step, count, step)]
        os.makedirs(self.staging, exist_ok=True)
        for name in os.listdir(self.staging):  # a temporary left by a killed run
            if name.endswith(".tmp"):
                os.unlink(os.path.join(self.staging, name))
        staged = {r for r in ranges if self._staged_whole(r)}
        todo = deque(r for r in ranges if r not in staged)
        if say is not None:
            earlier = f", {len(staged)} staged by an earlier run" if staged else ""
            say(
                f"fastload pack: on Ray ({cpus} CPUs), {len(todo)} of {len(ranges)} ranges of "
                f"{RANGE_SAMPLES} samples to make{earlier}\n"
            )
        self.index_ref = self.ray.put(self.index)
        try:
            for wanted in ranges:
                result = None
                while wanted not in staged and result is None:
                    self._submit(todo)
                    got, result = self._next_result()
                    if got != wanted:
                        self._stage(got, result)
                        staged.add(got)
                        result = None
                if result is None:
                    result = self._read_staged(wanted)
                yield _samples(*result)[max(0, start - wanted[0]) :]
                if wanted in staged:
                    os.unlink(self._path(wanted))  # written (a kill before its checkpoint: made again)
        finally:
            for ref in self.running:  # an error elsewhere, or the generator closed early
                with contextlib.suppress(Exception):
                    self.ray.cancel(ref)

    def _submit(self, todo: deque[_Range]) -> None:
        while todo and len(self.running) < self.window:
            first, stop = todo.popleft()
            hook = None
            if self.fail is not None or self.log is not None:
                hook = _TestHook(first, self.fail == str(first), self.log)
            ref = self.task.remote(self.index_ref, self.order[first:stop], self.setting, hook, self.skip)
            self.running[ref] = (first, stop)

    def _next_result(self) -> tuple[_Range, _Result]:
        """The next task to finish: its range and result. When it failed: the other tasks in
        flight are waited for and staged, then the error is raised."""
        [ref], _ = self.ray.wait(list(self.running), num_returns=1)
        got = self.running.pop(ref)
        try:
            return got, self._result(ref, got)
        except Exception:
            for other, rng in list(self.running.items()):
                self.running.pop(other)
                with contextlib.suppress(Exception):
                    self._stage(rng, self._result(other, rng))
            raise

    def _result(self, ref: Any, rng: _Range) -> _Result:
        try:
            result = self.ray.get(ref)
        except self.ray.exceptions.RayError as e:
            cause = getattr(e, "cause", None)  # a RayTaskError's: the task's own exception
            error = cause if isinstance(cause, BaseException) else e
            raise DatasetError(
                f"the Ray task making samples {rng[0]}..{rng[1] - 1} of the pack failed "
                f"({type(error).__name__}: {clip(str(error))}); run the same command again to go on "
                "(the samples made are kept)"
            ) from e
        if isinstance(result, _Failure):
            _checked(self.index, self.order, rng[0], result)  # raises, naming the sample
        sizes, data = result
        return sizes, data

    def _path(self, rng: _Range) -> str:
        return os.path.join(self.staging, f"range-{rng[0]:012d}-{rng[1]:012d}.bin")

    def _stage(self, rng: _Range, result: _Result) -> None:
        """Write a range's samples (its sizes, then their bytes) where a rerun finds them."""
        path = self._path(rng)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(np.ascontiguousarray(result[0], "<i8").tobytes())
            f.write(result[1].data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _staged_whole(self, rng: _Range) -> bool:
        """Whether the range's staged file is there and as long as its sizes say."""
        path, count = self._path(rng), rng[1] - rng[0]
        try:
            with open(path, "rb") as f:
                sizes = np.frombuffer(f.read(8 * count), "<i8")
                length = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return False
        return len(sizes) == count and length == 8 * count + int(_lengths(sizes).sum())

    def _read_staged(self, rng: _Range) -> _Result:
        with open(self._path(rng), "rb") as f:
            data = f.read()
        count = rng[1] - rng[0]
        sizes = np.frombuffer(data, "<i8", count).astype(np.int64)
        return sizes, np.frombuffer(data, np.uint8, offset=8 * count)
