"""Run data-loader "systems" side by side and report their medians.

Each system is a script run as its own process with its own python (see SYSTEMS), taking
`--data DIR --workers W --batch-size B --batches N` (or `--epochs E`) and printing one final JSON
line as described in tools/bench/bench_systems/bench_common.py. Systems alternate within each of R
rounds (the order rotates every round, so none always runs first). For every run the harness
records, over the whole process tree (workers included):

- images/s: images after the first batch / seconds from the first batch to the last;
- CPU ms per image, steady: user+sys CPU of the tree during that same span, cut from samples
  of /proc/<pid>/stat (utime+stime+cutime+cstime of every live process) taken every
  --cpu-ms and interpolated at the span's ends, divided by the span's images;
- CPU ms per image, whole run: user+sys from wait4() on the system process (itself plus every
  descendant it reaped) plus any orphans, which this harness, as a child subreaper, reaps;
  divided by every image delivered, the first batch included; imports and startup count here;
- TTFB: seconds from the start of loader construction to the first batch, as reported;
- peak PSS: the largest sum of Pss over /proc/<pid>/smaps_rollup of all tree processes,
  sampled every --pss-ms. Reading smaps_rollup walks the page tables: here it costs 10-15 ms
  of CPU per torch process, so sampling 3 processes every 50 ms would take most of a core from
  the 2-core machine under test; the default period is therefore 500 ms;
- GB/s: for systems that report "bytes".

Prints a markdown table of medians over the successful runs and, with --json, writes every
raw run, the sampler's own CPU seconds included. Linux only; standard library only, so any
python 3.10+ can run it. Add a system by adding an entry to SYSTEMS.

Paths come from flags or the environment: --data DIR (default $BENCH_DATA), an ImageNet-layout
folder (tools/bench/make_bench_dataset.py makes one); the peer systems' pythons are in the venvs that
tools/bench/bench_env.sh made under $BENCH_VENVS (needed only when a peer system is selected).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import resource
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SYSTEMS_DIR = Path(__file__).resolve().parent / "bench_systems"
VENVS = Path(os.environ["BENCH_VENVS"]) if os.environ.get("BENCH_VENVS") else None


def venv_python(name: str) -> Path | None:
    """The python of the peer venv `name` under $BENCH_VENVS; None while BENCH_VENVS is unset."""
    return None if VENVS is None else VENVS / name / "bin" / "python"


TV_PYTHON = venv_python("tv")
FFCV_PYTHON = venv_python("ffcv")
DALI_PYTHON = venv_python("dali")
MAIN_PYTHON = REPO / ".venv" / "bin" / "python"

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TREE_RESCAN_SECONDS = 0.25
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class System:
    """How to run one system. `batch_size`/`batches` override the harness's values; `python`
    is None for a peer system while BENCH_VENVS is unset."""

    python: Path | None
    script: Path
    extra_args: tuple[str, ...] = ()
    needs_data: bool = True
    batch_size: int | None = None
    batches: int | None = None
    prepare: bool = False  # run once with --prepare (untimed) before the rounds


SYSTEMS: dict[str, System] = {
    "torchvision": System(TV_PYTHON, SYSTEMS_DIR / "dataloader_torchvision.py"),
    "torchvision-fastcollate": System(TV_PYTHON, SYSTEMS_DIR / "dataloader_fastcollate.py"),
    "ffcv": System(FFCV_PYTHON, SYSTEMS_DIR / "ffcv_loader.py", prepare=True),
    "fastload": System(MAIN_PYTHON, SYSTEMS_DIR / "fastload_loader.py"),
    "fastload-pil": System(MAIN_PYTHON, SYSTEMS_DIR / "fastload_loader.py", ("--backend", "pil")),
    # fastload's workers, plan and ring with DALI's CPU operators decoding (needs fastload[dali]).
    "fastload-dali": System(MAIN_PYTHON, SYSTEMS_DIR / "fastload_loader.py", ("--backend", "dali")),
    "dali-cpu": System(DALI_PYTHON, SYSTEMS_DIR / "dali_cpu_loader.py"),
    # Validation pipelines: Resize(256) + CenterCrop(224) (or the system's equivalent), in order.
    "fastload-val": System(MAIN_PYTHON, SYSTEMS_DIR / "fastload_loader.py", ("--val",)),
    "fastload-dali-val": System(
        MAIN_PYTHON, SYSTEMS_DIR / "fastload_loader.py", ("--val", "--backend", "dali")
    ),
    "torchvision-val": System(TV_PYTHON, SYSTEMS_DIR / "dataloader_torchvision.py", ("--val",)),
    "ffcv-val": System(FFCV_PYTHON, SYSTEMS_DIR / "ffcv_loader.py", ("--val",), prepare=True),
    "dali-cpu-val": System(DALI_PYTHON, SYSTEMS_DIR / "dali_cpu_loader.py", ("--val",)),
    # Train recipes, float32 normalized out (bench_systems/recipe_common.py): "basic" is
    # RandomResizedCrop(224) + flip; "deit" adds RandAugment(2, 9), ColorJitter(0.4, 0.4, 0.4),
    # RandomErasing(0.25) and per-batch MixUp/CutMix (soft labels). basic vs deit on one system:
    # what the augmentations themselves cost.
    "torchvision-basic": System(TV_PYTHON, SYSTEMS_DIR / "dataloader_recipe.py", ("--recipe", "basic")),
    "torchvision-deit": System(TV_PYTHON, SYSTEMS_DIR / "dataloader_recipe.py", ("--recipe", "deit")),
    "fastload-basic": System(MAIN_PYTHON, SYSTEMS_DIR / "fastload_recipe.py", ("--recipe", "basic")),
    "fastload-deit": System(MAIN_PYTHON, SYSTEMS_DIR / "fastload_recipe.py", ("--recipe", "deit")),
    "ceiling": System(MAIN_PYTHON, SYSTEMS_DIR / "decode_ceiling.py"),
    "transport-fastload": System(
        MAIN_PYTHON,
        SYSTEMS_DIR / "transport_fastload.py",
        needs_data=False,
        batch_size=256,
        batches=400,
    ),
    "transport-dataloader": System(
        MAIN_PYTHON,
        SYSTEMS_DIR / "transport_dataloader.py",
        needs_data=False,
        batch_size=256,
        batches=400,
    ),
}


@dataclass(frozen=True)
class CpuSample:
    """The process tree's cumulative user+sys CPU seconds at one moment."""

    time: float
    cpu_seconds: float


