"""`fastload pack --max-side N` on Ray (`pack(ray=True)`) against the plain pack's process pool.

From a folder of JPEGs (tools/bench/make_bench_dataset.py makes photo-like ones of ImageNet
sizes), each round packs it with --max-side N three ways, alternating, each into a fresh
directory under --work, each in a fresh process (as `fastload pack` runs): the plain pack with
`--workers 2`, and `--ray` on a local Ray of 1 and of 2 CPUs. For Ray two times are kept: the
pack itself (Ray already started) and the whole command (Ray's start and shutdown included). Every
pack is checked byte-identical to the round's plain one. Prints medians [min-max] over rounds.

    .venv/bin/python tools/bench/bench_pack_ray.py --data DIR --work DIR [--max-side 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(data: str, dst: str, max_side: int, ray_cpus: int) -> dict[str, float]:
    """Pack in this process; seconds: `start` (Ray), `pack`, `stop` (Ray)."""
    from fastload import sources

    times = {"start": 0.0, "stop": 0.0}
    if ray_cpus:
        import ray

        t0 = time.perf_counter()
        ray.init(num_cpus=ray_cpus, include_dashboard=False)
        times["start"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    sources.pack(data, dst, progress=False, max_side=max_side, workers=2, ray=bool(ray_cpus))
    times["pack"] = time.perf_counter() - t0
    if ray_cpus:
        t0 = time.perf_counter()
        ray.shutdown()
        times["stop"] = time.perf_counter() - t0
    return times


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        filecmp.cmp(a / n, b / n, shallow=False) for n in names
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA"), help="ImageNet-layout JPEG folder")
    parser.add_argument("--work", help="where the packs go (emptied each round)")
    parser.add_argument("--max-side", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("DST", "RAY_CPUS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.data, args.child[0], args.max_side, int(args.child[1]))))
        return
    if not args.data or not args.work:
        parser.error("pass --data DIR (or set BENCH_DATA; tools/bench/make_bench_dataset.py makes one) "
                     "and --work DIR")
    ways = {"pack --workers 2": 0, "pack --ray, 1 CPU": 1, "pack --ray, 2 CPUs": 2}
    pack_s: dict[str, list[float]] = {way: [] for way in ways}
    whole_s: dict[str, list[float]] = {way: [] for way in ways}
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    for r in range(args.rounds):
        work = Path(args.work) / f"round-{r}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        for way, cpus in ways.items():
            dst = work / f"ray-{cpus}"
            command = [sys.executable, __file__, "--data", args.data, "--max-side", str(args.max_side),
                       "--child", str(dst), str(cpus)]
            t0 = time.perf_counter()
            out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
            whole_s[way].append(time.perf_counter() - t0)
            times = json.loads(out.strip().splitlines()[-1])
            pack_s[way].append(times["pack"])
            if cpus and not same_files(dst, work / "ray-0"):
                raise SystemExit(f"{dst} differs from the plain pack {work / 'ray-0'}")
            print(f"round {r} {way}: pack {times['pack']:.1f} s, Ray start {times['start']:.1f} s, "
                  f"stop {times['stop']:.1f} s, whole process {whole_s[way][-1]:.1f} s", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    count = sum(1 for p in Path(args.data).rglob("*") if p.is_file())
    base = statistics.median(pack_s["pack --workers 2"])

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}]"

    print(f"\n{count} files, --max-side {args.max_side}; seconds, median [min-max] of {args.rounds} rounds; "
          f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    print("| command | pack (s) | images/s | vs --workers 2 | whole process (s) |")
    print("|---|---:|---:|---:|---:|")
    for way in ways:
        median = statistics.median(pack_s[way])
        print(f"| `{way}` | {spread(pack_s[way])} | {count / median:,.0f} | {base / median:.2f}x "
              f"| {spread(whole_s[way])} |")


if __name__ == "__main__":
    main()
