"""Crafted resume states against `FastLoader.load_state_dict` (issue 29, item 8): the figures for
docs/RELIABILITY.md. Nothing is timed; each state is judged.

Six loaders (a map-style Dataset with and without drop_last, a user's sampler, an image folder
as rank 1 of 2, an image folder under a block shuffle, an IterableDataset) each save real states
(after every batch of two epochs, and from other batch layouts); those are mutated: each field
replaced by negative, huge, -2**63, 2**63, float, NaN, None, str, bool, list and dict values,
keys dropped and added, nested fingerprints changed, positions shifted consistently (every
batch of the epoch, far epochs), and two or three fields at once. Each state is loaded into a
fresh loader in a child process under a watchdog (`--timeout` seconds a state: past it the
child is killed and the state counted as hung, and a new child goes on) and judged:

- refused: a ConfigError;
- resumed correctly: the resumed epoch's sample ids (and the next epoch's) are exactly what an
  uninterrupted run yields from the position the state names (a reference loader of the
  state's seed, `set_epoch`, from that batch: no repeats, none missing);
- wrong: anything else resumed, or a state a real run saved (or a consistent shift of one) refused;
- crashed: any other exception; hung: past the watchdog.

The target is 0 wrong, hung or crashed.

    .venv/bin/python tools/bench/bench_resume_fuzz.py [--limit N] [--seed 1] [--timeout 20] [--json]

(every state it makes, about 29,000 in 40 s on 2 busy cores; --limit N: a seeded sample of N)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import multiprocessing
import random
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from fastload import ConfigError, FastLoader
from fastload import transforms as T

N = 22  # samples: a short last batch under most batch sizes


class Ids(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


class Stream(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(10))


def make_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for i in range(N):
        klass = root / f"c{i % 2}"
        klass.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(klass / f"{i:02d}.jpg")
    return root


def loader(config: str, folder: str, **over: Any) -> FastLoader:
    """The loader named `config` (`over`: other arguments, for states of another layout)."""
    images: dict[str, Any] = {"transform": [T.Resize((8, 8))], "device": "cpu", "sample_ids": True}
    kinds: dict[str, tuple[Any, dict[str, Any]]] = {
        "dataset": (Ids(), {"batch_size": 4, "shuffle": True}),
        "dataset-drop-last": (Ids(), {"batch_size": 4, "shuffle": True, "drop_last": True}),
        "sampler": (Ids(), {"batch_size": 5, "sampler": list(reversed(range(N)))}),
        "folder-rank1of2": (folder, {"batch_size": 3, "shuffle": True, "rank": 1, "world_size": 2, **images}),
        "folder-block": (folder, {"batch_size": 4, "shuffle": True, "shuffle_block": 3, **images}),
        "iterable": (Stream(), {"batch_size": 3}),
    }
    dataset, kwargs = kinds[config]
    return FastLoader(dataset, **{"num_workers": 0, "seed": 7, **kwargs, **over})


def ids(batch: Any) -> list[int]:
    if isinstance(batch, list | tuple):  # an image batch: [images, labels, sample ids]
        return [int(i) for i in batch[2].indices]
    return [int(i) for i in batch]


def epoch_ids(fl: FastLoader) -> list[list[int]]:
    return [ids(b) for b in fl]


# -- the states -------------------------------------------------------------------------------

OTHER_LAYOUTS: dict[str, list[dict[str, Any]]] = {  # states a run of another layout saved
    "dataset": [{"batch_size": 2}, {"batch_size": 8}, {"batch_size": 3}],
    "dataset-drop-last": [{"batch_size": 2}],
    "sampler": [{"batch_size": 1}],
    "folder-rank1of2": [{"batch_size": 6, "world_size": 1, "rank": 0}, {"batch_size": 3, "rank": 0}],
    "folder-block": [{"batch_size": 2}],
    "iterable": [{"batch_size": 2}],
}
VALUES: list[Any] = [
    -1, -3, -(2**63), 2**63, 2**63 - 1, 2**62 + 1, 10**30, 0, 1, 0.5, math.nan, math.inf, None, "1", True,
    False, [], [1], {}, {"num_samples": 1},
]


def real_states(config: str, folder: str) -> list[tuple[str, dict[str, Any], bool]]:
    """States saved by real runs: after every batch of two epochs (these must resume), and from
    other layouts (these may be refused: NOTE [elastic resume])."""
    out = []
    with loader(config, folder) as fl:
        for epoch in range(2):
            for k, _ in enumerate(fl):
                out.append((f"real e{epoch} b{k + 1}", fl.state_dict(), True))
    for over in OTHER_LAYOUTS[config]:
        with loader(config, folder, **over) as fl:
            it = iter(fl)
            for k in range(2):
                next(it)
                out.append((f"layout {over} b{k + 1}", fl.state_dict(), False))
    return out


def mutations(base: dict[str, Any], rng: random.Random, same_layout: bool) -> Iterator[tuple[str, Any, bool]]:
    """(what, state, valid): `valid` where a run of this loader's layout could have saved it (it
    must not be refused)."""
    for field in base:
        for value in VALUES:
            yield f"{field}={value!r}"[:60], {**base, field: value}, False
        yield f"drop {field}", {k: v for k, v in base.items() if k != field}, False
    yield "extra key", {**base, "batches_yeilded": 1}, False
    if isinstance(base.get("source"), dict) and base["source"]:
        for key, value in (("num_samples", N + 1), ("num_samples", -1), ("targets", "0" * 16),
                           ("classes", None), ("extra", 1)):
            yield f"source.{key}={value!r}", {**base, "source": {**base["source"], key: value}}, False
    if isinstance(base.get("stream_batches"), list):
        for counts in ([10**9], [-1], [1, 1], [0], [5], [2**63]):
            yield f"stream_batches={counts}", {**base, "stream_batches": counts}, False
    for what, state in consistent_shifts(base):
        yield what, state, same_layout
    fields = list(base)
    for _ in range(12):  # several fields at once
        state = dict(base)
        for field in rng.sample(fields, rng.randint(2, 3)):
            state[field] = rng.choice(VALUES)
        yield "combined", state, False


def consistent_shifts(base: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The position moved (within the epoch, to far epochs) with every count that depends on it."""
    batches, size = base.get("epoch_batches"), base.get("batch_size")
    for epoch in (0, 3, 2**40):
        if batches is not None and size is not None:
            for b in range(batches):  # (the epoch's end: among the real states)
                yield f"shifted e{epoch} b{b}", {
                    **base, "epoch": epoch, "batches_yielded": b, "samples_yielded": b * size
                }
        elif "stream_batches" in base:
            for c in range(6):
                yield f"shifted e{epoch} streams {c}", {
                    **base, "epoch": epoch, "batches_yielded": c, "stream_batches": [c]
                }


