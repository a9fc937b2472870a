"""`fastload verify` finds every sample of a source (a folder, tar shards) that training would fail
on (a text file, a JPEG cut short mid-scan, an empty file; not one the decoder recovers from, as
training does), and writes
a list that `FastLoader(exclude=...)` reads: an epoch without those samples, every good one once,
in an order that is a function of (seed, epoch) and the list; `exclude=` by names or indices,
and refused where it cannot mean what it says.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from daemon_helpers import RESIZE, DaemonProcess
from helpers import build_folder, write_tar_shards

from fastload import ConfigError, FastLoader
from fastload._diagnostics.verify import verify
from fastload._exclusion import read_list, write_list
from fastload.sources import TarShards

pytestmark = pytest.mark.timeout(120)
KW: dict[str, Any] = {"transform": RESIZE, "device": "cpu", "sample_ids": True, "shuffle": True}


def _damage(root: Path) -> set[str]:
    """Three broken files of different kinds (text, a JPEG cut mid-scan, an empty file), and one
    whose scan holds garbage, which the decoder recovers from (gray blocks, as Pillow): their paths."""
    text, cut, empty = (
        sorted(root.glob("n00/*.jpg"))[1],
        sorted(root.glob("n01/*.jpg"))[0],
        sorted(root.glob("n02/*.jpg"))[-1],
    )
    text.write_bytes(b"not an image" * 30)
    data = cut.read_bytes()
    cut.write_bytes(data[: int(len(data) * 0.6)])
    empty.write_bytes(b"")
    garbled = sorted(root.glob("n02/*.jpg"))[0]
    raw = bytearray(garbled.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 40] = bytes(range(40))
    garbled.write_bytes(bytes(raw))
    return {str(text), str(cut), str(empty)}


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[str]]:
    root = build_folder(tmp_path_factory.mktemp("damaged"), classes=3, per_class=6)
    return root, _damage(root)


def test_verify_names_every_broken_file_and_why(damaged: tuple[Path, set[str]]) -> None:
    root, bad = damaged
    result = verify(root, workers=2, progress=None)
    assert result.samples == 18
    assert {name for name, _ in result.broken} == bad
    why = dict(result.broken)  # in words, not a decoder's repr of its input
    text, cut, empty = sorted(bad, key=lambda name: ("n00" not in name, "n01" not in name))
    assert why[text].endswith("not an image: starts with b'not an i' (text?) (360 bytes)"), why[text]
    assert "truncated JPEG: no end-of-image marker (" in why[cut]
    assert why[empty].endswith("empty file (0 bytes)"), why[empty]
    assert not any(" object at 0x" in reason for reason in why.values())


def test_the_command_writes_a_list_the_loader_excludes(
    damaged: tuple[Path, set[str]], tmp_path: Path
) -> None:
    root, bad = damaged
    listed = tmp_path / "broken.txt"
    done = subprocess.run(
        [sys.executable, "-m", "fastload", "verify", str(root), "-o", str(listed), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 1, done.stderr  # broken samples found, as fsck says so
    assert "3 of 18 samples broken" in done.stderr and "exclude=" in done.stderr
    assert set(read_list(listed)) == bad
    kw = {
        "batch_size": 4,
        "transform": RESIZE,
        "device": "cpu",
        "sample_ids": True,
        "shuffle": True,
        "seed": 1,
    }
    with FastLoader(root, num_workers=2, exclude=listed, **kw) as loader:  # on_error="raise": none met
        assert len(loader) == 4  # 15 samples
        names = [n for _, _, ids in loader for n in ids.names]
    assert len(names) == 15 and not set(names) & bad
    with FastLoader(root, num_workers=0, exclude=sorted(bad), **kw) as same:  # names given directly
        assert [n for _, _, ids in same for n in ids.names] == names


def test_a_clean_source_verifies_with_exit_status_0(tmp_path: Path) -> None:
    root = build_folder(tmp_path / "clean", classes=2, per_class=3)
    done = subprocess.run(
        [sys.executable, "-m", "fastload", "verify", str(root), "--quiet"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0 and done.stdout == "" and "0 of 6 samples broken" in done.stderr


def test_verify_reads_tar_shards(tmp_path: Path) -> None:
    root = build_folder(tmp_path / "folder", classes=2, per_class=4)
    (bad,) = _damage_one(root)
    shards = write_tar_shards(root, tmp_path / "shards", per_shard=3)
    result = verify(str(tmp_path / "shards" / "train-{000000..000002}.tar"), workers=1, progress=None)
    assert result.samples == 8 and len(result.broken) == 1
    name, why = result.broken[0]
    assert name.startswith(shards[0].name)
    assert why == "not an image: starts with b'\\xff\\xd8 broke' (90 bytes)"
    with FastLoader(
        TarShards(str(tmp_path / "shards" / "train-{000000..000002}.tar")),
        batch_size=2,
        transform=RESIZE,
        device="cpu",
        num_workers=1,
        exclude=[name],
    ) as loader:
        assert sum(len(labels) for _, labels in loader) == 7
    del bad


def _damage_one(root: Path) -> list[str]:
    victim = sorted(root.glob("n00/*.jpg"))[0]
    victim.write_bytes(b"\xff\xd8 broken" * 10)
    return [str(victim)]


def test_exclude_keeps_ranks_even_and_resume_checks_it(damaged: tuple[Path, set[str]]) -> None:
    root, bad = damaged
    kw = {
        "batch_size": 2,
        "transform": RESIZE,
        "device": "cpu",
        "sample_ids": True,
        "shuffle": True,
        "seed": 2,
    }
    held = []
    for rank in range(2):
        with FastLoader(root, num_workers=1, exclude=sorted(bad), rank=rank, world_size=2, **kw) as loader:
            held.append([n for _, _, ids in loader for n in ids.names])
    assert len(held[0]) == len(held[1]) == 8  # 15 samples: 8 a rank, one repeated (padding)
    assert set(held[0]) | set(held[1]) == {str(p) for p in root.rglob("*.*")} - bad
    with FastLoader(root, num_workers=0, exclude=sorted(bad), **kw) as first:
        next(iter(first))
        state = first.state_dict()
    with (
        FastLoader(root, num_workers=0, exclude=sorted(bad)[:1], **kw) as other,
        pytest.raises(ConfigError, match="excluded"),
    ):
        other.load_state_dict(state)


class _Numbers(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        if i == 3:
            raise OSError("sample 3 is unreadable")
        return i


def test_a_dataset_excludes_by_index_and_stand_ins_avoid_the_excluded() -> None:
    with FastLoader(_Numbers(), batch_size=3, num_workers=1, exclude=[3]) as loader:
        assert sorted(int(v) for batch in loader for v in batch) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    with pytest.raises(ConfigError, match="by name"):
        FastLoader(_Numbers(), batch_size=3, exclude=["3"])


def test_exclude_refuses_what_it_cannot_mean(
    damaged: tuple[Path, set[str]], tmp_path: Path, shared_daemon: DaemonProcess
) -> None:
    root, bad = damaged
    with pytest.raises(ConfigError, match="does not hold"):
        FastLoader(root, device="cpu", transform=RESIZE, exclude=[str(tmp_path / "elsewhere.jpg")])
    with pytest.raises(ConfigError, match="outside"):
        FastLoader(root, device="cpu", transform=RESIZE, exclude=[99])
    with pytest.raises(ConfigError, match="daemon"):
        FastLoader(root, device="cpu", transform=RESIZE, exclude=sorted(bad), daemon=shared_daemon.address)
    with pytest.raises(ConfigError, match="cannot read"):
        FastLoader(root, device="cpu", transform=RESIZE, exclude=tmp_path / "missing.txt")


def test_a_list_round_trips_awkward_names(tmp_path: Path) -> None:
    names = [
        ("plain/name.jpg", "OSError: x"),
        ('odd\tname"with\nbreaks.jpg', "ValueError: y"),
        ('"quoted', "z"),
    ]
    path = tmp_path / "list.txt"
    assert write_list(path, names, "a header\non two lines") == 3
    assert read_list(path) == [n for n, _ in names]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert path.read_text().startswith("# a header\n# on two lines\n")


def test_an_output_that_cannot_be_written_fails_before_any_sample_is_decoded(
    damaged: tuple[Path, set[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fastload.__main__ import main
    from fastload._diagnostics import verify as verify_module

    root, _ = damaged
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(verify_module, "verify", None)  # decoding anything would fail otherwise
    assert main(["verify", str(root), "-o", str(blocker / "bad.txt")]) == 1
    assert f"{blocker} is not a directory: create it" in capsys.readouterr().err
    assert main(["verify", str(root), "-o", str(tmp_path)]) == 1
    assert "is a directory: give a file's path" in capsys.readouterr().err

