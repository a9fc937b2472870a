"""`from_torchvision`: torchvision pipelines (v1 and v2) as fastload transforms and normalization.

Protects what a user moving a torchvision recipe to fastload relies on: every supported transform
converts to the equal fastload transform with its parameters (torchvision's defaults included,
as torchvision stores them: ColorJitter(0.4) is a brightness range only), v1 and v2 alike;
interpolation modes and AutoAugment policies by name; the Normalize returned as FastLoader's
`normalize`; the units of values written for float images; unsupported transforms named in a
ConfigError that points to the Dataset path; the result surviving `to_config`/`from_config`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import torchvision_or_skip

from fastload import ConfigError
from fastload import transforms as T
from fastload.transforms import from_torchvision

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def api(version: str) -> types.ModuleType:
    """torchvision.transforms ("v1") or torchvision.transforms.v2 (the test is skipped without it)."""
    torchvision_or_skip()
    import torchvision.transforms
    import torchvision.transforms.v2

    return torchvision.transforms if version == "v1" else torchvision.transforms.v2


def tv(version: str, name: str) -> Any:
    module = api(version)
    if not hasattr(module, name):
        pytest.skip(f"torchvision.transforms {version} has no {name}")
    return getattr(module, name)


def mode(name: str) -> Any:
    """An InterpolationMode by name."""
    return getattr(api("v1").InterpolationMode, name)


def only(t: Any) -> T.Transform:
    transforms, _ = from_torchvision(t)
    assert len(transforms) == 1
    return transforms[0]


# (what to build in torchvision, with its module's names; the equal fastload transform)
CASES: list[tuple[str, Callable[[Callable[[str], Any]], Any], T.Transform]] = [
    ("rrc-default", lambda m: m("RandomResizedCrop")(224), T.RandomResizedCrop((224, 224))),
    (
        "rrc",
        lambda m: m("RandomResizedCrop")(
            (20, 30), scale=(0.2, 0.9), ratio=(0.5, 2.0), interpolation=mode("BICUBIC"), antialias=False
        ),
        T.RandomResizedCrop((20, 30), (0.2, 0.9), (0.5, 2.0), "bicubic", False),
    ),
    ("resize-default", lambda m: m("Resize")(256), T.Resize(256)),
    (
        "resize-pair",
        lambda m: m("Resize")((20, 30), interpolation=mode("NEAREST")),
        T.Resize((20, 30), "nearest"),
    ),
    (
        "resize-max",
        lambda m: m("Resize")([100], max_size=200, interpolation=mode("BOX")),
        T.Resize(100, "box", 200),
    ),
    ("center-crop", lambda m: m("CenterCrop")(224), T.CenterCrop((224, 224))),
    ("center-crop-pair", lambda m: m("CenterCrop")((20, 30)), T.CenterCrop((20, 30))),
    ("flip-default", lambda m: m("RandomHorizontalFlip")(), T.RandomHorizontalFlip()),
    ("flip", lambda m: m("RandomHorizontalFlip")(0.3), T.RandomHorizontalFlip(0.3)),
    ("jitter-brightness", lambda m: m("ColorJitter")(0.4), T.ColorJitter(brightness=(0.6, 1.4))),
    (
        "jitter-all",
        lambda m: m("ColorJitter")(0.4, 0.3, 0.2, 0.1),
        T.ColorJitter((0.6, 1.4), (0.7, 1.3), (0.8, 1.2), (-0.1, 0.1)),
    ),
    (
        "jitter-ranges",
        lambda m: m("ColorJitter")(brightness=(0.5, 1.5), saturation=1.5, hue=(-0.2, 0.1)),
        T.ColorJitter(brightness=(0.5, 1.5), saturation=(0.0, 2.5), hue=(-0.2, 0.1)),
    ),
    ("jitter-none", lambda m: m("ColorJitter")(), T.ColorJitter()),
    ("grayscale-default", lambda m: m("RandomGrayscale")(), T.RandomGrayscale()),
    ("grayscale", lambda m: m("RandomGrayscale")(0.7), T.RandomGrayscale(0.7)),
    ("blur-default", lambda m: m("GaussianBlur")(5), T.GaussianBlur((5, 5), (0.1, 2.0))),
    ("blur", lambda m: m("GaussianBlur")((3, 7), sigma=1.5), T.GaussianBlur((3, 7), (1.5, 1.5))),
    ("solarize", lambda m: m("RandomSolarize")(128), T.RandomSolarize(128)),
    ("solarize-p", lambda m: m("RandomSolarize")(200, p=0.3), T.RandomSolarize(200, 0.3)),
    ("posterize", lambda m: m("RandomPosterize")(4), T.RandomPosterize(4)),
    ("posterize-p", lambda m: m("RandomPosterize")(2, p=0.9), T.RandomPosterize(2, 0.9)),
    ("autocontrast", lambda m: m("RandomAutocontrast")(), T.RandomAutocontrast()),
    ("autocontrast-p", lambda m: m("RandomAutocontrast")(0.2), T.RandomAutocontrast(0.2)),
    ("equalize", lambda m: m("RandomEqualize")(), T.RandomEqualize()),
    ("equalize-p", lambda m: m("RandomEqualize")(0.9), T.RandomEqualize(0.9)),
    ("randaugment-default", lambda m: m("RandAugment")(), T.RandAugment()),
    (
        "randaugment",
        lambda m: m("RandAugment")(
            num_ops=3, magnitude=5, num_magnitude_bins=11, interpolation=mode("BILINEAR"), fill=[10, 20, 30]
        ),
        T.RandAugment(3, 5, 11, "bilinear", (10.0, 20.0, 30.0)),
    ),
    ("trivial-default", lambda m: m("TrivialAugmentWide")(), T.TrivialAugmentWide()),
    (
        "trivial",
        lambda m: m("TrivialAugmentWide")(num_magnitude_bins=15, fill=7),
        T.TrivialAugmentWide(15, fill=7),
    ),
    ("autoaugment-default", lambda m: m("AutoAugment")(), T.AutoAugment()),
    (
        "autoaugment",
        lambda m: m("AutoAugment")(m("AutoAugmentPolicy").SVHN, interpolation=mode("BILINEAR"), fill=128),
        T.AutoAugment("svhn", "bilinear", 128),
    ),
    ("augmix-default", lambda m: m("AugMix")(), T.AugMix()),
    (
        "augmix",
        lambda m: m("AugMix")(severity=5, mixture_width=2, chain_depth=2, alpha=0.5, all_ops=False),
        T.AugMix(5, 2, 2, 0.5, False),
    ),
    ("erasing-default", lambda m: m("RandomErasing")(), T.RandomErasing()),
    (
        "erasing",
        lambda m: m("RandomErasing")(p=0.25, scale=(0.1, 0.2), ratio=(0.5, 2), value=(1, 2, 3)),
        T.RandomErasing(0.25, (0.1, 0.2), (0.5, 2.0), (1.0, 2.0, 3.0)),
    ),
    ("erasing-random", lambda m: m("RandomErasing")(value="random"), T.RandomErasing(value="random")),
    ("mixup", lambda m: m("MixUp")(num_classes=10), T.MixUp(num_classes=10)),
    ("cutmix", lambda m: m("CutMix")(alpha=0.5, num_classes=3), T.CutMix(alpha=0.5, num_classes=3)),
    (
        "choice",
        lambda m: m("RandomChoice")([m("MixUp")(num_classes=5), m("CutMix")(num_classes=5)]),
        T.RandomChoice((T.MixUp(num_classes=5), T.CutMix(num_classes=5))),
    ),
    (
        "choice-p",
        lambda m: m("RandomChoice")(
            [m("MixUp")(alpha=0.2, num_classes=5), m("CutMix")(num_classes=5)], p=[1, 3]
        ),
        T.RandomChoice((T.MixUp(alpha=0.2, num_classes=5), T.CutMix(num_classes=5)), p=(0.25, 0.75)),
    ),
]


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize(("built", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_supported_transform_converts_with_its_parameters(
    version: str, built: Callable[[Callable[[str], Any]], Any], expected: T.Transform
) -> None:
    t = built(lambda name: tv(version, name))
    got = only(t)
    assert got == expected
    assert T.to_config([got]) == T.to_config([expected])  # the same types, field by field
    if isinstance(expected, T.ColorJitter):
        assert got.ranges() == expected.ranges()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name",
    [
        "RandomHorizontalFlip",
        "ColorJitter",
        "RandomGrayscale",
        "RandomAutocontrast",
        "RandomEqualize",
        "RandAugment",
        "TrivialAugmentWide",
        "AutoAugment",
        "AugMix",
        "RandomErasing",
    ],
)
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_torchvisions_defaults_are_fastloads(version: str, name: str) -> None:
    assert only(tv(version, name)()) == getattr(T, name)()


def test_color_jitter_with_one_number_is_brightness_only() -> None:
    for version in ("v1", "v2"):
        got = only(tv(version, "ColorJitter")(0.4))
        assert got.ranges() == T.ColorJitter(0.4).ranges() == ((0.6, 1.4), None, None, None)  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_interpolation_modes_map_to_fastloads_names(version: str) -> None:
    modes = api("v1").InterpolationMode
    for m in modes:
        if m is modes.NEAREST_EXACT:
            with pytest.raises(ConfigError, match="NEAREST_EXACT"):
                from_torchvision(tv(version, "Resize")(8, interpolation=m))
            continue
        assert only(tv(version, "Resize")(8, interpolation=m)) == T.Resize(8, interpolation=m.value)
        rrc = only(tv(version, "RandomResizedCrop")(8, interpolation=m))
        assert rrc.interpolation == m.value  # type: ignore[attr-defined]
    assert {m.value for m in modes} - {"nearest-exact"} == {
        "nearest",
        "bilinear",
        "bicubic",
        "box",
        "hamming",
        "lanczos",
    }


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_autoaugment_policies_map_to_fastloads_names(version: str) -> None:
    policies = api("v1").AutoAugmentPolicy
    for policy in policies:
        assert only(tv(version, "AutoAugment")(policy)) == T.AutoAugment(policy.value)
    assert {p.value for p in policies} == {"imagenet", "cifar10", "svhn"}


def recipe(version: str) -> Any:
    """torchvision's reference ImageNet training recipe (references/classification/presets.py)."""
    m = api(version)
    head = [m.RandomResizedCrop(176, interpolation=mode("BILINEAR")), m.RandomHorizontalFlip(0.5)]
    head.append(m.TrivialAugmentWide(interpolation=mode("BILINEAR")))
    if version == "v1":
        tail = [
            m.PILToTensor(),
            m.ConvertImageDtype(torch.float),
            m.Normalize(*IMAGENET),
            m.RandomErasing(0.1),
        ]
    else:
        tail = [
            m.PILToTensor(),
            m.ToDtype(torch.float, scale=True),
            m.Normalize(*IMAGENET),
            m.RandomErasing(0.1),
        ]
    return m.Compose(head + tail)


