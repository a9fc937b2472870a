"""Does the loader keep a trainer fed? A training loop, timed three ways, for each loader:

- **loader alone**: the loop takes batches and does nothing with them (run before and after the
  fed run, and averaged: the machine's speed drifts between runs; `loader_drift` says how much);
- **consumer alone**: the training step, repeated on one fixed batch (what the step can eat);
- **fed**: the loader feeding the step, the way training runs;

reporting images/s of each, fed as a share of min(loader alone, consumer alone), the time the
trainer spends waiting inside `next()` and how busy the loader's workers were (fastload's own
counters: read + decode + augment wall time over wall time x workers; above 100% when the workers' stages
also wait for a CPU, e.g. a spinning step on the same cores). Several epochs are run back to
back (`--epochs`), so what happens at epoch ends counts.

The step: `--step sleep:MS` or `--step spin:MS` (runs anywhere; `sleep:auto` takes as long per
batch as the loader alone delivers one, the hardest case for overlap), or `--step resnet18` /
`--step resnet50` (torchvision's model, forward + backward + SGD, bf16 autocast, channels_last, on
CUDA; needs torchvision and a GPU). Loaders: `fastload`, `fastload-dali` (backend="dali": DALI's
`mixed` decode on a GPU, its CPU operators otherwise), `fastload-nvjpeg` (backend="nvjpeg":
torchvision's GPU decoder; CUDA only), and `dataloader` (torch DataLoader +
torchvision ImageFolder with the same transforms and Apex-style uint8 collation; needs
torchvision). Images: RandomResizedCrop + horizontal flip, uint8, normalized on the device by the
step (fastload: by the loader) when it is a model; `--recipe deit` adds DeiT's augmentations
(fastload only; labels become soft targets, which cross_entropy takes as they are).

    .venv/bin/python tools/bench/bench_train.py --data DIR [--step sleep:auto] [--loaders fastload]
        [--workers 2] [--batch-size 64] [--size 224] [--epochs 3] [--warmup 5] [--rounds 3]
(--data defaults to $BENCH_DATA; each figure is the median over --rounds, with min and max)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from fastload import FastLoader
from fastload import transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

Step = Callable[[Any], None]


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA"), help="ImageNet-layout folder")
    parser.add_argument("--step", default="sleep:auto")
    parser.add_argument("--loaders", default="fastload")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument(
        "--recipe", choices=("basic", "deit"), default="basic",
        help="basic: RandomResizedCrop + flip; deit (fastload only): + RandAugment(2, 9), "
        "ColorJitter(0.4, 0.4, 0.4), RandomErasing(0.25), MixUp/CutMix (soft targets)",
    )
    parser.add_argument("--prefetch", type=int, help="fastload's batches in flight (default: its own)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5, help="batches not timed at the start")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="append every run here, one JSON object per line")
    args = parser.parse_args()
    if not args.data:
        parser.error(
            "no data: pass --data DIR or set BENCH_DATA (tools/bench/make_bench_dataset.py makes one)"
        )
    return args


def _device(step: str) -> torch.device:
    if step.startswith(("sleep:", "spin:")):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        sys.exit(f"--step {step} needs CUDA; use --step sleep:MS or spin:MS here")
    return torch.device("cuda")


def make_step(spec: str, batch_ms: float) -> Step:
    """The training step a loop runs per batch."""
    kind, _, value = spec.partition(":")
    if kind in ("sleep", "spin"):
        seconds = (batch_ms if value == "auto" else float(value)) / 1000

        def simulated(batch: Any) -> None:
            if kind == "sleep":
                time.sleep(seconds)
                return
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass

        return simulated
    import torchvision  # only for a real model

    model = getattr(torchvision.models, spec)().cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train(batch: Any) -> None:
        images, labels = batch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return train


def recipe(name: str, size: int, classes: int) -> list[T.Transform]:
    """The loader's transforms: crop + flip, and for "deit" DeiT's augmentations (on CUDA the
    colour/policy stage runs on the GPU after the copy, batched; on a CPU in the workers)."""
    chain: list[T.Transform] = [T.RandomResizedCrop(size), T.RandomHorizontalFlip()]
    if name == "deit":
        mixing = [T.MixUp(alpha=0.8, num_classes=classes), T.CutMix(alpha=1.0, num_classes=classes)]
        chain += [T.RandAugment(2, 9), T.ColorJitter(0.4, 0.4, 0.4), T.RandomErasing(0.25)]
        chain.append(T.RandomChoice(mixing))
    return chain


def _fastload(args: argparse.Namespace, device: torch.device, backend: str = "native") -> Any:
    normalize = (MEAN, STD) if device.type == "cuda" or args.recipe == "deit" else None
    classes = sum(1 for entry in os.scandir(args.data) if entry.is_dir())
    return FastLoader(
        args.data,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        seed=0,
        num_workers=args.workers,
        prefetch=args.prefetch,
        device=device,
        normalize=normalize,
        dtype=torch.bfloat16,
        transform=recipe(args.recipe, args.size, classes),
        backend=backend,
    )


def _fastload_dali(args: argparse.Namespace, device: torch.device) -> Any:
    """backend="dali": nvJPEG decoding and GPU augmentation where `device` is CUDA (`mixed`)."""
    return _fastload(args, device, backend="dali")


def _fastload_nvjpeg(args: argparse.Namespace, device: torch.device) -> Any:
    """backend="nvjpeg": torchvision's batched nvJPEG, then one kernel crops and resizes (CUDA only)."""
    return _fastload(args, device, backend="nvjpeg")


