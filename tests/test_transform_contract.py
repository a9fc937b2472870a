"""The contract every declared transform keeps (`fastload.transforms.declare_transform`), run over
every declaration (fastload's own, and any a test module imported before collection declared, such
as test_extension_transform's): so a new transform is tested without editing this file.

For each: its declared kernel is registered (a public transform without one fails here, and the
loader refuses it when it builds its plan); its JSON spec carries exactly its parameters and
round-trips (how a daemon rebuilds it); its torchvision conversion, where it declares one, turns
torchvision's transform of its name and example parameters back into it, and, where both are
deterministic on a fixed input, gives the same pixels; and it runs through its kernel on a tiny
batch, where the loader runs it. Declarations that break the rules are refused: no kernel at
declaration, a kernel nobody registered at check time, a name already taken, mutable data.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
import torch
from helpers import torchvision_or_skip

from fastload import ConfigError
from fastload import transforms as T
from fastload._augment.program import TrainerStages
from fastload._augment.registry import KERNELS, check_kernels
from fastload._demo import photo_like
from fastload.transforms import _declare
from fastload.transforms._declare import Declaration

DECLARED = sorted(T.declared_transforms().values(), key=lambda d: d.name)
OWN = [d for d in DECLARED if d.cls.__module__.startswith("fastload.")]
SIDE = 16


def _ids(d: Declaration) -> str:
    return d.name


def _images(n: int = 3, seed: int = 0) -> torch.Tensor:
    """(n, 3, SIDE, SIDE) uint8 photo-like images, NHWC memory (as a slot)."""
    rng = np.random.default_rng(seed)
    rows = np.stack([np.asarray(photo_like(rng, SIDE, SIDE)) for _ in range(n)])
    return torch.from_numpy(rows).permute(0, 3, 1, 2)


def _pixels(t: T.Transform, x: torch.Tensor, seed: int) -> torch.Tensor:
    """The pixel stage of [CenterCrop(SIDE), t] on x, as the trainer's process runs it."""
    plan = T.compile_transforms([T.CenterCrop(SIDE), t])
    stages = TrainerStages(plan, seed=seed, pixels_here=True)
    return stages.before_normalize(x.clone(), 0, np.arange(x.shape[0]))


# The contract, over every declaration


def test_every_transform_module_declares_something() -> None:
    # The list below is derived, not written: it is only as good as the declarations it found.
    assert len(OWN) >= 22 and all(issubclass(d.cls, T.Transform) for d in DECLARED)


@pytest.mark.parametrize("declared", DECLARED, ids=_ids)
def test_it_has_a_kernel(declared: Declaration) -> None:
    kernel = declared.kernel
    assert KERNELS.has_kernel(declared.cls), f"{declared.name} declares kernel {kernel!r}, not registered"
    check_kernels([declared.make_example()])


@pytest.mark.parametrize("declared", DECLARED, ids=_ids)
def test_its_json_spec_carries_its_parameters_and_round_trips(declared: Declaration) -> None:
    t = declared.make_example()
    assert t.stage == declared.stage and T.declaration_of(type(t)) is declared
    (entry,) = json.loads(json.dumps(T.to_config([t])))
    assert entry["type"] == declared.name
    assert set(entry) - {"type"} == set(declared.parameters)
    assert T.from_config([entry]) == (t,)


def _torchvision_of(value: Any, v2: Any) -> Any:
    """torchvision's counterpart of an example's value: a transform built by its name, a tuple of
    them as a list, an interpolation by its mode; anything else as it is."""
    if isinstance(value, T.Transform):
        declared = T.declaration_of(type(value))
        assert declared is not None
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}  # type: ignore[arg-type]
        return getattr(v2, declared.name)(**{k: _torchvision_of(v, v2) for k, v in fields.items()})
    if isinstance(value, tuple) and value and all(isinstance(v, T.Transform) for v in value):
        return [_torchvision_of(v, v2) for v in value]
    return value