def test_a_recipe_converts_the_same_from_v1_and_v2() -> None:
    expected = (
        T.RandomResizedCrop((176, 176)),
        T.RandomHorizontalFlip(0.5),
        T.TrivialAugmentWide(interpolation="bilinear"),
        T.RandomErasing(0.1),
    )
    for version in ("v1", "v2"):
        transforms, normalize = from_torchvision(recipe(version))
        assert transforms == expected
        assert normalize == IMAGENET
        assert T.compile_transforms(transforms).out_height == 176


def test_chains_lists_and_nested_composes_are_flattened() -> None:
    v1, v2 = api("v1"), api("v2")
    nested = v2.Compose(
        [v2.Compose([v2.Resize(256), v2.CenterCrop(224)]), [v2.ToImage(), v1.RandomHorizontalFlip()]]
    )
    transforms, normalize = from_torchvision(nested)
    assert transforms == (T.Resize(256), T.CenterCrop((224, 224)), T.RandomHorizontalFlip())
    assert normalize is None  # uint8 images: no normalization
    # fastload transforms in the list are kept as they are
    assert from_torchvision([v1.Resize(256), T.CenterCrop(224)]) == ((T.Resize(256), T.CenterCrop(224)), None)
    assert from_torchvision([]) == ((), None)


def test_v1_random_choice_of_v2_mixing() -> None:
    # v1 has no MixUp / CutMix; its RandomChoice (which keeps the weights as given) can hold v2's.
    v1, v2 = api("v1"), api("v2")
    choice = v1.RandomChoice([v2.MixUp(alpha=0.2, num_classes=5), v2.CutMix(num_classes=5)], p=[1, 3])
    expected = T.RandomChoice((T.MixUp(alpha=0.2, num_classes=5), T.CutMix(num_classes=5)), p=(0.25, 0.75))
    assert only(choice) == expected


