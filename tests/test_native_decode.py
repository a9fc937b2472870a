"""The native JPEG decoder, `fastload._jpeg`, against Pillow.

The reference is what Pillow computes from a full decode: `convert("RGB")`, then
`resize((out_w, out_h), filter, box=box)`, then a left-right flip. The native decoder decodes at a
DCT scale (1/2, 1/4, 1/8) when the box allows it, so it is compared by PSNR (>= 30 dB); at scale 1
it reads the same pixels and must match much more closely.

The table of PSNR and mean absolute difference per image kind and filter, over the same images
and boxes, is `tools/bench/native_quality.py`.
"""

from __future__ import annotations

import base64
import io
import math
import os
import threading
import time

import numpy as np
import pytest
from PIL import Image

from fastload._demo import photo_like

_jpeg = pytest.importorskip(
    "fastload._jpeg",
    reason="fastload._jpeg is not built (needs libjpeg-turbo headers at install time)",
)

BILINEAR, BICUBIC, NEAREST = 2, 3, 0
MIN_PSNR = 30.0
MIN_PSNR_SCALE1 = 40.0


def encode(img: Image.Image, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **{"quality": 90, **kwargs})
    return buf.getvalue()


def _exif() -> bytes:
    exif = Image.Exif()
    exif[0x010F] = "fastload"  # Make
    exif[0x0112] = 6  # Orientation: ignored by both decoders (no exif_transpose)
    return exif.tobytes()