def descendants(root: int) -> list[int]:
    """Every live (or zombie) process below `root`, from the ppid fields in /proc/*/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid` (its own CPU plus its reaped children's);
    0 once it has been reaped (its CPU then shows in its parent's cutime/cstime)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    rest = fields[fields.rindex(")") + 2 :].split()
    return sum(int(x) for x in rest[11:15]) / CLOCK_TICKS


def pss_bytes(pid: int) -> int:
    """Pss from /proc/<pid>/smaps_rollup (0 for a zombie or a process gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


class TreeSampler(threading.Thread):
    """Samples this process's descendants (the run's tree: the system process, its children and
    any orphans reparented here) until stopped: CPU every `cpu_interval` seconds, the summed PSS
    every `pss_interval`, the set of processes every TREE_RESCAN_SECONDS (a process that comes
    and goes in between is still counted, in its parent's cutime/cstime once reaped)."""

    def __init__(self, cpu_interval: float, pss_interval: float) -> None:
        super().__init__(daemon=True)
        self.cpu_interval = cpu_interval
        self.pss_interval = pss_interval
        self.cpu_samples: list[CpuSample] = []
        self.pss_samples = 0
        self.peak_pss_bytes = 0
        self.own_cpu_seconds = 0.0
        self._stop_event = threading.Event()

    def run(self) -> None:
        me = os.getpid()
        pids: list[int] = []
        next_rescan = next_pss = time.monotonic()
        while not self._stop_event.is_set():
            now = time.monotonic()
            if now >= next_rescan:
                pids = descendants(me)
                next_rescan = now + TREE_RESCAN_SECONDS
            self.cpu_samples.append(CpuSample(now, sum(map(cpu_seconds, pids))))
            if now >= next_pss:
                self.peak_pss_bytes = max(self.peak_pss_bytes, sum(map(pss_bytes, pids)))
                self.pss_samples += 1
                next_pss = now + self.pss_interval
            self._stop_event.wait(self.cpu_interval)
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        self.own_cpu_seconds = usage.ru_utime + usage.ru_stime

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def cpu_at(samples: Sequence[CpuSample], when: float) -> float:
    """The tree's cumulative CPU at `when`, linearly interpolated between samples."""
    if when <= samples[0].time:
        return samples[0].cpu_seconds
    for before, after in itertools.pairwise(samples):
        if before.time <= when <= after.time:
            span = after.time - before.time
            share = (when - before.time) / span if span > 0 else 1.0
            return before.cpu_seconds + share * (after.cpu_seconds - before.cpu_seconds)
    return samples[-1].cpu_seconds


def rusage_cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def reap_leftovers(group: int) -> tuple[float, int]:
    """Kill what is left of the run's process group, reap every child of this harness (orphans
    reparented to it as subreaper); return their CPU seconds and how many there were."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)
    cpu = 0.0
    count = 0
    while True:
        try:
            _, _, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return cpu, count
        cpu += rusage_cpu(usage)
        count += 1


def last_json_line(text: str) -> dict[str, Any] | None:
    """The last stdout line that parses as a JSON object."""
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def run_process(argv: list[str], sampler: TreeSampler, timeout: float) -> dict[str, Any]:
    """Run `argv` in its own session while `sampler` watches its tree; return the raw
    measurements (the CPU samples under "cpu_samples")."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.monotonic()
        pid = os.posix_spawn(
            argv[0],
            argv,
            dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, err.fileno(), 2),
            ],
            setsid=True,
        )
        sampler.start()
        killer = threading.Timer(timeout, os.killpg, (pid, signal.SIGKILL))
        killer.start()
        _, status, usage = os.wait4(pid, 0)
        wall = time.monotonic() - start
        killer.cancel()
        sampler.stop()
        orphan_cpu, orphans = reap_leftovers(pid)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "wall_seconds": wall,
        "cpu_seconds_run": rusage_cpu(usage) + orphan_cpu,
        "leftover_processes": orphans,
        "cpu_samples": sampler.cpu_samples,
        "peak_pss_bytes": sampler.peak_pss_bytes,
        "pss_samples": sampler.pss_samples,
        "sampler_cpu_seconds": sampler.own_cpu_seconds,
        "result": last_json_line(stdout),
        "stderr_tail": stderr[-2000:],
    }


