"""Packs with smaller stored images (`sources.pack(max_side=...)`, `fastload pack --max-side N`).

Protects: images whose longer side exceeds N come back with that side N and the source's aspect
(the shorter side rounded), close to a Lanczos resize of the source; smaller ones are the source's
bytes; JPEGs and alpha-less PNGs become JPEGs (gray ones gray), PNGs with alpha stay PNGs with
alpha; labels, names and order are the plain pack's; the bytes do not depend on the worker count;
the manifest records the options and old packs without them still load; an interrupted pack
finishes byte-identical to an uninterrupted one, with the pool or without; resuming with other
options is refused; unreadable images, and a PNG without Pillow, are errors naming the file; the
CLI flags work through `main(argv)`; without the native extension Pillow makes the same
images; the native encoder is deterministic and checks its arguments.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import photo_like
from test_sources_packed import Interrupted, _interrupt_at

from fastload import ConfigError, DatasetError, FastLoader, sources
from fastload import transforms as T
from fastload.__main__ import main
from fastload.sources._packing import data_files
from fastload.sources._packing import reencode as _reencode
from fastload.sources._packing import writer as _pack_writer

Image = pytest.importorskip("PIL.Image")
jpeg = pytest.importorskip("fastload._jpeg")

N = 100
# (name, width, height, kind): kinds "rgb" and "gray" are JPEGs at quality 95; "png" RGB, "rgba"
# PNG with a transparent corner.
IMAGES = [
    ("a/0.jpg", 160, 120, "rgb"),  # landscape, over N
    ("a/1.jpg", 90, 140, "rgb"),  # portrait, over N
    ("a/2.jpg", 100, 64, "rgb"),  # exactly N: kept
    ("a/3.jpg", 80, 60, "rgb"),  # within N: kept
    ("a/4.jpg", 333, 101, "gray"),  # wide gray, over N
    ("b/0.png", 130, 110, "png"),  # over N: becomes a JPEG
    ("b/1.png", 120, 150, "rgba"),  # over N, alpha: a smaller PNG
    ("b/2.png", 70, 90, "rgba"),  # within N: kept
    ("b/3.jpg", 401, 299, "rgb"),  # large enough for a DCT-scaled decode (1/2 or 1/4)
    ("c/0.jpg", 99, 101, "rgb"),  # just over N
    ("c/1.jpg", 128, 96, "gray"),
    ("c/2.jpg", 64, 200, "rgb"),
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("max_side") / "data"
    for k, (name, width, height, kind) in enumerate(IMAGES):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        image = photo_like(np.random.default_rng(k), width, height)
        if kind == "gray":
            image.convert("L").save(path, format="JPEG", quality=95)
        elif kind == "rgb":
            image.save(path, format="JPEG", quality=95)
        elif kind == "png":
            image.save(path, format="PNG")
        else:
            rgba = image.convert("RGBA")
            alpha = np.full((height, width), 255, np.uint8)
            alpha[: height // 3, : width // 3] = 0
            rgba.putalpha(Image.fromarray(alpha))
            rgba.save(path, format="PNG")
    return root


@pytest.fixture(scope="module")
def reduced(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("packs") / "reduced"
    sources.pack(folder, dst, progress=False, max_side=N, workers=1)
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _samples(pack: Path) -> list[bytes]:
    index = sources.Packed(str(pack)).open()
    return [bytes(b) for b in index.read(np.arange(len(index)))]


def test_large_images_are_resized_and_small_ones_kept(folder: Path, reduced: Path, tmp_path: Path) -> None:
    plain = sources.pack(folder, tmp_path / "plain", progress=False)
    stored = _samples(reduced)
    index, plain_index = sources.Packed(str(reduced)).open(), plain.open()
    assert index.labels.tolist() == plain_index.labels.tolist()
    assert [index.name(i) for i in range(len(index))] == [plain_index.name(i) for i in range(len(index))]
    by_name = {name: (width, height, kind) for name, width, height, kind in IMAGES}
    for i, blob in enumerate(stored):
        name = index.name(i).split(":", 1)[-1]
        width, height, kind = by_name[name]
        source = (folder / name).read_bytes()
        if max(width, height) <= N:
            assert blob == source, name
            continue
        with Image.open(io.BytesIO(blob)) as got:
            longer, shorter = max(got.size), min(got.size)
            assert longer == N and (got.width >= got.height) == (width >= height), (name, got.size)
            assert shorter == round(min(width, height) * N / max(width, height)), (name, got.size)
            assert got.format == ("PNG" if kind == "rgba" else "JPEG"), name
            assert got.mode == {"gray": "L", "rgba": "RGBA"}.get(kind, "RGB"), name
            # The pixels are the source's, resized: close to Pillow's Lanczos resize of it.
            with Image.open(folder / name) as src:
                mode = "RGBA" if kind == "rgba" else "RGB"
                want = np.asarray(src.convert(mode).resize(got.size, Image.Resampling.LANCZOS), np.float64)
            have = np.asarray(got.convert(mode), np.float64)
            mse = np.mean((have - want) ** 2)
            assert mse < 255**2 / 1e3, (name, mse)  # PSNR > 30 dB


def test_manifest_records_the_options_and_old_packs_load(folder: Path, reduced: Path, tmp_path: Path) -> None:
    manifest = json.loads((reduced / "manifest.json").read_text())
    assert manifest["max_side"] == N and manifest["quality"] == 90 and manifest["complete"]
    plain = tmp_path / "plain"
    sources.pack(folder, plain, progress=False)
    old = json.loads((plain / "manifest.json").read_text())
    assert old["max_side"] is None and old["quality"] is None
    # A pack made before the option: no such keys. It loads, and `pack` leaves it alone.
    del old["max_side"], old["quality"]
    (plain / "manifest.json").write_text(json.dumps(old))
    assert len(sources.Packed(str(plain)).open()) == len(IMAGES)
    sources.pack(folder, plain, progress=False)
    with pytest.raises(ConfigError, match=r"source's bytes \(no --max-side\), not with --max-side 100"):
        sources.pack(folder, plain, progress=False, max_side=N)


def test_the_bytes_do_not_depend_on_the_worker_count(
    folder: Path, reduced: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reencode, "TASK_SAMPLES", 2)  # 6 tasks over 3 processes
    sources.pack(folder, tmp_path / "pool", progress=False, max_side=N, workers=3)
    assert _files(tmp_path / "pool") == _files(reduced)


def test_the_loader_reads_a_reduced_pack(reduced: Path) -> None:
    augment = [T.RandomResizedCrop(32), T.RandomHorizontalFlip()]
    with FastLoader(
        str(reduced), batch_size=4, shuffle=True, num_workers=2, transform=augment, seed=3, device="cpu"
    ) as loader:
        batches = [(images.clone(), labels.clone()) for images, labels in loader]
    assert [tuple(images.shape) for images, _ in batches] == [(4, 3, 32, 32)] * 3
    labels = sorted(int(x) for _, batch in batches for x in batch)
    assert labels == sorted(sources.Packed(str(reduced)).open().labels.tolist())
    assert all(int(images.float().std()) > 0 for images, _ in batches)


@pytest.mark.parametrize(("workers", "at"), [(1, 2), (1, 4), (2, 3)])
def test_an_interrupted_pack_finishes_identical(
    folder: Path, reduced: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, at: int
) -> None:
    # 2 samples a task, a checkpoint every 3: interrupts land between checkpoints too.
    monkeypatch.setattr(_reencode, "TASK_SAMPLES", 2)
    monkeypatch.setattr(_pack_writer, "CHECKPOINT_SAMPLES", 3)
    dst = tmp_path / "train"
    with monkeypatch.context() as patch:
        _interrupt_at(patch, "read", at)  # a forked pool worker counts its own reads
        with pytest.raises(Interrupted):
            sources.pack(folder, dst, progress=False, max_side=N, workers=workers)
    with pytest.raises(DatasetError, match="incomplete pack"):
        sources.Packed(str(dst)).open()
    if workers == 1 and at == 4:
        assert np.load(dst / data_files.CHECKPOINT).shape[0] >= 6  # some samples were checkpointed
    # Other options than the pack was started with are refused, and leave it as it was.
    for other in ({}, {"max_side": N + 1}, {"max_side": N, "quality": 80}):
        with pytest.raises(ConfigError, match=r"is a pack with --max-side 100 --quality 90.*finish it"):
            sources.pack(folder, dst, progress=False, workers=workers, **other)
    sources.pack(folder, dst, progress=False, max_side=N, workers=workers)
    assert _files(dst) == _files(reduced)
    with pytest.raises(ConfigError, match=r"not with --max-side 100 --quality 80.*use those options"):
        sources.pack(folder, dst, progress=False, max_side=N, quality=80)


def test_bad_images_and_missing_pillow_are_named(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken"
    (broken / "a").mkdir(parents=True)
    data = (folder / "b/3.jpg").read_bytes()
    (broken / "a/0.jpg").write_bytes(data[: len(data) // 2])  # a truncated JPEG, over N
    cut_short = (
        r"0\.jpg is not a whole image \(truncated JPEG: no end-of-image marker.*--on-error skip.*"
        r"--exclude bad\.txt"
    )
    with pytest.raises(DatasetError, match=cut_short):
        sources.pack(broken, tmp_path / "p1", progress=False, max_side=N, workers=2)
    (broken / "a/0.jpg").write_bytes(b"hello, this is text" * 9)  # what it is, not a decoder's repr
    text = r"0\.jpg is not a whole image \(not an image: starts with b'hello, t' \(text\?\)"
    with pytest.raises(DatasetError, match=text) as info:
        sources.pack(broken, tmp_path / "p1b", progress=False, max_side=N, workers=1)
    assert " object at 0x" not in str(info.value)
    start = data.find(b"\xff\xc0") + 4  # whole, but its frame header says 7-bit samples
    (broken / "a/0.jpg").write_bytes(data[:start] + b"\x07" + data[start + 1 :])
    refused = r"cannot re-encode .*0\.jpg: cannot decode this JPEG .*precision 7"
    with pytest.raises(DatasetError, match=refused):
        sources.pack(broken, tmp_path / "p3", progress=False, max_side=N, workers=2)
    png = tmp_path / "png"
    (png / "a").mkdir(parents=True)
    (png / "a/0.png").write_bytes((folder / "b/0.png").read_bytes())
    monkeypatch.setattr(_reencode, "_pillow", lambda: None)
    with pytest.raises(ConfigError, match=r"0\.png: .*not a JPEG needs Pillow: pip install pillow"):
        sources.pack(png, tmp_path / "p2", progress=False, max_side=N, workers=1)


def test_without_the_native_extension_pillow_re_encodes(
    folder: Path, reduced: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_reencode, "built_native_jpeg", lambda: None)
    dst = tmp_path / "pillow"
    sources.pack(folder, dst, progress=False, max_side=N, workers=1)
    for blob, native in zip(_samples(dst), _samples(reduced), strict=True):
        with Image.open(io.BytesIO(blob)) as got, Image.open(io.BytesIO(native)) as want:
            assert (got.format, got.mode, got.size) == (want.format, want.mode, want.size)
            mse = np.mean((np.asarray(got, np.float64) - np.asarray(want, np.float64)) ** 2)
            assert mse < 255**2 / 10**3.5  # PSNR > 35 dB: the same images, other code


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"max_side": 8}, "max_side must be an integer of at least 16"),
        ({"max_side": N, "quality": 101}, "quality must be an integer in 1..100"),
        ({"quality": 80}, "give max_side too"),
        ({"max_side": N, "workers": 0}, "workers must be a positive integer"),
    ],
)
def test_bad_options_are_refused(folder: Path, tmp_path: Path, options: dict[str, int], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        sources.pack(folder, tmp_path / "p", progress=False, **options)
    assert not (tmp_path / "p").exists()


def test_cli(folder: Path, reduced: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "cli"
    assert main(["pack", str(folder), str(dst), "--max-side", str(N), "--workers", "2"]) == 0
    assert f"{len(IMAGES)}/{len(IMAGES)} samples" in capsys.readouterr().err
    assert _files(dst) == _files(reduced)
    q = tmp_path / "q"
    assert main(["pack", str(folder), str(q), "--max-side", str(N), "--quality", "70", "--quiet"]) == 0
    manifest = json.loads((q / "manifest.json").read_text())
    assert (manifest["max_side"], manifest["quality"]) == (N, 70)
    assert sum(map(len, _samples(q))) < sum(map(len, _samples(reduced)))
    assert capsys.readouterr().err == ""
    assert main(["pack", str(folder), str(q), "--max-side", "64", "--quiet"]) == 1
    assert "not with --max-side 64 --quality 90" in capsys.readouterr().err
    assert main(["pack", str(folder), str(tmp_path / "x"), "--quality", "70"]) == 1
    assert "give max_side too" in capsys.readouterr().err


def test_native_encoder() -> None:
    pixels = np.asarray(photo_like(np.random.default_rng(5), 70, 50))
    data = jpeg.encode_jpeg(pixels, 70, 50, 90)
    assert data == jpeg.encode_jpeg(pixels.copy(), 70, 50, 90)  # deterministic
    with Image.open(io.BytesIO(data)) as got:
        assert (got.size, got.mode) == ((70, 50), "RGB")
        error = np.abs(np.asarray(got, np.int16) - pixels).mean()
    reference = io.BytesIO()  # Pillow's libjpeg at the same settings: as close to the pixels
    Image.fromarray(pixels).save(reference, format="JPEG", quality=90, subsampling="4:2:0", optimize=True)
    with Image.open(reference) as want:
        assert error <= np.abs(np.asarray(want, np.int16) - pixels).mean() * 1.05 + 0.05
    gray = jpeg.encode_jpeg(np.ascontiguousarray(pixels[..., 0]), 70, 50, 90)
    with Image.open(io.BytesIO(gray)) as got:
        assert got.mode == "L"
    assert len(jpeg.encode_jpeg(pixels, 70, 50, 50)) < len(data)
    with pytest.raises(ValueError, match="neither 70 x 51 RGB nor gray"):
        jpeg.encode_jpeg(pixels, 70, 51, 90)
    with pytest.raises(ValueError, match=r"quality 1\.\.100"):
        jpeg.encode_jpeg(pixels, 70, 50, 0)
    with pytest.raises(TypeError):
        jpeg.encode_jpeg(pixels[:, ::2], 35, 50, 90)


@pytest.mark.parametrize(
    ("size", "fitted"),
    [((160, 120), (100, 75)), ((90, 140), (64, 100)), ((100, 64), (100, 64)), ((1000, 3), (100, 1))],
)
def test_fitted_size(size: tuple[int, int], fitted: tuple[int, int]) -> None:
    assert _reencode.fitted_size(*size, N) == fitted