# ---------------------------------------------------------------------------------------------
# Normalize and units


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_normalize_is_returned_and_conversions_dropped(version: str) -> None:
    m = api(version)
    to_float = m.ToTensor() if version == "v1" else m.ToDtype(torch.float32, scale=True)
    for chain in (
        [m.RandomResizedCrop(8), to_float, m.Normalize(*IMAGENET)],
        [to_float, m.Normalize(list(IMAGENET[0]), list(IMAGENET[1])), m.RandomResizedCrop(8)],
        [m.Normalize(*IMAGENET), m.RandomResizedCrop(8), to_float],  # placement is irrelevant
    ):
        assert from_torchvision(m.Compose(chain)) == ((T.RandomResizedCrop((8, 8)),), IMAGENET)
    # One value for every channel, as torchvision broadcasts it.
    assert from_torchvision([to_float, m.Normalize([0.5], [0.25])])[1] == ((0.5,) * 3, (0.25,) * 3)
    # Float images in [0, 1] without a Normalize: fastload makes them with mean 0 and std 1.
    assert from_torchvision([m.CenterCrop(8), to_float])[1] == ((0.0,) * 3, (1.0,) * 3)
    assert from_torchvision([m.CenterCrop(8), m.PILToTensor()])[1] is None  # uint8
    with pytest.raises(ConfigError, match="two Normalize"):
        from_torchvision([to_float, m.Normalize(*IMAGENET), m.Normalize(*IMAGENET)])