def system_argv(system: System, args: argparse.Namespace) -> list[str]:
    argv = [str(system.python), str(system.script)]
    if system.needs_data:
        argv += ["--data", str(args.data)]
    argv += ["--workers", str(args.workers)]
    argv += ["--batch-size", str(system.batch_size or args.batch_size)]
    if args.epochs is not None:
        argv += ["--epochs", str(args.epochs)]
    else:
        argv += ["--batches", str(system.batches or args.batches)]
    return argv + list(system.extra_args)


def measure_run(name: str, round_index: int, argv: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One timed run of one system, with its derived metrics. Of the system's JSON line only
    images, steady_seconds and ttfb_seconds are required; without steady_window there is no
    steady CPU figure, and without batches the whole-run CPU is divided by `images` alone."""
    sampler = TreeSampler(args.cpu_ms / 1000, args.pss_ms / 1000)
    raw = run_process(argv, sampler, args.timeout)
    samples: list[CpuSample] = raw.pop("cpu_samples")
    result = raw["result"]
    record: dict[str, Any] = {"system": name, "round": round_index, "argv": argv, **raw}
    record["cpu_samples"] = len(samples)
    record["ok"] = raw["returncode"] == 0 and result is not None and result["images"] > 0
    if not record["ok"]:
        return record
    images = result["images"]
    steady = result["steady_seconds"]
    batches = result.get("batches")
    all_images = images * batches / (batches - 1) if batches else images
    record["images_per_second"] = images / steady
    record["cpu_ms_per_image_run"] = 1000 * raw["cpu_seconds_run"] / all_images
    record["ttfb_seconds"] = result["ttfb_seconds"]
    if "steady_window" in result and samples:
        first, last = result["steady_window"]
        record["cpu_seconds_steady"] = cpu_at(samples, last) - cpu_at(samples, first)
        record["cpu_ms_per_image_steady"] = 1000 * record["cpu_seconds_steady"] / images
    if "bytes" in result:
        record["gb_per_second"] = result["bytes"] / steady / 1e9
    return record


def prepare(name: str, system: System, args: argparse.Namespace) -> None:
    """Run a system's untimed --prepare step (e.g. building its dataset file)."""
    argv = [str(system.python), str(system.script), "--data", str(args.data), "--prepare"]
    print(f"# preparing {name}", file=sys.stderr, flush=True)
    raw = run_process(argv, TreeSampler(1.0, 1.0), args.timeout)
    if raw["returncode"] != 0:
        raise SystemExit(f"{name} --prepare failed:\n{raw['stderr_tail']}")


COLUMNS: list[tuple[str, str, str]] = [
    ("images/s", "images_per_second", "{:.0f}"),
    ("CPU ms/img steady", "cpu_ms_per_image_steady", "{:.2f}"),
    ("CPU ms/img whole run", "cpu_ms_per_image_run", "{:.2f}"),
    ("TTFB s", "ttfb_seconds", "{:.2f}"),
    ("peak PSS MiB", "peak_pss_bytes", "{:.0f}"),
    ("GB/s", "gb_per_second", "{:.2f}"),
]


def medians(runs: list[dict[str, Any]], names: list[str]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for name in names:
        good = [r for r in runs if r["system"] == name and r["ok"]]
        table[name] = {
            key: statistics.median(r[key] for r in good if key in r)
            for _, key, _ in COLUMNS
            if any(key in r for r in good)
        }
    return table


def markdown(runs: list[dict[str, Any]], table: dict[str, dict[str, float]]) -> str:
    header = ["system", "ok runs", *(title for title, _, _ in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, values in table.items():
        mine = [r for r in runs if r["system"] == name]
        cells = [name, f"{sum(r['ok'] for r in mine)}/{len(mine)}"]
        for _, key, fmt in COLUMNS:
            value = values.get(key)
            if value is not None and key == "peak_pss_bytes":
                value /= 2**20
            cells.append("–" if value is None else fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def become_subreaper() -> None:
    """Have orphaned descendants reparent to this process, so their CPU time is not lost."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=os.environ.get("BENCH_DATA") or None,
        help="ImageNet-layout folder (default: $BENCH_DATA)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated names from: {', '.join(SYSTEMS)} (default: all)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--batches", type=int, default=100, help="batches per run (a system may override)")
    length.add_argument("--epochs", type=int, help="epochs per run, instead of --batches")
    parser.add_argument("--cpu-ms", type=float, default=50.0, help="CPU sampling period")
    parser.add_argument("--pss-ms", type=float, default=500.0, help="PSS sampling period")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--json", type=Path, help="write all raw runs here")
    args = parser.parse_args()
    args.system_names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = [n for n in args.system_names if n not in SYSTEMS]
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {list(SYSTEMS)}")
    if args.data is None:
        if any(SYSTEMS[n].needs_data for n in args.system_names):
            parser.error(
                "no data: pass --data DIR or set BENCH_DATA (tools/bench/make_bench_dataset.py makes one)"
            )
    else:
        args.data = args.data.resolve()
    peers = [n for n in args.system_names if SYSTEMS[n].python is None]
    if peers:
        parser.error(
            f"{peers} run in the peer venvs: set BENCH_VENVS to the folder where "
            "tools/bench/bench_env.sh made them"
        )
    missing = [
        str(path)
        for n in args.system_names
        for path in (SYSTEMS[n].python, SYSTEMS[n].script)
        if not path.exists()
    ]
    if missing:
        parser.error(f"missing: {missing} (tools/bench/bench_env.sh makes the venvs)")
    return args


def main() -> int:
    args = parse_args()
    names: list[str] = args.system_names
    become_subreaper()
    for name in names:
        if SYSTEMS[name].prepare:
            prepare(name, SYSTEMS[name], args)

    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for round_index in range(args.rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            run = measure_run(name, round_index, system_argv(SYSTEMS[name], args), args)
            runs.append(run)
            summary = (
                f"{run['images_per_second']:.0f} img/s"
                if run["ok"]
                else f"FAILED rc={run['returncode']}: {run['stderr_tail'][-300:]}"
            )
            print(f"# round {round_index} {name}: {summary}", file=sys.stderr, flush=True)

    table = medians(runs, names)
    print(markdown(runs, table))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "config": {
                "data": str(args.data),
                "systems": {n: {"argv": system_argv(SYSTEMS[n], args)} for n in names},
                "rounds": args.rounds,
                "cpu_ms": args.cpu_ms,
                "pss_ms": args.pss_ms,
                "cpu_count": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
            },
            "medians": table,
            "runs": runs,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
