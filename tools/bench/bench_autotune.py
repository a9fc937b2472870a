"""Issue 32's targets for one loader ("Tunes itself"): `"auto"` (neither num_workers nor prefetch
given) against fixed settings, in three scenarios, on one ImageNet-layout folder of JPEGs.

  decode   RandomResizedCrop(224) + flip, batch 64, a trainer that only consumes. A grid of fixed
           settings (workers 1..cores x prefetch 2,4,8,16,32), each point's rate at steady state
           (after --point-warmup-s of --point-s), then "auto" from cold for --auto-s: its rate over
           0..30 s and 10..30 s, the most ring bytes it held over 20..30 s (converged; and its
           peak, the starting window), against the grid's best point and its ring. Targets:
           auto >= 97% of the best within 30 s; its ring <= the best's + 10%.
  trainer  a trainer step of 2x one worker's time per batch (measured first: one worker, no step),
           as 1-thread matmuls (--step cpu; their count calibrated on an idle core) or a sleep
           (--step sleep, a GPU step's stand-in): "auto" against the fixed default (num_workers=
           cores, autotune=False), over --trainer-s each. Targets: step rate >= 99% of the fixed
           default's, workers' CPU time <= 60% of its (utime + stime from /proc/PID/stat, sampled
           while they live); also the worker-seconds held (live workers summed over time).
  burner   a trainer that only consumes; one busy process per core starts at 20 s and stops at
           60 s of an 80-s run (--burner). Per second: the rate and the worker count, for "auto"
           and the fixed default; the re-convergence time after each change (the first second
           from which the rolling rate, over enough seconds to hold 16 batches, stays within 10%
           of the phase's steady level, the median of its last half, at most 10 s; and the last
           change of the worker count in the phase), and the CPU pressure (/proc/pressure/cpu
           "some": the share of time a runnable task waited for a CPU) before, during and after
           the burner. Target: re-converged within 10 s of each change, no run-queue storm.

Every measurement runs alone in a fresh process (tools/bench/autotune_run.py), so one loader's
workers never overlap another's. A round runs every system of a scenario once, their order rotated
each round; tables give medians of --rounds rounds with [min..max] spreads, and ratios paired
within a round. Ring bytes are the loader's ring segments in /dev/shm (the slots: in flight + 2),
sampled; the tuner's statistics (tuner_workers, tuner_in_flight, ring_slots, tuner_changes,
tuner_reason) are printed where the loader has them, and read as absent before.

    python tools/bench/bench_autotune.py --folder DIR [--quick] [--scenarios decode,trainer,burner]
        [--rounds 3] [--workers-grid 1,2] [--prefetch-grid 2,4,8,16,32] [--step cpu|sleep] [--json F]

The folder: tools/bench/make_bench_dataset.py DIR --images 2000, or --make-with PYTHON (a python
with scikit-image) makes it where missing. 11 to 15 minutes on 2 cores at the defaults (the grid is
half of it), about 1.5 with --quick. The header gives the machine's CPU pressure before the run: on
a shared machine (pressure well above 0%) rates move with what else runs, and paired ratios less.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RUN = HERE / "autotune_run.py"
MIB = 1 << 20
SAMPLE_S = 0.25

Samples = list[dict[str, Any]]


def measure(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in a fresh process (autotune_run.py): its samples."""
    full = {"mode": "run", "folder": str(args.folder), "batch_size": args.batch_size,
            "size": args.size, "interval": SAMPLE_S, "cores": args.cores, **spec}  # fmt: skip
    done = subprocess.run([sys.executable, str(RUN), json.dumps(full)], stdout=subprocess.PIPE, check=True)
    return json.loads(done.stdout.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def images_at(samples: Samples, t: float) -> float:
    """Images delivered by time `t` (from the loader's construction), interpolated between samples."""
    prev_t, prev_n = 0.0, 0.0
    for row in samples:
        if row["t"] >= t:
            share = (t - prev_t) / max(1e-9, row["t"] - prev_t)
            return prev_n + share * (row["images"] - prev_n)
        prev_t, prev_n = row["t"], row["images"]
    return prev_n


def rate(samples: Samples, start: float, end: float) -> float:
    """Images a second over [start, end)."""
    return (images_at(samples, end) - images_at(samples, start)) / (end - start)


def per_cpu_second(samples: Samples, start: float, end: float) -> float:
    """Images per CPU second of the trainer and its workers over the samples in [start, end]
    (the work an image costs, which other processes on a shared machine move less than the rate)."""
    inside = [r for r in samples if start <= r["t"] <= end]
    first, last = inside[0], inside[-1]
    cpu = sum(last[k] - first[k] for k in ("worker_cpu_s", "trainer_cpu_s"))
    return (last["images"] - first["images"]) / max(1e-9, cpu)


def per_second(samples: Samples, end: float) -> list[float]:
    return [rate(samples, s, s + 1) for s in range(int(end))]


def tuner_workers(row: dict[str, Any]) -> int:
    """The worker count: the tuner's active workers when the statistics have them (absent before
    the tuner, 0 when nothing is tuned), else the live worker processes."""
    return row.get("tuner_workers") or row["workers"]  # type: ignore[no-any-return]


def ring_mib(run: dict[str, Any], slot_bytes: int, since: float = 0.0) -> float:
    """The most ring memory a run held from `since` (seconds from the loader's construction) on:
    its slot segments in /dev/shm, or the statistics' ring slots x a batch's bytes where that is
    more (a ring the tuner grows elsewhere)."""
    samples = [r for r in run["samples"] if r["t"] >= since]
    held = [max(r["ring_bytes"], (r.get("ring_slots") or 0) * slot_bytes) for r in samples]
    return max(held) / MIB


def worker_timeline(samples: Samples) -> str:
    """The worker count's changes, e.g. "0.2s:2 12.7s:3" (and the tuner's last reason, if any)."""
    steps, last = [], None
    for row in samples:
        count = tuner_workers(row)
        if count != last:
            steps.append(f"{row['t']:.1f}s:{count}")
            last = count
    end = samples[-1]
    extra = "" if not end.get("tuner_workers") else (
        f" (tuner: {end['tuner_changes']} changes, last reason {reason_name(end['tuner_reason'])}, "
        f"in flight {end['tuner_in_flight']}, ring slots {end['ring_slots']})"
    )  # fmt: skip
    return " ".join(steps) + extra


def reason_name(code: int | None) -> str:
    """The tuner's reason code as its name (`fastload._loading.tuning.decisions.Reason`)."""
    try:
        from fastload._loading.tuning.decisions import Reason

        return Reason(code).name
    except (ImportError, ValueError):
        return str(code)


def worker_seconds(samples: Samples) -> float:
    """Live workers summed over time (worker-seconds held)."""
    total, prev_t = 0.0, 0.0
    for row in samples:
        total += row["workers"] * (row["t"] - prev_t)
        prev_t = row["t"]
    return total


def pressure(samples: Samples, start: float, end: float) -> float | None:
    """The share of [start, end) during which a runnable task waited for a CPU (PSI "some")."""
    inside = [r for r in samples if start <= r["t"] <= end and r["psi_us"] is not None]
    if len(inside) < 2:
        return None
    first, last = inside[0], inside[-1]
    return (last["psi_us"] - first["psi_us"]) / 1e6 / max(1e-9, last["t"] - first["t"])


def reconverged_after(
    rates: list[float], change: int, end: int, batch_size: int, within: float = 0.10
) -> float | None:
    """Seconds after `change` from which the rolling rate stays within `within` of the steady
    level of [change, end) (the median of its last half, at most 10 s); None if it never does.
    The rolling window holds at least 16 batches at the steady level (3 s at least): a per-second
    rate moves by a whole batch (64 images are 20% of 320 img/s), which is no re-convergence."""
    tail = rates[max(change, end - min(10, (end - change) // 2)) : end]
    steady = statistics.median(tail)
    span = max(3, math.ceil(16 * batch_size / max(steady, 1e-9)))
    rolling = [sum(rates[k : k + span]) / span for k in range(change, end - span + 1)]
    for i in range(len(rolling)):
        if all(abs(r - steady) <= within * steady for r in rolling[i:]):
            return float(i)
    return None


def workers_settled_after(samples: Samples, change: float, end: float) -> float:
    """Seconds after `change` of the last change of the worker count before `end` (0: none)."""
    last, settled = None, change
    for row in samples:
        count = tuner_workers(row)
        if last is not None and count != last and change <= row["t"] < end:
            settled = row["t"]
        last = count
    return settled - change


def spread(values: list[float], digits: int = 0) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}..{max(values):.{digits}f}]"


def rotated(names: list[str], r: int) -> list[str]:
    return names[r % len(names) :] + names[: r % len(names)]


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def decode_bound(args: argparse.Namespace) -> dict[str, Any]:
    grid = [(w, p) for w in args.workers_grid for p in args.prefetch_grid]
    names = [f"w{w} p{p}" for w, p in grid] + ["auto"]
    rates: dict[str, list[float]] = {n: [] for n in names}
    rings: dict[str, list[float]] = {n: [] for n in names}
    per_cpu: dict[str, list[float]] = {n: [] for n in names}
    auto_runs: list[dict[str, Any]] = []
    warm, end = args.auto_warmup_s, args.auto_s
    for r in range(args.rounds):
        for name in rotated(names, r):
            if name == "auto":
                run = measure({"seconds": end, "seed": r}, args)
                auto_runs.append(run)
                rates[name].append(rate(run["samples"], warm, end))
                per_cpu[name].append(per_cpu_second(run["samples"], warm, end))
                rates.setdefault("auto from cold", []).append(rate(run["samples"], 0, end))
            else:
                w, p = grid[names.index(name)]
                run = measure({"seconds": args.point_s, "workers": w, "prefetch": p, "seed": r}, args)
                rates[name].append(rate(run["samples"], args.point_warmup_s, args.point_s))
                per_cpu[name].append(per_cpu_second(run["samples"], args.point_warmup_s, args.point_s))
            slot_bytes = args.batch_size * 3 * args.size * args.size
            rings[name].append(ring_mib(run, slot_bytes))
            if name == "auto":  # once converged: the last 10 s of the first 30 (the target's)
                rings.setdefault("auto, converged", []).append(ring_mib(run, slot_bytes, max(end - 10, 0)))
            print(f"decode round {r + 1}: {name} {rates[name][-1]:.0f} img/s", file=sys.stderr, flush=True)
    best = max(names[:-1], key=lambda n: statistics.median(rates[n]))
    print(f"\n### decode-bound: {args.batch_size} x {args.size}px crops, trainer only consumes\n")
    print("| setting | img/s median [min..max] | img per CPU-s (trainer + workers) | ring MiB (max held) |")
    print("|---|---:|---:|---:|")
    for name in names[:-1]:
        mark = " (best)" if name == best else ""
        print(
            f"| {name}{mark} | {spread(rates[name])} | {spread(per_cpu[name])} | {spread(rings[name], 1)} |"
        )
    print(f"| auto, {warm:g}..{end:g} s | {spread(rates['auto'])} | {spread(per_cpu['auto'])} "
          f"| {spread(rings['auto'], 1)} |")  # fmt: skip
    print(f"| auto from cold, 0..{end:g} s | {spread(rates['auto from cold'])} | | |")
    print(f"| auto, {max(end - 10, 0):g}..{end:g} s | | | {spread(rings['auto, converged'], 1)} |")
    from_cold = [a / b for a, b in zip(rates["auto from cold"], rates[best], strict=True)]
    warmed = [a / b for a, b in zip(rates["auto"], rates[best], strict=True)]
    ring = [a / b for a, b in zip(rings["auto, converged"], rings[best], strict=True)]
    peak = [a / b for a, b in zip(rings["auto"], rings[best], strict=True)]
    reach = [time_to_reach(run["samples"], statistics.median(rates[best]) * 0.97, end) for run in auto_runs]
    print(f"\nauto / best ({best}), paired: 0..{end:g} s {spread(from_cold, 3)}, {warm:g}..{end:g} s "
          f"{spread(warmed, 3)} (target >= 0.97 within {end:g} s: "
          f"{verdict(statistics.median(warmed) >= 0.97)}); ring auto ({max(end - 10, 0):g}..{end:g} s) / "
          f"best {spread(ring, 3)} (target <= 1.10: {verdict(statistics.median(ring) <= 1.10)}); its "
          f"peak (the starting window) / best {spread(peak, 3)}")  # fmt: skip
    print(
        "auto held >= 97% of the best's median rate (3-s rolling) from second: "
        + ", ".join("never" if t is None else f"{t:g}" for t in reach)
    )
    for r, run in enumerate(auto_runs):
        print(f"auto round {r + 1} workers: {worker_timeline(run['samples'])}")
    return {"rates": rates, "per_cpu_s": per_cpu, "ring_mib": rings, "best": best, "auto_runs": auto_runs}


def time_to_reach(samples: Samples, target: float, end: float) -> float | None:
    """The first second from which the 3-s rolling rate stays >= `target` until `end`."""
    rates = per_second(samples, end)
    rolling = [sum(rates[k : k + 3]) / 3 for k in range(len(rates) - 2)]
    for i in range(len(rolling)):
        if all(r >= target for r in rolling[i:]):
            return float(i)
    return None


def trainer_bound(args: argparse.Namespace) -> dict[str, Any]:
    one = measure({"seconds": args.point_s, "workers": 1, "prefetch": 2}, args)
    batch_s = args.batch_size / rate(one["samples"], args.point_warmup_s, args.point_s)
    step: dict[str, Any] = {"step": args.step, "step_s": 2 * batch_s}
    if args.step == "cpu":
        done = subprocess.run(
            [sys.executable, str(RUN), json.dumps({"mode": "calibrate", "step_s": 2 * batch_s})],
            stdout=subprocess.PIPE, check=True,
        )  # fmt: skip
        step["step_work"] = json.loads(done.stdout)["step_work"]
    work = f" ({step['step_work']} matmuls)" if "step_work" in step else ""
    print(f"trainer: one worker's batch {batch_s * 1000:.0f} ms; step {args.step} "
          f"{2 * batch_s * 1000:.0f} ms{work}", file=sys.stderr, flush=True)  # fmt: skip
    systems = {"auto": {}, "fixed": {"workers": args.cores, "autotune": False}}
    results: dict[str, dict[str, list[float]]] = {n: {"steps": [], "cpu": [], "held": []} for n in systems}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in systems}
    for r in range(args.rounds):
        for name in rotated(list(systems), r):
            run = measure({"seconds": args.trainer_s, "seed": r, **step, **systems[name]}, args)
            samples, end = run["samples"], run["samples"][-1]["t"]
            results[name]["steps"].append(run["batches"] / end)
            results[name]["cpu"].append(samples[-1]["worker_cpu_s"])
            results[name]["held"].append(worker_seconds(samples))
            runs[name].append(run)
            print(
                f"trainer round {r + 1}: {name} {run['batches'] / end:.2f} steps/s",
                file=sys.stderr,
                flush=True,
            )
    print(f"\n### trainer-bound: step = {args.step}, {2 * batch_s * 1000:.0f} ms (2 x one worker's "
          f"{batch_s * 1000:.0f} ms a batch), {args.trainer_s:g} s a run\n")  # fmt: skip
    print("| system | steps/s | workers' CPU s | worker-seconds held |")
    print("|---|---:|---:|---:|")
    for name in systems:
        label = "auto" if name == "auto" else f"fixed default ({args.cores} workers, autotune=False)"
        cells = [spread(results[name][k], d) for k, d in (("steps", 3), ("cpu", 1), ("held", 1))]
        print(f"| {label} | " + " | ".join(cells) + " |")
    ratios = {k: [a / b for a, b in zip(results["auto"][k], results["fixed"][k], strict=True)]
              for k in ("steps", "cpu", "held")}  # fmt: skip
    steps_ok, cpu_ok = (statistics.median(ratios["steps"]) >= 0.99, statistics.median(ratios["cpu"]) <= 0.60)
    print(f"\nauto / fixed, paired: step rate {spread(ratios['steps'], 3)} (target >= 0.99: "
          f"{verdict(steps_ok)}); workers' CPU {spread(ratios['cpu'], 3)} (target <= 0.60: "
          f"{verdict(cpu_ok)}); worker-seconds held {spread(ratios['held'], 3)}")  # fmt: skip
    for name in systems:
        for r, run in enumerate(runs[name]):
            print(f"{name} round {r + 1} workers: {worker_timeline(run['samples'])}")
    return {"batch_s": batch_s, "step": step, "results": results, "runs": runs}


def burner_mid_run(args: argparse.Namespace) -> dict[str, Any]:
    on, off, end = args.burner
    systems = {"auto": {}, "fixed": {"workers": args.cores, "autotune": False}}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in systems}
    for r in range(args.burner_rounds):
        for name in rotated(list(systems), r):
            spec = {"seconds": end, "seed": r, "burner_on": on, "burner_off": off, **systems[name]}
            runs[name].append(measure(spec, args))
            print(f"burner round {r + 1}: {name} done", file=sys.stderr, flush=True)
    print(f"\n### burner mid-run: {args.cores} busy processes from {on:g} s to {off:g} s of {end:g} s\n")
    print(
        "| system | img/s before | during | after | re-converged s after start | after stop "
        "| workers settled s after start / stop | CPU pressure before / during / after |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, system_runs in runs.items():
        rates = [per_second(run["samples"], end) for run in system_runs]
        phases = [
            [statistics.median(rs[a:b]) for rs in rates] for a, b in ((on // 2, on), (on, off), (off, end))
        ]
        after_on = [reconverged_after(rs, on, off, args.batch_size) for rs in rates]
        after_off = [reconverged_after(rs, off, end, args.batch_size) for rs in rates]
        settled = [
            [workers_settled_after(run["samples"], a, b) for run in system_runs]
            for a, b in ((on, off), (off, end))
        ]
        psi = [
            [pressure(run["samples"], a, b) for run in system_runs]
            for a, b in ((0, on), (on, off), (off, end))
        ]
        print(f"| {name} | " + " | ".join(spread(p) for p in phases)
              + f" | {_seconds(after_on)} | {_seconds(after_off)} | "
              + " / ".join(_seconds([round(x, 1) for x in v]) for v in settled) + " | "
              + " / ".join(_shares(p) for p in psi) + " |")  # fmt: skip
    for name, system_runs in runs.items():
        for r, run in enumerate(system_runs):
            rates = per_second(run["samples"], end)
            print(f"\n{name} round {r + 1}, img/s each second: " + " ".join(f"{x:.0f}" for x in rates))
            print(f"{name} round {r + 1} workers: {worker_timeline(run['samples'])}")
    return {"runs": runs}


def _seconds(values: list[float | None]) -> str:
    return ", ".join("never" if v is None else f"{v:g}" for v in values)


def _shares(values: list[float | None]) -> str:
    return ", ".join("n/a" if v is None else f"{100 * v:.0f}%" for v in values)


def machine_pressure(seconds: float = 3.0) -> str:
    """How busy the machine is before a measurement: the share of `seconds` during which a runnable
    task waited for a CPU (PSI "some"; near 0% on a quiet machine: rates from a busy one are noise)."""
    try:
        with open("/proc/pressure/cpu") as f:
            before = int(f.readline().rsplit("total=", 1)[1])
        time.sleep(seconds)
        with open("/proc/pressure/cpu") as f:
            after = int(f.readline().rsplit("total=", 1)[1])
    except (OSError, IndexError, ValueError):
        return "CPU pressure unknown (no /proc/pressure/cpu)"
    return f"CPU pressure {100 * (after - before) / 1e6 / seconds:.0f}% over {seconds:g} s idle"


def numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--folder", type=Path, required=True, help="an ImageNet-layout folder of JPEGs")
    parser.add_argument(
        "--make-with", default="", help="a python with scikit-image: make --folder if missing"
    )
    parser.add_argument("--images", type=int, default=2000, help="images, when making the folder")
    parser.add_argument("--scenarios", default="decode,trainer,burner")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, a small grid, short runs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--workers-grid", type=numbers, default=None, help="default: 1..cores")
    parser.add_argument("--prefetch-grid", type=numbers, default=[2, 4, 8, 16, 32])
    parser.add_argument("--point-s", type=float, default=6.0, help="a grid point's run")
    parser.add_argument("--point-warmup-s", type=float, default=2.0, help="of it, not timed")
    parser.add_argument("--auto-s", type=float, default=30.0)
    parser.add_argument("--auto-warmup-s", type=float, default=10.0)
    parser.add_argument("--trainer-s", type=float, default=20.0)
    parser.add_argument("--step", choices=("cpu", "sleep"), default="cpu")
    parser.add_argument("--burner", type=numbers, default=[20, 60, 80], help="on,off,end seconds")
    parser.add_argument("--burner-rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write every sample here")
    args = parser.parse_args()
    args.cores = len(os.sched_getaffinity(0))
    args.workers_grid = args.workers_grid or list(range(1, args.cores + 1))
    if args.quick:
        args.rounds, args.burner_rounds, args.prefetch_grid = 1, 1, [4]
        args.point_s, args.point_warmup_s, args.auto_s, args.auto_warmup_s = 3.0, 1.0, 8.0, 3.0
        args.trainer_s, args.burner = 6.0, [3, 8, 13]
    if len(args.burner) != 3 or not 0 < args.burner[0] < args.burner[1] < args.burner[2]:
        parser.error("--burner is on,off,end seconds, in that order")
    if not args.folder.is_dir():
        if not args.make_with:
            parser.error(f"{args.folder} is missing: make it with make_bench_dataset.py, or pass --make-with")
        make = [
            args.make_with,
            str(HERE / "make_bench_dataset.py"),
            str(args.folder),
            "--images",
            str(args.images),
        ]
        subprocess.run(make, check=True)
    print(f"{args.folder}, batch {args.batch_size}, {args.size}px, {args.cores} cores, {args.rounds} "
          f"rounds (burner {args.burner_rounds}); {machine_pressure()}", flush=True)  # fmt: skip
    started = time.perf_counter()
    scenarios = {"decode": decode_bound, "trainer": trainer_bound, "burner": burner_mid_run}
    results = {}
    for name in args.scenarios.split(","):
        if name not in scenarios:
            parser.error(f"unknown scenario {name!r}: pick from {', '.join(scenarios)}")
        results[name] = scenarios[name](args)
    print(f"\n{time.perf_counter() - started:.0f} s in all; after it, {machine_pressure()}")
    if args.json:
        args.json.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
