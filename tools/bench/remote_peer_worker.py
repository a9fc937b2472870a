"""One system's side of tools/bench/bench_remote_peers.py, run by that system's python.

Standard library at the top, so every venv can run it (and the driver can import its helpers);
each system's own imports happen inside its functions. Subcommands:

  prepare-mds DATA OUT            MosaicML Streaming's MDSWriter: columns image (`bytes`: the JPEG
                                  file's bytes, unchanged) + label (`int`), default shard size
  prepare-wds DATA OUT --shards N webdataset's ShardWriter: NAME.jpg (the file's bytes) + NAME.cls,
                                  N tar shards of equal sample count
  run SYSTEM ...                  time --epochs epochs of SYSTEM (fastload, streaming, webdataset)
                                  reading from --url; one JSON line on stdout

Both writers take the images in one seeded shuffled order (what a dataset's shards are written
in, so that a reader's shard shuffle plus a buffer mixes classes); labels are the index of the
class folder among the sorted class folders, as `fastload pack` gives them.

The timed epoch runs from the first `iter()` on the loader to the last batch's arrival (so a cold
epoch includes the wait for its first batch, which is also reported). Every batch is checked:
uint8 images of 3x224x224 each, labels in [0, classes); the epoch's image count against the
dataset's. CPU seconds are the loader's process tree's (this process, its workers, their curl
children) and the store's (--store-pids: the S3 server and the latency proxy) over the epoch.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import resource
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SIZE = 224
ORDER_SEED = 0


def list_images(data: Path) -> tuple[list[tuple[Path, int]], int]:
    """(path, label) of every image under the class folders of `data`, in the writers' seeded
    shuffled order; and the number of classes."""
    classes = sorted(p.name for p in data.iterdir() if p.is_dir())
    items = [(f, label) for label, name in enumerate(classes) for f in sorted((data / name).iterdir())
             if f.is_file()]
    random.Random(ORDER_SEED).shuffle(items)
    return items, len(classes)


def _ticks(pid: int) -> int:
    """CPU clock ticks of a live process and of its children it has reaped (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime


def _descendants(pid: int) -> list[int]:
    """The live processes below `pid`."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process, its reaped children (and theirs) and its live
    descendants (with what they have reaped)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    return done + sum(_ticks(p) for p in _descendants(os.getpid())) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds used so far by these processes and their live descendants."""
    pids = list(pids)
    every = pids + [d for p in pids for d in _descendants(p)]
    return sum(_ticks(p) for p in every) / os.sysconf("SC_CLK_TCK")


def _streaming() -> Any:
    """The `streaming` package. Its __init__ imports streaming.vision, which imports torchvision
    for its vision dataset classes (unused here); no torchvision wheel on PyPI loads on torch
    2.13.0+cpu (see _pil_recipe), so where it does not import, the three names streaming.vision
    takes from it are stood in by empty ones first."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):
        import importlib.machinery
        import types

        for name in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                     "torchvision.transforms.functional"):
            sys.modules[name] = types.ModuleType(name)
            sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
        sys.modules["torchvision.datasets"].CIFAR10 = None  # type: ignore[attr-defined]
        sys.modules["torchvision.transforms.functional"].to_tensor = None  # type: ignore[attr-defined]
    import streaming

    return streaming


def prepare_mds(data: Path, out: Path) -> None:
    MDSWriter = _streaming().MDSWriter

    items, _ = list_images(data)
    with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"}) as writer:
        for path, label in items:
            writer.write({"image": path.read_bytes(), "label": label})


def prepare_wds(data: Path, out: Path, shards: int) -> None:
    import webdataset as wds

    items, _ = list_images(data)
    out.mkdir(parents=True, exist_ok=True)
    per_shard = math.ceil(len(items) / shards)
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=per_shard, maxsize=1 << 40, verbose=0) as sink:
        for index, (path, label) in enumerate(items):
            sink.write({"__key__": f"{index:08d}", "jpg": path.read_bytes(), "cls": str(label).encode()})


def _pil_recipe(image: Any) -> Any:
    """torchvision's RandomResizedCrop(224) + RandomHorizontalFlip + PILToTensor on a PIL image,
    written out: no torchvision wheel on PyPI runs on torch 2.13.0+cpu (its C extension wants
    libc10_cuda), and these three are Python over PIL in torchvision too. The crop's draw is
    torchvision's get_params (scale (0.08, 1), ratio (3/4, 4/3), 10 tries, then the centre crop
    of the clamped ratio), from torch's generator as there; crop then bilinear resize, as
    torchvision's resized_crop does for PIL; 3x224x224 uint8, as PILToTensor gives."""
    import numpy as np
    import torch
    from PIL import Image

    width, height = image.size
    area = width * height
    log_ratio = torch.log(torch.tensor((3 / 4, 4 / 3)))
    for _ in range(10):
        target = area * torch.empty(1).uniform_(0.08, 1.0).item()
        aspect = math.exp(torch.empty(1).uniform_(log_ratio[0].item(), log_ratio[1].item()).item())
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,)).item())
            left = int(torch.randint(0, width - w + 1, size=(1,)).item())
            break
    else:
        w, h = width, height
        if width / height < 3 / 4:
            h = int(round(width / (3 / 4)))
        elif width / height > 4 / 3:
            w = int(round(height * (4 / 3)))
        top, left = (height - h) // 2, (width - w) // 2
    image = image.crop((left, top, left + w, top + h)).resize((SIZE, SIZE), Image.BILINEAR)
    if torch.rand(1).item() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.as_tensor(np.array(image, copy=True)).permute(2, 0, 1)