def test_normalize_of_unscaled_floats_is_in_fastloads_units() -> None:
    v2 = api("v2")
    mean255, std255 = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]
    _, normalize = from_torchvision([v2.ToImage(), v2.ToDtype(torch.float32), v2.Normalize(mean255, std255)])
    assert normalize is not None
    assert normalize[0] == pytest.approx(IMAGENET[0]) and normalize[1] == pytest.approx(IMAGENET[1])
    # Floats in 0..255 without a Normalize: std 1/255 keeps them in 0..255.
    assert from_torchvision([v2.ToImage(), v2.ToDtype(torch.float32)])[1] == ((0.0,) * 3, (1 / 255,) * 3)
    # ToImage then ToDtype(scale=True) then back to uint8: no normalization.
    back = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.ToDtype(torch.uint8, scale=True)]
    assert from_torchvision(back)[1] is None
    # A dict of dtypes by input type: the images' entry.
    image_type = torchvision_or_skip().tv_tensors.Image
    by_type = v2.ToDtype({image_type: torch.float32, "others": None}, scale=True)
    assert from_torchvision([v2.ToImage(), by_type])[1] == ((0.0,) * 3, (1.0,) * 3)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_values_for_float_images_are_scaled_to_uint8_units(version: str) -> None:
    m = api(version)
    to_float = m.ToTensor() if version == "v1" else m.ToDtype(torch.float32, scale=True)
    # torchvision's threshold and fill are in the units of the images they get.
    transforms, _ = from_torchvision([m.RandomSolarize(100), to_float, m.RandomSolarize(0.5)])
    assert transforms == (T.RandomSolarize(100), T.RandomSolarize(127.5))
    transforms, _ = from_torchvision([to_float, m.RandAugment(fill=[0.0, 0.5, 1.0])])
    assert transforms == (T.RandAugment(fill=(0.0, 127.5, 255.0)),)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_erasing_before_normalize_gets_its_value_normalized(version: str) -> None:
    m = api(version)
    to_float = m.ToTensor() if version == "v1" else m.ToDtype(torch.float32, scale=True)
    transforms, normalize = from_torchvision(
        [to_float, m.RandomErasing(p=1.0, value=0), m.Normalize(*IMAGENET)]
    )
    assert normalize == IMAGENET
    value = transforms[0].value  # type: ignore[attr-defined]
    assert value == pytest.approx([-m_ / s for m_, s in zip(*IMAGENET, strict=True)])
    after, _ = from_torchvision([to_float, m.Normalize(*IMAGENET), m.RandomErasing(p=1.0, value=0)])
    assert after == (T.RandomErasing(p=1.0, value=0.0),)
    with pytest.raises(ConfigError, match="after Normalize"):
        from_torchvision([to_float, m.RandomErasing(value="random"), m.Normalize(*IMAGENET)])


def test_erasing_before_the_conversion_to_float() -> None:
    v2 = api("v2")
    # On uint8 images (v2 erases them), then normalized: the value is in uint8 units.
    chain = [v2.ToImage(), v2.RandomErasing(value=(255, 0, 51)), v2.ToDtype(torch.float32, scale=True)]
    transforms, _ = from_torchvision([*chain, v2.Normalize([0.5] * 3, [0.5] * 3)])
    assert transforms[0].value == pytest.approx((1.0, -1.0, -0.6))  # type: ignore[attr-defined]
    # Without a Normalize, the output is floats in [0, 1]: so is the value.
    transforms, normalize = from_torchvision(
        [v2.ToImage(), v2.RandomErasing(value=255), v2.ToDtype(torch.float32, scale=True)]
    )
    assert transforms == (T.RandomErasing(value=1.0),) and normalize == ((0.0,) * 3, (1.0,) * 3)
    # Noise is the same in [0, 1] units as in the output's, not in uint8 units.
    transforms, _ = from_torchvision(
        [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.RandomErasing(value="random")]
    )
    assert transforms == (T.RandomErasing(value="random"),)
    with pytest.raises(ConfigError, match="before Normalize"):
        from_torchvision(
            [v2.ToImage(), v2.RandomErasing(value="random"), v2.ToDtype(torch.float32, scale=True)]
        )


@pytest.mark.parametrize("name", ["ColorJitter", "RandAugment", "RandomEqualize"])
def test_photometric_transforms_after_normalize_are_refused(name: str) -> None:
    v1 = api("v1")
    args = (0.4,) if name == "ColorJitter" else ()
    with pytest.raises(ConfigError, match=f"{name} comes after Normalize"):
        from_torchvision([v1.ToTensor(), v1.Normalize(*IMAGENET), getattr(v1, name)(*args)])


# ---------------------------------------------------------------------------------------------
# What cannot be converted


def _unsupported(version: str) -> list[tuple[str, Any]]:
    m = api(version)
    cases = [
        ("Lambda", m.Lambda(lambda x: x)),
        ("ElasticTransform", m.ElasticTransform()),
        ("RandomOrder", m.RandomOrder([m.RandomHorizontalFlip()])),
        ("RandomChoice", m.RandomChoice([m.ColorJitter(0.4), m.RandomGrayscale()])),
    ]
    if version == "v2":
        cases.append(("RandomPhotometricDistort", m.RandomPhotometricDistort()))
    return cases


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_unsupported_transforms_are_named_with_the_dataset_path(version: str) -> None:
    m = api(version)
    for name, t in _unsupported(version):
        with pytest.raises(ConfigError) as caught:
            from_torchvision(m.Compose([m.RandomResizedCrop(8), t]))
        message = str(caught.value)
        assert message.startswith(name), message
        assert "Dataset" in message and "FastLoader" in message, message


def test_foreign_objects_and_impossible_parameters_are_config_errors() -> None:
    v2 = api("v2")
    with pytest.raises(ConfigError, match="neither a torchvision nor a fastload transform"):
        from_torchvision([v2.CenterCrop(8), lambda x: x])
    with pytest.raises(ConfigError, match="num_classes"):
        from_torchvision(v2.MixUp())
    with pytest.raises(ConfigError, match="needs a size"):
        from_torchvision(v2.Resize(size=None, max_size=300))
    with pytest.raises(ConfigError, match="RandomErasing: ratio"):  # fastload's own checks still run
        from_torchvision(v2.RandomErasing(ratio=(-1.0, 1.0)))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Round trip, and torchvision stays optional


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_converted_pipelines_survive_to_config_and_from_config(version: str) -> None:
    every = []
    for _, built, _ in CASES:
        try:
            every.append(only(built(lambda name: getattr(api(version), name))))
        except AttributeError:  # v1 has no MixUp / CutMix
            continue
    for t in every:
        data = json.loads(json.dumps(T.to_config([t])))
        assert T.from_config(data) == (t,)
    transforms, _ = from_torchvision(recipe(version))
    assert T.from_config(json.loads(json.dumps(T.to_config(transforms)))) == transforms


