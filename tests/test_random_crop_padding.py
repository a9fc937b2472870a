"""RandomCrop with padding (`transforms._geometric.RandomCrop`, `_loading/decoding/padding.py`).

Protects: each sample's pixels equal the padded image cropped at the box that sample drew
(torchvision v2's `pad` + `crop` where torchvision is installed, numpy's `pad` always; tolerance
0), through the native backend (JPEGs by the per-batch path and by the per-sample walk, PNGs
through Pillow) and the Pillow backend, for every padding form (int, (lr, tb), (l, t, r, b)),
`pad_if_needed` (on images smaller than the crop), scalar and per-channel fills, the four
padding modes, flips before and after the crop, a crop after a resize and a crop of the padded
crop; the conversion from torchvision v1/v2 and timm's RandomCropOrPad (the padding's order as
each stores it); the same batches from 0 and 2 workers and through a daemon; and every refusal:
bad parameters, a resize or a second padding after a padded crop, an image larger than the
padded crop can take, DALI and the GPU decoders.
"""

from __future__ import annotations

import io
import warnings
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from fastload import ConfigError, FastLoader
from fastload import transforms as T
from fastload._loading.decoding.backend import make_backend
from fastload._loading.decoding.native import png_size
from fastload._loading.decoding.padding import fold
from fastload._native_jpeg import native_jpeg
from fastload._sample_random import SampleDraws
from fastload.transforms._batch_geometry import sample_batch

MODES = ("constant", "edge", "reflect", "symmetric")


def _v2_functional() -> Any:
    """torchvision.transforms.v2.functional, or None where torchvision is not installed."""
    try:
        import torchvision.transforms.v2.functional as F
    except ImportError:
        return None
    return F


