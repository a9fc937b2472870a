"""The pixel-stage geometric transforms (`fastload.transforms._warps`: RandomVerticalFlip,
RandomRotation, RandomAffine) and Grayscale against torchvision v2, and their conversion.

Protects: each sample's pixels equal torchvision's tensor kernel (`vertical_flip`, `rotate`,
`affine`) on the parameters that sample drew (tolerance 0), for random angles, translations,
scales and shears, nearest and bilinear, every fill, a given centre, square and oblong images,
both memory layouts; the quarter turns torchvision takes as `rot90`; the parameters' ranges; the
torchvision parameters fastload refuses (expand, one grey channel) and where such a transform may
stand in a chain; and that FastLoader takes a torchvision Compose of them, giving the batches of
the same fastload chain.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from test_augment_policies import FILLS, INTERPOLATIONS, _images, _tv_fill, _tv_mode, _v2
from test_torchvision_compat import api

from fastload import ConfigError
from fastload import transforms as T
from fastload._augment.ops import to_device
from fastload._augment.perspective import corners
from fastload._augment.registry import sample_op


def _run(t: T.Transform, x: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, dict[str, Any], Any]:
    """(output, host params, op) of t's kernel on a copy of x with seeded uniforms."""
    op = sample_op(t)
    u = np.random.default_rng(seed).random((x.shape[0], op.draws))
    params = op.params(u)
    out = op.apply(x.clone(), to_device(params, x.device))
    return out, params, op


@pytest.mark.parametrize("channels_last", [False, True])
def test_vertical_flip_flips_the_samples_that_drew_it(channels_last: bool) -> None:
    F = _v2().functional
    x = _images(8, 12, 10, channels_last)
    out, params, _ = _run(T.RandomVerticalFlip(0.5), x)
    flipped = set(params["index"].tolist())
    assert 0 < len(flipped) < 8
    for i in range(8):
        expected = F.vertical_flip(x[i]) if i in flipped else x[i]
        assert torch.equal(out[i], expected)


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize(("height", "width", "channels_last"), [(16, 16, True), (12, 18, False)])
@pytest.mark.parametrize("center", [None, (3.0, 5.5)])
def test_rotation_equals_torchvision_per_sample(
    fill: Any, interpolation: str, height: int, width: int, channels_last: bool, center: Any
) -> None:
    F = _v2().functional
    x = _images(6, height, width, channels_last)
    t = T.RandomRotation(60, interpolation=interpolation, center=center, fill=fill)
    out, params, _ = _run(t, x)
    assert np.all(np.abs(params["angle"]) <= 60) and len(set(params["angle"].tolist())) == 6
    for i, angle in enumerate(params["angle"].tolist()):
        where = None if center is None else list(center)
        mode = _tv_mode(interpolation)
        expected = F.rotate(x[i], angle, interpolation=mode, center=where, fill=_tv_fill(fill))
        assert torch.equal(out[i], expected), (i, angle)


@pytest.mark.parametrize("degrees", [0, 90, 180, 270, -90, 450])
@pytest.mark.parametrize(("height", "width"), [(16, 16), (12, 18)])
def test_rotation_by_quarter_turns_is_torchvisions_fast_path_or_its_grid(
    degrees: float, height: int, width: int
) -> None:
    v2 = _v2()
    x = _images(3, height, width, True)
    out, _, _ = _run(T.RandomRotation((degrees, degrees)), x)
    reference = v2.RandomRotation((degrees, degrees))
    for i in range(3):
        assert torch.equal(out[i], reference(x[i]))


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize(("height", "width", "channels_last"), [(16, 16, True), (12, 18, False)])
@pytest.mark.parametrize("center", [None, (4.0, 2.5)])
def test_affine_equals_torchvision_per_sample(
    fill: Any, interpolation: str, height: int, width: int, channels_last: bool, center: Any
) -> None:
    F = _v2().functional
    x = _images(6, height, width, channels_last)
    t = T.RandomAffine(
        (-40, 40), translate=(0.2, 0.3), scale=(0.7, 1.3), shear=(-15, 15, -8, 8),
        interpolation=interpolation, fill=fill, center=center,
    )
    out, params, op = _run(t, x)
    shifts = op.translations(torch.from_numpy(params["shift"]), height, width)
    assert float(shifts[:, 0].abs().max()) <= round(0.2 * width)
    assert float(shifts[:, 1].abs().max()) <= round(0.3 * height)
    assert np.all((params["scale"] >= 0.7) & (params["scale"] <= 1.3))
    for i in range(6):
        expected = F.affine(
            x[i],
            angle=float(params["angle"][i]),
            translate=[float(v) for v in shifts[i]],
            scale=float(params["scale"][i]),
            shear=[float(v) for v in params["shear"][i]],
            interpolation=_tv_mode(interpolation),
            fill=_tv_fill(fill),
            center=None if center is None else list(center),
        )
        assert torch.equal(out[i], expected), i


