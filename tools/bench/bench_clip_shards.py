"""CLIP-style shards (issue 31's target: >= 2x WebDataset + DataLoader): image-text pairs with
metadata loaded for training, fastload against WebDataset + DataLoader + torchvision v2.

Shards: the JPEGs of --data (an image folder, e.g. tools/bench/make_bench_dataset.py's) written
once into --work as WebDataset tar shards of --per-shard samples, `KEY.jpg` + `KEY.txt` (a caption
of 40-200 characters) + `KEY.json` (LAION-like metadata). Each system loads one epoch of them,
RandomResizedCrop(224) + RandomHorizontalFlip, uint8 (B, 3, 224, 224) images, the captions as
`list[str]` and the metadata parsed, with --workers worker processes, on the CPU:

  fastload    FastLoader(TarShards(..., fields={"image": "jpg", "text": "txt", "meta": "json"}),
              shuffle=True) (its default shuffle: blocks of a shard, a window of them);
  fastload-image  the same with fields={"image": "jpg"}: images alone, what the captions and
              metadata cost (--systems to choose; all three by default);
  webdataset  wds.WebDataset(shards, shardshuffle=True).shuffle(1000).decode("pil")
              .to_tuple("jpg", "txt", "json") + torchvision.transforms.v2 (RandomResizedCrop(224,
              antialias=True), RandomHorizontalFlip, PILToTensor), .batched(B) in a
              DataLoader(batch_size=None, num_workers=W) (its documented recipe).

Each system runs as its own process (the peer's in --peer-python, a throwaway venv outside the
repo with torch, torchvision and webdataset); the systems alternate within each of --rounds
rounds, the order rotating, so they share the machine's state pair by pair. Reported: images/s
from the first batch to the last (steady), and the whole epoch's seconds from construction
(startup and first batch included), medians [min-max] over the rounds, and fastload's paired
ratio per round.

    python tools/bench/bench_clip_shards.py --data FOLDER --work DIR --peer-python PY \\
        [--workers 2] [--batch-size 64] [--rounds 3] [--samples 2000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

FIELDS = {"image": "jpg", "text": "txt", "meta": "json"}
_WORDS = ("a", "photo", "of", "the", "red", "small", "dog", "cat", "on", "beach", "with", "sunset", "in",
          "city", "tree", "old", "man", "car", "bicycle")  # fmt: skip


def write_shards(data: Path, work: Path, per_shard: int, samples: int) -> str:
    """WebDataset shards of the folder's first `samples` JPEGs (sorted) with captions and JSON
    metadata, written once (kept in `work`); the brace pattern naming them."""
    shards = work / "shards"
    images = sorted(p for p in data.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[:samples]
    count = (len(images) + per_shard - 1) // per_shard
    pattern = str(shards / f"clip-{{000000..{count - 1:06d}}}.tar")
    if (shards / "done").exists():
        return pattern
    shards.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    for number in range(count):
        with tarfile.open(shards / f"clip-{number:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(number * per_shard, min(len(images), (number + 1) * per_shard)):
                caption = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 40)))
                meta = {"url": f"https://example.com/{i}.jpg", "width": 500, "height": 375,
                        "similarity": rng.random(), "key": f"{i:09d}"}  # fmt: skip
                for suffix, payload in ((".jpg", images[i].read_bytes()), (".txt", caption.encode()),
                                        (".json", json.dumps(meta).encode())):  # fmt: skip
                    info = tarfile.TarInfo(f"{i:09d}{suffix}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
    (shards / "done").write_text(pattern)
    return pattern


def run_fastload(pattern: str, workers: int, batch_size: int, images_only: bool = False) -> dict[str, Any]:
    from fastload import FastLoader, sources
    from fastload import transforms as T

    started = time.perf_counter()
    source = sources.TarShards(pattern, fields={"image": "jpg"} if images_only else FIELDS)
    chain = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    with FastLoader(source, batch_size=batch_size, shuffle=True, transform=chain, num_workers=workers,
                    device="cpu", seed=0) as loader:  # fmt: skip
        if images_only:
            return _consume(loader, started, lambda b: (b["image"], b["image"], b["image"]))
        return _consume(loader, started, lambda b: (b["image"], b["text"], b["meta"]))


def run_webdataset(pattern: str, workers: int, batch_size: int) -> dict[str, Any]:
    import torch
    import webdataset as wds
    from torchvision.transforms import v2

    started = time.perf_counter()
    crop = v2.RandomResizedCrop(224, antialias=True)
    augment = v2.Compose([crop, v2.RandomHorizontalFlip(), v2.PILToTensor()])
    dataset = (
        wds.WebDataset(pattern, shardshuffle=True, empty_check=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "txt", "json")
        .map_tuple(augment, lambda t: t, lambda m: m)
        .batched(batch_size, partial=True)
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    return _consume(loader, started, lambda b: b)


def _consume(loader: Any, started: float, parts: Any) -> dict[str, Any]:
    images = first_images = 0
    first = last = 0.0
    for batch in loader:
        pixels, texts, metas = parts(batch)
        same = len(texts) == len(metas) == len(pixels)
        if not same or tuple(pixels.shape[1:]) != (3, 224, 224):
            raise SystemExit(f"unexpected batch: images {tuple(pixels.shape)}, {len(texts)} texts")
        images += len(pixels)
        last = time.perf_counter()
        if not first:
            first, first_images = last, len(pixels)
    steady = (images - first_images) / (last - first) if last > first else 0.0
    return {"images": images, "steady": steady, "epoch_seconds": last - started,
            "first_batch": first - started}


def _run_system(name: str, python: str, args: argparse.Namespace, pattern: str) -> dict[str, Any]:
    command = [python, __file__, "--run", name, "--pattern", pattern, "--workers", str(args.workers),
               "--batch-size", str(args.batch_size)]  # fmt: skip
    env = dict(os.environ)
    if name.startswith("fastload"):
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{name} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _spread(values: list[float], unit: str = "") -> str:
    return f"{statistics.median(values):,.1f}{unit} [{min(values):,.1f}-{max(values):,.1f}]"


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--data", type=Path, help="an image folder of JPEGs (make_bench_dataset.py)")
    parser.add_argument("--work", type=Path, help="where the shards are written (kept between runs)")
    parser.add_argument("--peer-python", help="a python with torch, torchvision and webdataset")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--per-shard", type=int, default=250)
    parser.add_argument("--systems", default="fastload,fastload-image,webdataset")
    parser.add_argument("--run", choices=("fastload", "fastload-image", "webdataset"), help=argparse.SUPPRESS)
    parser.add_argument("--pattern", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:  # one system's epoch, in its own process: one JSON line
        if args.run == "webdataset":
            result = run_webdataset(args.pattern, args.workers, args.batch_size)
        else:
            result = run_fastload(args.pattern, args.workers, args.batch_size, args.run == "fastload-image")
        print(json.dumps(result))
        return
    if not (args.data and args.work and args.peer_python):
        parser.error("--data, --work and --peer-python are needed")
    pattern = write_shards(args.data, args.work, args.per_shard, args.samples)
    pythons = {"fastload": sys.executable, "fastload-image": sys.executable, "webdataset": args.peer_python}
    systems = {name: pythons[name] for name in args.systems.split(",")}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    order = list(systems)
    for round_number in range(args.rounds):
        for name in order:
            results[name].append(_run_system(name, systems[name], args, pattern))
            print(f"round {round_number + 1} {name}: {results[name][-1]}", file=sys.stderr)
        order = order[1:] + order[:1]
    images = next(iter(results.values()))[0]["images"]
    print(f"\n{images} samples (JPEG + txt + json), batch {args.batch_size}, {args.workers} workers, "
          f"RandomResizedCrop(224) + flip; medians [min-max] over {args.rounds} rounds\n")  # fmt: skip
    print("| system | images/s, steady | epoch s (with startup) | first batch s |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        steady = _spread([r["steady"] for r in runs])
        epoch = _spread([r["epoch_seconds"] for r in runs])
        print(f"| {name} | {steady} | {epoch} | {_spread([r['first_batch'] for r in runs])} |")
    for ours, peer in (("fastload", "webdataset"), ("fastload", "fastload-image")):
        if ours not in results or peer not in results:
            continue
        pairs = zip(results[ours], results[peer], strict=True)
        ratios = [(f["steady"] / w["steady"], w["epoch_seconds"] / f["epoch_seconds"]) for f, w in pairs]
        print(f"\n{ours} / {peer}, paired per round: steady {_spread([r[0] for r in ratios], 'x')}, "
              f"whole epoch {_spread([r[1] for r in ratios], 'x')}")  # fmt: skip


if __name__ == "__main__":
    main()