def _image(height: int, width: int, seed: int) -> np.ndarray:
    """Smooth-ish uint8 RGB pixels (noise on gradients: a JPEG keeps them close)."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, width)[None, :, None] + np.linspace(0, 50, height)[:, None, None]
    return np.clip(rng.normal(0, 20, (height, width, 3)) + ramp, 0, 255).astype(np.uint8)


def _encoded(pixels: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def _decoded(blob: bytes, backend: str) -> np.ndarray:
    """The whole image as the backend decodes it (for JPEGs, native's own libjpeg-turbo)."""
    jpeg = native_jpeg()
    if backend == "native" and blob[:2] == b"\xff\xd8" and jpeg is not None:
        width, height = jpeg.jpeg_size(blob)
        out = np.empty((height, width, 3), np.uint8)
        jpeg.decode_crop_resize(blob, (0.0, 0.0, float(width), float(height)), out, height, width)
        return out
    with Image.open(io.BytesIO(blob)) as img:
        return np.asarray(img.convert("RGB")).copy()


def _effective_pads(crop: T.RandomCrop, height: int, width: int) -> tuple[int, int, int, int]:
    """(left, top, right, bottom): v2's padding with `pad_if_needed`'s additions."""
    left, top, right, bottom = crop.pads()
    crop_h, crop_w = _size(crop)
    if crop.pad_if_needed and height + top + bottom < crop_h:
        lack = crop_h - (height + top + bottom)
        top, bottom = top + lack, bottom + lack
    if crop.pad_if_needed and width + left + right < crop_w:
        lack = crop_w - (width + left + right)
        left, right = left + lack, right + lack
    return left, top, right, bottom


def _size(crop: T.RandomCrop) -> tuple[int, int]:
    return (crop.size, crop.size) if isinstance(crop.size, int) else (crop.size[0], crop.size[-1])


def _reference(pixels: np.ndarray, crop: T.RandomCrop, top: int, left: int) -> np.ndarray:
    """The padded image cropped at (top, left) of the unpadded image (numpy's pad; its modes are
    torchvision's), checked against torchvision v2's `pad` + `crop` where it is installed."""
    height, width = pixels.shape[:2]
    pl, pt, pr, pb = _effective_pads(crop, height, width)
    crop_h, crop_w = _size(crop)
    widths = ((pt, pb), (pl, pr), (0, 0))
    if crop.padding_mode == "constant":
        fill = np.trunc(np.broadcast_to(np.asarray(crop.fill, np.float64), (3,))).astype(np.uint8)
        padded = np.stack([np.pad(pixels[..., c], widths[:2], constant_values=fill[c]) for c in range(3)], -1)
    else:
        padded = np.pad(pixels, widths, mode=crop.padding_mode)
    expected = padded[top + pt : top + pt + crop_h, left + pl : left + pl + crop_w]
    F = _v2_functional()
    if F is not None and not (crop.padding_mode == "reflect" and max(pl, pr) >= width):
        fill = list(crop.fill) if isinstance(crop.fill, tuple) else crop.fill
        chw = torch.from_numpy(pixels).permute(2, 0, 1)
        theirs = F.pad(chw, [pl, pt, pr, pb], fill=fill, padding_mode=crop.padding_mode)
        theirs = F.crop(theirs, top + pt, left + pl, crop_h, crop_w).permute(1, 2, 0).numpy()
        assert np.array_equal(theirs, expected), "numpy's pad is not torchvision's here"
    return expected


def _check_batch(
    chain: list[T.Transform], blobs: list[bytes], backend: str, indices: np.ndarray | None = None
) -> int:
    """Decode `blobs` through `backend` with a task's draws; each sample must be the reference
    for the box it drew. Returns how many samples reached the padding."""
    plan = T.compile_transforms(chain)
    draws = SampleDraws(5, 1, np.arange(len(blobs)) if indices is None else indices)
    out = np.zeros((len(blobs), plan.out_height, plan.out_width, 3), np.uint8)
    make_backend(backend, plan).decode_batch(blobs, draws, out)
    padded = 0
    for i, blob in enumerate(blobs):
        pixels = _decoded(blob, backend)
        rng = draws[i]
        flip_before = False
        crop: T.RandomCrop | None = None
        flip_after = False
        for t in chain:  # the chain's own draws, in order (flips, then the crop, then flips)
            if isinstance(t, T.RandomHorizontalFlip):
                drew = rng.random() < t.p
                if crop is None:
                    flip_before ^= drew
                else:
                    flip_after ^= drew
            elif isinstance(t, T.RandomCrop):
                crop = t
                image = pixels[:, ::-1] if flip_before else pixels
                top, left, _, _ = t.sample_box(image.shape[0], image.shape[1], rng)
                expected = _reference(np.ascontiguousarray(image), t, top, left)
        assert crop is not None
        if flip_after:
            expected = expected[:, ::-1]
        assert np.array_equal(out[i], expected), (i, backend)
        height, width = pixels.shape[:2]
        padded += int(plan.sample(height, width, draws[i]).needs_padding)
    return padded


FORMS: dict[str, dict[str, Any]] = {
    "int": {"size": 32, "padding": 4},
    "lr-tb": {"size": (30, 26), "padding": (2, 5)},
    "ltrb": {"size": 32, "padding": (1, 2, 3, 4)},
    "if-needed": {"size": 40, "pad_if_needed": True},
    "both": {"size": (44, 36), "padding": (3, 0), "pad_if_needed": True},
    "none": {"size": 24},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize(("backend", "fmt"), [("native", "JPEG"), ("native", "PNG"), ("pil", "PNG")])
def test_each_sample_is_the_padded_image_cropped_where_it_drew(
    mode: str, form: str, backend: str, fmt: str
) -> None:
    if backend == "native" and fmt == "JPEG" and native_jpeg() is None:
        pytest.skip("fastload's native extension is not built")
    crop = T.RandomCrop(**FORMS[form], fill=(10, 200, 31) if mode == "constant" else 0, padding_mode=mode)
    blobs = [_encoded(_image(28 + i % 3, 32 + 2 * (i % 4), i), fmt) for i in range(16)]
    padded = _check_batch([crop, T.RandomHorizontalFlip()], blobs, backend)
    assert padded > (0 if form != "none" else -1) and (form != "none" or padded == 0)


@pytest.mark.parametrize("fill", [0, 128, 77.9, (10, 20, 30), (255,)])
def test_fills_are_truncated_to_uint8_as_torchvision_casts_them(fill: Any) -> None:
    blobs = [_encoded(_image(32, 32, i), "PNG") for i in range(8)]
    assert _check_batch([T.RandomCrop(32, padding=6, fill=fill)], blobs, "pil") > 0


@pytest.mark.parametrize("mode", MODES)
def test_flips_before_the_crop_mirror_where_the_padding_lands(mode: str) -> None:
    blobs = [_encoded(_image(30, 34, i), "PNG") for i in range(12)]
    chain: list[T.Transform] = [
        T.RandomHorizontalFlip(0.5),
        T.RandomCrop(32, padding=(5, 1, 2, 3), padding_mode=mode),
    ]
    assert _check_batch(chain, blobs, "native") > 0


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "mixed"])
def test_the_per_batch_and_per_sample_paths_decode_the_same_pixels(fmt: str) -> None:
    if native_jpeg() is None:
        pytest.skip("fastload's native extension is not built")
    formats = ["JPEG", "PNG", "BMP"] if fmt == "mixed" else [fmt]  # BMP: neither, sample by sample
    blobs = [_encoded(_image(32, 30 + i % 5, i), formats[i % len(formats)]) for i in range(12)]
    plan = T.compile_transforms(
        [T.RandomCrop(32, padding=4, padding_mode="reflect"), T.RandomHorizontalFlip()]
    )
    draws = SampleDraws(2, 0, np.arange(12))
    batched, walked = (np.zeros((12, 32, 32, 3), np.uint8) for _ in range(2))
    backend = make_backend("native", plan)
    backend.decode_batch(blobs, draws, batched)
    backend.decode_batch(blobs, list(draws), walked)  # not SampleDraws: sample by sample
    assert np.array_equal(batched, walked)