# A 72x56 Adobe YCCK JPEG (Pillow cannot write YCCK): made with libjpeg's jpeg_set_colorspace(JCS_YCCK)
# from Adobe-polarity CMYK gradients, a disc and a sawtooth K channel.
YCCK_JPEG = base64.b64decode(
    "/9j/7gAOQWRvYmUAZAAAAAAC/9sAQwADAgIDAgIDAwMDBAMDBAUIBQUEBAUKBwcGCAwKDAwLCgsLDQ4SEA0OEQ4LCxAWEBETFBUV"
    "FQwPFxgWFBgSFBUU/9sAQwEDBAQFBAUJBQUJFA0LDRQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQU"
    "FBQUFBQU/8AAFAgAOABIBAEiAAIRAQMRAQQiAP/EAB8AAAEFAQEBAQEBAAAAAAAAAAABAgMEBQYHCAkKC//EALUQAAIBAwMCBAMF"
    "BQQEAAABfQECAwAEEQUSITFBBhNRYQcicRQygZGhCCNCscEVUtHwJDNicoIJChYXGBkaJSYnKCkqNDU2Nzg5OkNERUZHSElKU1RV"
    "VldYWVpjZGVmZ2hpanN0dXZ3eHl6g4SFhoeIiYqSk5SVlpeYmZqio6Slpqeoqaqys7S1tre4ubrCw8TFxsfIycrS09TV1tfY2drh"
    "4uPk5ebn6Onq8fLz9PX29/j5+v/EAB8BAAMBAQEBAQEBAQEAAAAAAAABAgMEBQYHCAkKC//EALURAAIBAgQEAwQHBQQEAAECdwAB"
    "AgMRBAUhMQYSQVEHYXETIjKBCBRCkaGxwQkjM1LwFWJy0QoWJDThJfEXGBkaJicoKSo1Njc4OTpDREVGR0hJSlNUVVZXWFlaY2Rl"
    "ZmdoaWpzdHV2d3h5eoKDhIWGh4iJipKTlJWWl5iZmqKjpKWmp6ipqrKztLW2t7i5usLDxMXGx8jJytLT1NXW19jZ2uLj5OXm5+jp"
    "6vLz9PX29/j5+v/aAA4EAQACEQMRBAAAPwD83LbR/wDZrXtdH6cV0Vro/T5a39K8MyXjfKu1B1Y19TTqVsZVVHDx5pPZI8/AZmop"
    "Ns/UC5uevNZVzc9eaLm5681k3Nz15rlLXR+nFa9to+MfLXf2Pg+3QDerSHA6nH8q2IfB9swAEbJ7q3P6171ThXNHT5nKCfbmd/yt"
    "+J+hZfnULrULm5681lXNz15oubnrzWVc3PXmvP7XR+nFa1ro/TiuubwrJaAPjfH/AHgOn1q3a6P0+WvzHMJYjA1XRxUeWS6P810a"
    "80fqmW5mpJOLC5uevNZNzc9eaLm5681lXNz15rnbXR+nGK1rXR/auittH/2a17XRuny18zVx3mfp2X5jtqFzc9ea7X4f/D/+0PL1"
    "bVo/9E4a3tnH+t9GYf3fQfxfT7x8P/h//aHl6tq0f+icNb2zj/W+jMP7voP4vp970u5uevNc7baP0+Wiu5tdH6fLRXlyx2p+gUMx"
    "9xahc3PXmisq5uevNFeC2OhmSVEAGWIAzXe2GhLDGiKvyqMDipdB0fN/D8vr/I121ro3+zX9E8E1ILD1sV9py5fRJJ/jf8Ef49UM"
    "zd4xuZNzc9eayrm5680XNz15rKubnrzXO22jf7Na1ro/T5a6O20bOPlrWtdG/wBmvuauO8z77L8x21C5uevNZNzc9eaLm5681lXN"
    "z15rnLbRQwwVyp6giqJ0D7NcPHjIB4Pt2r0i10Y8fL+lR6jo3+lpx/AP5mvx/j6pCpgIYh/FCX4Pdfk/kfq+TZm1K1wubnrzXa/D"
    "/wCH/wDaHl6tq0f+icNb2zj/AFvozD+76D+L6fePh/8AD/8AtDy9W1aP/ROGt7Zx/rfRmH930H8X0+96Xc3PXmuMttG9q17bRv8A"
    "Zro7bRuny1rWujf7NfzjVx3mfr+X5jtqFzc9eayrm5680XNz15rJubnrzXO2ujdOKK7m20bGPloryZ47U/QcPmPubhc3PXmisq5u"
    "evNFeDafphgmSQLypzgcZrvbLSRIqsoypGQagtdHyR8tdHo8DWoCsheM9u4+n+FfsPDPFdPKqs6GJdqc9b9muvo+vovM/wAf8NjX"
    "NJxeplXNz15rJubnrzRc3PXmsq5uevNR2uj9PlrWtdG6fLW1YW9vMoIcL6h/lrYhtbeMAtIvXHy8/wAq/UanEGClT9qq8eXvzK35"
    "n3eX4+V0gubnrzXa/D/4f/2h5eratH/onDW9s4/1vozD+76D+L6fePh/8P8A+0PL1bVo/wDROGt7Zx/rfRmH930H8X0+96Xc3PXm"
    "sS10fp8tU5NO+03TOB8ucL9K6t0NwvlxoUQ9SepHpU1to5/u1+CcZcXUcx5cJhJXhF3b7vpbyWuvV+l3+t5RjHD3pPULm5681lXN"
    "z15oubnrzWTc3PXmudttH5Hy1rWuj/7NdHa6N0+Wta10b/Zr8drY7zP1fL8y21C5uevNZVzc9eaLm5681lXNz15rnbXR+ny0V3Nr"
    "ox4+WivKljXfc/QaGZe4tQubnrzRWTc3PXmivA7XR+ny1r2uj9Ploor6yrWn3P8AJfL689NTKubnrzXa/D/4f/2h5eratH/onDW9"
    "s4/1vozD+76D+L6feKK1rbR+ny1r22j/AOzRRXi1q0+5+mZfXnpqel3Nz15rKubnrzRRWta6P0+Wte20fp8tFFeNWqz7n6Xl9eem"
    "pk3Nz15rKubnrzRRWvbaP0+Wta10fp8v6UUV4tWtNo/TMvrz01Mq5uevNZNzc9eaKK17bR/9miiivGqVp8x+g4evPk3Mq5uevNFF"
    "Ff/Z"
)

# name -> (width, height, seed of fastload._demo.photo_like, how to encode)
KINDS = {
    "420": (500, 375, 1, lambda im: encode(im, subsampling=2)),
    "422_portrait": (375, 500, 2, lambda im: encode(im, subsampling=1)),
    "444_odd": (333, 257, 3, lambda im: encode(im, subsampling=0)),
    "gray": (500, 375, 4, lambda im: encode(im.convert("L"))),
    "cmyk": (320, 240, 5, lambda im: encode(im.convert("CMYK"))),
    "progressive": (500, 375, 6, lambda im: encode(im, progressive=True)),
    "restart": (500, 375, 7, lambda im: encode(im, restart_marker_blocks=3)),
    "progressive_restart": (456, 311, 8, lambda im: encode(im, progressive=True, restart_marker_rows=1)),
    "exif": (400, 300, 9, lambda im: encode(im, exif=_exif())),
    "rgb_colorspace": (300, 200, 12, lambda im: encode(im, keep_rgb=True)),
    "ycck": (72, 56, 0, lambda im: YCCK_JPEG),
    "large": (1200, 900, 10, lambda im: encode(im, subsampling=2)),
    "tiny": (37, 29, 11, lambda im: encode(im, subsampling=2)),
}


