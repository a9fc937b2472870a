"""A pack of a dataset with broken samples (`fastload pack --exclude LIST --on-error skip|raise`).

Protects: a pack never holds a broken sample (empty, not an image, a JPEG or PNG cut short) as if
good, with or without `--max-side`: by default the run stops naming the file and how to go on
(the samples packed so far kept), and `on_error="skip"`, run again, goes on and leaves such
samples out, listed with why in the manifest and said at the end; `exclude=` takes the list
`fastload verify` writes, the manifest records it and a resume with another list is refused; the
pack is byte-identical for any worker count, after a resume, and on Ray; the command line's
flags; `pack --help` names every source kind it takes (an HDF5 file of images among them); a
destination that cannot be written fails before any sample is read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import build_folder
from test_sources_packed import interrupted_pack

from fastload import ConfigError, DatasetError, FastLoader, sources
from fastload import transforms as T
from fastload.__main__ import main
from fastload._diagnostics.verify import verify
from fastload._exclusion import write_list
from fastload.sources._packing import reencode as _reencode
from fastload.sources._packing import writer as _pack_writer
from fastload.sources._packing.image_bytes import damage

pytestmark = pytest.mark.timeout(120)
SHARD = 40_000


def _break(root: Path) -> dict[str, str]:
    """Four broken files of the kinds a plain pack must not copy: path -> what the error says."""
    images = sorted(p for p in root.glob("*/*") if p.suffix.lower() in (".jpg", ".jpeg"))
    empty, text, cut = images[1], images[5], images[9]
    png = next(root.glob("*/*.png"))
    empty.write_bytes(b"")
    text.write_bytes(b"<html>403 Forbidden</html>" * 10)
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    png_data = png.read_bytes()
    png.write_bytes(png_data[: len(png_data) // 2])
    return {
        str(empty): "empty file",
        str(text): "not an image",
        str(cut): "truncated JPEG",
        str(png): "truncated PNG",
    }


@pytest.fixture(scope="module")
def dirty(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = build_folder(tmp_path_factory.mktemp("dirty") / "data", classes=3, per_class=6)
    return root, _break(root)


@pytest.fixture(scope="module")
def clean_part(dirty: tuple[Path, dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pack of `dirty` with its broken samples left out (plain, uninterrupted, one worker)."""
    dst = tmp_path_factory.mktemp("packs") / "skipped"
    _skipping(dirty[0], dst, shard_bytes=SHARD)
    return dst


def _skipping(src: Path, dst: Path, **options: Any) -> None:
    """`pack(..., on_error="skip", progress=False)`, which warns of the samples it left out."""
    with pytest.warns(UserWarning, match=r"left out 4 samples .*manifest\.json"):
        sources.pack(src, dst, progress=False, on_error="skip", **options)


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _labels(loader: FastLoader) -> list[int]:
    return sorted(int(x) for batch in loader for x in batch[1])