def _torchvision_transform(declared: Declaration) -> Any:
    torchvision_or_skip()
    from torchvision.transforms import InterpolationMode, v2

    example = dict(declared.example)
    if isinstance(example.get("interpolation"), str):
        example["interpolation"] = InterpolationMode(example["interpolation"])
    return getattr(v2, declared.name)(**{k: _torchvision_of(v, v2) for k, v in example.items()})


def _deterministic(t: T.Transform, x: torch.Tensor) -> torch.Tensor | None:
    """The pixel stage's output on x when it draws nothing that shows (two seeds, the same pixels)."""
    first = _pixels(t, x, seed=1)
    return first if torch.equal(first, _pixels(t, x, seed=2)) else None


CONVERTED = [d for d in DECLARED if d.torchvision is not None]


@pytest.mark.parametrize("declared", CONVERTED, ids=_ids)
def test_its_torchvision_conversion_builds_and_agrees(declared: Declaration) -> None:
    reference = _torchvision_transform(declared)
    transforms, normalize = T.from_torchvision(reference)
    assert transforms == (declared.make_example(),) and normalize is None
    if declared.stage != "pixels":
        return  # geometry: test_torchvision_compat's decode cases; later stages draw per batch
    x = _images()
    ours = _deterministic(transforms[0], x)
    theirs = [reference(image) for image in x.contiguous()]
    again = [reference(image) for image in x.contiguous()]
    if ours is None or not all(torch.equal(a, b) for a, b in zip(theirs, again, strict=True)):
        return  # random where it runs: compared sample by sample in test_augment_* instead
    diff = (ours.to(torch.int16) - torch.stack(theirs).to(torch.int16)).abs()
    # Exact but for GaussianBlur, separable here where torchvision convolves in 2-D (at most 1 apart).
    assert int(diff.max()) <= (1 if declared.name == "GaussianBlur" else 0)


def test_deterministic_examples_are_compared_with_torchvision() -> None:
    # The agreement above is not vacuous: the colour transforms' and warps' examples draw nothing.
    pixels = [d for d in OWN if d.stage == "pixels"]
    compared = {d.name for d in pixels if _deterministic(d.make_example(), _images()) is not None}
    assert compared >= {
        "ColorJitter", "GaussianBlur", "RandomAutocontrast", "RandomEqualize", "RandomGrayscale",
        "RandomPosterize", "RandomSolarize", "Grayscale", "RandomVerticalFlip", "RandomRotation",
        "RandomAffine",
    }


@pytest.mark.parametrize("declared", DECLARED, ids=_ids)
def test_it_runs_through_its_kernel_on_a_tiny_batch(declared: Declaration) -> None:
    t = declared.make_example()
    if declared.stage == "geometry":  # its kernel is the decode's geometry (TransformPlan.sample)
        # A Views is a whole transform: each of its views is a chain's plan (NOTE [views]).
        whole = isinstance(t, T.Views)
        plans = T.compile_transforms([t]).views if whole else (T.compile_transforms([t, T.CenterCrop(2)]),)
        for plan in plans:
            geometry = plan.sample(SIDE, SIDE + 4, np.random.default_rng(0))
            left, top, right, bottom = geometry.box
            assert (geometry.out_height, geometry.out_width) == (plan.out_height, plan.out_width)
            assert whole or (plan.out_height, plan.out_width) == (2, 2)
            assert 0 <= left < right <= SIDE + 4 and 0 <= top < bottom <= SIDE
        return
    x = _images(4)
    if declared.stage == "pixels":
        out = _pixels(t, x, seed=3)
        assert out.shape == x.shape and out.dtype == torch.uint8
        return
    plan = T.compile_transforms([T.CenterCrop(SIDE), t])
    stages = TrainerStages(plan, seed=3, pixels_here=True)
    images = (x.float() - 128.0) / 64.0
    labels = torch.arange(4) % int(getattr(t, "num_classes", 1))
    out, targets = stages.after_normalize(images, labels, 0, np.arange(4))
    assert out.shape == x.shape and out.dtype == torch.float32 and bool(torch.isfinite(out).all())
    if declared.stage == "batch":
        assert targets.shape == (4, t.num_classes)  # type: ignore[attr-defined]
        assert torch.allclose(targets.sum(dim=1), torch.ones(4))