# -- judging ----------------------------------------------------------------------------------


class Reference:
    """What an uninterrupted run yields: a fresh loader of the state's seed at an epoch."""

    def __init__(self, config: str, folder: str) -> None:
        self.config, self.folder = config, folder
        self._cache: dict[tuple[int, int], list[list[int]]] = {}

    def epoch(self, seed: int, epoch: int) -> list[list[int]]:
        if (seed, epoch) not in self._cache:
            with loader(self.config, self.folder, seed=seed) as fl:
                fl.set_epoch(epoch)
                self._cache[(seed, epoch)] = epoch_ids(fl)
        return self._cache[(seed, epoch)]


def expected(config: str, folder: str, state: dict[str, Any], ref: Reference) -> tuple[Any, Any] | None:
    """(rest of the resumed epoch, the epoch after) that an accepted `state` must give, or None
    where no loader may accept it (its position falls on no batch boundary here)."""
    seed, epoch, b = state["seed"], state["epoch"], state["batches_yielded"]
    if config == "iterable":
        rest = ref.epoch(seed, epoch)[state["stream_batches"][0] :]
        return rest, ref.epoch(seed, epoch + 1)
    with loader(config, folder) as fl:
        size, world, batches = fl.batch_size, fl._assembly.spec.world_size, len(fl)
    epoch_batches = state.get("epoch_batches")
    if epoch_batches is not None and b >= epoch_batches:
        return ref.epoch(seed, epoch + 1), ref.epoch(seed, epoch + 2)
    start = b
    if state["version"] == 2 and (state["batch_size"], state["world_size"]) != (size, world):
        total = state["samples_yielded"] * state["world_size"]
        if size is None or total % (size * world):
            return None
        start = total // (size * world)
    if start >= batches:
        return ref.epoch(seed, epoch + 1), ref.epoch(seed, epoch + 2)
    return ref.epoch(seed, epoch)[start:], ref.epoch(seed, epoch + 1)


