"""Transforms: torchvision's semantics, checked without torchvision (and against it when present).

Protects what a model trained with torchvision expects: RandomResizedCrop's box distribution and
central fallback, Resize's output size rules (int, max_size, pair), CenterCrop's rounding, the
flip rate; compile-time output sizes; how a chain maps back to a box of the source image; and
the pixels: with JPEG draft off, the Pillow backend computes exactly what torchvision computes on
PIL images (crop, resize BILINEAR, flip); with draft on, it stays within 30 dB PSNR of that.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import torchvision_or_skip, write_image
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from fastload import ConfigError
from fastload import transforms as T
from fastload._loading.decoding.pil import decode_into

BILINEAR = Image.Resampling.BILINEAR

# ---------------------------------------------------------------------------------------------
# Reference algorithms, transcribed from torchvision (transforms.RandomResizedCrop.get_params and
# transforms.functional._compute_resized_output_size), with torch's RNG replaced by a numpy
# Generator drawn in the same order.


def tv_rrc_params(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], rng: np.random.Generator
) -> tuple[int, int, int, int]:
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def tv_resize_size(height: int, width: int, size: int, max_size: int | None) -> tuple[int, int]:
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    return new_h, new_w


# ---------------------------------------------------------------------------------------------
# RandomResizedCrop


def _fallback_box(t: T.RandomResizedCrop, height: int, width: int) -> tuple[int, int, int, int]:
    """torchvision's central fallback: the whole image, its ratio clamped into `t.ratio`."""
    in_ratio = width / height
    if in_ratio < min(t.ratio):
        w, h = width, int(round(width / min(t.ratio)))
    elif in_ratio > max(t.ratio):
        w, h = int(round(height * max(t.ratio))), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@settings(max_examples=300, deadline=None)
