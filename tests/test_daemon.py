"""The loader daemon's behaviour, seen from trainers attached to a `fastload serve` subprocess.

Protects the daemon-mode contract: a trainer attached to a daemon gets the same batches, bit for
bit, as the same loader in local mode; ranks get DistributedSampler's disjoint, equal shards
(from arguments or RANK/WORLD_SIZE); trainers attached at once are served by their shares
(test_daemon_shares.py), so none waits for another's whole epoch; a session over the memory
budget is refused saying how much it needs and how much is left; `fastload status` lists
sessions and fails without a daemon; a loader with no daemon to talk to fails at once, saying to
run `fastload serve`; and a second daemon on the same socket directory refuses to start.

The tests wait for events (a reply, a queue length, a worker reaching a task), never for a time:
their bounds are hang guards, so a machine busy with other work only makes them slower.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from daemon_helpers import (
    AUGMENT,
    RESIZE,
    Batches,
    DaemonPool,
    DaemonProcess,
    assert_same_batches,
    local_epoch,
    refused_serve,
    serve_command,
    take,
)
from helpers import wait_until, write_tar_shards

from fastload import ConfigError, DaemonError, FastLoader
from fastload import transforms as T
from fastload.__main__ import main
from fastload._loading.slots.ring_plan import EXTRA_SLOTS, default_in_flight
from fastload._sizes import format_size
from fastload.sources import HDF5, FileList, Source, TarShards, pack
from fastload.sources._formats.folder import scan_image_folder

pytestmark = pytest.mark.timeout(180)  # a regression here tends to be a hang
HANG_S = 60.0  # how long a test waits for something that comes in well under a second

def sample_ids(folder: Path) -> dict[bytes, int]:
    """Sample index by its resized pixels: tells which samples a shard's batches hold."""
    images, _ = local_epoch(folder, batch_size=1000, transform=RESIZE)[0]
    ids = {images[i].numpy().tobytes(): i for i in range(len(images))}
    assert len(ids) == len(images), "two samples have the same pixels: the test cannot tell them apart"
    return ids


def ids_of(batches: Batches, ids: dict[bytes, int]) -> list[int]:
    return [ids[image.numpy().tobytes()] for images, _ in batches for image in images]


# ---------------------------------------------------------------------------------------------
# Same batches as local mode


def test_daemon_batches_equal_local_batches_over_two_epochs(
    shared_daemon: DaemonProcess, image_folder: Path
) -> None:
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 1234, "transform": AUGMENT}
    with (
        FastLoader(image_folder, num_workers=0, device="cpu", **kwargs) as local,
        FastLoader(
            image_folder, num_workers=2, device="cpu", daemon=shared_daemon.address, **kwargs
        ) as attached,
    ):
        assert attached.classes == local.classes
        assert attached.class_to_idx == local.class_to_idx  # from the welcome's classes
        with pytest.raises(ConfigError, match="which a daemon holds"):
            attached.targets  # noqa: B018  local only: the index lives in the daemon
        assert len(attached) == len(local) == 5
        epochs = []
        for epoch in (1, 0):  # set_epoch, out of order: batches depend on (seed, epoch) only
            local.set_epoch(epoch)
            attached.set_epoch(epoch)
            got = take(attached)
            assert_same_batches(got, take(local))
            assert [len(b[1]) for b in got] == [5, 5, 5, 5, 4]
            epochs.append(got)
    assert not torch.equal(epochs[0][0][0], epochs[1][0][0]), "epochs 0 and 1 gave the same batch"


def test_a_daemon_serves_a_file_list_as_a_local_loader_reads_it(
    shared_daemon: DaemonProcess, image_folder: Path, tmp_path: Path
) -> None:
    # Another source than a folder: the hello describes it, the daemon indexes it once and its
    # workers attach the index; multi-hot targets (float32 rows) travel in the slots too.
    index = scan_image_folder(image_folder)
    listing = tmp_path / "tags.csv"
    listing.write_text("".join(f"{index.path(i)},{index.labels[i]};{(i % 3)}\n" for i in range(len(index))))
    source = FileList(str(listing), multi_label=True, num_classes=3)
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 99, "transform": AUGMENT}
    with (
        FastLoader(source, num_workers=0, device="cpu", sample_ids=True, **kwargs) as local,
        FastLoader(source, num_workers=1, device="cpu", daemon=shared_daemon.address, sample_ids=True,
                   **kwargs) as attached,
    ):
        assert len(attached) == len(local) == 5
        for (xa, ya, ia), (xb, yb, ib) in zip(attached, local, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb) and torch.equal(ia.indices, ib.indices)
            assert ya.dtype == torch.float32 and ya.shape[1] == 3
            assert ia.names is None and ib.names is not None  # a daemon's trainer holds no index
    listed = [row["path"] for row in shared_daemon.status()["datasets"]]
    assert any(str(listing) in path for path in listed)


@pytest.mark.parametrize("kind", ["packed", "tar", "hdf5"])
def test_a_daemon_serves_packed_files_tar_shards_and_hdf5(
    shared_daemon: DaemonProcess,
    image_folder: Path,
    tmp_path: Path,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Sources read from large files: the workers attach their index from shared memory and open
    # the files themselves; given relative paths, the daemon (another working directory) is sent
    # them absolute.
    monkeypatch.chdir(tmp_path)
    source: Source
    if kind == "packed":
        source = pack(image_folder, "packed", progress=False)
    elif kind == "tar":
        write_tar_shards(image_folder, tmp_path / "shards", per_shard=7)
        source = TarShards("shards/train-{000000..000003}.tar")
    else:
        index = scan_image_folder(image_folder)
        with h5py.File("images.h5", "w") as f:
            data = f.create_dataset("images", (len(index),), dtype=h5py.vlen_dtype(np.uint8))
            for i in range(len(index)):
                data[i] = np.frombuffer(Path(index.path(i)).read_bytes(), np.uint8)
            f.create_dataset("labels", data=index.labels)
            f.create_dataset("rows", data=np.zeros((len(index), 4), np.float32))
        source = HDF5("images.h5")
        with pytest.raises(DaemonError, match="holds arrays"):
            arrays = HDF5("images.h5", data="rows")
            FastLoader(arrays, batch_size=4, transform=RESIZE, daemon=shared_daemon.address)
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 5, "transform": AUGMENT}
    with (
        FastLoader(source, num_workers=0, device="cpu", **kwargs) as local,
        FastLoader(source, num_workers=1, device="cpu", daemon=shared_daemon.address, **kwargs) as attached,
    ):
        assert_same_batches(take(attached), take(local))


# ---------------------------------------------------------------------------------------------
# Rank sharding


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_get_disjoint_equal_shards_covering_the_epoch(
    shared_daemon: DaemonProcess, image_folder: Path, world_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = sample_ids(image_folder)
    kwargs: dict[str, Any] = {
        "batch_size": 4, "shuffle": True, "drop_last": True, "seed": 5, "transform": RESIZE, "device": "cpu",
    }
    shards: list[list[int]] = []
    for rank in range(world_size):
        with FastLoader(
            image_folder, num_workers=1, daemon=shared_daemon.address, rank=rank, world_size=world_size,
            **kwargs,
        ) as loader:
            batches = take(loader)
            assert len(batches) == len(loader) == 24 // world_size // 4
        shards.append(ids_of(batches, ids))
    assert len({len(s) for s in shards}) == 1, "ranks got different numbers of samples"
    assert sorted(i for s in shards for i in s) == list(range(24)), "shards overlap or miss samples"

    # torch.distributed's environment says the same
    last = world_size - 1
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setenv("RANK", str(last))
    with FastLoader(image_folder, num_workers=1, daemon=shared_daemon.address, **kwargs) as loader:
        from_env = take(loader)
        # (an earlier loader's session may still be ending: its bye follows its close())
        assert wait_until(lambda: [s["rank"] for s in shared_daemon.sessions()] == [last], HANG_S)
    assert ids_of(from_env, ids) == shards[last]
    assert_same_batches(from_env, local_epoch(image_folder, rank=last, world_size=world_size, **kwargs))


def test_uneven_dataset_is_sharded_as_distributed_sampler_with_drop_last(
    shared_daemon: DaemonProcess, make_folder: Callable[..., Path]
) -> None:
    folder = make_folder(classes=3, per_class=9)  # 27 samples
    ids = sample_ids(folder)
    shards = []
    for rank in range(2):
        with FastLoader(
            folder, batch_size=4, shuffle=True, drop_last=True, seed=2, transform=RESIZE, device="cpu",
            num_workers=1, daemon=shared_daemon.address, rank=rank, world_size=2,
        ) as loader:
            shards.append(ids_of(take(loader), ids))
    # 27 -> 13 samples per rank (the 27th dropped), 3 whole batches of 4 each (one more dropped)
    assert [len(s) for s in shards] == [12, 12]
    assert not set(shards[0]) & set(shards[1])


# ---------------------------------------------------------------------------------------------
# Two trainers at once


def test_two_trainers_are_served_round_robin_with_correct_batches(
    daemon_pool: DaemonPool, image_folder: Path, make_folder: Callable[..., Path]
) -> None:
    """A trainer that queued its whole epoch does not make a later one wait for all of it.

    What is checked is the order in which the daemon's one worker runs the trainers' batches: with
    the worker stopped, a queues all 12 of its batches (2 go to the worker, 10 wait), then b its 2;
    once the worker goes on, round-robin runs b's first batch after one or two more of a's, where
    first come, first served would run all of a's first. Each batch's arrival in its trainer is
    timed: b's first must arrive before most of a's (the trainers' threads take batches as they
    come, so an arrival trails its batch's end by far less than a batch takes).
    """
    daemon = daemon_pool.start(workers=1)  # it sends 2 tasks at a time to its worker
    kwargs: dict[str, Any] = {"batch_size": 2, "shuffle": True, "transform": RESIZE, "device": "cpu"}
    plain = make_folder(classes=2, per_class=2, name="b")  # 4 images: b's epoch is 2 batches
    expected = {"a": local_epoch(image_folder, seed=1, **kwargs), "b": local_epoch(plain, seed=2, **kwargs)}
    got: dict[str, Batches] = {"a": [], "b": []}
    arrivals: dict[str, list[float]] = {"a": [], "b": []}
    errors: dict[str, BaseException] = {}

    def run(name: str, loader: FastLoader) -> None:
        try:
            for batch in loader:
                arrivals[name].append(time.monotonic())
                got[name].append([t.clone() for t in batch])
        except BaseException as e:  # reported by the test thread
            errors[name] = e

    def queued() -> list[int]:
        mine = [s for s in daemon.sessions() if s["pid"] == os.getpid()]
        return [s["queued"] for s in sorted(mine, key=lambda s: s["session"])]

    address = daemon.address
    with (
        FastLoader(image_folder, seed=1, prefetch=12, num_workers=1, daemon=address, **kwargs) as a,
        FastLoader(plain, seed=2, prefetch=2, num_workers=1, daemon=address, **kwargs) as b,
    ):
        threads = {
            name: threading.Thread(target=run, args=(name, loader), daemon=True)
            for name, loader in (("a", a), ("b", b))
        }
        # Pause the worker so that the queues build up as they would under load.
        daemon.signal_workers(signal.SIGSTOP)
        try:
            threads["a"].start()
            assert wait_until(lambda: queued()[:1] == [10], HANG_S), queued()
            threads["b"].start()
            assert wait_until(lambda: queued() == [10, 2], HANG_S), queued()
        finally:
            daemon.signal_workers(signal.SIGCONT)
        for thread in threads.values():
            thread.join(HANG_S)
            assert not thread.is_alive(), "a trainer hangs"
    assert not errors, errors
    assert_same_batches(got["a"], expected["a"])
    assert_same_batches(got["b"], expected["b"])
    before_b = sum(t < arrivals["b"][0] for t in arrivals["a"])
    # Round-robin: b's first batch ran after 3 or 4 of a's; first come, first served: after all 12.
    # Arrivals are taken by the trainers' threads, which share this process (and, on a loaded
    # machine, its cores): b's can trail a few of a's (8 beside two CPU burners), never all 12.
    assert before_b <= 10, f"b's first batch arrived after {before_b} of a's 12 batches"


# ---------------------------------------------------------------------------------------------
# Memory budget


_REFUSED = re.compile(r"needs (\S+ [KMG]iB) but only (\S+ [KMG]?i?B) of the daemon's 64 MiB budget is left")


def test_session_over_the_budget_is_refused_saying_what_is_needed_and_left(
    shared_daemon: DaemonProcess, image_folder: Path
) -> None:
    address = shared_daemon.address
    big: dict[str, Any] = {
        "transform": [T.Resize((64, 64))], "prefetch": 4, "device": "cpu", "num_workers": 1,
    }
    # 6 slots of 512 x 64 x 64 x 3 bytes: 36 MiB of the 64
    with FastLoader(image_folder, batch_size=512, daemon=address, **big) as first:
        status = shared_daemon.status()
        left = format_size(status["budget_bytes"] - status["used_bytes"])
        segments = shared_daemon.segments()
        for batch_size, need in ((512, "36 MiB"), (4096, "288 MiB")):
            with pytest.raises(DaemonError, match=_REFUSED) as refused:
                FastLoader(image_folder, batch_size=batch_size, daemon=address, **big)
            match = _REFUSED.search(str(refused.value))
            assert match is not None
            assert (match.group(1), match.group(2)) == (need, left), str(refused.value)
            assert "--memory-budget" in str(refused.value)
        assert shared_daemon.segments() == segments, "a refused session left segments"
        assert wait_until(lambda: len(shared_daemon.sessions()) == 1, HANG_S), shared_daemon.sessions()
        assert [len(y) for _, y in first] == [24]
    # Once the first session is gone, the second fits.
    with FastLoader(image_folder, batch_size=512, daemon=address, **big) as second:
        assert [len(y) for _, y in second] == [24]


def test_a_session_that_leaves_prefetch_unset_gets_the_daemons_default(
    shared_daemon: DaemonProcess, image_folder: Path
) -> None:
    with FastLoader(
        image_folder, batch_size=4, transform=RESIZE, device="cpu", num_workers=1,
        daemon=shared_daemon.address,
    ) as loader:
        assert len(list(loader)) == 6
        pipeline = loader._runs.pipeline
        assert pipeline is not None and pipeline.ring is not None and pipeline.layout is not None
        expected = default_in_flight(shared_daemon.status()["workers"], pipeline.layout.slot_bytes)
        assert pipeline.window.limit == expected
        assert len(pipeline.ring) == expected + EXTRA_SLOTS


def test_a_state_with_another_seed_resumes_an_attached_loader_as_a_local_one(
    shared_daemon: DaemonProcess, image_folder: Path
) -> None:
    kwargs: dict[str, Any] = {"batch_size": 4, "shuffle": True, "transform": RESIZE, "device": "cpu"}
    with FastLoader(image_folder, num_workers=0, seed=7, **kwargs) as local:
        it = iter(local)
        next(it), next(it)
        state = local.state_dict()
        rest = [[t.clone() for t in b] for b in it]
    with FastLoader(image_folder, num_workers=1, seed=1, daemon=shared_daemon.address, **kwargs) as attached:
        next(iter(attached))
        attached.load_state_dict(state)  # seed 7: a new session, the same plan as the local loader's
        assert attached.seed == 7
        assert_same_batches([[t.clone() for t in b] for b in attached], rest)


# ---------------------------------------------------------------------------------------------
# `fastload status`, no daemon, a second daemon


def test_status_of_a_daemon_without_sessions_exits_0(
    daemon_pool: DaemonPool, capfd: pytest.CaptureFixture[str]
) -> None:
    # A healthy idle daemon (docker compose's healthcheck runs `fastload status`); 1 means none answers.
    daemon = daemon_pool.start(workers=1)
    assert main(["status", "--address", daemon.address]) == 0
    assert "0 session(s)" in capfd.readouterr().out


def test_the_next_epoch_is_decoded_ahead_as_by_a_local_loader(
    shared_daemon: DaemonProcess, image_folder: Path
) -> None:
    """Issue 28: a daemon session started every epoch cold (14-80 ms for its first batch against
    ~1 ms locally). Once an epoch's batches are all submitted, the session's free slots decode the
    next epoch's first batches (NOTE [no drain]); the next iteration takes them over, and they are
    the batches a local loader gives."""
    kwargs: dict[str, Any] = {
        "batch_size": 4, "shuffle": True, "seed": 3, "transform": RESIZE, "device": "cpu"
    }
    with FastLoader(image_folder, num_workers=1, daemon=shared_daemon.address, **kwargs) as loader:
        first = take(loader)

        def decoding_ahead() -> bool:
            mine = [s for s in shared_daemon.sessions() if s["pid"] == os.getpid()]
            return len(mine) == 1 and mine[0]["epoch"] == 1 and mine[0]["images"] > 24

        assert wait_until(decoding_ahead, HANG_S), shared_daemon.sessions()
        second = take(loader)
    with FastLoader(image_folder, num_workers=0, **kwargs) as local:
        assert_same_batches(first, take(local))
        assert_same_batches(second, take(local))


def test_status_lists_the_sessions(
    shared_daemon: DaemonProcess, image_folder: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with FastLoader(
        image_folder, batch_size=4, transform=RESIZE, device="cpu", num_workers=1,
        daemon=shared_daemon.address, rank=1, world_size=2, seed=0,
    ) as loader:
        next(iter(loader))
        assert main(["status", "--address", shared_daemon.address]) == 0
    out = capfd.readouterr().out
    assert f"fastload daemon pid {shared_daemon.pid}: 2 workers" in out
    assert "1 session(s)" in out
    rows = [line.split() for line in out.splitlines() if line.strip().endswith(str(image_folder))]
    assert len(rows) == 1, out
    assert rows[0][1:3] == [str(os.getpid()), "1/2"], out
    # Position: the newest batch asked for: epoch 0's, or, with its 3 batches all asked for, the
    # next epoch's first ones, decoded ahead (NOTE [no drain]).
    assert rows[0][3].split(".")[0] in ("0", "1"), out
    assert int(rows[0][4]) >= 4  # images loaded so far


def test_status_without_a_daemon_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--address", f"ipc://{tmp_path}/daemon.sock"]) == 1
    assert "no fastload daemon is running" in capsys.readouterr().err
    # The command itself, at this user's default address.
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    result = subprocess.run(
        [sys.executable, "-m", "fastload", "status"], capture_output=True, text=True, timeout=HANG_S,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    assert result.returncode == 1
    assert f"no fastload daemon is running at ipc://{runtime}/fastload/daemon.sock" in result.stderr


def test_loader_with_no_daemon_fails_at_once_saying_to_start_one(
    tmp_path: Path, image_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def attach(address: str, expected: str) -> None:
        # "At once": the loader finds that nothing listens before it says hello, rather than
        # waiting for a welcome until its connect timeout ("no answer ... within 5 s").
        with pytest.raises(DaemonError) as refused:
            FastLoader(image_folder, batch_size=4, transform=RESIZE, device="cpu", daemon=address)
        assert str(refused.value) == (
            f"no fastload daemon is running at {expected}: start one with `fastload serve`"
        )

    missing = f"ipc://{tmp_path}/daemon.sock"
    attach(missing, missing)  # no socket at all
    # A stale socket file, as a daemon killed with SIGKILL leaves: nothing listens on it.
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))
    assert stale.exists()
    attach(f"ipc://{stale}", f"ipc://{stale}")
    # daemon="default": this user's runtime directory.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    attach("default", f"ipc://{tmp_path}/fastload/daemon.sock")


def test_second_daemon_on_the_same_socket_dir_refuses(shared_daemon: DaemonProcess) -> None:
    code, stderr = refused_serve(serve_command(shared_daemon.socket_dir, workers=1), timeout_s=HANG_S)
    assert code == 1, stderr
    assert f"already running (pid {shared_daemon.pid}" in stderr
    # ...and took nothing away from the first one.
    assert shared_daemon.pid_path.read_text().strip() == str(shared_daemon.pid)
    assert shared_daemon.status()["pid"] == shared_daemon.pid
