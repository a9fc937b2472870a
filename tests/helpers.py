"""Helpers shared by the tests: photo-like images and folders, segments and processes.

Images come from `fastload._demo.photo_like`, the one photo-like generator (the demo's).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fastload._demo import photo_like

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is in the `test` extra; /proc is the fallback
    psutil = None

SHM_DIR = "/dev/shm"


def torchvision_or_skip() -> types.ModuleType:
    """torchvision, the reference the transform tests compare against (a test-only package: the
    test command installs it without its dependencies); the test is skipped, saying why, without it.

    Where no torchvision build matches this torch (a CPU torch, PyTorch's CPU index unreachable),
    tools/_venv.sh keeps the nearest build in `.venv/test-reference`, off the venv's own path
    (NOTE [test references outside the venv]); it is put on the tests' path here, with timm. That
    CUDA build cannot load its compiled operators (nms, roi_align: nothing the transforms use) and
    its import fails registering their meta kernels; its transforms are plain torch code, so they
    are imported without those.
    """
    import pytest

    reference = Path(sys.prefix) / "test-reference"
    try:
        import torchvision
    except ImportError:
        if not (reference / "torchvision").is_dir() or str(reference) in sys.path:
            pytest.skip("torchvision is not installed (a test-only reference: tools/_venv.sh installs it)")
        sys.path.append(str(reference))
        return torchvision_or_skip()
    except RuntimeError as e:  # its compiled operators do not match this torch build
        if "torchvision::" not in str(e):
            raise
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")
        import torchvision
    return torchvision

# Processes and segments


def fastload_segments(pid: int | None = None) -> set[str]:
    """Names of fastload segments in /dev/shm, all of them or those owned by `pid`."""
    prefix = "fastload_" if pid is None else f"fastload_{pid}_"
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(prefix)}
    except FileNotFoundError:
        return set()


def segment_owner(name: str) -> int:
    """The owner pid in a segment name `fastload_<pid>_<hex>` (-1 if it has none)."""
    try:
        return int(name.split("_")[1])
    except (IndexError, ValueError):
        return -1


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    if psutil is not None:
        try:
            return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def live_children() -> dict[int, str]:
    """Live (non-zombie) descendants of this process: pid -> name."""
    me = os.getpid()
    if psutil is not None:
        found: dict[int, str] = {}
        for child in psutil.Process(me).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() != psutil.STATUS_ZOMBIE:
                    found[child.pid] = child.name()
        return found
    parents: dict[int, tuple[int, str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        state, ppid = text.rsplit(")", 1)[1].split()[:2]
        parents[int(entry)] = (int(ppid), state, name)
    found, frontier = {}, {me}
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in parents.items() if ppid in frontier}
        found.update({pid: parents[pid][2] for pid in frontier if parents[pid][1] != "Z"})
    return found


def child_pids(parent: int) -> list[int]:
    """Live (non-zombie) children of `parent`: a loader's workers, or a daemon's (not the fork
    server a daemon opens sources from, nor its resource tracker)."""
    pids = []
    for child in psutil.Process(parent).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            command = " ".join(child.cmdline())
            helper = "multiprocessing.forkserver" in command or "multiprocessing.resource_tracker" in command
            if child.status() != psutil.STATUS_ZOMBIE and not helper:
                pids.append(child.pid)
    return pids


class Killer(threading.Thread):
    """Sends `signum` to a random child of `parent` every ~`every_s` seconds until stopped
    (fault injection: what the OOM killer or an operator does to worker processes).

    At a fixed rate alone, kills can outpace the work on a machine so busy that a replacement
    worker takes longer than `every_s` to start and load a batch: every replacement is killed
    before it does anything, and the epoch never ends. So either give `progress` (a count of
    batches the test has received so far: a kill then also waits until a batch came since the
    previous one), or `max_kills` (it stops after that many, and the epoch then ends).
    """

    def __init__(
        self,
        parent: int,
        every_s: float,
        signum: int = signal.SIGKILL,
        seed: int = 0,
        progress: Callable[[], int] | None = None,
        max_kills: int | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.parent, self.every_s, self.signum = parent, every_s, signum
        self.rng = random.Random(seed)
        self.progress = progress
        self.max_kills = max_kills
        self.sent: list[int] = []
        self._halt = threading.Event()

    def run(self) -> None:
        last = self.progress() if self.progress is not None else 0
        while not self._halt.wait(self.rng.uniform(0.5, 1.5) * self.every_s):
            if self.max_kills is not None and len(self.sent) >= self.max_kills:
                return
            if self.progress is not None:
                now = self.progress()
                if now == last:
                    continue  # no batch since the last kill: let the replacement work first
                last = now
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                pids = child_pids(self.parent)
                if pids:
                    pid = self.rng.choice(pids)
                    os.kill(pid, self.signum)
                    self.sent.append(pid)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def wait_children_gone(ignore: set[int], grace_s: float) -> dict[int, str]:
    """Wait up to `grace_s` for our descendants (except `ignore`) to exit; return those left."""
    deadline = time.monotonic() + grace_s
    while True:
        left = {pid: name for pid, name in live_children().items() if pid not in ignore}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def segfault_self() -> None:
    """Die of SIGSEGV, as a crashing decoder does, without the stack dump pytest's faulthandler
    (inherited by a forked worker) would print: a passing run must not print "Fatal Python error"."""
    import faulthandler

    faulthandler.disable()
    os.kill(os.getpid(), signal.SIGSEGV)


def segfault_at(bad: int) -> Callable[[int], None]:
    """A per-sample hook that crashes its process (`segfault_self`) at sample `bad`."""

    def hook(i: int) -> None:
        if i == bad:
            segfault_self()

    return hook


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `condition` until it holds or `timeout_s` passes; return its last value."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return condition()
        time.sleep(0.02)
    return True


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILL each pid (and reap it when it is our child)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def engine_socket_dirs(pid: int | None = None) -> set[str]:
    """Engine socket directories (`fastload-engine-PID-*`) of `pid`, or of every process."""
    import tempfile

    prefix = "fastload-engine-" if pid is None else f"fastload-engine-{pid}-"
    bases = {tempfile.gettempdir()}
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        bases.add(xdg)
    found = set()
    for base in bases:
        with contextlib.suppress(OSError):
            found |= {os.path.join(base, n) for n in os.listdir(base) if n.startswith(prefix)}
    return found


def unlink_segments(names: Iterable[str]) -> None:
    """Remove segment files by name; missing ones are fine."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))


# Images


def write_image(path: Path, height: int, width: int, *, seed: int, mode: str = "RGB") -> Path:
    """Write a photo-like image; the format follows the suffix (JPEG unless .png)."""
    img = photo_like(np.random.default_rng(seed), width, height)
    if mode != "RGB":
        img = img.convert(mode)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".png":
        img.save(path, format="PNG")
    else:
        img.save(path, format="JPEG", quality=90)
    return path


def undefined_huffman_table(jpeg: bytes) -> bytes:
    """The JPEG with its first scan naming Huffman tables that are never defined: its headers
    read, it ends in an end-of-image marker, and every decoder refuses it only when decoding
    ("Huffman table 0x03 was not defined"): damage that no look at the bytes finds first."""
    sos = jpeg.index(b"\xff\xda")
    return jpeg[: sos + 6] + b"\x33" + jpeg[sos + 7 :]  # FFDA, length, Ns, Cs1, then Td1|Ta1


# (height, width): landscape, portrait, wide, square, tall
SIZES = ((96, 128), (128, 96), (64, 160), (120, 120), (160, 100), (100, 150))


def build_folder(root: Path, classes: int = 3, per_class: int = 8, seed: int = 0) -> Path:
    """An ImageNet-layout folder: `classes` folders of `per_class` images of mixed sizes.

    Every fourth image is a grayscale ('L') JPEG, every third JPEG has the ImageNet `.JPEG`
    suffix, and the second image of the second class is a PNG.
    """
    k = 0
    for c in range(classes):
        for i in range(per_class):
            height, width = SIZES[k % len(SIZES)]
            if c == 1 and i == 1:
                name = f"img_{i:03d}.png"
            else:
                name = f"img_{i:03d}.JPEG" if k % 3 == 0 else f"img_{i:03d}.jpg"
            mode = "L" if k % 4 == 3 else "RGB"
            write_image(root / f"n{c:02d}" / name, height, width, seed=seed * 1000 + k, mode=mode)
            k += 1
    return root


def write_gpu_folder(root: Path, classes: int, seed: int) -> Path:
    """`classes` class folders of 24 smooth JPEGs each, 160..183 x 120 pixels, drawn from `seed`
    (the GPU tests' folders)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"c{c}").mkdir()
        for i in range(24):
            base = rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((160 + i, 120), Image.Resampling.BICUBIC)
            img.save(root / f"c{c}" / f"{i}.jpg", quality=90)
    return root


def write_tar_shards(
    folder: Path,
    directory: Path,
    per_shard: int,
    *,
    label_as: str | None = "cls",
    prefix: str = "train",
    extra: Callable[[int], list[tuple[str, bytes]]] | None = None,
    drop: tuple[tuple[int, str], ...] = (),
) -> list[Path]:
    """WebDataset shards of an image folder, in the folder's index order (sample i is key
    `s{i:05d}`, so shard indices equal folder indices), `per_shard` samples a shard, each image
    followed by its label as `.cls` text or `.json` {"label": ...} (`label_as`; None: no label),
    then `extra(i)`'s (suffix, bytes) members; (i, suffix) in `drop` leaves that member out."""
    import io
    import json
    import tarfile

    from fastload.sources import ImageFolder

    index = ImageFolder(str(folder)).open()
    directory.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, first in enumerate(range(0, len(index), per_shard)):
        shard = directory / f"{prefix}-{number:06d}.tar"
        with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(first, min(len(index), first + per_shard)):
                path = Path(index.path(i))
                label = int(index.labels[i])
                text = json.dumps({"label": label}) if label_as == "json" else str(label)
                members = [(path.suffix.lower(), path.read_bytes())]
                members += [(f".{label_as}", text.encode())] if label_as is not None else []
                members += extra(i) if extra is not None else []
                for suffix, payload in members:
                    if (i, suffix) in drop:
                        continue
                    info = tarfile.TarInfo(f"s{i:05d}{suffix}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        shards.append(shard)
    return shards


def epoch_with_ids(dataset: object, num_workers: int, seed: int) -> list[tuple[Any, Any, Any]]:
    """One shuffled epoch of a source (batches of 5, RandomResizedCrop(32) + flip, on the CPU) as
    (images, labels, SampleIds), the tensors cloned."""
    from fastload import FastLoader
    from fastload import transforms as T

    augment = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]
    with FastLoader(
        dataset, batch_size=5, shuffle=True, num_workers=num_workers, transform=augment, seed=seed,
        device="cpu", sample_ids=True,
    ) as loader:  # fmt: skip
        return [(images.clone(), labels.clone(), ids) for images, labels, ids in loader]