def _dataloader(args: argparse.Namespace, device: torch.device) -> Any:
    if args.recipe != "basic":
        sys.exit("--recipe deit is fastload's only here: tools/bench/bench_loaders.py times DataLoader + "
                 "torchvision v2 with the recipe (torchvision-deit)")
    import numpy as np
    import torchvision.transforms as tvt
    from torchvision.datasets import ImageFolder

    def fast_collate(samples: list[tuple[Any, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.from_numpy(np.stack([np.asarray(img, np.uint8) for img, _ in samples]))
        return images.permute(0, 3, 1, 2), torch.tensor([label for _, label in samples])

    dataset = ImageFolder(
        args.data, transform=tvt.Compose([tvt.RandomResizedCrop(args.size), tvt.RandomHorizontalFlip()])
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=args.workers,
        collate_fn=fast_collate,
        pin_memory=device.type == "cuda",
        persistent_workers=True,
    )
    return _OnDevice(loader, device)


class _OnDevice:
    """DataLoader's batches on the device, normalized there (what a training script does)."""

    def __init__(self, loader: Any, device: torch.device) -> None:
        self.loader, self.device = loader, device
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255

    def __iter__(self) -> Iterator[Any]:
        for images, labels in self.loader:
            if self.device.type == "cuda":
                images = images.to(self.device, non_blocking=True).to(memory_format=torch.channels_last)
                images = ((images.float() - self.mean) / self.std).to(torch.bfloat16)
                labels = labels.to(self.device, non_blocking=True)
            yield images, labels

    def close(self) -> None:
        self.loader = None


LOADERS = {
    "fastload": _fastload,
    "fastload-dali": _fastload_dali,
    "fastload-nvjpeg": _fastload_nvjpeg,
    "dataloader": _dataloader,
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_loop(
    loader: Iterable[Any], step: Step, epochs: int, warmup: int, device: torch.device
) -> dict[str, float]:
    """Images/s after `warmup` batches, and the share of that time spent waiting for batches."""
    images = 0
    waited = 0.0
    taken = 0
    start = None
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            batch = next(it, None)
            t1 = time.perf_counter()
            if batch is None:
                break
            taken += 1
            if taken == warmup:
                _sync(device)
                start, images, waited = time.perf_counter(), 0, 0.0
            elif start is not None:
                waited += t1 - t0
                images += len(batch[1])
            step(batch)
    _sync(device)
    elapsed = time.perf_counter() - (start or time.perf_counter())
    return {
        "images_per_s": images / elapsed if elapsed else 0.0,
        "trainer_wait": waited / elapsed if elapsed else 0.0,
    }


def consumer_alone(step: Step, loader: Iterable[Any], batches: int, device: torch.device) -> float:
    batch = next(iter(loader))
    for _ in range(3):
        step(batch)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(batches):
        step(batch)
    _sync(device)
    return batches * len(batch[1]) / (time.perf_counter() - t0)


def _workers_busy(loader: Any, before: Any, wall_s: float, workers: int) -> float | None:
    stats = loader.stats() if hasattr(loader, "stats") else None
    if stats is None or before is None or not workers:
        return None
    stages = ("read_s", "decode_s", "augment_s")
    busy = sum(getattr(stats, stage) - getattr(before, stage) for stage in stages)
    return busy / (wall_s * workers)


def measure(name: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    loader = LOADERS[name](args, device)
    try:
        t0 = time.perf_counter()
        alone = run_loop(loader, lambda batch: None, args.epochs, args.warmup, device)
        batch_ms = args.batch_size / alone["images_per_s"] * 1000
        step = make_step(args.step, batch_ms)
        consumer = consumer_alone(step, loader, 20, device)
        before = loader.stats() if hasattr(loader, "stats") else None
        t1 = time.perf_counter()
        fed = run_loop(loader, step, args.epochs, args.warmup, device)
        busy = _workers_busy(loader, before, time.perf_counter() - t1, args.workers)
        # Alone again: on a shared machine the loader's rate drifts between runs (up to 15%
        # here), and a fed run compared with a rate taken before it alone would count a slower
        # machine as the pipeline's loss. The bound is the mean of the two alone runs around it.
        after = run_loop(loader, lambda batch: None, args.epochs, args.warmup, device)
        del t0
    finally:
        loader.close()
    loader_rate = (alone["images_per_s"] + after["images_per_s"]) / 2
    bound = min(loader_rate, consumer)
    return {
        "loader": name,
        "step": args.step,
        "step_ms": round(batch_ms, 1) if args.step.endswith(":auto") else None,
        "loader_alone": loader_rate,
        "loader_drift": after["images_per_s"] / alone["images_per_s"] - 1,
        "consumer_alone": consumer,
        "fed": fed["images_per_s"],
        "fed_share": fed["images_per_s"] / bound,
        "trainer_wait": fed["trainer_wait"],
        "workers_busy": busy,
    }


def main() -> None:
    args = _parse()
    device = _device(args.step)
    names = [n for n in args.loaders.split(",") if n]
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        sys.exit(f"unknown loaders {unknown}: choose from {sorted(LOADERS)}")
    if "dataloader" in names:
        try:
            import torchvision  # noqa: F401
        except ImportError:
            sys.exit("--loaders dataloader needs torchvision (e.g. the $BENCH_VENVS/tv venv)")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for round_index in range(args.rounds):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            result = measure(name, args, device)
            runs[name].append(result)
            print(json.dumps({"round": round_index, **result}), flush=True)
            if args.json:
                with open(args.json, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"round": round_index, **result}) + "\n")
    print(
        f"\n{args.step}, batch {args.batch_size}, {args.workers} workers, {args.epochs} epochs, "
        "median [min-max]"
    )
    print(
        "| loader | loader alone img/s | consumer alone img/s | fed img/s | fed / min(both) "
        "| trainer wait | workers busy |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, results in runs.items():
        cells = [
            _cell(results, key, fmt)
            for key, fmt in (
                ("loader_alone", "{:.0f}"),
                ("consumer_alone", "{:.0f}"),
                ("fed", "{:.0f}"),
                ("fed_share", "{:.1%}"),
                ("trainer_wait", "{:.1%}"),
                ("workers_busy", "{:.0%}"),
            )
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")


def _cell(results: list[dict[str, Any]], key: str, fmt: str) -> str:
    """median [min-max] of one figure over the rounds."""
    values = [r[key] for r in results if r[key] is not None]
    if not values:
        return "–"
    low, mid, high = (fmt.format(v) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid} [{low}–{high}]"


if __name__ == "__main__":
    main()