_cache: dict[str, tuple[bytes, Image.Image]] = {}


def sample(kind: str) -> tuple[bytes, Image.Image]:
    """(JPEG bytes, Pillow's full RGB decode of them)."""
    if kind not in _cache:
        width, height, seed, enc = KINDS[kind]
        data = enc(photo_like(np.random.default_rng(seed), width, height))
        with Image.open(io.BytesIO(data)) as im:
            rgb = im.convert("RGB")
        _cache[kind] = (data, rgb)
    return _cache[kind]


def boxes(width: int, height: int, seed: int) -> list[tuple[tuple[float, float, float, float], int, int]]:
    """(box, out_w, out_h): full images, tiny and fractional crops, edge crops, random crops."""
    w, h = float(width), float(height)
    cases: list[tuple[tuple[float, float, float, float], int, int]] = [
        ((0, 0, w, h), 224, 224),
        ((0, 0, w, h), width, height),  # identity
        ((0, 0, w, h), max(1, width // 2), max(1, height // 2)),  # DCT scale 1/2
        ((0, 0, w, h), max(1, width // 8), max(1, height // 8)),  # DCT scale 1/8
        ((0, 0, w, h), max(1, width // 5), max(1, height // 3)),
        ((w * 0.3, h * 0.4, w * 0.3 + min(5.5, w * 0.5), h * 0.4 + min(3.25, h * 0.5)), 64, 48),  # tiny
        ((min(10.7, w / 4), min(3.3, h / 4), w - min(20.2, w / 4), h - min(7.9, h / 4)), 100, 80),
        ((w - min(50.5, w), h - min(40.25, h), w, h), 24, 20),  # bottom-right edge, scaled
        ((w - min(17, w), h - min(13, h), w, h), 64, 64),  # bottom-right edge, upscaled
        ((w - min(33.3, w), 0, w, min(h, 17.9)), 16, 8),  # top-right edge
        ((0, h - min(21, h), min(w, 45), h), 11, 5),  # bottom-left edge
        ((0, 0, min(w, 31), min(h, 17)), 93, 51),  # top-left, upscaled
    ]
    if width >= 200 and height >= 160:
        cases += [
            ((16, 16, 176, 144), 40, 32),  # iMCU-aligned at scale 1/4
            ((w - 160, h - 128, w, h), 40, 32),
            ((1, 1, w - 1, h - 1), width // 3, height // 4),
        ]
    rng = np.random.default_rng(seed)
    for _ in range(8):  # RandomResizedCrop(224)-like
        box, _ = random_resized_crop(width, height, rng)
        out = 224 if min(width, height) >= 200 else 32
        cases.append((box, out, out))
    return cases


def random_resized_crop(
    width: int, height: int, rng: np.random.Generator
) -> tuple[tuple[float, float, float, float], bool]:
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= width and 0 < ch <= height:
            top, left = int(rng.integers(0, height - ch + 1)), int(rng.integers(0, width - cw + 1))
            return (float(left), float(top), float(left + cw), float(top + ch)), bool(rng.random() < 0.5)
    return (0.0, 0.0, float(width), float(height)), False


def reference(rgb: Image.Image, box, out_w: int, out_h: int, flip: bool, filt: int) -> np.ndarray:
    out = rgb.resize((out_w, out_h), Image.Resampling(filt), box=box)
    if flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out)


def native(data: bytes, box, out_w: int, out_h: int, flip: bool, filt: int) -> tuple[np.ndarray, int]:
    out = np.empty((out_h, out_w, 3), np.uint8)
    denom = _jpeg.decode_crop_resize(data, box, out, out_h, out_w, flip, filt)
    return out, denom


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def expected_denom(box, out_w: int, out_h: int) -> int:
    bw, bh = box[2] - box[0], box[3] - box[1]
    for d in (8, 4, 2):
        if bw / d >= out_w and bh / d >= out_h:
            return d
    return 1


def pillow_draft(data: bytes, box, out_w: int, out_h: int, flip: bool, filt: int, denom: int) -> np.ndarray:
    """Pillow's own DCT-scaled path at the same scale: draft(), then resize of the scaled box."""
    with Image.open(io.BytesIO(data)) as im:
        width, height = im.size
        im.draft("RGB", (max(1, width // denom), max(1, height // denom)))
        assert im.size == (-(-width // denom), -(-height // denom)), (im.size, denom)
        rgb = im.convert("RGB")
    scaled = tuple(v / denom for v in box)
    return reference(rgb, scaled, out_w, out_h, flip, filt)


def compare_kind(kind: str, filt: int = BILINEAR) -> list[dict]:
    data, rgb = sample(kind)
    width, height = rgb.size
    rows = []
    for i, (box, out_w, out_h) in enumerate(boxes(width, height, seed=len(kind))):
        for flip in (False, True):
            got, denom = native(data, box, out_w, out_h, flip, filt)
            ref = reference(rgb, box, out_w, out_h, flip, filt)
            draft = pillow_draft(data, box, out_w, out_h, flip, filt, denom) if denom > 1 else ref
            rows.append(
                {
                    "case": i,
                    "box": box,
                    "out": (out_w, out_h),
                    "flip": flip,
                    "denom": denom,
                    "psnr": psnr(got, ref),
                    "draft_psnr": psnr(draft, ref),
                    "shape_ok": got.shape == ref.shape,
                }
            )
    return rows


# --------------------------------------------------------------------------------------------
# Accuracy


def test_fixtures_have_their_features() -> None:
    markers = {
        "progressive": b"\xff\xc2",  # SOF2
        "progressive_restart": b"\xff\xdd",  # DRI
        "restart": b"\xff\xdd",
        "exif": b"Exif\x00\x00",
        "cmyk": b"Adobe",
        "ycck": b"Adobe",
    }
    for kind, marker in markers.items():
        assert marker in sample(kind)[0], kind
    assert b"\xff\xd0" in sample("restart")[0]  # RST0 in the scan
    with Image.open(io.BytesIO(sample("ycck")[0])) as im:
        assert im.mode == "CMYK" and im.info.get("adobe_transform") == 2
    with Image.open(io.BytesIO(sample("gray")[0])) as im:
        assert im.mode == "L"


@pytest.mark.parametrize("kind", list(KINDS))
def test_matches_pillow_bilinear(kind: str) -> None:
    rows = compare_kind(kind, BILINEAR)
    assert all(r["shape_ok"] for r in rows)
    # Outputs of a few pixels from a DCT-scaled decode (e.g. a 37x29 image to 4x3 at 1/8) lose a
    # little more: the 8x8 DCT average adds to the triangle filter's blur. Pillow's draft() at the
    # same scale does the same; such outputs are held to 25 dB and to Pillow's draft() quality.
    bad = [r for r in rows if r["psnr"] < (MIN_PSNR if min(r["out"]) >= 8 else 25.0)]
    assert not bad, f"{kind}: {len(bad)} of {len(rows)} cases below {MIN_PSNR} dB: {bad[:4]}"
    bad1 = [r for r in rows if r["denom"] == 1 and r["psnr"] < MIN_PSNR_SCALE1]
    assert not bad1, f"{kind}: scale-1 cases below {MIN_PSNR_SCALE1} dB: {bad1[:4]}"
    worse = [r for r in rows if r["denom"] > 1 and r["psnr"] < r["draft_psnr"] - 0.5]
    assert not worse, f"{kind}: less accurate than Pillow's draft() at the same scale: {worse[:4]}"
    for r in rows:
        assert r["denom"] == expected_denom(r["box"], *r["out"]), r


@pytest.mark.parametrize("kind", ["420", "444_odd", "cmyk", "ycck", "gray"])
def test_matches_pillow_bicubic(kind: str) -> None:
    rows = compare_kind(kind, BICUBIC)
    bad = [r for r in rows if r["psnr"] < MIN_PSNR]
    assert not bad, f"{kind}: {len(bad)} of {len(rows)} cases below {MIN_PSNR} dB: {bad[:4]}"


@pytest.mark.parametrize("kind", ["420", "gray"])
def test_nearest(kind: str) -> None:
    # Nearest does not filter: against Pillow's (aliased) nearest it only agrees closely where no
    # DCT scaling happened; scaled cases are only checked to be a plausible image of the box.
    rows = compare_kind(kind, NEAREST)
    unscaled = [r for r in rows if r["denom"] == 1]
    assert unscaled
    bad = [r for r in unscaled if r["psnr"] < MIN_PSNR]
    assert not bad, bad[:4]
    assert all(r["psnr"] > 20 for r in rows), min(r["psnr"] for r in rows)


def test_other_pillow_filters() -> None:
    data, rgb = sample("420")
    box = (30.5, 20.0, 470.25, 350.0)
    for filt in (Image.Resampling.LANCZOS, Image.Resampling.BOX, Image.Resampling.HAMMING):
        got, _ = native(data, box, 150, 130, False, int(filt))
        assert psnr(got, reference(rgb, box, 150, 130, False, int(filt))) > MIN_PSNR


def test_scale1_is_pillow_exact_on_full_image() -> None:
    # Same pixels in, same fixed-point arithmetic: identical output (libjpeg-turbo's ISLOW IDCT and
    # fancy upsampling are the same in Pillow's bundled copy and the system one).
    data, rgb = sample("420")
    box = (12.25, 7.5, 480.0, 370.0)
    got, denom = native(data, box, 300, 250, True, BILINEAR)
    assert denom == 1
    assert psnr(got, reference(rgb, box, 300, 250, True, BILINEAR)) > 45


def reference_clipped(rgb: Image.Image, box, clip, out_w: int, out_h: int, flip: bool, filt: int):
    """torchvision's crop-then-resize: the filter sees only `clip` (rounded out to whole pixels)."""
    x0, y0 = max(0, math.floor(clip[0] + 1e-6)), max(0, math.floor(clip[1] + 1e-6))
    x1, y1 = min(rgb.width, math.ceil(clip[2] - 1e-6)), min(rgb.height, math.ceil(clip[3] - 1e-6))
    shifted = (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0)
    return reference(rgb.crop((x0, y0, x1, y1)), shifted, out_w, out_h, flip, filt)


@pytest.mark.parametrize("kind", ["420", "progressive", "cmyk", "gray", "large"])
def test_clip_matches_crop_then_resize(kind: str) -> None:
    data, rgb = sample(kind)
    width, height = rgb.size
    w, h = float(width), float(height)
    rng = np.random.default_rng(7)
    cases = []
    for _ in range(12):  # RandomResizedCrop: clip = box
        box, flip = random_resized_crop(width, height, rng)
        cases.append((box, box, 224, 224, flip))
    cases += [
        (
            (10.5, 20.25, w * 0.9 + 0.75, h * 0.8 + 0.5),
            (10.5, 20.25, w * 0.9 + 0.75, h * 0.8 + 0.5),
            100,
            90,
            False,
        ),
        ((50.0, 40.0, 200.0, 160.0), (30.0, 20.0, 260.0, 200.0), 64, 48, True),  # box inside clip
        ((0.0, 0.0, 40.0, 30.0), (0.0, 0.0, 40.0, 30.0), 160, 120, False),  # upscale in a corner
        ((w - 120.0, h - 90.0, w, h), (w - 120.0, h - 90.0, w, h), 30, 20, True),  # bottom right
    ]
    for filt in (BILINEAR, BICUBIC):
        for box, clip, out_w, out_h, flip in cases:
            out = np.empty((out_h, out_w, 3), np.uint8)
            denom = _jpeg.decode_crop_resize(data, box, out, out_h, out_w, flip, filt, clip=clip)
            ref = reference_clipped(rgb, box, clip, out_w, out_h, flip, filt)
            value = psnr(out, ref)
            assert value >= (MIN_PSNR_SCALE1 if denom == 1 else MIN_PSNR), (box, clip, denom, value)


def test_clip_none_is_whole_image() -> None:
    data, rgb = sample("422_portrait")
    box = (30.5, 40.25, 300.0, 450.0)
    a = np.empty((100, 80, 3), np.uint8)
    b = np.empty((100, 80, 3), np.uint8)
    _jpeg.decode_crop_resize(data, box, a, 100, 80, False, BILINEAR)
    _jpeg.decode_crop_resize(data, box, b, 100, 80, False, BILINEAR, clip=(0, 0, *rgb.size))
    np.testing.assert_array_equal(a, b)
    out = np.empty((10, 10, 3), np.uint8)
    with pytest.raises(ValueError, match="not inside the clip"):
        _jpeg.decode_crop_resize(data, box, out, 10, 10, False, BILINEAR, clip=(40, 40, 300, 450))
    with pytest.raises(ValueError, match="clip"):
        _jpeg.decode_crop_resize(data, box, out, 10, 10, False, BILINEAR, clip=(0, 0, 400, 500))
    with pytest.raises(TypeError):
        _jpeg.decode_crop_resize(data, box, out, 10, 10, False, BILINEAR, clip=(0, 0, 300))
    with pytest.raises(ValueError, match="finite"):
        _jpeg.decode_crop_resize(data, box, out, 10, 10, False, BILINEAR, clip=(0, 0, math.inf, 500))


def test_scales_used() -> None:
    data, _ = sample("large")  # 1200 x 900
    cases = {
        (0, 0, 1200, 900): {(1100, 800): 1, (600, 450): 2, (300, 225): 4, (150, 112): 8, (10, 10): 8},
        (100, 100, 400, 400): {(224, 224): 1, (150, 150): 2, (75, 75): 4, (37, 37): 8},
    }
    for box, outs in cases.items():
        for (ow, oh), want in outs.items():
            _, denom = native(data, box, ow, oh, False, BILINEAR)
            assert denom == want, (box, ow, oh, denom)


def test_flip_is_mirror() -> None:
    data, _ = sample("444_odd")
    box = (3.5, 4.5, 300.0, 250.0)
    a, _ = native(data, box, 77, 66, False, BILINEAR)
    b, _ = native(data, box, 77, 66, True, BILINEAR)
    np.testing.assert_array_equal(a[:, ::-1], b)


@pytest.mark.parametrize("filt", [BILINEAR, BICUBIC, NEAREST, int(Image.Resampling.LANCZOS)])
def test_simd_and_portable_resamplers_agree(filt: int) -> None:
    # The AVX2 passes (used where the CPU has AVX2) compute the same integer sums as the portable C.
    if not _jpeg._set_simd(None):
        pytest.skip("no AVX2 on this CPU: only the portable resampler exists")
    jobs = []
    for kind in ("420", "cmyk", "gray", "tiny"):
        data, rgb = sample(kind)
        for box, out_w, out_h in boxes(*rgb.size, seed=3)[::3]:
            jobs.append((data, box, out_w, out_h))
    try:
        for i, (data, box, out_w, out_h) in enumerate(jobs):
            _jpeg._set_simd(True)
            a, _ = native(data, box, out_w, out_h, bool(i % 2), filt)
            _jpeg._set_simd(False)
            b, _ = native(data, box, out_w, out_h, bool(i % 2), filt)
            np.testing.assert_array_equal(a, b)
    finally:
        _jpeg._set_simd(True)


def test_grayscale_is_replicated() -> None:
    data, _ = sample("gray")
    out, _ = native(data, (0, 0, 500, 375), 100, 75, False, BILINEAR)
    np.testing.assert_array_equal(out[..., 0], out[..., 1])
    np.testing.assert_array_equal(out[..., 0], out[..., 2])


# --------------------------------------------------------------------------------------------
# API


def test_jpeg_size() -> None:
    for kind in ("420", "422_portrait", "gray", "cmyk", "progressive", "exif", "tiny"):
        data, rgb = sample(kind)
        assert _jpeg.jpeg_size(data) == rgb.size
        assert _jpeg.jpeg_size(memoryview(data)) == rgb.size
        assert _jpeg.jpeg_size(bytearray(data)) == rgb.size
        assert _jpeg.jpeg_size(np.frombuffer(data, np.uint8)) == rgb.size


@pytest.mark.parametrize(
    "blob", [b"", b"\x00", b"not a jpeg at all", b"\x89PNG\r\n\x1a\n" + bytes(100), b"\xff\xd8\xff"]
)
def test_garbage_raises(blob: bytes) -> None:
    with pytest.raises(ValueError, match="not a JPEG or corrupt header"):
        _jpeg.jpeg_size(blob)
    out = np.empty((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="corrupt JPEG"):
        _jpeg.decode_crop_resize(blob, (0, 0, 8, 8), out, 8, 8, False, BILINEAR)
    with pytest.raises(ValueError, match="corrupt JPEG"):
        _jpeg.entropy_decode_only(blob)


def test_accepts_buffers_and_keywords() -> None:
    data, _ = sample("420")
    ref, _ = native(data, (0, 0, 500, 375), 50, 40, True, BILINEAR)
    flat = bytearray(50 * 40 * 3)
    assert _jpeg.decode_crop_resize(memoryview(data), [0, 0, 500, 375], flat, 40, 50, True, 2) == 8
    np.testing.assert_array_equal(np.frombuffer(flat, np.uint8).reshape(40, 50, 3), ref)
    out = np.empty((40, 50, 3), np.uint8)
    denom = _jpeg.decode_crop_resize(
        data=data,
        box=(0, 0, 500, 375),
        out=out,
        out_h=40,
        out_w=50,
        flip=True,
        filter=Image.Resampling.BILINEAR,
    )
    assert denom == 8
    np.testing.assert_array_equal(out, ref)
    assert int(Image.Resampling.BILINEAR) == _jpeg.BILINEAR
    assert int(Image.Resampling.BICUBIC) == _jpeg.BICUBIC
    assert int(Image.Resampling.NEAREST) == _jpeg.NEAREST
    assert _jpeg.entropy_decode_only(data) is None


def test_bad_arguments() -> None:
    data, _ = sample("420")
    out = np.empty((10, 10, 3), np.uint8)

    def call(*, data=data, box=(0, 0, 500, 375), out=out, h=10, w=10, filt=BILINEAR):
        return _jpeg.decode_crop_resize(data, box, out, h, w, False, filt)

    call()
    with pytest.raises(ValueError, match="box"):
        call(box=(0, 0, 501, 375))
    with pytest.raises(ValueError, match="box"):
        call(box=(-1, 0, 100, 100))
    with pytest.raises(ValueError, match="box"):
        call(box=(10, 10, 10, 20))  # empty
    with pytest.raises(ValueError, match="box"):
        call(box=(20, 10, 10, 20))  # inverted
    with pytest.raises(ValueError, match="finite"):
        call(box=(0, 0, float("nan"), 20))
    with pytest.raises(ValueError, match="too thin"):  # edges equal once rounded to float, as Pillow does
        call(box=(100, 10, 100.000001, 20))
    with pytest.raises(TypeError):
        call(box=(0, 0, 10))
    with pytest.raises(TypeError):
        call(box="abcd")
    with pytest.raises(ValueError, match="shape"):
        call(out=np.empty((10, 9, 3), np.uint8))
    with pytest.raises(ValueError, match="bytes"):
        call(out=bytearray(10 * 10 * 3 - 1))
    with pytest.raises(ValueError):
        call(out=np.empty((10, 10, 4), np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        call(out=np.empty((10, 10, 3), np.float32))
    with pytest.raises(TypeError):
        call(out=np.empty((10, 20, 3), np.uint8)[:, ::2])  # not contiguous
    ro = np.empty((10, 10, 3), np.uint8)
    ro.flags.writeable = False
    with pytest.raises(TypeError):
        call(out=ro)
    with pytest.raises(TypeError):
        call(out=bytes(300))  # read-only
    with pytest.raises(TypeError):
        call(data="a string")
    with pytest.raises(TypeError):
        call(data=None)
    with pytest.raises(ValueError):
        call(h=0)
    with pytest.raises(ValueError, match="filter"):
        call(filt=7)
    with pytest.raises(TypeError):
        _jpeg.jpeg_size(12)
    with pytest.raises(TypeError):
        _jpeg.entropy_decode_only(None)


def test_box_rounding_slack_is_clamped() -> None:
    data, rgb = sample("420")
    box = (0.0, 0.0, 500.0000001, 375.0000001)
    got, _ = native(data, box, 224, 224, False, BILINEAR)
    assert psnr(got, reference(rgb, (0, 0, 500, 375), 224, 224, False, BILINEAR)) > MIN_PSNR_SCALE1


# --------------------------------------------------------------------------------------------
# Bad data: errors, never crashes


TOP_CROP = ((0.0, 0.0, 100.0, 60.0), 50, 30)  # stops decoding early (rows below are not read)


@pytest.mark.parametrize("kind", ["420", "progressive", "restart", "gray", "cmyk", "ycck"])
def test_truncated_raises(kind: str) -> None:
    data, rgb = sample(kind)
    width, height = rgb.size
    w, h = float(width), float(height)
    top_crop = ((0.0, 0.0, w * 0.3, h * 0.15), 50, 30)  # decoding stops early: rows below not read
    crops = [top_crop, ((0.0, 0.0, w, h), 64, 48), ((w - min(80.0, w), h - min(60.0, h), w, h), 40, 30)]
    n = len(data)
    for cut in (n // 50, n // 3, n * 2 // 3, n - 200, n - 2, n - 1):
        blob = data[:cut]
        for box, ow, oh in crops:
            out = np.empty((oh, ow, 3), np.uint8)
            with pytest.raises(ValueError, match="corrupt JPEG"):
                _jpeg.decode_crop_resize(blob, box, out, oh, ow, False, BILINEAR)
        with pytest.raises(ValueError, match="corrupt JPEG"):
            _jpeg.entropy_decode_only(blob)


def test_trailing_bytes_after_eoi_are_fine() -> None:
    data, _ = sample("420")
    a, _ = native(data, *TOP_CROP[:1], 50, 30, False, BILINEAR)
    b, _ = native(data + b"\x00" * 100 + b"junk", *TOP_CROP[:1], 50, 30, False, BILINEAR)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["420", "progressive", "restart"])
def test_corrupt_bytes_never_crash(kind: str) -> None:
    data, rgb = sample(kind)
    width, height = rgb.size
    rng = np.random.default_rng(123)
    out = np.empty((32, 32, 3), np.uint8)
    outcomes = {"ok": 0, "error": 0}
    for i in range(150):
        blob = bytearray(data)
        n = int(rng.integers(1, 8))
        # mostly the entropy-coded data, sometimes the header
        lo = 2 if i % 5 == 0 else min(len(data) - 3, 700)
        for pos in rng.integers(lo, len(data) - 2, size=n):
            blob[int(pos)] = int(rng.integers(0, 256))
        box, _ = random_resized_crop(width, height, rng)
        try:
            _jpeg.decode_crop_resize(bytes(blob), box, out, 32, 32, bool(i % 2), BILINEAR)
            outcomes["ok"] += 1
        except ValueError:
            outcomes["error"] += 1
    assert outcomes["ok"] + outcomes["error"] == 150


def test_huge_header_is_refused() -> None:
    data, _ = sample("420")
    blob = bytearray(data)
    sof = blob.find(b"\xff\xc0")
    assert sof > 0
    blob[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") + (60000).to_bytes(2, "big")
    assert _jpeg.jpeg_size(bytes(blob)) == (60000, 60000)
    out = np.empty((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="exceeds the limit"):
        _jpeg.decode_crop_resize(bytes(blob), (0, 0, 100, 100), out, 8, 8, False, BILINEAR)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc")
def test_error_paths_do_not_leak() -> None:
    data, _ = sample("large")
    truncated = data[: len(data) - 2]
    out = np.empty((224, 224, 3), np.uint8)
    box = (0.0, 0.0, 600.0, 500.0)

    def burn(n: int) -> None:
        for _ in range(n):
            with pytest.raises(ValueError):
                _jpeg.decode_crop_resize(truncated, box, out, 224, 224, False, BILINEAR)
            with pytest.raises(ValueError):
                _jpeg.decode_crop_resize(data, (0, 0, 1201, 900), out, 224, 224, False, BILINEAR)

    burn(50)  # warm up allocator pools
    before = _rss_bytes()
    burn(400)  # a leaked row buffer + libjpeg state would be > 1 MB per call
    assert _rss_bytes() - before < 16 * 2**20


# --------------------------------------------------------------------------------------------
# Threads


def test_two_threads_agree_with_sequential() -> None:
    jobs = []
    for kind in ("420", "progressive", "cmyk", "gray", "restart", "large"):
        data, rgb = sample(kind)
        rng = np.random.default_rng(len(jobs))
        for _ in range(6):
            box, flip = random_resized_crop(*rgb.size, rng)
            jobs.append((data, box, flip))
    expected = [native(d, b, 96, 80, f, BILINEAR)[0] for d, b, f in jobs]
    results: list[list[np.ndarray]] = [[], []]
    errors: list[BaseException] = []

    def work(slot: int) -> None:
        try:
            for _ in range(3):
                for d, b, f in jobs:
                    results[slot].append(native(d, b, 96, 80, f, BILINEAR)[0])
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for slot in results:
        for i, got in enumerate(slot):
            np.testing.assert_array_equal(got, expected[i % len(jobs)])


def test_gil_is_released_while_decoding() -> None:
    # While one thread is inside decode_crop_resize (a long scale-1 decode of a big image), the
    # other thread must be able to run Python code. If the GIL were held, no main-thread loop
    # iteration could be timestamped strictly inside the call.
    # Noise at quality 100 with 4:4:4 chroma: a slow decode (well over 60 ms) on any machine.
    noise = np.random.default_rng(42).integers(0, 256, (2000, 2600, 3), dtype=np.uint8)
    data = encode(Image.fromarray(noise), quality=100, subsampling=0)
    out = np.empty((2000, 2600, 3), np.uint8)
    box = (0.0, 0.0, 2600.0, 2000.0)
    spans: list[tuple[float, float]] = []
    done = threading.Event()
    margin = 0.02  # > the 5 ms switch interval: time the worker may spend before entering C

    def work() -> None:
        # Until three calls were long enough to judge (a fast machine decodes even this quickly).
        for _ in range(30):
            t0 = time.perf_counter()
            _jpeg.decode_crop_resize(data, box, out, 2000, 2600, True, BILINEAR)
            spans.append((t0, time.perf_counter()))
            if sum(t1 - t0 > 3 * margin for t0, t1 in spans) >= 3:
                break
        done.set()

    stamps = []
    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    t.join()
    stamps_arr = np.array(stamps)
    inside = 0
    for t0, t1 in spans:
        if t1 - t0 > 3 * margin:
            inside += int(np.count_nonzero((stamps_arr > t0 + margin) & (stamps_arr < t1 - margin / 4)))
    assert inside > 0, f"no Python progress during the decode calls {spans}"