def test_a_png_header_gives_its_size_or_nothing() -> None:
    blob = _encoded(_image(20, 36, 0), "PNG")
    assert png_size(blob) == (36, 20) and png_size(memoryview(blob)) == (36, 20)
    assert png_size(blob[:20]) is None and png_size(_encoded(_image(20, 36, 0), "JPEG")) is None
    assert png_size(blob[:12] + b"tEXt" + blob[16:]) is None  # IHDR not first: Pillow reads it


def test_a_padded_crop_after_a_resize_pads_the_resized_image() -> None:
    # Resize then pad-and-crop: the padding exactly, the part inside the resized image's pixels
    # within a level (its box resampled alone: Pillow rounds a box to float32, so the filter's
    # centres may move by an ulp; seen with Pillow 13, not 12), as Resize + CenterCrop.
    blobs = [_encoded(_image(40, 52, i), "PNG") for i in range(6)]
    plan = T.compile_transforms([T.Resize((36, 36)), T.RandomCrop(32, padding=4, fill=9)])
    whole = T.compile_transforms([T.Resize((36, 36))])
    draws = SampleDraws(1, 0, np.arange(6))
    out = np.zeros((6, 32, 32, 3), np.uint8)
    resized = np.zeros((6, 36, 36, 3), np.uint8)
    make_backend("pil", plan).decode_batch(blobs, draws, out)
    make_backend("pil", whole).decode_batch(blobs, SampleDraws(1, 0, np.arange(6)), resized)
    for i in range(6):
        top, left, _, _ = plan.geometry[1].sample_box(36, 36, draws[i])  # type: ignore[attr-defined]
        expected = _reference(resized[i], T.RandomCrop(32, padding=4, fill=9), top, left)
        assert np.abs(out[i].astype(np.int16) - expected).max() <= 1
        inside = _reference(np.ones((36, 36, 3), np.uint8), T.RandomCrop(32, padding=4), top, left) == 1
        assert not inside.all() and np.all(out[i][~inside] == 9)