def test_fastload_transforms_do_not_import_torchvision() -> None:
    code = "import sys, fastload.transforms; sys.exit('torchvision' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_fastloader_takes_a_torchvision_pipeline(version: str, image_folder: Any) -> None:
    from fastload import FastLoader

    t = api(version)
    to_float = [t.ToTensor()] if version == "v1" else [t.ToImage(), t.ToDtype(torch.float32, scale=True)]
    pipeline = t.Compose(
        [t.RandomResizedCrop(24), t.RandomHorizontalFlip(), *to_float, t.Normalize(*IMAGENET)]
    )
    common: dict[str, Any] = {"batch_size": 8, "shuffle": True, "seed": 2, "num_workers": 0, "device": "cpu"}
    with FastLoader(image_folder, transform=pipeline, **common) as converted, FastLoader(
        image_folder, transform=[T.RandomResizedCrop(24), T.RandomHorizontalFlip()], normalize=IMAGENET,
        **common,
    ) as native:
        for (xa, ya), (xb, yb) in zip(converted, native, strict=True):
            assert xa.dtype == torch.float32 and torch.equal(xa, xb) and torch.equal(ya, yb)
    with pytest.raises(ConfigError, match="normalization once"):
        FastLoader(image_folder, transform=pipeline, normalize=((0.5,) * 3, (0.5,) * 3), **common)
    with pytest.raises(ConfigError, match=r"ElasticTransform.*Dataset"):
        FastLoader(image_folder, transform=t.Compose([t.CenterCrop(8), t.ElasticTransform()]), **common)


# backend="pil" gives a Pillow pipeline's pixels (NOTE [Pillow's pixels]): torchvision's transforms
# on PIL images, with the same crops and flips. (name, fastload chain, torchvision's output for a
# sample's geometry, the largest difference allowed in levels.)
PIXEL_CASES = [
    ("rrc-bilinear-flip", [T.RandomResizedCrop(40), T.RandomHorizontalFlip()], "bilinear", 0),
    ("rrc-bicubic", [T.RandomResizedCrop(40, interpolation="bicubic")], "bicubic", 0),
    ("resize-centercrop", [T.Resize(56), T.CenterCrop(48)], "bilinear", 1),  # the centre box, rounded
]


@pytest.mark.parametrize("case", PIXEL_CASES, ids=[c[0] for c in PIXEL_CASES])
def test_the_pil_backend_gives_torchvisions_pixels_on_pil_images(case: Any, image_folder: Any) -> None:
    import numpy as np
    from PIL import Image

    from fastload._loading.decoding.backend import make_backend
    from fastload._sample_random import sample_randoms
    from fastload.transforms import compile_transforms

    torchvision_or_skip()
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    _, chain, filter_name, bound = case
    plan = compile_transforms(chain)
    backend = make_backend("pil", plan)
    filter_ = InterpolationMode(filter_name)
    files = sorted(p for p in image_folder.rglob("*") if p.is_file())
    for k, path in enumerate(files):
        out = np.zeros((1, plan.out_height, plan.out_width, 3), np.uint8)
        backend.decode_batch([path.read_bytes()], sample_randoms(5, 0, np.array([k])), out)
        with Image.open(path) as img:
            image = img.convert("RGB")  # as torchvision's ImageFolder loads it
        g = plan.sample(image.height, image.width, sample_randoms(5, 0, np.array([k]))[0])
        if isinstance(chain[0], T.RandomResizedCrop):
            left, top, right, bottom = (int(v) for v in g.box)
            size = [plan.out_height, plan.out_width]
            ref = F.resized_crop(image, top, left, bottom - top, right - left, size, filter_, antialias=True)
        else:
            ref = F.center_crop(F.resize(image, 56, filter_, antialias=True), 48)
        if g.flip:
            ref = F.hflip(ref)
        diff = np.abs(out[0].astype(int) - np.asarray(ref).astype(int))
        assert diff.max() <= bound, (path.name, int(diff.max()), float(diff.mean()))