def test_affine_translations_cover_torchvisions_range() -> None:
    op = sample_op(T.RandomAffine(0, translate=(0.25, 0.0)))
    shift = torch.from_numpy(np.random.default_rng(1).random((4000, 2)).astype(np.float32))
    tx = op.translations(shift, 10, 16)[:, 0]  # max_dx = 4: round(uniform(-4, 4)), halves to even
    counts = torch.bincount((tx + 4).to(torch.int64), minlength=9).tolist()
    assert all(c > 0 for c in counts) and counts[0] < counts[1] and counts[8] < counts[7]


@pytest.mark.parametrize("fill", FILLS)
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize(("height", "width", "channels_last"), [(16, 16, True), (13, 18, False)])
def test_perspective_equals_torchvision_per_sample(
    fill: Any, interpolation: str, height: int, width: int, channels_last: bool
) -> None:
    F = _v2().functional
    from torchvision.transforms.functional import _get_perspective_coeffs

    x = _images(8, height, width, channels_last)
    t = T.RandomPerspective(0.6, p=0.75, interpolation=interpolation, fill=fill)
    out, params, op = _run(t, x)
    chosen = params["index"].tolist()
    assert 0 < len(chosen) < 8
    ends = corners(torch.from_numpy(params["corners"]), height, width, 0.6)
    ours = op.coefficients(torch.from_numpy(params["corners"]), height, width)
    start = [[0, 0], [width - 1, 0], [width - 1, height - 1], [0, height - 1]]
    for row, i in enumerate(chosen):
        end = [[int(v) for v in corner] for corner in ends[row]]
        bound_w, bound_h = int(0.6 * (width // 2)) + 1, int(0.6 * (height // 2)) + 1
        assert 0 <= end[0][0] < bound_w and width - bound_w <= end[1][0] < width
        assert height - bound_h <= end[2][1] < height and 0 <= end[3][0] < bound_w
        coeffs = _get_perspective_coeffs(start, end)
        assert ours[row].tolist() == coeffs
        expected = F.perspective(
            x[i], None, None, interpolation=_tv_mode(interpolation), fill=_tv_fill(fill), coefficients=coeffs
        )
        assert torch.equal(out[i], expected), i
    untouched = [i for i in range(8) if i not in chosen]
    assert torch.equal(out[untouched], x[untouched])


def test_perspective_draws_every_corner_torchvision_can() -> None:
    u = torch.from_numpy(np.random.default_rng(2).random((3000, 8)))
    ends = corners(u, 10, 20, 1.0)  # bounds: 11 along x (width // 2 + 1), 6 along y
    assert sorted(set(ends[:, 0, 0].tolist())) == list(range(11))
    assert sorted(set(ends[:, 2, 1].tolist())) == list(range(4, 10))


def test_refused_parameters_say_what_to_do() -> None:
    with pytest.raises(ConfigError, match="expand must be False"):
        T.RandomRotation(10, expand=True)
    with pytest.raises(ConfigError, match="num_output_channels must be 3"):
        T.Grayscale(1)
    with pytest.raises(ConfigError, match="RandomAffine: shear"):
        T.RandomAffine(0, shear=(1, 2, 3))
    with pytest.raises(ConfigError, match="RandomAffine: translate"):
        T.RandomAffine(0, translate=(0.5, 2))
    with pytest.raises(ConfigError, match="RandomRotation: degrees"):
        T.RandomRotation((10, -10))
    with pytest.raises(ConfigError, match="RandomRotation: interpolation"):
        T.RandomRotation(10, interpolation="bicubic")
    v2 = _v2()
    with pytest.raises(ConfigError, match="Grayscale: num_output_channels"):
        T.from_torchvision(v2.Grayscale())
    with pytest.raises(ConfigError, match="RandomRotation: expand"):
        T.from_torchvision(v2.RandomRotation(10, expand=True))
    # Like every pixel-stage transform, after the crops: a chain that rotates first is refused.
    with pytest.raises(ConfigError, match=r"CenterCrop \(geometry stage\) comes after RandomRotation"):
        T.compile_transforms([T.RandomRotation(10), T.CenterCrop(8)])


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_conversion_reads_torchvisions_stored_parameters(version: str) -> None:
    m = api(version)
    (rotation, affine, flip, grey, perspective), normalize = T.from_torchvision(
        [
            m.RandomRotation(15, fill=[5, 25, 100]),
            m.RandomAffine(10, translate=(0.1, 0.2), scale=(0.9, 1.1), shear=5),
            m.RandomVerticalFlip(0.3),
            m.Grayscale(num_output_channels=3),
            m.RandomPerspective(0.2, p=0.4, fill=[1, 0, 7]),
        ]
    )
    assert rotation == T.RandomRotation((-15.0, 15.0), fill=(5.0, 25.0, 100.0)) and normalize is None
    assert affine == T.RandomAffine((-10.0, 10.0), translate=(0.1, 0.2), scale=(0.9, 1.1), shear=(-5.0, 5.0))
    assert flip == T.RandomVerticalFlip(0.3) and grey == T.Grayscale(3)
    assert perspective == T.RandomPerspective(0.2, p=0.4, fill=(1.0, 0.0, 7.0))
    # A fill written for float images in [0, 1] (after the conversion to float) is scaled to uint8.
    to_float = [m.ToTensor()] if version == "v1" else [m.ToImage(), m.ToDtype(torch.float32, scale=True)]
    (scaled,), _ = T.from_torchvision([*to_float, m.RandomRotation(15, fill=[0.5, 0.25, 1.0])])
    assert scaled == T.RandomRotation((-15.0, 15.0), fill=(127.5, 63.75, 255.0))


def test_fastloader_takes_a_torchvision_compose_of_them(image_folder: Any) -> None:
    from fastload import FastLoader

    v2 = _v2()
    pipeline = v2.Compose(
        [
            v2.RandomResizedCrop(20),
            v2.RandomVerticalFlip(),
            v2.RandomRotation(20, interpolation=v2.InterpolationMode.BILINEAR),
            v2.RandomAffine(5, translate=(0.1, 0.1), shear=3),
            v2.RandomPerspective(0.3),
            v2.RandomGrayscale(0.3),
            v2.Grayscale(3),
        ]
    )
    chain = [
        T.RandomResizedCrop(20), T.RandomVerticalFlip(), T.RandomRotation(20, interpolation="bilinear"),
        T.RandomAffine(5, translate=(0.1, 0.1), shear=3), T.RandomPerspective(0.3), T.RandomGrayscale(0.3),
        T.Grayscale(3),
    ]
    common: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 4, "device": "cpu"}
    with FastLoader(image_folder, transform=pipeline, num_workers=0, **common) as converted, FastLoader(
        image_folder, transform=chain, num_workers=2, **common
    ) as native:
        batches = 0
        for (xa, ya), (xb, yb) in zip(converted, native, strict=True):
            # The same batches from the converted chain inline and fastload's own in two workers.
            assert xa.dtype == torch.uint8 and torch.equal(xa, xb) and torch.equal(ya, yb)
            assert torch.equal(xa[:, 0], xa[:, 1])  # Grayscale: 3 equal channels
            batches += 1
        assert batches == 3


def test_timms_vflip_recipe_converts() -> None:
    from test_timm import convert, timm_data

    recipe = timm_data().create_transform(32, is_training=True, hflip=0.5, vflip=0.25, color_jitter=None)
    transforms, _, _ = convert(recipe)
    flips = [T.RandomResizedCrop, T.RandomHorizontalFlip, T.RandomVerticalFlip]
    assert [type(t) for t in transforms[:3]] == flips and T.RandomVerticalFlip(0.25) in transforms