def test_a_crop_of_the_padded_crop_moves_where_the_image_lies() -> None:
    blobs = [_encoded(_image(32, 32, i), "PNG") for i in range(8)]
    plan = T.compile_transforms([T.RandomCrop(32, padding=4, padding_mode="edge"), T.CenterCrop(30)])
    padded_plan = T.compile_transforms([T.RandomCrop(32, padding=4, padding_mode="edge")])
    out, full = np.zeros((8, 30, 30, 3), np.uint8), np.zeros((8, 32, 32, 3), np.uint8)
    make_backend("pil", plan).decode_batch(blobs, SampleDraws(3, 0, np.arange(8)), out)
    make_backend("pil", padded_plan).decode_batch(blobs, SampleDraws(3, 0, np.arange(8)), full)
    assert np.array_equal(out, full[:, 1:31, 1:31])


def test_fold_is_numpys_pad_for_long_pads_too() -> None:
    row = np.arange(5)
    for mode in ("edge", "reflect", "symmetric"):
        positions = np.arange(-13, 18)
        assert np.array_equal(row[fold(positions, 5, mode)], np.pad(row, (13, 13), mode=mode)), mode
    assert np.array_equal(fold(np.arange(-3, 4), 1, "reflect"), np.zeros(7, np.int64))


def test_the_batch_geometry_records_where_each_image_lies() -> None:
    plan = T.compile_transforms([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()])
    draws = SampleDraws(0, 0, np.arange(4000))
    batch = sample_batch(plan, np.full(4000, 32), np.full(4000, 32), draws.uniforms)
    assert batch is not None and batch.image_rects is not None
    assert np.all(np.abs(batch.image_rects[:, :2]) <= 4) and np.all(
        batch.image_rects[:, 2:] - batch.image_rects[:, :2] == 32
    )
    assert 0.97 < batch.needs_padding().mean() < 1.0  # 1 in 81 crops falls exactly on the image
    assert (
        sample_batch(
            T.compile_transforms([T.RandomCrop(40)]), np.full(2, 32), np.full(2, 32), draws.uniforms[:2]
        )
        is None
    )


CHAIN_48 = [
    T.RandomCrop(48, padding=4, pad_if_needed=True, padding_mode="reflect"),
    T.RandomHorizontalFlip(),
]
COMMON: dict[str, Any] = {
    "batch_size": 8,
    "shuffle": True,
    "seed": 11,
    "device": "cpu",
    "transform": CHAIN_48,
}


def test_zero_and_two_workers_give_the_same_batches(image_folder: Any) -> None:
    common = COMMON
    with (
        FastLoader(image_folder, num_workers=0, **common) as inline,
        FastLoader(image_folder, num_workers=2, **common) as pool,
    ):
        batches = 0
        for (xa, ya), (xb, yb) in zip(inline, pool, strict=True):
            assert xa.shape == (8, 3, 48, 48) and torch.equal(xa, xb) and torch.equal(ya, yb)
            batches += 1
        assert batches == 3


def test_a_daemon_gives_the_same_batches(image_folder: Any, shared_daemon: Any) -> None:
    # The chain crosses to the daemon as JSON (padding and fill included) and its workers pad.
    with (
        FastLoader(image_folder, num_workers=0, **COMMON) as inline,
        FastLoader(image_folder, daemon=shared_daemon.address, **COMMON) as served,
    ):
        pairs = list(zip(inline, served, strict=True))
        assert len(pairs) == 3 and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in pairs)