def resumed_tail(
    source: object, options: dict[str, Any], copy: Callable[[Any], Any], taken: int = 2
) -> list[Any]:
    """The rest of an epoch after `taken` batches: a state saved by a 2-worker loader, restored
    into a 1-worker one made with another seed (the state's wins); each batch through `copy`."""
    from fastload import FastLoader

    with FastLoader(source, num_workers=2, seed=7, **options) as saver:
        it = iter(saver)
        for _ in range(taken):
            next(it)
        state = saver.state_dict()
    with FastLoader(source, num_workers=1, seed=1, **options) as restored:
        restored.load_state_dict(state)
        return [copy(batch) for batch in restored]


def epoch_outcomes(loader: Iterable[Any]) -> list[Any]:
    """One epoch like a tolerant training loop, in order: each batch's tensors (copied: a slot is
    reused once its batch is dropped), or the `SampleError` that batch raised."""
    from fastload import SampleError

    outcomes: list[Any] = []
    it = iter(loader)
    while True:
        try:
            outcomes.append([t.clone() for t in next(it)])
        except StopIteration:
            return outcomes
        except SampleError as e:
            outcomes.append(e)


def split_outcomes(outcomes: list[Any]) -> tuple[list[Any], list[Any]]:
    """(the batches, the SampleErrors) of `epoch_outcomes`."""
    from fastload import SampleError

    errors = [o for o in outcomes if isinstance(o, SampleError)]
    return [o for o in outcomes if not isinstance(o, SampleError)], errors


def loader_series(stats: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A loader's Prometheus series as a scrape reads them, labelled rank 0, loader 0:
    (name, sorted labels) -> value. Skips the test without prometheus-client."""
    import pytest

    prometheus_client = pytest.importorskip("prometheus_client")
    parser = pytest.importorskip("prometheus_client.parser")
    from fastload._diagnostics.metrics.families import Families
    from fastload._diagnostics.metrics.loader_series import add_loader

    families = Families()
    add_loader(families, {"rank": "0", "loader": "0"}, stats, None)

    class Scrape:
        def collect(self) -> Any:
            return iter(families)

    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(Scrape())
    text = prometheus_client.generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }
