"""Distributed training: every rank reads its own shard, and a user's sampler keeps its epoch.

Protects DDP runs from silent data loss: the rank comes from torch.distributed when its process
group is up, else from the launcher's environment (Lightning sets no RANK), and a world of several
processes with no rank to be found is an error, never rank 0 (every rank would read rank 0's
shard). A folder's shards are DistributedSampler's, padding and drop_last included. A user's
sampler is never set to the loader's own epoch count (a resumed run replayed epoch 0's order):
its epoch is the user's, `loader.set_epoch` forwards to it, and `loader.sampler` is where
Lightning finds it. The multi-process tests run real gloo groups (tests/dist_trainer.py) under
torch.multiprocessing.spawn and under torchrun, and the DDP example under torchrun.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, RandomSampler

from fastload import ConfigError, FastLoader, SettingsWarning
from fastload import transforms as T
from fastload._loading.order.plan import ShuffledPlan
from fastload._loading.order.ranks import process_position as _distributed

REPO = Path(__file__).resolve().parents[1]
LAUNCHER_VARIABLES = (
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT",
)


@pytest.fixture(autouse=True)
def _no_launcher_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a lone process; it sets the launcher variables it is about."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def _setenv(monkeypatch: pytest.MonkeyPatch, **variables: str) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


# ---------------------------------------------------------------------------------------------
# Rank and world size


def test_lone_process_is_rank_0_of_1() -> None:
    assert _distributed(None, None) == (0, 1)


@pytest.mark.parametrize(
    ("variables", "position"),
    [
        ({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}, (3, 4)),  # torchrun
        ({"WORLD_SIZE": "2", "NODE_RANK": "0", "LOCAL_RANK": "1"}, (1, 2)),  # Lightning, one node
        ({"WORLD_SIZE": "4", "NODE_RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (3, 4)),
        ({"WORLD_SIZE": "4", "GROUP_RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}, (2, 4)),
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (1, 2)),  # one node, no node rank
    ],
)
def test_rank_comes_from_the_launchers_environment(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], position: tuple[int, int]
) -> None:
    _setenv(monkeypatch, **variables)
    assert _distributed(None, None) == position


@pytest.mark.parametrize(
    "variables",
    [
        {"WORLD_SIZE": "2"},
        {"WORLD_SIZE": "4", "NODE_RANK": "1", "LOCAL_RANK": "1"},  # which rank: LOCAL_WORLD_SIZE unknown
    ],
)
def test_several_processes_and_no_rank_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str]
) -> None:
    _setenv(monkeypatch, **variables)
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=\d.*no rank.*init_process_group.*rank="):
        _distributed(None, None)


def test_folder_loader_refuses_to_guess_a_rank(monkeypatch: pytest.MonkeyPatch, image_folder: Path) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="no rank"):
        FastLoader(image_folder, batch_size=4, num_workers=0, device="cpu")


@pytest.mark.parametrize("name", ["WORLD_SIZE", "RANK"])
def test_a_variable_that_is_not_an_integer_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    _setenv(monkeypatch, WORLD_SIZE="2", RANK="0")
    monkeypatch.setenv(name, "two")
    with pytest.raises(ConfigError, match=f"{name}='two' is not an integer"):
        _distributed(None, None)


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _setenv(monkeypatch, WORLD_SIZE="8", RANK="5")
    assert _distributed(1, 2) == (1, 2)
    assert _distributed(2, None) == (2, 8)
    monkeypatch.setenv("WORLD_SIZE", "nonsense")  # not even read when both are given
    assert _distributed(1, 2) == (1, 2)


def test_a_lone_argument_is_checked_against_what_it_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"rank 1 is not within world_size 1.*world_size="):
        _distributed(1, None)
    with pytest.raises(ConfigError, match=r"world_size=2 was given without rank=.*no rank"):
        _distributed(None, 2)
    _setenv(monkeypatch, WORLD_SIZE="8", RANK="5")
    with pytest.raises(ConfigError, match=r"world_size=2 was given without rank=.*\(5\) is one of 8"):
        _distributed(None, 2)
    assert _distributed(None, 8) == (5, 8)
    assert _distributed(None, 1) == (0, 1)
    with pytest.raises(ConfigError, match="rank must be an int"):
        _distributed("1", 2)  # type: ignore[arg-type]


def test_the_process_group_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    _setenv(monkeypatch, WORLD_SIZE="4", RANK="0")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    assert _distributed(None, None) == (1, 2)


# ---------------------------------------------------------------------------------------------
# Shards: DistributedSampler's, padding and drop_last included


class Indices(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


SHARD_CASES = [(n, world) for n in (2, 3, 10, 11, 13, 24) for world in (2, 3, 4, 5)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("n", "world"), SHARD_CASES)
def test_shards_are_distributed_samplers(n: int, world: int, drop_last: bool) -> None:
    batch_size = 2
    for rank in range(world):
        plan = ShuffledPlan(
            n, batch_size, shuffle=False, drop_last=drop_last, seed=0, rank=rank, world_size=world
        )
        sampler = DistributedSampler(Indices(n), world, rank, shuffle=False, drop_last=drop_last)
        assert plan.order(0).tolist() == list(sampler)
        want = DataLoader(Indices(n), batch_size=batch_size, sampler=sampler, drop_last=drop_last)
        assert len(plan) == len(want)
        assert [b.tolist() for b in plan.iter_batches(0)] == [b.tolist() for b in want]
        shuffled = ShuffledPlan(
            n, batch_size, shuffle=True, drop_last=drop_last, seed=0, rank=rank, world_size=world
        )
        assert len(shuffled.order(1)) == len(sampler) and len(shuffled) == len(want)


def _digest(image: torch.Tensor) -> str:
    return hashlib.sha1(image.contiguous().numpy().tobytes()).hexdigest()


def _expected_shards(folder: Path, world: int) -> list[list[str]]:
    """Each rank's images (as tests/dist_trainer.py records them) under DistributedSampler."""
    with FastLoader(
        folder, batch_size=1000, num_workers=0, transform=[T.Resize((16, 16))], device="cpu"
    ) as loader:
        ((images, _),) = list(loader)
        digests = [_digest(image) for image in images]
    assert len(set(digests)) == len(digests), "two images have the same pixels: shards cannot be told apart"
    return [
        [digests[i] for i in DistributedSampler(Indices(len(digests)), world, rank, shuffle=False)]
        for rank in range(world)
    ]


# ---------------------------------------------------------------------------------------------
# Real process groups (gloo, 2 processes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(command: list[str], timeout_s: float) -> str:
    """Run `command` (in its own session) to its end; on a timeout kill all it started and fail."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"{command} did not finish in {timeout_s} s:\n{out}")
    assert proc.returncode == 0, f"{command} exited with {proc.returncode}:\n{out}"
    return out


def _torchrun(*args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}", *args,
    ]


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def odd_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """9 images: 2 ranks get 5 each, the first image twice (DistributedSampler's padding)."""
    from helpers import build_folder

    return build_folder(tmp_path_factory.mktemp("odd_folder"), classes=3, per_class=3)


@pytest.mark.timeout(150)
def test_spawned_ranks_without_rank_variable_read_their_own_shards(odd_folder: Path, tmp_path: Path) -> None:
    _run([sys.executable, str(REPO / "tests" / "dist_trainer.py"), "spawn", str(odd_folder), str(tmp_path),
          str(_free_port())], timeout_s=120)
    shards = _expected_shards(odd_folder, 2)
    for record in _records(tmp_path):
        # Before the group: Lightning's environment (NODE_RANK 0) names the rank by LOCAL_RANK.
        assert record["from_environment"] == shards[record["local_rank"]]
        # After: the group, which numbers the processes the other way round, names it.
        assert record["from_process_group"] == shards[record["group_rank"]]
    assert len(set(shards[0] + shards[1])) == 9  # every image seen; the padding repeats one


@pytest.mark.timeout(150)
def test_torchrun_ranks_read_their_shards_and_keep_their_samplers_epoch(
    odd_folder: Path, tmp_path: Path
) -> None:
    _run(_torchrun(str(REPO / "tests" / "dist_trainer.py"), "torchrun", str(odd_folder), str(tmp_path)), 120)
    shards = _expected_shards(odd_folder, 2)
    for record in _records(tmp_path):
        rank = record["rank"]
        assert record["folder"] == shards[rank]
        sampler = DistributedSampler(Indices(11), 2, rank, shuffle=True, seed=7)
        sampler.set_epoch(3)  # as the trainer did: the loader must not reset it to its own count
        assert record["sampler_indices"] == list(sampler)


@pytest.mark.timeout(150)
def test_torchrun_ranks_stay_in_step_past_a_broken_file_with_on_error_skip(tmp_path: Path) -> None:
    """Issue 22's DDP case: 2 ranks, a corrupt file, on_error="skip": the same step count on both
    ranks (each step all-reduces, so a rank short of a batch would hang: the timeout), every good
    image each epoch, the broken one never, and the rank that met it counted it."""
    from helpers import build_folder

    data = build_folder(tmp_path / "data", classes=3, per_class=3)
    broken = sorted(data.glob("n01/*"))[2]
    broken.write_bytes(b"\xff\xd8 not the rest of a JPEG" * 4)
    out = tmp_path / "out"
    out.mkdir()
    _run(_torchrun(str(REPO / "tests" / "dist_trainer.py"), "skip", str(data), str(out)), 120)
    records = _records(out)
    assert records[0]["steps"] == records[1]["steps"] == [3, 3]  # 9 images: 5 a rank, batches of 2
    good = {str(p) for p in data.rglob("*.*")} - {str(broken)}
    for epoch in range(2):
        held = [n for r in records for batch in r["names"][3 * epoch : 3 * epoch + 3] for n in batch]
        assert len(held) == 10 and set(held) >= good and str(broken) not in held
    assert {n for r in records for n in r["skipped"]} == {str(broken)}
    assert sum(r["skipped_count"] for r in records) >= 2  # met once an epoch


def test_ranks_given_no_seed_take_the_shared_default_and_a_given_seed_or_generator_wins(
    image_folder: Path,
) -> None:
    kw: dict[str, Any] = {
        "batch_size": 4, "num_workers": 0, "device": "cpu", "world_size": 2, "transform": [T.Resize((8, 8))]
    }
    for rank in range(2):
        torch.manual_seed(rank)  # per-rank RNG state, as timm's random_seed(seed, rank) leaves it
        said = r"world_size=2 and no seed=.*seed=0"
        with pytest.warns(SettingsWarning, match=said), FastLoader(image_folder, rank=rank, **kw) as loader:
            assert loader.seed == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FastLoader(image_folder, rank=0, seed=9, **kw) as loader:
            assert loader.seed == 9
        # A generator is the user's choice of order: drawn from (and seeded alike on every rank).
        seeds = []
        for rank in range(2):
            generator = torch.Generator().manual_seed(5)
            with FastLoader(image_folder, rank=rank, generator=generator, **kw) as loader:
                seeds.append(loader.seed)
        assert seeds[0] == seeds[1] != 0
        # One process keeps DataLoader's draw from torch's RNG.
        torch.manual_seed(3)
        alone = {k: v for k, v in kw.items() if k != "world_size"}
        with FastLoader(image_folder, **alone) as one:
            assert one.seed != 0


def test_a_dataset_without_a_sampler_in_a_distributed_run_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank would load the whole Dataset (as under DataLoader, which Lightning mends by
    injecting a DistributedSampler: it leaves FastLoader alone). Said once, with the sampler to use."""
    _setenv(monkeypatch, WORLD_SIZE="2", RANK="1")
    said = r"run of 2 processes: every rank loads all 11 samples"
    with pytest.warns(SettingsWarning, match=said), FastLoader(Indices(11), batch_size=2, shuffle=True) as it:
        assert sum(len(b) for b in it) == 11
    drawn = torch.Generator().manual_seed(1)  # DataLoader's order from it: still every sample
    with pytest.warns(SettingsWarning, match=said), FastLoader(Indices(11), 2, True, generator=drawn) as it:
        assert sum(len(b) for b in it) == 11
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = DistributedSampler(Indices(11), num_replicas=2, rank=1)
        with FastLoader(Indices(11), batch_size=2, sampler=sampler) as loader:
            assert sum(len(b) for b in loader) == 6


@pytest.mark.timeout(150)
def test_torchrun_ranks_given_no_seed_share_one_order_and_are_told_once(tmp_path: Path) -> None:
    """Issue 28: ranks that seed torch per rank (timm's recipe) and give no seed= once drew
    different orders and read overlapping shards (26 of 100 samples on both ranks, 26 on neither).
    With no seed= they share DistributedSampler's default: each epoch, every image on exactly one
    rank; a new order each epoch; and each rank is told once."""
    from helpers import build_folder

    data = build_folder(tmp_path / "data", classes=4, per_class=5)  # 20 images: 10 a rank, no padding
    out = tmp_path / "out"
    out.mkdir()
    _run(_torchrun(str(REPO / "tests" / "dist_trainer.py"), "unseeded", str(data), str(out)), 120)
    records = _records(out)
    every = sorted(str(p) for p in data.rglob("*.*"))
    for epoch in range(2):
        held = [name for r in records for name in r["epochs"][epoch]]
        assert sorted(held) == every, f"epoch {epoch}: shards overlap or miss samples"
    assert records[0]["epochs"][0] != records[0]["epochs"][1]  # set_epoch still reorders
    for r in records:
        told = [w for w in r["warnings"] if w.startswith("SettingsWarning") and "no seed=" in w]
        assert len(told) == 1 and "seed=0" in told[0], r["warnings"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("recipe", ["basic", "deit"])
def test_ddp_example_trains_under_torchrun(odd_folder: Path, recipe: str) -> None:
    out = _run(
        _torchrun(str(REPO / "examples" / "ddp_train.py"), "--data", str(odd_folder), "--epochs", "2",
                  "--batch-size", "2", "--workers", "1", "--recipe", recipe, "--check-shards"),
        timeout_s=120,
    )
    # Where each rank trains: the CPU without CUDA, a GPU each where there are two, and on a 1-GPU
    # machine both on cuda:0 over gloo (NCCL refuses two ranks on one GPU), said once.
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for rank in range(2):
        device, backend = ("cpu", "gloo") if gpus == 0 else ("cuda:0", "gloo")
        if gpus >= 2:
            device, backend = f"cuda:{rank}", "nccl"
        assert f"rank {rank}/2 on {device}, process group on {backend}" in out, out
        for epoch in range(2):
            assert f"rank {rank}/2 epoch {epoch}: 3 batches, 5 samples" in out, out
    for epoch in range(2):  # by sample ids across the ranks: 9 images, each on one rank, 1 padding
        assert f"shards epoch {epoch}: 9 samples over 2 ranks, each on one rank (1 repeated" in out, out
    assert out.count("ddp_train: 2 ranks on this machine, 1 GPU(s)") == (gpus == 1), out


def _ddp_example() -> Any:
    """examples/ddp_train.py as a module (it runs nothing on import)."""
    spec = importlib.util.spec_from_file_location("ddp_train_example", REPO / "examples" / "ddp_train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ddp_example_shares_gpus_over_gloo_when_ranks_outnumber_them() -> None:
    placement = _ddp_example().placement
    assert placement(1, 2, 0) == (torch.device("cpu"), "gloo", None)
    assert placement(3, 8, 8) == (torch.device("cuda", 3), "nccl", None)
    # More ranks than GPUs: round-robin, and every rank of the machine picks gloo (one backend).
    for local_rank in range(2):
        device, backend, note = placement(local_rank, 2, 1)
        assert (device, backend) == (torch.device("cuda", 0), "gloo")
        assert note is not None and "gloo" in note and "cuda:(r % 1)" in note
    assert placement(5, 8, 4)[:2] == (torch.device("cuda", 1), "gloo")
    assert placement(0, 8, 4)[:2] == (torch.device("cuda", 0), "gloo")


# ---------------------------------------------------------------------------------------------
# A user's sampler keeps its epoch


def _order(loader: Iterable[Any]) -> list[int]:
    return [int(i) for (batch,) in loader for i in batch]


class _Ids(Dataset[tuple[int]]):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> tuple[int]:
        return (i,)


def _epoch_order(epoch: int) -> list[int]:
    sampler = DistributedSampler(_Ids(), num_replicas=1, rank=0, shuffle=True)
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_epoch_set_on_a_users_sampler_wins(num_workers: int) -> None:
    sampler = DistributedSampler(_Ids(), num_replicas=1, rank=0, shuffle=True)
    with FastLoader(_Ids(), batch_size=4, sampler=sampler, num_workers=num_workers) as loader:
        sampler.set_epoch(5)
        assert _order(loader) == _epoch_order(5)
        assert _order(loader) == _epoch_order(5), "the loader moved the sampler on by itself"
        loader.set_epoch(3)
        assert sampler.epoch == 3
        assert _order(loader) == _epoch_order(3)


def _epochs(loader: Iterable[Any], sampler: DistributedSampler[Any]) -> list[list[int]]:
    """Four iterations; the user sets the sampler's epoch before the second and the fourth."""
    seen = []
    for epoch in (None, 2, None, 7):
        if epoch is not None:
            sampler.set_epoch(epoch)
        seen.append(_order(loader))
    return seen


def test_iterations_follow_the_sampler_as_under_dataloader() -> None:
    twins = [DistributedSampler(_Ids(), num_replicas=2, rank=1, shuffle=True, seed=4) for _ in range(2)]
    want = _epochs(DataLoader(_Ids(), batch_size=3, sampler=twins[0]), twins[0])
    with FastLoader(_Ids(), batch_size=3, sampler=twins[1], num_workers=0) as loader:
        assert _epochs(loader, twins[1]) == want


def test_set_epoch_reaches_the_sampler_inside_a_batch_sampler() -> None:
    sampler = DistributedSampler(_Ids(), num_replicas=1, rank=0, shuffle=True)
    batches = BatchSampler(sampler, batch_size=4, drop_last=False)
    with FastLoader(_Ids(), batch_sampler=batches, num_workers=0) as loader:
        assert loader.batch_sampler is batches and loader.sampler is None
        loader.set_epoch(4)
        assert sampler.epoch == 4
        assert _order(loader) == _epoch_order(4)


def test_loader_exposes_the_users_sampler_as_lightning_expects() -> None:
    """Lightning sets each epoch on `loader.sampler` and `loader.batch_sampler.sampler`."""
    sampler = DistributedSampler(_Ids(), num_replicas=1, rank=0, shuffle=True)
    with FastLoader(_Ids(), batch_size=4, sampler=sampler, num_workers=0) as loader:
        assert loader.sampler is sampler and loader.batch_sampler is None
    with FastLoader(_Ids(), batch_size=4, shuffle=True, num_workers=0) as loader:
        assert loader.sampler is None and loader.batch_sampler is None


class _Noisy(Dataset[tuple[int, torch.Tensor]]):
    """A Dataset with randomness of its own (seeded by fastload per batch from (seed, epoch))."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.rand(2)


def _noisy_epoch(choose_epoch: Callable[[FastLoader, DistributedSampler[Any]], None]) -> list[list[Any]]:
    sampler = DistributedSampler(_Noisy(), num_replicas=1, rank=0, shuffle=True)
    with FastLoader(_Noisy(), batch_size=4, sampler=sampler, num_workers=0, seed=3) as loader:
        choose_epoch(loader, sampler)
        return [[ids.tolist(), noise.clone()] for ids, noise in loader]


def test_a_samplers_epoch_seeds_its_batches_randomness() -> None:
    by_sampler = _noisy_epoch(lambda loader, sampler: sampler.set_epoch(2))
    by_loader = _noisy_epoch(lambda loader, sampler: loader.set_epoch(2))
    first = _noisy_epoch(lambda loader, sampler: None)
    assert [ids for ids, _ in by_sampler] == [ids for ids, _ in by_loader]
    assert all(torch.equal(a[1], b[1]) for a, b in zip(by_sampler, by_loader, strict=True))
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(by_sampler, first, strict=True))


def _take(loader: FastLoader, k: int | None = None) -> Iterator[list[int]]:
    for b, (batch,) in enumerate(loader):
        if k is not None and b == k:
            return
        yield batch.tolist()


@pytest.mark.parametrize(
    "restore", ["load_state_dict only", "then sampler.set_epoch", "then loader.set_epoch"]
)
def test_resume_replays_the_samplers_epoch(restore: str) -> None:
    sampler = DistributedSampler(_Ids(), num_replicas=1, rank=0, shuffle=True)
    with FastLoader(_Ids(), batch_size=4, sampler=sampler, num_workers=0) as loader:
        sampler.set_epoch(6)
        whole = list(_take(loader))
        sampler.set_epoch(6)
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    assert state["epoch"] == 6 and state["batches_yielded"] == 2
    fresh = DistributedSampler(_Ids(), num_replicas=1, rank=0, shuffle=True)  # at epoch 0
    with FastLoader(_Ids(), batch_size=4, sampler=fresh, num_workers=0) as restored:
        restored.load_state_dict(state)
        if restore == "then sampler.set_epoch":
            fresh.set_epoch(6)
        elif restore == "then loader.set_epoch":
            restored.set_epoch(6)
        assert list(_take(restored)) == whole[2:]


def test_a_random_sampler_without_epoch_still_gets_new_seeds_each_epoch() -> None:
    sampler = RandomSampler(_Noisy(), generator=torch.Generator().manual_seed(0))
    with FastLoader(_Noisy(), batch_size=12, sampler=sampler, num_workers=0, seed=1) as loader:
        (_, first), (_, second) = next(iter(loader)), next(iter(loader))
        assert not torch.equal(first, second)


# ---------------------------------------------------------------------------------------------
# Frameworks


def test_an_iterator_never_drawn_from_uses_up_no_epoch(image_folder: Path) -> None:
    """Lightning calls iter() on a loader that is not a DataLoader to check it, and drops it."""
    kwargs: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 2, "num_workers": 0, "device": "cpu"}
    with FastLoader(image_folder, transform=[T.RandomResizedCrop(16)], **kwargs) as loader:
        first = [labels.tolist() for _, labels in loader]
        second = [labels.tolist() for _, labels in loader]
    with FastLoader(image_folder, transform=[T.RandomResizedCrop(16)], **kwargs) as loader:
        iter(loader)  # the check
        assert [labels.tolist() for _, labels in loader] == first
        iter(loader)
        assert [labels.tolist() for _, labels in loader] == second != first
    with FastLoader(_Ids(), batch_size=4, shuffle=True, num_workers=0) as loader:
        it = iter(loader)
        next(it)
        state = loader.state_dict()
    with FastLoader(_Ids(), batch_size=4, shuffle=True, num_workers=0) as restored:
        restored.load_state_dict(state)
        iter(restored)  # the check, made after the state is loaded: the position is kept
        assert len(list(restored)) == len(restored) - 1