def fastload_epochs(args: argparse.Namespace) -> tuple[Any, Any]:
    """FastLoader over the pack at --url, as tools/bench/bench_remote.py makes it."""
    from fastload import FastLoader
    from fastload import transforms as T
    from fastload.sources import Packed

    recipe = [T.RandomResizedCrop(SIZE), T.RandomHorizontalFlip()]
    loader = FastLoader(Packed(args.url, cache_limit=args.cache_limit), batch_size=args.batch_size,
                        num_workers=args.workers, transform=recipe, device="cpu", shuffle=True, seed=0,
                        shuffle_block=args.shuffle_block)

    def epoch(number: int) -> Any:
        loader.set_epoch(number)
        return loader

    return epoch, loader.close


def streaming_epochs(args: argparse.Namespace) -> tuple[Any, Any]:
    """StreamingDataset (remote --url, a fresh --local) decoding with PIL, in a torch DataLoader."""
    from PIL import Image
    from torch.utils.data import DataLoader

    StreamingDataset = _streaming().StreamingDataset
    class Images(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: int) -> tuple[Any, int]:
            sample = super().__getitem__(index)
            return _pil_recipe(Image.open(io.BytesIO(sample["image"])).convert("RGB")), sample["label"]

    dataset = Images(remote=args.url, local=args.local, shuffle=True, batch_size=args.batch_size)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=args.workers)
    return (lambda number: loader), (lambda: None)


def webdataset_epochs(args: argparse.Namespace) -> tuple[Any, Any]:
    """wds.WebDataset over the shard URLs (`pipe:curl ...`), batched in the workers."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    pipeline = (
        wds.WebDataset(args.url, shardshuffle=100, nodesplitter=wds.single_node_only)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "cls")
        .map_tuple(_pil_recipe, int)
        .batched(args.batch_size, partial=True)
    )
    loader = DataLoader(pipeline, batch_size=None, num_workers=args.workers)
    return (lambda number: loader), (lambda: None)


SYSTEMS = {"fastload": fastload_epochs, "streaming": streaming_epochs, "webdataset": webdataset_epochs}
# what each system imports, done before its setup is timed (so setup is the loader's construction)
IMPORTS = {"fastload": lambda: __import__("fastload.sources"), "streaming": lambda: _streaming(),
           "webdataset": lambda: __import__("webdataset")}


def timed_epoch(loader: Iterable[Any], classes: int, store: list[int]) -> dict[str, float]:
    """Images, seconds, first-batch seconds, and CPU seconds (the loader's tree's, the store's) of
    one pass over `loader`, every batch checked."""
    cpu, store_cpu = tree_cpu_seconds(), cpu_seconds(store)
    started = time.perf_counter()
    first, images = 0.0, 0
    for batch in loader:
        pictures, labels = batch[0], batch[1]
        if not first:
            first = time.perf_counter() - started
        if str(pictures.dtype) != "torch.uint8" or pictures.numel() != len(labels) * 3 * SIZE * SIZE:
            shape = f"{pictures.dtype} {tuple(pictures.shape)}"
            raise AssertionError(f"a batch of {shape} for {len(labels)} labels")
        if int(labels.min()) < 0 or int(labels.max()) >= classes:
            raise AssertionError(f"labels out of [0, {classes}): {labels.tolist()}")
        images += len(labels)
    seconds = time.perf_counter() - started
    return {"images": images, "seconds": seconds, "first_batch_seconds": first,
            "cpu_seconds": tree_cpu_seconds() - cpu, "store_cpu_seconds": cpu_seconds(store) - store_cpu}


def run(args: argparse.Namespace) -> None:
    __import__("torch.utils.data")
    IMPORTS[args.system]()
    started = time.perf_counter()
    epoch, close = SYSTEMS[args.system](args)
    setup = time.perf_counter() - started
    epochs = []
    try:
        for number in range(args.epochs):
            epochs.append(timed_epoch(epoch(number), args.classes, args.store_pids))
            if epochs[-1]["images"] != args.images:
                raise AssertionError(f"epoch {number}: {epochs[-1]['images']} images, not {args.images}")
    finally:
        close()
    print(json.dumps({"system": args.system, "setup_seconds": setup, "epochs": epochs}), flush=True)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    commands = parser.add_subparsers(dest="command", required=True)
    mds = commands.add_parser("prepare-mds")
    wds = commands.add_parser("prepare-wds")
    for command in (mds, wds):
        command.add_argument("data", type=Path)
        command.add_argument("out", type=Path)
    wds.add_argument("--shards", type=int, required=True)
    timed = commands.add_parser("run")
    timed.add_argument("system", choices=sorted(SYSTEMS))
    timed.add_argument("--url", required=True, help="the pack, the MDS folder, or the shards' URLs")
    timed.add_argument("--local", help="streaming: its local cache folder (fresh for a cold run)")
    timed.add_argument("--cache-limit", type=int, help="fastload: the node cache's limit in bytes")
    timed.add_argument("--shuffle-block", type=int, help="fastload: a block shuffle's run (default: full)")
    timed.add_argument("--images", type=int, required=True, help="the dataset's size (checked per epoch)")
    timed.add_argument("--classes", type=int, required=True)
    timed.add_argument("--workers", type=int, default=2)
    timed.add_argument("--batch-size", type=int, default=64)
    timed.add_argument("--epochs", type=int, default=2)
    timed.add_argument("--store-pids", type=lambda s: [int(p) for p in s.split(",") if p], default=[])
    args = parser.parse_args()
    if args.command == "prepare-mds":
        prepare_mds(args.data, args.out)
    elif args.command == "prepare-wds":
        prepare_wds(args.data, args.out, args.shards)
    else:
        run(args)


if __name__ == "__main__":
    sys.exit(main())