def _fake_torchvision(version: str, **attributes: Any) -> Any:
    """An object read as torchvision's RandomCrop (its class's module names torchvision)."""
    module = "torchvision.transforms.v2._geometry" if version == "v2" else "torchvision.transforms.transforms"
    cls = type("RandomCrop", (), {"__module__": module})
    obj = cls()
    obj.__dict__.update(attributes)
    return obj


def test_conversion_reads_each_versions_padding_order() -> None:
    common = {"size": (32, 32), "pad_if_needed": False, "padding_mode": "reflect", "fill": 0}
    # v2 stores [left, right, top, bottom]; v1 keeps what it was given: (left, top, right, bottom).
    (v2,), _ = T.from_torchvision(_fake_torchvision("v2", padding=[1, 3, 2, 4], **common))
    (v1,), _ = T.from_torchvision(_fake_torchvision("v1", padding=(1, 2, 3, 4), **common))
    assert v1 == v2 == T.RandomCrop((32, 32), padding=(1, 2, 3, 4), padding_mode="reflect")
    (v2,), _ = T.from_torchvision(_fake_torchvision("v2", padding=[4, 4, 4, 4], **common))
    assert v2 == T.RandomCrop((32, 32), padding=4, padding_mode="reflect")
    (plain,), _ = T.from_torchvision(_fake_torchvision("v1", padding=None, **{**common, "fill": (1, 2, 3)}))
    assert plain == T.RandomCrop((32, 32), fill=(1.0, 2.0, 3.0), padding_mode="reflect")


def _torchvision() -> ModuleType:
    pytest.importorskip(
        "torchvision", reason="torchvision is not installed: the real conversion is compared where it is"
    )
    import torchvision.transforms
    import torchvision.transforms.v2  # a submodule: an attribute once imported

    return torchvision.transforms


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_conversion_from_torchvision_keeps_the_padding(version: str) -> None:
    tv = _torchvision()
    m = tv.v2 if version == "v2" else tv
    pipeline = m.Compose([m.RandomCrop(32, padding=(1, 2, 3, 4), fill=(5, 6, 7)), m.RandomHorizontalFlip()])
    transforms, normalize = T.from_torchvision(pipeline)
    crop = T.RandomCrop((32, 32), padding=(1, 2, 3, 4), fill=(5.0, 6.0, 7.0))
    assert transforms == (crop, T.RandomHorizontalFlip())
    (cifar,), _ = T.from_torchvision(m.RandomCrop(32, padding=4, padding_mode="edge", pad_if_needed=True))
    assert (
        cifar == T.RandomCrop((32, 32), padding=4, pad_if_needed=True, padding_mode="edge")
        and normalize is None
    )


def test_the_config_round_trip_keeps_every_parameter() -> None:
    crop = T.RandomCrop(
        (30, 20), padding=(1, 2, 3, 4), pad_if_needed=True, fill=(1, 2, 3), padding_mode="symmetric"
    )
    assert T.from_config(T.to_config([crop])) == (crop,)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"padding": -1}, "padding must be"),
        ({"padding": (1, 2, 3)}, "padding must be"),
        ({"padding": 1.5}, "padding must be"),
        ({"padding": (1, True)}, "padding must be"),
        ({"padding_mode": "wrap"}, "padding_mode must be"),
        ({"fill": 300}, "fill must be"),
        ({"fill": None}, "fill must be"),
        ({"fill": (1, 2)}, "fill must be"),
        ({"pad_if_needed": 1}, "pad_if_needed must be"),
        ({"size": 0}, "size must be"),
    ],
)
def test_bad_parameters_are_refused_by_name(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=f"RandomCrop: {says}"):
        T.RandomCrop(**{"size": 8, **kwargs})