# What `__all__` and the declarations say of each other


def test_the_public_transforms_are_fastloads_declarations() -> None:
    exported = set(T.__all__) - {"Transform", "from_torchvision", "three_augment"}
    assert exported == {d.name for d in OWN}
    assert all(getattr(T, d.name) is d.cls for d in OWN)


# Declarations that break the rules


@pytest.fixture
def scratch_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declarations made by the test are forgotten after it (the registry's own dict is swapped)."""
    monkeypatch.setattr(_declare, "_DECLARED", dict(_declare._DECLARED))


def test_a_transform_without_a_kernel_is_refused_when_declared(scratch_declarations: None) -> None:
    with pytest.raises(ConfigError, match=r"Sepia .* declares no kernel"):

        @T.declare_transform(stage="pixels")
        @dataclasses.dataclass(frozen=True)
        class Sepia(T.Transform):
            p: float = 0.5

    assert "Sepia" not in T.declared_transforms()


def test_a_kernel_nobody_registered_fails_the_check_and_the_contract(scratch_declarations: None) -> None:
    @T.declare_transform(stage="pixels", kernel="NoSuchKernel")
    @dataclasses.dataclass(frozen=True)
    class Sepia(T.Transform):
        p: float = 0.5

    declared = T.declared_transforms()["Sepia"]
    with pytest.raises(AssertionError, match="NoSuchKernel"):
        test_it_has_a_kernel(declared)  # the contract above fails for it
    with pytest.raises(ConfigError, match=r"Sepia has no kernel \(it declares 'NoSuchKernel'"):
        check_kernels(T.compile_transforms([T.RandomResizedCrop(8), Sepia()]).transforms)
    with pytest.raises(ConfigError, match="Sepia has no batched kernel"):
        TrainerStages(T.compile_transforms([T.RandomResizedCrop(8), Sepia()]), seed=0, pixels_here=True)


def test_a_member_without_a_kernel_fails_the_check(scratch_declarations: None) -> None:
    @T.declare_transform(stage="pixels", kernel="NoSuchKernel")
    @dataclasses.dataclass(frozen=True)
    class Sepia(T.Transform):
        pass

    with pytest.raises(ConfigError, match="Sepia has no kernel"):
        check_kernels([T.RandomApply((T.RandomEqualize(), Sepia()))])


def test_a_geometric_transform_the_decode_does_not_know_has_no_kernel(scratch_declarations: None) -> None:
    @T.declare_transform(stage="geometry", kernel=T.DECODE)
    @dataclasses.dataclass(frozen=True)
    class Perspective(T.Transform):
        pass

    assert not KERNELS.has_kernel(Perspective)
    with pytest.raises(ConfigError, match="Perspective has no kernel: the decoder folds in only"):
        T.compile_transforms([Perspective(), T.CenterCrop(4)])


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"stage": "colour", "kernel": "X"}, "stage must be one of"),
        ({"stage": "pixels", "kernel": T.DECODE}, "is the kernel of the geometry stage"),
        ({"stage": "geometry", "kernel": "X"}, "is the kernel of the geometry stage"),
        ({"stage": "pixels", "kernel": "X", "example": {"q": 1}}, "its example has no parameter q"),
        ({"stage": "pixels", "kernel": "X", "name": "RandomEqualize"}, "already declared by fastload"),
    ],
)
def test_bad_declarations_are_refused(
    scratch_declarations: None, keywords: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):

        @T.declare_transform(**keywords)
        @dataclasses.dataclass(frozen=True)
        class Sepia(T.Transform):
            p: float = 0.5


def test_only_frozen_transform_dataclasses_are_declared(scratch_declarations: None) -> None:
    with pytest.raises(ConfigError, match="frozen data"):

        @T.declare_transform(stage="pixels", kernel="X")
        @dataclasses.dataclass
        class Mutable(T.Transform):
            p: float = 0.5

    plain = dataclasses.dataclass(frozen=True)(type("Plain", (), {}))
    with pytest.raises(ConfigError, match=r"a subclass of fastload\.transforms\.Transform"):
        T.declare_transform(stage="pixels", kernel="X")(plain)
