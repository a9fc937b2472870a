"""Single-core decode+augment: fastload's native decoder against Pillow, pillow-simd, DALI and FFCV.

Every method runs in its own long-lived worker process (each in the venv it needs), all pinned to
the same core with os.sched_setaffinity, over the same images, to 224x224x3 uint8:

  train  RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip
  val    Resize(256) + CenterCrop(224)

Methods (venv; what one image costs):
  pillow-full        .venv, Pillow: full decode; train: crop then resize (torchvision's
                     resized_crop) + flip; val: resize the whole image to shorter side 256, then
                     crop (torchvision's Resize + CenterCrop)
  pillow-draft       .venv, Pillow: draft() (DCT-scaled decode), then one resize of the box, cut
                     to the geometry's clip first (what fastload's `pil` backend does)
  pillow-simd-full   $BENCH_VENVS/simd, pillow-simd (AVX2 build): as pillow-full
  pillow-simd-draft  $BENCH_VENVS/simd, pillow-simd: as pillow-draft
  dali-1t            $BENCH_VENVS/dali, DALI CPU pipeline, device_id=None, num_threads=1, batch
                     --batch, synchronous (exec_async/exec_pipelined off, so no work happens
                     between passes); fn.readers.file over the same files; train:
                     decoders.image_random_crop + resize(224x224) + flip(coin_flip); val:
                     decoders.image + resize(resize_shorter=256) + crop(224); outputs copied
                     to numpy (TensorListCPU.as_array)
  ffcv-1t            $BENCH_VENVS/ffcv, FFCV Loader, num_workers=1, batch --batch, sequential, over
                     the same images' records in DIR.beton (made by `ffcv_loader.py --prepare`:
                     re-encoded by Pillow at quality 90, so not byte-identical to the files);
                     train: RandomResizedCropRGBImageDecoder((224, 224)) + RandomHorizontalFlip;
                     val: CenterCropRGBImageDecoder((224, 224), ratio=224/256)
  native             .venv, fastload._jpeg.decode_crop_resize(data, g.box, out, 224, 224, g.flip,
                     BILINEAR, g.clip) with g from fastload.transforms' plan (ROI + DCT-scaled decode)
  entropy-floor      .venv, fastload._jpeg.entropy_decode_only: Huffman decoding of the whole image

The geometry of the Pillow and native methods (one draw per image, seed --seed) comes from
fastload.transforms.compile_transforms(...).sample(h, w, rng); DALI and FFCV draw their own. JPEG
bytes are in memory for the Python-level methods; DALI reads the (page-cached) files; FFCV reads
its .beton through the OS cache. Each worker does --warmup untimed passes (FFCV's numba JIT,
DALI's first allocations), then methods take turns, one pass each per round, order rotating; the
table shows the median images/s over --rounds passes, and ratios against ffcv-1t and the floor.

Paths come from flags or the environment: --data DIR (default $BENCH_DATA), an ImageNet-layout
folder (tools/bench/make_bench_dataset.py makes one); the peer venvs are those tools/bench/bench_env.sh made
under $BENCH_VENVS (needed only when a method runs in one).

    .venv/bin/python tools/bench/bench_decode_peers.py [--data DIR] [--images 512] [--rounds 5]
        [--pipelines train,val]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
VENVS = Path(os.environ["BENCH_VENVS"]) if os.environ.get("BENCH_VENVS") else None
MAIN_PYTHON = REPO / ".venv" / "bin" / "python"
SIZE = 224


def venv_python(name: str) -> Path | None:
    """The python of the peer venv `name` under $BENCH_VENVS; None while BENCH_VENVS is unset."""
    return None if VENVS is None else VENVS / name / "bin" / "python"


# method -> python that runs its worker (None: a peer venv's, and BENCH_VENVS is unset)
METHODS: dict[str, Path | None] = {
    "pillow-full": MAIN_PYTHON,
    "pillow-draft": MAIN_PYTHON,
    "pillow-simd-full": venv_python("simd"),
    "pillow-simd-draft": venv_python("simd"),
    "dali-1t": venv_python("dali"),
    "ffcv-1t": venv_python("ffcv"),
    "native": MAIN_PYTHON,
    "entropy-floor": MAIN_PYTHON,
}


# ----------------------------------------------------------------------------- orchestrator


def image_folder_files(root: Path) -> list[Path]:
    """DIR/<class>/<file> in the order ffcv_loader.py writes the .beton (classes sorted, files
    sorted), so position i here is record i there."""
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    return [p for c in classes for p in sorted(c.iterdir()) if p.is_file()]


def make_jobs(files: list[Path], pipeline: str, seed: int) -> list[dict[str, Any]]:
    import numpy as np

    from fastload import _jpeg
    from fastload import transforms as T

    chain = (
        [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]
        if pipeline == "train"
        else [T.Resize(256), T.CenterCrop(SIZE)]
    )
    plan = T.compile_transforms(chain)
    rng = np.random.default_rng(seed)
    jobs = []
    for path in files:
        width, height = _jpeg.jpeg_size(path.read_bytes())
        g = plan.sample(height, width, rng)
        assert (g.out_height, g.out_width) == (SIZE, SIZE)
        jobs.append({"path": str(path), "box": g.box, "clip": g.clip, "flip": g.flip})
    return jobs


class Worker:
    def __init__(self, method: str, spec: Path, cpu: int) -> None:
        self.method = method
        argv = [str(METHODS[method]), str(Path(__file__).resolve()), "--worker", method,
                "--spec", str(spec), "--cpu", str(cpu)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready: dict[str, Any] | None = None

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.method}: worker exited (rc={self.proc.wait()})")
        return json.loads(line)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def run_pipeline(pipeline: str, methods: list[str], args: argparse.Namespace, files: list[Path],
                 indices: list[int]) -> dict[str, Any]:
    jobs = make_jobs([files[i] for i in indices], pipeline, args.seed)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({
            "pipeline": pipeline, "jobs": jobs, "beton": str(args.data.with_name(args.data.name + ".beton")),
            "beton_indices": indices, "records": len(files), "batch": args.batch, "warmup": args.warmup,
        }, f)
        spec = Path(f.name)
    workers: list[Worker] = []
    passes: dict[str, list[float]] = {m: [] for m in methods}
    info: dict[str, Any] = {}
    try:
        # Start and warm the workers one at a time, so their warm-up passes don't overlap.
        for method in methods:
            w = Worker(method, spec, args.cpu)
            workers.append(w)
            w.ready = w.read()
            info[method] = w.ready
            print(f"# {pipeline} {method}: ready ({w.ready.get('version', '')})", file=sys.stderr, flush=True)
        for r in range(args.rounds):
            shift = r % len(workers)
            for w in workers[shift:] + workers[:shift]:
                w.send("pass")
                result = w.read()
                passes[w.method].append(result["images"] / result["seconds"])
            print(f"# {pipeline} round {r}: " + ", ".join(f"{m} {v[-1]:.0f}" for m, v in passes.items()),
                  file=sys.stderr, flush=True)
    finally:
        for w in workers:
            w.close()
        spec.unlink()
    return {"passes": passes, "info": info, "medians": {m: statistics.median(v) for m, v in passes.items()}}


def table(pipeline: str, result: dict[str, Any], images: int) -> str:
    med = result["medians"]
    ffcv = med.get("ffcv-1t")
    floor = med.get("entropy-floor")
    title = ("RandomResizedCrop(224) + flip" if pipeline == "train" else "Resize(256) + CenterCrop(224)")
    rounds = len(next(iter(result["passes"].values())))
    lines = [
        f"**{pipeline}: {title}**, {images} images, one core, median of {rounds} passes",
        "",
        "| method | version | images/s | ms/image | min–max images/s | vs ffcv-1t | vs floor |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for method, value in med.items():
        runs = result["passes"][method]
        version = result["info"][method].get("version", "")
        lines.append(
            f"| {method} | {version} | {value:.0f} | {1000 / value:.2f} | {min(runs):.0f}–{max(runs):.0f} | "
            + (f"{value / ffcv:.2f}x" if ffcv else "–") + " | "
            + (f"{value / floor:.2f}x" if floor else "–") + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=os.environ.get("BENCH_DATA") or None,
                    help="ImageNet-layout folder (default: $BENCH_DATA)")
    ap.add_argument("--images", type=int, default=512, help="images per pass (a multiple of --batch)")
    ap.add_argument("--batch", type=int, default=32, help="DALI/FFCV batch size")
    ap.add_argument("--rounds", type=int, default=5, help="timed passes per method")
    ap.add_argument("--warmup", type=int, default=2, help="untimed passes per worker before the rounds")
    ap.add_argument("--cpu", type=int, default=None, help="core to pin every worker to")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pipelines", default="train,val")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"from: {', '.join(METHODS)}")
    ap.add_argument("--json", type=Path, help="write every pass here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker, args.spec, args.cpu)
        return
    if args.images % args.batch:
        ap.error("--images must be a multiple of --batch")
    if args.data is None:
        ap.error("no data: pass --data DIR or set BENCH_DATA (tools/bench/make_bench_dataset.py makes one)")
    args.data = args.data.resolve()
    if args.cpu is None:
        args.cpu = min(os.sched_getaffinity(0))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    peers = [m for m in methods if m in METHODS and METHODS[m] is None]
    if peers:
        ap.error(
            f"{peers} run in the peer venvs: set BENCH_VENVS to where tools/bench/bench_env.sh made them"
        )
    missing = [str(p) for m in methods if m in METHODS and (p := METHODS[m]) is not None and not p.exists()]
    if unknown or missing:
        ap.error(
            f"unknown methods {unknown}, missing pythons {missing} (tools/bench/bench_env.sh makes them)"
        )
    files = image_folder_files(args.data)
    if len(files) < args.images:
        ap.error(f"only {len(files)} images under {args.data}")
    indices = [i * len(files) // args.images for i in range(args.images)]  # spread over the classes
    results = {}
    for pipeline in [p.strip() for p in args.pipelines.split(",") if p.strip()]:
        results[pipeline] = run_pipeline(pipeline, methods, args, files, indices)
        print(table(pipeline, results[pipeline], args.images) + "\n", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": {k: str(v) for k, v in vars(args).items()},
                                         "loadavg": os.getloadavg(), "results": results}, indent=2) + "\n")


# ----------------------------------------------------------------------------- workers


def pillow_methods(method: str, spec: dict[str, Any]):
    import numpy as np
    import PIL
    from PIL import Image

    bilinear = Image.Resampling.BILINEAR
    blobs = [Path(j["path"]).read_bytes() for j in spec["jobs"]]
    jobs = list(zip(blobs, spec["jobs"], strict=True))
    val = spec["pipeline"] == "val"
    out = np.empty((SIZE, SIZE, 3), np.uint8)

    def full(blob: bytes, job: dict[str, Any]) -> None:
        with Image.open(io.BytesIO(blob)) as img:
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            if val:  # torchvision Resize(256) + CenterCrop(224)
                w, h = rgb.size
                nw, nh = (256, int(256 * h / w)) if w <= h else (int(256 * w / h), 256)
                res = rgb.resize((nw, nh), bilinear)
                left, top = int(round((nw - SIZE) / 2)), int(round((nh - SIZE) / 2))
                res = res.crop((left, top, left + SIZE, top + SIZE))
            else:  # torchvision resized_crop: crop, then resize
                box = tuple(round(v) for v in job["box"])
                res = rgb.crop(box).resize((SIZE, SIZE), bilinear)
        if job["flip"]:
            res = res.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out[...] = np.asarray(res)

    def draft(blob: bytes, job: dict[str, Any]) -> None:  # fastload/_loading/decoding/pil.py's decode_into
        with Image.open(io.BytesIO(blob)) as img:
            width, height = img.size
            left, top, right, bottom = job["box"]
            clip = job["clip"] or (0.0, 0.0, float(width), float(height))
            wanted = (math.ceil(width * SIZE / (right - left)), math.ceil(height * SIZE / (bottom - top)))
            img.draft("RGB", wanted)
            sx, sy = img.size[0] / width, img.size[1] / height
            left, top, right, bottom = left * sx, top * sy, right * sx, bottom * sy
            clip = (clip[0] * sx, clip[1] * sy, clip[2] * sx, clip[3] * sy)
            x0, y0 = max(0, math.floor(clip[0] + 1e-6)), max(0, math.floor(clip[1] + 1e-6))
            x1, y1 = min(img.size[0], math.ceil(clip[2] - 1e-6)), min(img.size[1], math.ceil(clip[3] - 1e-6))
            src = img
            if (x0, y0, x1, y1) != (0, 0, *img.size):
                src = img.crop((x0, y0, x1, y1))
                left, top, right, bottom = left - x0, top - y0, right - x0, bottom - y0
            rgb = src if src.mode == "RGB" else src.convert("RGB")
            res = rgb.resize((SIZE, SIZE), bilinear, box=(left, top, right, bottom))
        if job["flip"]:
            res = res.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out[...] = np.asarray(res)

    fn = draft if method.endswith("draft") else full

    def one_pass() -> int:
        for blob, job in jobs:
            fn(blob, job)
        return len(jobs)

    from PIL import features

    return one_pass, f"Pillow {PIL.__version__}, libjpeg-turbo {features.version('libjpeg_turbo')}"


def native_methods(method: str, spec: dict[str, Any]):
    import numpy as np

    from fastload import _jpeg

    jobs = [(Path(j["path"]).read_bytes(), tuple(j["box"]), bool(j["flip"]),
             None if j["clip"] is None else tuple(j["clip"])) for j in spec["jobs"]]
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    decode, floor, bilinear = _jpeg.decode_crop_resize, _jpeg.entropy_decode_only, _jpeg.BILINEAR

    def native() -> int:
        for blob, box, flip, clip in jobs:
            decode(blob, box, out, SIZE, SIZE, flip, bilinear, clip)
        return len(jobs)

    def entropy() -> int:
        for blob, _, _, _ in jobs:
            floor(blob)
        return len(jobs)

    return (native if method == "native" else entropy), "fastload._jpeg"


def dali_method(method: str, spec: dict[str, Any]):
    import nvidia.dali as dali
    from nvidia.dali import fn, pipeline_def, types

    files = [j["path"] for j in spec["jobs"]]
    batch = spec["batch"]
    val = spec["pipeline"] == "val"

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, exec_async=False, exec_pipelined=False,
                  seed=0)
    def pipe():
        jpegs, _ = fn.readers.file(files=files, random_shuffle=False, name="reader")
        if val:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256)
            images = fn.crop(images, crop=(SIZE, SIZE))
        else:
            images = fn.decoders.image_random_crop(
                jpegs, device="cpu", output_type=types.RGB,
                random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
            )
            images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
            images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images

    p = pipe()
    p.build()  # not timed
    runs = len(files) // batch

    def one_pass() -> int:
        n = 0
        for _ in range(runs):
            (images,) = p.run()
            n += len(images.as_array())
        return n

    return one_pass, f"DALI {dali.__version__}"


def ffcv_method(method: str, spec: dict[str, Any]):
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.reader import Reader
    from ffcv.transforms import RandomHorizontalFlip

    records = Reader(spec["beton"]).num_samples
    if records != spec["records"]:
        raise SystemExit(f"{spec['beton']} has {records} records, the folder {spec['records']}: remake it "
                         "(tools/bench/bench_systems/ffcv_loader.py --prepare)")
    if spec["pipeline"] == "val":
        image = [CenterCropRGBImageDecoder((SIZE, SIZE), ratio=SIZE / 256)]
    else:
        image = [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip()]
    loader = Loader(spec["beton"], batch_size=spec["batch"], num_workers=1, order=OrderOption.SEQUENTIAL,
                    indices=spec["beton_indices"], drop_last=False, os_cache=True,
                    pipelines={"image": image, "label": None})

    def one_pass() -> int:
        n = 0
        for (images,) in loader:
            n += len(images)
        return n

    return one_pass, f"FFCV {importlib.metadata.version('ffcv')}"


def worker_main(method: str, spec_path: Path, cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})  # before any library starts threads: they inherit it
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # libraries' prints go to stderr, the protocol stays clean
    spec = json.loads(spec_path.read_text())
    if method.startswith("pillow"):
        one_pass, version = pillow_methods(method, spec)
    elif method in ("native", "entropy-floor"):
        one_pass, version = native_methods(method, spec)
    elif method == "dali-1t":
        one_pass, version = dali_method(method, spec)
    elif method == "ffcv-1t":
        one_pass, version = ffcv_method(method, spec)
    else:
        raise SystemExit(f"unknown method {method}")
    expected = len(spec["jobs"])
    for _ in range(spec["warmup"]):
        n = one_pass()
        if n != expected:
            raise SystemExit(f"{method}: a pass gave {n} images, expected {expected}")

    def say(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    say({"ready": True, "version": version, "cpus": sorted(os.sched_getaffinity(0))})
    for line in sys.stdin:
        if line.strip() != "pass":
            break
        t0 = time.perf_counter()
        n = one_pass()
        say({"images": n, "seconds": time.perf_counter() - t0})


if __name__ == "__main__":
    main()