def test_what_cannot_follow_a_padded_crop_is_refused() -> None:
    for after in (T.Resize((16, 16)), T.RandomResizedCrop(16), T.RandomCrop(16, padding=2)):
        with pytest.raises(
            ConfigError, match="after a padded RandomCrop only crops without padding and flips"
        ):
            T.compile_transforms([T.RandomCrop(32, padding=4), after])
    # A crop without padding, a CenterCrop and flips may follow; anything may precede.
    T.compile_transforms(
        [
            T.Resize(40),
            T.RandomCrop(32, padding=4),
            T.RandomCrop(30),
            T.CenterCrop(28),
            T.RandomHorizontalFlip(),
        ]
    )
    T.compile_transforms([T.RandomCrop(32), T.Resize((16, 16))])


def test_an_image_the_padded_crop_cannot_take_fails_its_sample() -> None:
    plan = T.compile_transforms([T.RandomCrop(40, padding=2)])
    out = np.zeros((1, 40, 40, 3), np.uint8)
    with pytest.raises(
        Exception, match=r"RandomCrop\(40\) is larger than the 32x32 image .*pad_if_needed=True"
    ):
        make_backend("pil", plan).decode_batch(
            [_encoded(_image(32, 32, 0), "PNG")], SampleDraws(0, 0, np.arange(1)), out
        )


def test_dali_and_the_gpu_decoders_refuse_padding_by_name() -> None:
    plan = T.compile_transforms([T.RandomCrop(32, padding=4)])
    with pytest.raises(ConfigError, match=r"backend='dali' cannot pad a crop .*backend='native'"):
        make_backend("dali", plan)
    from fastload._loading.running.dali_executor import DaliExecutor

    for decoder in ("dali", "nvjpeg"):
        with pytest.raises(
            ConfigError, match=f"backend='{decoder}' on the trainer's device cannot pad a crop"
        ):
            DaliExecutor(None, plan, 0, 8, None, torch.device("cpu"), decoder=decoder)  # type: ignore[arg-type]
    # Without padding they are not refused for it (DALI's own absence aside).
    T.compile_transforms([T.RandomCrop(32)]).padded_crop is None  # noqa: B015


def test_timms_random_crop_or_pad_is_a_random_crop_padded_where_needed() -> None:
    cls = type("RandomCropOrPad", (), {"__module__": "timm.data.transforms"})
    fake = cls()
    fake.__dict__.update(size=(32, 32), fill=(1, 2, 3), padding_mode="reflect")
    (crop,), _ = T.from_torchvision(fake)
    assert crop == T.RandomCrop((32, 32), pad_if_needed=True, fill=(1.0, 2.0, 3.0), padding_mode="reflect")


def test_timms_own_random_crop_or_pad_converts() -> None:
    from test_timm import timm_data

    tv = _torchvision()
    pipeline = tv.Compose(
        [timm_data().transforms.RandomCropOrPad(40, padding_mode="reflect"), tv.RandomHorizontalFlip()]
    )
    transforms, _ = T.from_torchvision(pipeline)
    assert transforms == (
        T.RandomCrop((40, 40), pad_if_needed=True, padding_mode="reflect"),
        T.RandomHorizontalFlip(),
    )


def test_lists_are_kept_as_tuples() -> None:
    crop = T.RandomCrop(8, padding=[1, 2], fill=[3, 4, 5])
    assert crop == T.RandomCrop(8, padding=(1, 2), fill=(3, 4, 5)) and hash(crop) == hash(
        T.RandomCrop(8, (1, 2), fill=(3, 4, 5))
    )


def test_v1s_double_padding_is_said_where_it_differs() -> None:
    common = {"size": (32, 32), "pad_if_needed": True, "fill": 0}
    with pytest.warns(UserWarning, match="v1 pads twice"):
        T.from_torchvision(_fake_torchvision("v1", padding=2, padding_mode="reflect", **common))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # v2, or a mode whose second padding is the first's: nothing said
        T.from_torchvision(_fake_torchvision("v2", padding=[2, 2, 2, 2], padding_mode="reflect", **common))
        T.from_torchvision(_fake_torchvision("v1", padding=2, padding_mode="edge", **common))