def run_one(config: str, folder: str, state: Any) -> tuple[str, Any]:
    """In the child: load `state` into a fresh loader; its verdict and what it yielded."""
    try:
        with loader(config, folder) as fl:
            fl.load_state_dict(state)
            first = epoch_ids(fl)
            second = epoch_ids(fl)
        return "resumed", (first, second)
    except ConfigError as e:
        return "refused", str(e)[:300]
    except Exception as e:
        return "crashed", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"


def child(conn: Any, folder: str) -> None:
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(run_one(job[0], folder, job[1]))


class Watchdog:
    """A child process running one state at a time; killed (and replaced) past `timeout_s`."""

    def __init__(self, folder: str, timeout_s: float) -> None:
        self.folder, self.timeout_s = folder, timeout_s
        self._ctx = multiprocessing.get_context("fork")
        self._start()

    def _start(self) -> None:
        self.conn, theirs = self._ctx.Pipe()
        self.proc = self._ctx.Process(target=child, args=(theirs, self.folder), daemon=True)
        self.proc.start()
        theirs.close()

    def run(self, config: str, state: Any) -> tuple[str, Any]:
        try:
            self.conn.send((config, state))
            if self.conn.poll(self.timeout_s):
                return self.conn.recv()  # type: ignore[no-any-return]
            verdict: tuple[str, Any] = ("hung", f"no answer within {self.timeout_s:g} s")
        except (EOFError, OSError) as e:
            verdict = ("crashed", f"the child died: {e} (exit {self.proc.exitcode})")
        self.close(kill=True)
        self._start()
        return verdict

    def close(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                self.proc.kill()
        self.proc.join(10)
        self.conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit", type=int, default=0, help="states at most (a seeded sample; 0: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds a state may take")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(make_folder(Path(tmp) / "data"))
        configs = list(OTHER_LAYOUTS)
        jobs = []
        for config in configs:
            for name, base, same in real_states(config, folder):
                jobs.append((config, name, base, same))
                jobs += [(config, f"{name}: {what}", s, ok) for what, s, ok in mutations(base, rng, same)]
        jobs += [(c, f"not a dict: {v!r}", v, False) for c in configs for v in (None, [], "x", 1, {1: 2})]
        if 0 < args.limit < len(jobs):
            jobs = rng.sample(jobs, args.limit)
        refs = {c: Reference(c, folder) for c in configs}
        dog = Watchdog(folder, args.timeout)
        counts: Counter[str] = Counter()
        examples: dict[str, list[str]] = {}
        try:
            for config, name, state, valid in jobs:
                verdict, got = dog.run(config, copy.deepcopy(state))
                if verdict == "refused" and valid:
                    verdict, got = "wrong", f"a state a run could save was refused: {got}"
                elif verdict == "resumed":
                    try:
                        want = expected(config, folder, state, refs[config])
                    except Exception:  # the state names no position a run could be at
                        want = None
                    verdict = "resumed correctly" if want is not None and tuple(got) == want else "wrong"
                    got = f"got {got}, want {want}"
                counts[verdict] += 1
                if verdict in ("wrong", "hung", "crashed"):
                    examples.setdefault(verdict, []).append(f"{config} [{name}]: {str(got)[:600]}")
        finally:
            dog.close()
    report = {
        "states": len(jobs),
        **{k: counts[k] for k in ("refused", "resumed correctly", "wrong", "hung", "crashed")},
        "seconds": round(time.monotonic() - started, 1),
        "examples": {k: v[:5] for k, v in examples.items()},
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(", ".join(f"{k}: {v}" for k, v in report.items() if k != "examples"))
        for kind, lines in report["examples"].items():
            print(f"{kind} (first {len(lines)}):")
            for line in lines:
                print("  " + line)
    sys.exit(1 if any(counts[k] for k in ("wrong", "hung", "crashed")) else 0)


if __name__ == "__main__":
    main()