@given(
    height=st.integers(1, 2000),
    width=st.integers(1, 2000),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([(0.08, 1.0), (0.5, 1.0), (0.25, 0.3), (0.9, 1.0)]),
    ratio=st.sampled_from([(3 / 4, 4 / 3), (1.0, 1.0), (0.5, 2.0)]),
)
def test_random_resized_crop_box_ranges(
    height: int, width: int, seed: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> None:
    t = T.RandomResizedCrop(16, scale=scale, ratio=ratio)
    top, left, h, w = box = t.sample_box(height, width, np.random.default_rng(seed))
    assert top >= 0 and left >= 0 and h > 0 and w > 0
    assert top + h <= height and left + w <= width, "the box must lie inside the image"
    if box == _fallback_box(t, height, width):
        return  # the documented central fallback (checked on its own below)
    # w = round(sqrt(A * r)), h = round(sqrt(A / r)): allow for that rounding, nothing more.
    slack = 0.5 * (w + h) + 0.25
    assert scale[0] * height * width - slack <= w * h <= scale[1] * height * width + slack
    assert (w + 0.5) / max(h - 0.5, 1e-9) >= ratio[0]
    assert (w - 0.5) / (h + 0.5) <= ratio[1]


@settings(max_examples=200, deadline=None)
@given(height=st.integers(1, 1000), width=st.integers(1, 1000), seed=st.integers(0, 2**32 - 1))
def test_random_resized_crop_is_torchvisions_algorithm(height: int, width: int, seed: int) -> None:
    t = T.RandomResizedCrop(16)
    got = t.sample_box(height, width, np.random.default_rng(seed))
    assert got == tv_rrc_params(height, width, t.scale, t.ratio, np.random.default_rng(seed))


@pytest.mark.parametrize(
    ("height", "width", "expected"),
    [
        (10, 1000, (0, (1000 - 13) // 2, 10, 13)),  # too wide: full height, widest allowed ratio
        (1000, 10, ((1000 - 13) // 2, 0, 13, 10)),  # too tall: full width, tallest allowed ratio
    ],
)
def test_random_resized_crop_fallback_for_extreme_images(
    height: int, width: int, expected: tuple[int, int, int, int]
) -> None:
    t = T.RandomResizedCrop(8)
    for seed in range(20):
        assert t.sample_box(height, width, np.random.default_rng(seed)) == expected


def test_random_resized_crop_fallback_in_range_ratio_takes_whole_image() -> None:
    t = T.RandomResizedCrop(8, scale=(1.5, 2.0))  # no try can fit: the whole image is the box
    assert t.sample_box(100, 120, np.random.default_rng(0)) == (0, 0, 100, 120)


def test_random_resized_crop_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        T.RandomResizedCrop(8, scale=(1.0, 0.5))
    with pytest.raises(ConfigError):
        T.RandomResizedCrop(8, ratio=(2.0, 1.0))
    with pytest.raises(ConfigError):
        T.RandomResizedCrop(0)
    with pytest.raises(ConfigError):
        T.RandomResizedCrop(8, interpolation="cubic-ish")


# ---------------------------------------------------------------------------------------------
# Resize, CenterCrop, flip


@pytest.mark.parametrize(
    ("height", "width", "size", "expected"),
    [
        (100, 200, 50, (50, 100)),
        (200, 100, 50, (100, 50)),
        (375, 500, 256, (256, 341)),  # int(256 * 500 / 375) = int(341.33)
        (500, 375, 256, (341, 256)),
        (120, 120, 64, (64, 64)),
        (64, 160, 100, (100, 250)),
    ],
)
def test_resize_int_matches_shorter_edge(
    height: int, width: int, size: int, expected: tuple[int, int]
) -> None:
    assert T.Resize(size).output_size(height, width) == expected


@settings(max_examples=200, deadline=None)
@given(
    height=st.integers(1, 3000),
    width=st.integers(1, 3000),
    size=st.integers(1, 512),
    extra=st.one_of(st.none(), st.integers(1, 600)),
)
def test_resize_output_size_is_torchvisions(height: int, width: int, size: int, extra: int | None) -> None:
    max_size = None if extra is None else size + extra
    want = tv_resize_size(height, width, size, max_size)
    assert T.Resize(size, max_size=max_size).output_size(height, width) == want
    # torchvision reads a 1-element sequence as that int (shorter edge), not as a square.
    assert T.Resize((size,), max_size=max_size).output_size(height, width) == want


def test_resize_max_size_caps_the_longer_edge() -> None:
    assert T.Resize(256, max_size=300).output_size(375, 500) == (225, 300)
    assert T.Resize(256, max_size=400).output_size(375, 500) == (256, 341)  # under the cap
    with pytest.raises(ConfigError, match="max_size"):  # at construction, not per sample
        T.Resize(256, max_size=256)
    with pytest.raises(ConfigError, match="max_size"):
        T.Resize((32, 32), max_size=64)


def test_resize_pair_sets_both_edges() -> None:
    assert T.Resize((30, 40)).output_size(375, 500) == (30, 40)
    assert T.Resize((30, 40)).output_size(500, 375) == (30, 40)


@pytest.mark.parametrize(
    ("height", "width", "size", "expected"),
    [
        (10, 10, 4, (3, 3, 4, 4)),
        (9, 9, 4, (2, 2, 4, 4)),  # (9 - 4) / 2 = 2.5 rounds to even: 2, as torchvision's round()
        (11, 11, 4, (4, 4, 4, 4)),  # 3.5 rounds to 4
        (13, 20, (5, 7), (4, 6, 5, 7)),  # 4.0, 6.5 -> 6
        (8, 8, 8, (0, 0, 8, 8)),
    ],
)
def test_center_crop_box_rounds_like_torchvision(
    height: int, width: int, size: int | tuple[int, int], expected: tuple[int, int, int, int]
) -> None:
    box = T.CenterCrop(size).box(height, width)
    assert box == expected
    crop_h, crop_w = (size, size) if isinstance(size, int) else size
    assert box[:2] == (int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0)))


def test_center_crop_larger_than_image_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Resize"):
        T.CenterCrop(64).box(32, 100)


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0])
def test_flip_rate_matches_p(p: float) -> None:
    plan = T.compile_transforms([T.CenterCrop(8), T.RandomHorizontalFlip(p)])
    n = 4000
    flips = sum(plan.sample(10, 10, np.random.default_rng(seed)).flip for seed in range(n))
    sigma = math.sqrt(max(p * (1 - p), 1e-12) / n)
    assert abs(flips / n - p) <= 4 * sigma + 1e-9


def test_flip_rejects_bad_p() -> None:
    with pytest.raises(ConfigError):
        T.RandomHorizontalFlip(1.5)


# ---------------------------------------------------------------------------------------------
# Parameter validation: once, at construction, in local mode and through from_config (the daemon)

NAN, INF = float("nan"), float("inf")
_LEGAL: dict[type, dict[str, Any]] = {
    T.RandomResizedCrop: {"size": 8},
    T.Resize: {"size": 8},
    T.CenterCrop: {"size": 8},
    T.RandomHorizontalFlip: {},
}
BAD_PARAMETERS: list[tuple[type, str, object]] = [
    *[
        (cls, "size", size)
        for cls in (T.RandomResizedCrop, T.Resize, T.CenterCrop)
        for size in (
            0,
            -1,
            10**9,
            T.MAX_SIDE + 1,
            True,
            224.0,
            (8, 0),
            (8.0, 8.0),
            (True, 4),
            (8, 8, 8),
            (T.MAX_SIDE + 1, 8),
            (),
            "224",
            None,
        )
    ],
    (T.Resize, "size", (0,)),
    (T.Resize, "size", (T.MAX_SIDE + 1,)),
    (T.Resize, "size", (2.5,)),
    *[
        (T.RandomResizedCrop, "scale", scale)
        for scale in (
            (NAN, 1.0),
            (0.5, NAN),
            (0.0, 1.0),
            (-0.1, 1.0),
            (1.0, 0.5),
            (INF, INF),
            (0.1, INF),
            (1e300, 1e300),
            (0.5,),
            (0.1, 0.5, 1.0),
            ("0.1", "1"),
            (True, True),
            0.5,
            None,
        )
    ],
    *[
        (T.RandomResizedCrop, "ratio", ratio)
        for ratio in (
            (0, 1),
            (0.0, 0.0),
            (-1.0, 1.0),
            (-2.0, -1.0),
            (INF, INF),
            (NAN, NAN),
            (2.0, 1.0),
            (1e-300, 1.0),
            (1.0, 1e300),
            (1.0,),
            ("a", "b"),
            None,
        )
    ],
    *[(cls, "interpolation", v) for cls in (T.RandomResizedCrop, T.Resize) for v in ("cubic-ish", None, 3)],
    *[(cls, "antialias", v) for cls in (T.RandomResizedCrop, T.Resize) for v in ("yes", 1, None)],
    *[(T.Resize, "max_size", v) for v in (8, 4, 0, -1, 10**9, T.MAX_SIDE + 1, 300.0, NAN, "400")],
    *[(T.RandomHorizontalFlip, "p", v) for v in (NAN, INF, -INF, -0.1, 1.5, "0.5", None, True, (0.5,))],
]


def _jsonable(value: object) -> object:
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize(
    ("cls", "param", "value"), BAD_PARAMETERS, ids=[f"{c.__name__}-{p}={v!r}" for c, p, v in BAD_PARAMETERS]
)
def test_bad_parameters_are_rejected_at_construction(cls: type, param: str, value: object) -> None:
    kwargs = {**_LEGAL[cls], param: value}
    with pytest.raises(ConfigError) as direct:
        cls(**kwargs)
    message = str(direct.value)
    assert message.startswith(f"{cls.__name__}: {param} must be "), message  # names what is accepted
    assert message.endswith(f"got {value!r}"), message  # and the bad value

    # The same value in a client's JSON (NaN and Infinity are JSON to Python's json module).
    entry = T.to_config([cls(**_LEGAL[cls])])[0]
    entry[param] = _jsonable(value)
    with pytest.raises(ConfigError) as remote:
        T.from_config(json.loads(json.dumps([entry])))
    assert cls.__name__ in str(remote.value) and param in str(remote.value), str(remote.value)


@pytest.mark.parametrize(
    "entry",
    [
        {"type": "RandomResizedCrop", "size": ["224", "224"]},
        {"type": "RandomResizedCrop", "size": 8, "scale": {"min": 0.1, "max": 1.0}},
        {"type": "RandomResizedCrop", "size": 8, "ratio": [None, None]},
        {"type": "Resize", "size": [[8, 8]]},
        {"type": "Resize", "size": 8, "max_size": [16]},
        {"type": "CenterCrop", "size": {"h": 8}},
        {"type": "CenterCrop", "size": [8, True]},
        {"type": "RandomHorizontalFlip", "p": [0.5, 0.5]},
        {"type": "RandomHorizontalFlip", "p": 10**400},
        {"type": "Resize", "size": 10**400},
        {"type": "Resize"},  # a required parameter missing: a TypeError inside, a ConfigError outside
    ],
)
def test_from_config_turns_odd_json_values_into_config_errors(entry: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as caught:
        T.from_config(json.loads(json.dumps([entry])))
    assert str(entry["type"]) in str(caught.value)
    assert len(str(caught.value)) < 300  # a client's huge value does not make a huge message


LEGAL_EDGES: list[tuple[type, dict[str, Any]]] = [
    (T.RandomResizedCrop, {"size": 8, "scale": (0.08, 1.5)}),
    (T.RandomResizedCrop, {"size": 8, "scale": (1.5, 2.0)}),
    (T.RandomResizedCrop, {"size": 8, "scale": [0.5, 1.0], "ratio": [0.5, 2.0]}),  # lists, as torchvision
    (T.RandomResizedCrop, {"size": 8, "scale": (1, 1), "ratio": (1, 1)}),
    (T.RandomResizedCrop, {"size": 8, "scale": (1e-9, 1e6), "ratio": (2e-6, 1e6)}),
    (T.RandomResizedCrop, {"size": 16384}),
    (T.RandomResizedCrop, {"size": (16384, 1), "antialias": False}),
    (T.Resize, {"size": 16384}),
    (T.Resize, {"size": (1,)}),
    (T.Resize, {"size": [16, 24]}),
    (T.Resize, {"size": 16383, "max_size": 16384}),
    (T.CenterCrop, {"size": (16384, 16384)}),
    (T.CenterCrop, {"size": 1}),
    (T.RandomHorizontalFlip, {"p": 0}),
    (T.RandomHorizontalFlip, {"p": 0.0}),
    (T.RandomHorizontalFlip, {"p": 1}),
    (T.RandomHorizontalFlip, {"p": 1.0}),
]


@pytest.mark.parametrize(("cls", "kwargs"), LEGAL_EDGES, ids=[f"{c.__name__}-{k}" for c, k in LEGAL_EDGES])
def test_legal_edge_values_are_accepted(cls: type, kwargs: dict[str, Any]) -> None:
    """torchvision's legal values stay legal, up to 16384-pixel sides, and work on every sample."""
    t = cls(**kwargs)
    rebuilt = T.from_config(json.loads(json.dumps(T.to_config([t]))))
    assert T.to_config(rebuilt) == T.to_config([t])
    # ... and they work on every sample, not just at construction.
    plan = T.compile_transforms([T.Resize((16384, 16384)), t, T.CenterCrop(1)])
    for seed in range(5):
        g = plan.sample(375, 500, np.random.default_rng(seed))
        assert (g.out_height, g.out_width) == (1, 1)
    if isinstance(t, T.RandomResizedCrop):
        top, left, h, w = t.sample_box(100_000, 3, np.random.default_rng(0))  # an extreme image
        assert 0 <= top < top + h <= 100_000 and 0 <= left < left + w <= 3


# ---------------------------------------------------------------------------------------------
# compile_transforms and geometry


@pytest.mark.parametrize(
    ("chain", "size"),
    [
        ([T.RandomResizedCrop(224)], (224, 224)),
        ([T.RandomResizedCrop((20, 30)), T.RandomHorizontalFlip()], (20, 30)),
        ([T.Resize(256), T.CenterCrop(224)], (224, 224)),
        ([T.Resize((32, 48))], (32, 48)),
        ([T.RandomResizedCrop(64), T.Resize((16, 24))], (16, 24)),
        ([T.CenterCrop(100), T.Resize((50, 50)), T.RandomHorizontalFlip()], (50, 50)),
    ],
)
def test_compile_knows_the_output_size(chain: list[T.Transform], size: tuple[int, int]) -> None:
    plan = T.compile_transforms(chain)
    assert (plan.out_height, plan.out_width) == size
    g = plan.sample(375, 500, np.random.default_rng(0))
    assert (g.out_height, g.out_width) == size


@pytest.mark.parametrize(
    "chain",
    [
        [],
        None,
        [T.RandomHorizontalFlip()],
        [T.Resize(256)],
        [T.Resize((256,))],  # a 1-sequence is the shorter edge, as an int
        [T.CenterCrop(64), T.Resize(32)],
    ],
)
def test_compile_rejects_variable_size_chains(chain: list[T.Transform] | None) -> None:
    with pytest.raises(ConfigError, match="same size"):
        T.compile_transforms(chain)


def test_compile_rejects_foreign_transforms() -> None:
    with pytest.raises(ConfigError, match="not a fastload transform"):
        T.compile_transforms([T.CenterCrop(8), lambda img: img])


def test_resize_then_center_crop_maps_back_to_the_source_box() -> None:
    plan = T.compile_transforms([T.Resize(256), T.CenterCrop(224)])
    g = plan.sample(375, 500, np.random.default_rng(0))
    # Resized to 256 x 341; the crop starts at (16, round(58.5) = 58) in resized pixels.
    sx, sy = 500 / 341, 375 / 256
    assert g.box == pytest.approx((58 * sx, 16 * sy, (58 + 224) * sx, (16 + 224) * sy))
    assert (g.out_height, g.out_width, g.flip) == (224, 224, False)


def test_flip_before_a_crop_mirrors_where_the_crop_lands() -> None:
    plan = T.compile_transforms([T.Resize(256), T.RandomHorizontalFlip(1.0), T.CenterCrop(224)])
    g = plan.sample(375, 500, np.random.default_rng(0))
    sx, sy = 500 / 341, 375 / 256
    left = 341 - 58 - 224  # the crop's left edge, seen in the unflipped image
    assert g.box == pytest.approx((left * sx, 16 * sy, (left + 224) * sx, (16 + 224) * sy))
    assert g.flip


def test_random_resized_crop_geometry_is_its_box() -> None:
    t = T.RandomResizedCrop((24, 32))
    plan = T.compile_transforms([t, T.RandomHorizontalFlip()])
    for seed in range(50):
        g = plan.sample(120, 160, np.random.default_rng(seed))
        top, left, h, w = t.sample_box(120, 160, np.random.default_rng(seed))
        assert g.box == (left, top, left + w, top + h)
        assert (g.out_height, g.out_width) == (24, 32)


# ---------------------------------------------------------------------------------------------
# Pixels: the Pillow backend against what torchvision computes on PIL images


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    return {
        "rgb": write_image(root / "rgb.jpg", 120, 160, seed=1),
        "portrait": write_image(root / "portrait.jpg", 160, 96, seed=2),
        "gray": write_image(root / "gray.jpg", 128, 128, seed=3, mode="L"),
        "png": write_image(root / "rgba.png", 100, 150, seed=4, mode="RGBA"),
    }


def _load_rgb(path: Path) -> Image.Image:
    with Image.open(path) as img:  # torchvision's ImageFolder loader: open, convert("RGB")
        return img.convert("RGB")


def _reference(path: Path, box: tuple[int, int, int, int], size: tuple[int, int], flip: bool) -> np.ndarray:
    """torchvision's F.resized_crop + F.hflip on a PIL image: crop, resize (BILINEAR), mirror."""
    out = _load_rgb(path).crop(box).resize((size[1], size[0]), BILINEAR)
    if flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _int_box(box: tuple[float, float, float, float]) -> tuple[int, int, int, int]:
    assert all(float(v).is_integer() for v in box), box
    return tuple(int(v) for v in box)  # type: ignore[return-value]


@pytest.mark.parametrize("name", ["rgb", "portrait", "gray", "png"])
def test_pillow_backend_without_draft_is_torchvisions_pixels(sources: dict[str, Path], name: str) -> None:
    plan = T.compile_transforms([T.RandomResizedCrop((40, 48)), T.RandomHorizontalFlip()])
    blob = sources[name].read_bytes()
    flips = 0
    for seed in range(16):
        out = np.zeros((40, 48, 3), np.uint8)
        g = decode_into(blob, plan, np.random.default_rng(seed), out, draft=False)
        flips += g.flip
        want = _reference(sources[name], _int_box(g.box), (40, 48), g.flip)
        np.testing.assert_array_equal(out, want, err_msg=f"seed {seed}, box {g.box}")
    assert 0 < flips < 16


def test_pillow_backend_resize_center_crop_is_torchvisions_pixels(sources: dict[str, Path]) -> None:
    plan = T.compile_transforms([T.Resize(64), T.CenterCrop(56)])
    for name in ("rgb", "portrait"):
        img = _load_rgb(sources[name])
        new_h, new_w = T.Resize(64).output_size(img.height, img.width)
        top, left, h, w = T.CenterCrop(56).box(new_h, new_w)
        want = np.asarray(img.resize((new_w, new_h), BILINEAR).crop((left, top, left + w, top + h)))
        out = np.zeros((56, 56, 3), np.uint8)
        decode_into(sources[name].read_bytes(), plan, np.random.default_rng(0), out, draft=False)
        # One resample of the box instead of resize-then-crop: the same filter taps, up to the
        # rounding of the window positions.
        assert np.abs(out.astype(int) - want).max() <= 1
        assert _psnr(out, want) > 45


@pytest.mark.parametrize("name", ["rgb", "portrait", "gray"])
def test_pillow_backend_with_draft_is_close_to_torchvision(sources: dict[str, Path], name: str) -> None:
    plan = T.compile_transforms([T.RandomResizedCrop(24, scale=(0.3, 1.0)), T.RandomHorizontalFlip()])
    blob = sources[name].read_bytes()
    differs = 0
    for seed in range(16):
        fast = np.zeros((24, 24, 3), np.uint8)
        exact = np.zeros((24, 24, 3), np.uint8)
        g = decode_into(blob, plan, np.random.default_rng(seed), fast, draft=True)
        decode_into(blob, plan, np.random.default_rng(seed), exact, draft=False)
        want = _reference(sources[name], _int_box(g.box), (24, 24), g.flip)
        assert _psnr(fast, want) >= 30, f"seed {seed}, box {g.box}"
        differs += not np.array_equal(fast, exact)
    assert differs > 0, "draft mode never engaged: the test images are too small to test it"


# ---------------------------------------------------------------------------------------------
# Against torchvision itself, where it is installed (it is not a dependency)


def test_against_torchvision_when_installed(sources: dict[str, Path]) -> None:
    torchvision = torchvision_or_skip()
    import torch
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    # get_params draws from torch's RNG, ours from numpy: compare the distributions.
    torch.manual_seed(0)
    tv = torchvision.transforms.RandomResizedCrop(16)
    img = torch.zeros(3, 300, 400)
    tv_boxes = np.array([tv.get_params(img, tv.scale, tv.ratio) for _ in range(4000)], dtype=np.float64)
    ours = T.RandomResizedCrop(16)
    our_boxes = np.array(
        [ours.sample_box(300, 400, np.random.default_rng(s)) for s in range(4000)], np.float64
    )
    for boxes in (tv_boxes, our_boxes):
        assert boxes[:, 0].min() >= 0 and (boxes[:, 0] + boxes[:, 2]).max() <= 300
    tv_area, our_area = (b[:, 2] * b[:, 3] / (300 * 400) for b in (tv_boxes, our_boxes))
    tv_ratio, our_ratio = (np.log(b[:, 3] / b[:, 2]) for b in (tv_boxes, our_boxes))
    assert abs(tv_area.mean() - our_area.mean()) < 0.02
    assert abs(tv_ratio.mean() - our_ratio.mean()) < 0.02
    assert abs(np.median(tv_boxes[:, 0]) - np.median(our_boxes[:, 0])) < 10

    # Pixels: F.resized_crop (+ hflip) on the PIL image, with the box our plan chose.
    plan = T.compile_transforms([ours, T.RandomHorizontalFlip()])
    for seed in range(8):
        out = np.zeros((16, 16, 3), np.uint8)
        g = decode_into(sources["rgb"].read_bytes(), plan, np.random.default_rng(seed), out, draft=False)
        left, top, right, bottom = _int_box(g.box)
        want = F.resized_crop(
            _load_rgb(sources["rgb"]),
            top,
            left,
            bottom - top,
            right - left,
            [16, 16],
            interpolation=InterpolationMode.BILINEAR,
        )
        if g.flip:
            want = F.hflip(want)
        np.testing.assert_array_equal(out, np.asarray(want))


def test_center_crop_alone_copies_pixels(sources: dict[str, Path]) -> None:
    plan = T.compile_transforms([T.CenterCrop(32)])
    out = np.zeros((32, 32, 3), np.uint8)
    decode_into(sources["rgb"].read_bytes(), plan, np.random.default_rng(0), out, draft=False)
    np.testing.assert_array_equal(out, np.asarray(_load_rgb(sources["rgb"]).crop((64, 44, 96, 76))))


def test_torchvisions_interpolation_mode_is_taken_as_its_name() -> None:
    mode = torchvision_or_skip().transforms.InterpolationMode
    assert T.Resize(10, interpolation=mode.BICUBIC).interpolation == "bicubic"
    nearest = T.RandomResizedCrop(8, interpolation=mode.NEAREST)
    assert nearest == T.RandomResizedCrop(8, interpolation="nearest")
    config = json.loads(json.dumps(T.to_config([T.Resize(10, interpolation=mode.BOX)])))
    assert config[0]["interpolation"] == "box"


def test_policies_take_torchvisions_interpolation_mode_too() -> None:
    mode = torchvision_or_skip().transforms.InterpolationMode
    assert T.RandAugment(interpolation=mode.BILINEAR).interpolation == "bilinear"
    assert T.TrivialAugmentWide(interpolation=mode.NEAREST) == T.TrivialAugmentWide(interpolation="nearest")
