"""One GPU run that answers the GPU-decoding questions (issue 21): which decoder and which shape.

For each variant: the loader alone (images/s after a warm-up, across epoch ends) and the trainer
process's CPU (cores: its user + system time over wall time; the native backend's workers are
other processes and not counted, DALI's and nvJPEG's threads are this process's). Then a model
(`--model resnet18`, bf16 autocast, channels_last, SGD) alone on one fixed batch, and fed by the
best variant of each decoder; one table at the end.

Variants (`--variants`, comma-separated; `;` inside brackets):
    native                   the CPU workers (`--workers`), libjpeg-turbo
    nvjpeg[threads=N]        backend="nvjpeg": torchvision's batched nvJPEG + fastload's kernel
    dali[k=v;k=v]            backend="dali" (mixed), shaped by FASTLOAD_DALI_TUNING's keys:
                             region (0/1), hw_decoder_load, queue_depth, pipelined (0/1), threads
    native@DIR, dali@DIR[..] a decoder on another dataset (a pack made with --max-side, say)
Without DALI installed its variants are skipped, saying so.

    python tools/bench/bench_gpu_decode.py --data DIR [--workers 15] [--batch-size 256]
        [--batches 60] [--warmup 10] [--model resnet18] [--variants ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import MEAN, STD, consumer_alone, make_step, recipe

from fastload import FastLoader

DEFAULT_VARIANTS = (  # DALI's shapes as changes from DaliTuning's defaults (NOTE [GPU decode tuning])
    "native,nvjpeg[threads=4],"
    "dali,dali[pipelined=0;queue_depth=1],dali[region=0],dali[hw_decoder_load=0],"
    "dali[hw_decoder_load=0.5],dali[queue_depth=3],dali[threads=8]"
)


def _parse() -> argparse.Namespace:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA"), help="ImageNet-layout folder")
    parser.add_argument("--workers", type=int, default=15, help="native's worker processes")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batches", type=int, default=60, help="timed batches per variant")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--model", default="resnet18", help="torchvision model for the fed runs; '' for none")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--json", help="append each measurement here, one JSON object per line")
    args = parser.parse_args()
    if not args.data:
        parser.error("--data (or $BENCH_DATA) is required")
    return args


def split_variants(text: str) -> list[str]:
    """Split at commas outside brackets."""
    out, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(current)
            current = ""
        else:
            current += ch
    return [v.strip() for v in [*out, current] if v.strip()]


def make_loader(variant: str, args: argparse.Namespace) -> FastLoader:
    """The loader of a variant (see the module docstring); DALI's shape through FASTLOAD_DALI_TUNING."""
    name, _, rest = variant.partition("[")
    options = dict(item.split("=", 1) for item in rest.rstrip("]").split(";") if item)
    name, _, data = name.partition("@")
    backend = {"native": "native", "nvjpeg": "nvjpeg", "dali": "dali"}[name]
    workers = args.workers if backend == "native" else int(options.get("threads", 4))
    os.environ["FASTLOAD_DALI_TUNING"] = ",".join(f"{k}={v}" for k, v in options.items() if backend == "dali")
    classes = sum(1 for entry in os.scandir(data or args.data) if entry.is_dir()) or 1000
    return FastLoader(
        data or args.data, batch_size=args.batch_size, shuffle=True, drop_last=True, seed=0,
        num_workers=workers, device="cuda", normalize=(MEAN, STD), dtype=torch.bfloat16,
        transform=recipe("default", args.size, classes), backend=backend,
    )


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(loader: FastLoader, batches: int, warmup: int, step: Any = None) -> tuple[float, float]:
    """(images/s, trainer cores) over `batches` batches after `warmup`, across epoch ends."""
    taken, epoch, images = 0, 0, 0
    start = cpu0 = 0.0
    while taken < warmup + batches:
        loader.set_epoch(epoch)
        for batch in loader:
            taken += 1
            if taken == warmup:
                torch.cuda.synchronize()
                start, cpu0 = time.perf_counter(), _cpu_s()
            elif taken > warmup:
                images += len(batch[1])
            if step is not None:
                step(batch)
            if taken >= warmup + batches:
                break
        epoch += 1
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    return images / wall, (_cpu_s() - cpu0) / wall


def main() -> None:
    args = _parse()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu_decode measures GPU decoding: it needs CUDA")
    try:
        import nvidia.dali  # noqa: F401

        has_dali = True
    except ImportError:
        has_dali = False
    rows: dict[str, dict[str, Any]] = {}
    for variant in split_variants(args.variants):
        if variant.startswith("dali") and not has_dali:
            print(f"{variant}: skipped, DALI is not installed", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            with make_loader(variant, args) as loader:
                rate, cores = timed(loader, args.batches, args.warmup)
        except Exception as e:  # one variant's failure is a row of the table, not the end of the run
            print(f"{variant}: failed: {type(e).__name__}: {e}", flush=True)
            rows[variant] = {"variant": variant, "error": f"{type(e).__name__}: {e}"}
            continue
        rows[variant] = {"variant": variant, "alone": rate, "cores": cores, "s": time.perf_counter() - t0}
        print(json.dumps(rows[variant]), flush=True)
    if args.model:
        _fed(args, rows)
    _table(args, rows)
    if args.json:
        with open(args.json, "a", encoding="utf-8") as f:
            for row in rows.values():
                f.write(json.dumps(row) + "\n")


def _fed(args: argparse.Namespace, rows: dict[str, dict[str, Any]]) -> None:
    """The model alone, then fed by each decoder's best variant by loader-alone rate."""
    best: dict[str, str] = {}
    for variant, row in rows.items():
        kind = variant.split("[")[0]
        if "alone" in row and (kind not in best or row["alone"] > rows[best[kind]]["alone"]):
            best[kind] = variant
    step = make_step(args.model, 0.0)
    with make_loader(best.get("native", "native"), args) as loader:
        model_alone = consumer_alone(step, loader, 30, torch.device("cuda"))
    rows["model alone"] = {"variant": f"{args.model} alone (one fixed batch)", "fed": model_alone}
    print(json.dumps(rows["model alone"]), flush=True)
    for variant in best.values():
        with make_loader(variant, args) as loader:
            rate, cores = timed(loader, args.batches, args.warmup, step)
        rows[variant].update(fed=rate, fed_cores=cores, fed_share=rate / model_alone)
        print(json.dumps(rows[variant]), flush=True)


def _table(args: argparse.Namespace, rows: dict[str, dict[str, Any]]) -> None:
    gpu = torch.cuda.get_device_name(0)
    print(
        f"\n{gpu}, {os.cpu_count()} cores, torch {torch.__version__}; batch {args.batch_size}, "
        f"{args.batches} batches after {args.warmup}; native: {args.workers} workers"
    )
    print(f"| variant | loader alone img/s | trainer cores | {args.model} fed img/s | of the model alone |")
    print("|---|---:|---:|---:|---:|")
    for row in rows.values():
        if "error" in row:
            print(f"| {row['variant']} | failed: {row['error'][:80]} | | | |")
            continue
        cells = [
            f"{row['alone']:.0f}" if "alone" in row else "",
            f"{row['cores']:.2f}" if "cores" in row else "",
            f"{row['fed']:.0f}" if "fed" in row else "",
            f"{row['fed_share']:.1%}" if "fed_share" in row else "",
        ]
        print(f"| {row['variant']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