def test_the_byte_checks_find_what_training_fails_on(image_folder: Path) -> None:
    """Cheap checks; a PNG without its IEND chunk but with all its pixels decodes (in training
    too), so it is not broken; a WebP shorter than its header says is."""
    png = next(image_folder.glob("*/*.png")).read_bytes()
    jpeg = next(image_folder.glob("*/*.jpg")).read_bytes()
    assert damage(png) is None and damage(jpeg) is None and damage(memoryview(jpeg)) is None
    assert damage(png[:-12]) is None
    assert damage(png[: len(png) // 2]) == "truncated PNG: no IEND chunk"
    assert damage(jpeg[:-2]) == f"truncated JPEG: no end-of-image marker ({len(jpeg) - 2} bytes)"
    assert damage(b"RIFF\xff\x00\x00\x00WEBPVP8 ") == "truncated WebP: 16 of 263 bytes"
    assert damage(b"GIF89a" + bytes(20)) is None and damage(b"P6 2 2 255\n" + bytes(12)) is None
    assert damage(b"") == "empty file (0 bytes)"  # the words every decoder reports (`_encoded_bytes`)
    assert damage(b"%PDF-1.4 ...") == "not an image: starts with b'%PDF-1.4' (text?) (12 bytes)"


def test_a_broken_sample_stops_the_pack_naming_it_and_skip_goes_on(
    dirty: tuple[Path, dict[str, str]], clean_part: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, broken = dirty
    dst = tmp_path / "pack"
    first = min(broken)  # in the folder's order, the first broken file stops the run
    said = rf"{first} is not a whole image \({broken[first]}.*--on-error skip.*fastload verify SRC"
    with pytest.raises(DatasetError, match=said):
        sources.pack(root, dst, shard_bytes=SHARD, progress=False)
    with pytest.raises(DatasetError, match="incomplete pack"):
        sources.Packed(str(dst)).open()
    # The same command with on_error="skip" goes on from there and leaves out every broken one.
    sources.pack(root, dst, shard_bytes=SHARD, on_error="skip")
    err = capsys.readouterr().err
    assert f"left out {len(broken)} samples" in err and "manifest.json" in err
    assert _files(dst) == _files(clean_part)  # as if it had skipped from the start
    manifest = json.loads((dst / "manifest.json").read_text())
    assert {name for name, _ in manifest["skipped"]} == set(broken)
    for name, why in manifest["skipped"]:
        assert broken[name] in why
    assert manifest["count"] == 18 - len(broken) and manifest["excluded"] == []
    names = sources.Packed(str(dst)).open()
    assert not {root / names.name(i) for i in range(len(names))} & {Path(b) for b in broken}
    # A complete pack run again is left alone: the samples left out do not make it "changed".
    sources.pack(root, dst, shard_bytes=SHARD, progress=False, on_error="skip")
    assert _files(dst) == _files(clean_part)
    with FastLoader(str(dst), batch_size=4, device="cpu", transform=[T.Resize((16, 16))]) as loader:
        assert len(_labels(loader)) == 18 - len(broken)
    assert verify(dst, workers=1).broken == []  # what it holds all decodes


@pytest.mark.parametrize(("workers", "at"), [(1, 2), (2, 3)])
def test_skipping_gives_the_same_pack_for_any_workers_and_after_a_resume(
    dirty: tuple[Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, at: int
) -> None:
    root, broken = dirty
    options: dict[str, Any] = {"shard_bytes": SHARD, "max_side": 64}
    whole = tmp_path / "whole"
    _skipping(root, whole, workers=1, **options)
    assert len(json.loads((whole / "manifest.json").read_text())["skipped"]) == len(broken)
    monkeypatch.setattr(_reencode, "TASK_SAMPLES", 2)
    resumed = tmp_path / "resumed"
    interrupted_pack(monkeypatch, root, resumed, "read", at, workers=workers, on_error="skip", **options)
    _skipping(root, resumed, workers=workers, **options)
    assert _files(resumed) == _files(whole)
    # A plain pack interrupted too: the same as an uninterrupted one.
    plain, again = tmp_path / "plain", tmp_path / "again"
    _skipping(root, plain, shard_bytes=SHARD)
    interrupted_pack(monkeypatch, root, again, "read", at, shard_bytes=SHARD, on_error="skip")
    _skipping(root, again, shard_bytes=SHARD)
    assert _files(again) == _files(plain)


def test_a_verify_list_excludes_samples_and_a_resume_must_give_the_same(
    dirty: tuple[Path, dict[str, str]], clean_part: Path, tmp_path: Path
) -> None:
    root, broken = dirty
    found = verify(root, workers=1)
    assert {name for name, _ in found.broken} == set(broken)
    listed = tmp_path / "bad.txt"
    write_list(listed, found.broken, "broken")
    dst = tmp_path / "pack"
    sources.pack(root, dst, shard_bytes=SHARD, progress=False, exclude=listed)  # on_error="raise"
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["excluded"] == sorted(broken) and manifest["skipped"] == []
    assert manifest["count"] == 18 - len(broken)
    # The same samples as a pack that skipped them: the same data and index, another manifest.
    assert {k: v for k, v in _files(dst).items() if k != "manifest.json"} == {
        k: v for k, v in _files(clean_part).items() if k != "manifest.json"
    }
    for other in (None, [sorted(broken)[0]]):
        with pytest.raises(ConfigError, match=r"leaving out 4 samples.*same --exclude list"):
            sources.pack(root, dst, shard_bytes=SHARD, progress=False, exclude=other)
    with pytest.raises(ConfigError, match="does not hold"):
        sources.pack(root, tmp_path / "other", progress=False, exclude=[str(root / "no-such.jpg")])


def test_the_command_line_takes_exclude_and_on_error(
    dirty: tuple[Path, dict[str, str]], clean_part: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, broken = dirty
    listed = tmp_path / "bad.txt"
    assert main(["verify", str(root), "-o", str(listed), "--workers", "1", "--quiet"]) == 1
    dst = tmp_path / "listed"
    assert main(["pack", str(root), str(dst), "--shard-size", str(SHARD), "--exclude", str(listed)]) == 0
    assert json.loads((dst / "manifest.json").read_text())["excluded"] == sorted(broken)
    capsys.readouterr()
    skipped = tmp_path / "skipped"
    assert main(["pack", str(root), str(skipped), "--shard-size", str(SHARD), "--quiet"]) == 1
    assert "is not a whole image" in capsys.readouterr().err
    assert main(["pack", str(root), str(skipped), "--shard-size", str(SHARD), "--on-error", "skip"]) == 0
    assert f"left out {len(broken)} samples" in capsys.readouterr().err
    assert _files(skipped) == _files(clean_part)


def test_the_help_names_every_source_kind_and_an_hdf5_file_packs(
    image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for kind in ("a folder", "a file list", "tar shards", "an HDF5 file of encoded images", "or a pack", "s3://"):
        assert kind in text
    h5py = pytest.importorskip("h5py")
    files = sorted(p for p in image_folder.glob("*/*"))
    with h5py.File(tmp_path / "images.h5", "w") as f:
        images = f.create_dataset("images", (len(files),), dtype=h5py.vlen_dtype(np.uint8))
        for i, path in enumerate(files):
            images[i] = np.frombuffer(path.read_bytes(), np.uint8)
        f.create_dataset("labels", data=np.arange(len(files)) % 3)
    assert main(["pack", str(tmp_path / "images.h5"), str(tmp_path / "pack"), "--quiet"]) == 0
    assert len(sources.Packed(str(tmp_path / "pack")).open()) == len(files)


def test_a_destination_that_cannot_be_written_fails_before_any_read(
    image_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(_pack_writer, "made_batches", None)  # reading a sample would fail otherwise
    assert main(["pack", str(image_folder), str(blocker / "pack")]) == 1
    assert f"cannot write the pack at {blocker / 'pack'}" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails
    with pytest.raises(ConfigError, match=r"needs Ray.*pip install 'fastload\[ray\]'"):
        sources.pack(image_folder, tmp_path / "ray", progress=False, ray=True)
    assert not (tmp_path / "ray").exists()
