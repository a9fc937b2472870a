"""Views: several crops of each image, each its own chain (`transforms.Views`, NOTE [views]).

What a DINO/iBOT/SimCLR user relies on: batches shaped [[view_0, ..., view_n-1], labels]; the
same batches for any worker count, after a resume mid-epoch and through a daemon; each view equal,
pixel for pixel, to its chain run alone under `view_seed(seed, view)`; the chain crossing to a
daemon as JSON; and what cannot run as written (a Views inside a view, MixUp/CutMix in a view,
transforms beside a Views, a backend that decodes one crop) refused at construction, saying why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from daemon_helpers import DaemonProcess
from test_cuda_protocol import FakeCuda

from fastload import ConfigError, FastLoader
from fastload import transforms as T
from fastload._augment.program import TrainerStages
from fastload._loading.slots.delivery import CudaDelivery, ImageOutput
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring import Ring
from fastload._sample_random import view_seed

NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
GLOBAL = [
    T.RandomResizedCrop(24, scale=(0.4, 1.0)),
    T.RandomHorizontalFlip(),
    T.RandomApply((T.ColorJitter(0.4, 0.4, 0.2, 0.1),), p=0.8),
    T.RandomGrayscale(0.2),
    T.GaussianBlur(3, sigma=(0.1, 2.0)),
    T.RandomSolarize(128.0, p=0.2),
]
LOCAL = [T.RandomResizedCrop(12, scale=(0.05, 0.4)), T.RandomHorizontalFlip(), T.RandomSolarize(128.0, p=0.5)]
VIEWS = T.Views([GLOBAL] * 2 + [LOCAL] * 3)

Batch = tuple[list[torch.Tensor], torch.Tensor]


def _epochs(root: Path, transform: Any, epochs: int = 2, **kwargs: Any) -> list[list[Any]]:
    options: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 11, "device": "cpu"}
    options.setdefault("num_workers", 0)
    options.update(kwargs)
    with FastLoader(root, transform=transform, **options) as loader:
        return [[_cloned(batch) for batch in loader] for _ in range(epochs)]


def _cloned(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    return [_cloned(b) for b in batch]


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
        return
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        _assert_same(x, y)


@pytest.fixture(scope="module")
def runs(image_folder: Path) -> dict[int, list[list[Any]]]:
    return {n: _epochs(image_folder, VIEWS, num_workers=n) for n in (0, 2)}


# The layout


def test_batches_are_a_list_of_views_then_labels(runs: dict[int, list[list[Any]]]) -> None:
    for views, labels in runs[0][0]:
        assert isinstance(views, list) and len(views) == 5
        n = labels.shape[0]
        assert labels.dtype == torch.int64 and labels.shape == (n,)
        assert [tuple(v.shape) for v in views] == [(n, 3, 24, 24)] * 2 + [(n, 3, 12, 12)] * 3
        assert all(v.dtype == torch.uint8 for v in views)
        assert all(v.is_contiguous(memory_format=torch.channels_last) for v in views)
    views, _ = runs[0][0][0]
    assert not torch.equal(views[0], views[1]) and not torch.equal(views[2], views[3])  # own draws
    assert not torch.equal(runs[0][0][0][0][0], runs[0][1][0][0][0])  # another epoch, other draws


def test_normalize_applies_to_every_view(image_folder: Path) -> None:
    (batch, *_), *_ = _epochs(image_folder, VIEWS, epochs=1, normalize=NORMALIZE)
    plain = _epochs(image_folder, VIEWS, epochs=1)[0][0]
    mean = torch.tensor(NORMALIZE[0]).view(1, 3, 1, 1)
    std = torch.tensor(NORMALIZE[1]).view(1, 3, 1, 1)
    for view, uint8 in zip(batch[0], plain[0], strict=True):
        assert view.dtype == torch.float32
        assert torch.allclose(view, (uint8.float() / 255 - mean) / std, atol=1e-5)
    _assert_same(batch[1], plain[1])


# Determinism, and what a view is


def test_the_same_batches_for_any_worker_count(runs: dict[int, list[list[Any]]]) -> None:
    _assert_same(runs[0], runs[2])


def test_view_seed_is_a_pure_function_of_seed_and_view() -> None:
    seeds = [view_seed(7, v) for v in range(10)]
    assert seeds == [view_seed(7, v) for v in range(10)]
    assert len(set(seeds)) == 10 and len({view_seed(s, 0) for s in (0, 1, 2**64, 2**127)}) == 4
    assert all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize("normalize", [None, NORMALIZE])
def test_each_view_is_its_chain_alone_under_the_view_seed(image_folder: Path, normalize: Any) -> None:
    chains = [GLOBAL, [*LOCAL, T.RandomErasing(p=0.5)] if normalize else LOCAL, GLOBAL]
    options = {"shuffle": False, "normalize": normalize, "num_workers": 2}
    together = _epochs(image_folder, T.Views(chains), **options)
    for v, chain in enumerate(chains):
        alone = _epochs(image_folder, chain, seed=view_seed(11, v), **options)
        for epoch_views, epoch_alone in zip(together, alone, strict=True):
            for (views, labels), (images, alone_labels) in zip(epoch_views, epoch_alone, strict=True):
                _assert_same(views[v], images)
                _assert_same(labels, alone_labels)


def test_the_trainers_colour_stage_per_view_gives_the_workers_pixels(image_folder: Path) -> None:
    # Batches going to a GPU get each view's pixel stage in the trainer's process after the copy
    # (`CudaDelivery`, one TrainerStages per view); here the same code runs on the CPU behind a
    # stand-in for torch.cuda, over views decoded without their colour, and must give the workers'.
    options: dict[str, Any] = {"shuffle": False, "epochs": 1}
    in_workers = _epochs(image_folder, VIEWS, **options)[0][0]
    geometry_only = T.Views([GLOBAL[:2]] * 2 + [LOCAL[:2]] * 3)
    decoded, labels = _epochs(image_folder, geometry_only, **options)[0][0]
    plan = T.compile_transforms([VIEWS])
    stages = [TrainerStages(view, seed, pixels_here=True) for view, seed in plan.view_plans(11)]
    n = labels.shape[0]
    layout = BatchLayout.infer([[v[0].permute(1, 2, 0).numpy() for v in decoded], 0], n)
    assert layout is not None
    ring = Ring(layout.slot_bytes, 1)
    delivery = CudaDelivery(ring, layout, ImageOutput(), torch.device("cpu"), cuda=FakeCuda(), stages=stages)
    try:
        slot = ring.acquire()
        assert slot is not None
        arrays = layout.arrays(ring.segments[slot].buf)
        for array, view in zip(arrays, [*decoded, labels], strict=True):
            array[:] = view.permute(0, 2, 3, 1).numpy() if view.dim() == 4 else view.numpy()
        del arrays
        views, delivered_labels = delivery.deliver(slot, n, (0, np.arange(n)))
        for v, (ours, theirs) in enumerate(zip(views, in_workers[0], strict=True)):
            assert not torch.equal(ours, decoded[v])  # the colour stage did run
            _assert_same(ours, theirs)
        _assert_same(delivered_labels, in_workers[1])
    finally:
        delivery.close()
        ring.close()


def test_a_broken_sample_gets_one_stand_in_for_every_view(make_folder: Any) -> None:
    root = make_folder(classes=2, per_class=5)
    broken = sorted(root.glob("n01/*"))[2]  # sample 7: batch 1, row 2
    broken.write_bytes(broken.read_bytes()[:200])  # a JPEG cut short in its header
    options: dict[str, Any] = {"batch_size": 5, "shuffle": False, "seed": 3, "num_workers": 1}
    options["device"] = "cpu"
    with (
        pytest.warns(UserWarning, match=broken.name),
        FastLoader(root, transform=VIEWS, on_error="skip", sample_ids=True, **options) as loader,
    ):
        batches = [(_cloned(views), labels.clone(), ids.indices.clone()) for views, labels, ids in loader]
    rows = {int(i): (b, r) for b, (_, _, ids) in enumerate(batches) for r, i in enumerate(ids)}
    stand_in = int(batches[1][2][2])
    assert stand_in != 7 and 7 not in rows and all(len(v) == 5 for batch in batches for v in batch[0])
    # Every view of the stand-in is that sample's own (its draws keyed by its index), where it also sits.
    b, r = rows[stand_in]
    for view, its_own in zip(batches[1][0], batches[b][0], strict=True):
        _assert_same(view[2], its_own[r])


# decode="once": every view cropped from one full-size decode


def test_decode_once_gives_the_same_crops_from_one_decode(image_folder: Path) -> None:
    geometry = [[T.RandomResizedCrop(24, scale=(0.4, 1.0)), T.RandomHorizontalFlip()]] * 2
    geometry += [[T.RandomResizedCrop(12, scale=(0.05, 0.4), interpolation="bicubic")]] * 3
    each = _epochs(image_folder, T.Views(geometry), epochs=1)[0]
    once_views = T.Views(geometry, decode="once")
    once = {n: _epochs(image_folder, once_views, epochs=1, num_workers=n)[0] for n in (0, 2)}
    _assert_same(once[0], once[2])  # deterministic for any worker count
    for (views_once, labels_once), (views_each, labels_each) in zip(once[0], each, strict=True):
        _assert_same(labels_once, labels_each)
        for a, b in zip(views_once, views_each, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            # The same boxes and flips; only the resampling differs (torch's from full resolution,
            # the decoder's from its DCT-scaled decode): ~1 level on average; another crop is ~50.
            assert float((a.float() - b.float()).abs().mean()) < 3.0


def test_decode_once_crosses_as_json_and_to_the_workers() -> None:
    once = T.Views([LOCAL, GLOBAL], decode="once")
    assert T.from_config(json.loads(json.dumps(T.to_config([once])))) == (once,)
    plan = T.compile_transforms([once])
    assert plan.decode_once and not T.compile_transforms([VIEWS]).decode_once
    assert plan.for_workers(with_pixels=False).decode_once


@pytest.mark.parametrize(
    ("views", "message"),
    [
        ([LOCAL], "decode must be 'each' or 'once', got 'twice'"),
        ([[T.Resize(16), T.CenterCrop(12)]], r"views\[0\] must be a chain whose geometry is one Random"),
        ([[T.RandomResizedCrop(12, interpolation="lanczos")]], "interpolation bilinear, bicubic, nearest"),
    ],
)
def test_decode_once_refuses_what_it_cannot_crop(views: list[Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        T.Views(views, decode="twice" if "twice" in message else "once")


# Resume, and a daemon


def test_a_resume_mid_epoch_gives_the_rest_of_the_epoch(image_folder: Path, runs: dict[int, Any]) -> None:
    options: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 11, "device": "cpu"}
    with FastLoader(image_folder, transform=VIEWS, num_workers=2, **options) as saver:
        batches = iter(saver)
        next(batches), next(batches)
        state = saver.state_dict()
    with FastLoader(image_folder, transform=VIEWS, num_workers=0, **options) as restored:
        restored.load_state_dict(state)
        rest = [_cloned(batch) for batch in restored]
    _assert_same(rest, runs[0][0][2:])


def test_the_same_batches_through_a_daemon(
    shared_daemon: DaemonProcess, image_folder: Path, runs: dict[int, Any]
) -> None:
    _assert_same(runs[0], _epochs(image_folder, VIEWS, num_workers=1, daemon=shared_daemon.address))


def test_the_probe_times_every_view(image_folder: Path) -> None:
    from fastload._diagnostics.probe import probe

    result = probe(image_folder, transform=[VIEWS], sample=6, seconds=0.2)
    assert result.decode_images_per_s > 0 and result.chain == "Views"


def test_a_daemon_counts_every_views_bytes_against_its_budget(image_folder: Path) -> None:
    from fastload._daemon.sessions import check_hello
    from fastload._errors import DaemonError

    hello = {
        "dataset": str(image_folder), "transforms": T.to_config([VIEWS]), "batch_size": 5, "prefetch": 0,
        "seed": 1, "pid": os.getpid(), "rank": 0, "world_size": 1,
    }
    one_batch = 5 * 3 * (2 * 24 * 24 + 3 * 12 * 12)
    plan, _ = check_hello(hello, budget_bytes=one_batch)
    assert len(plan.views) == 5
    with pytest.raises(DaemonError, match=r"5 images of 24x24 \+ 24x24 \+ 12x12 \+ 12x12 \+ 12x12 is larger"):
        check_hello(hello, budget_bytes=one_batch - 1)


# The chain as data, and its plan


def test_a_views_crosses_as_json_and_compiles_one_plan_per_view() -> None:
    config = json.loads(json.dumps(T.to_config([VIEWS])))
    assert T.from_config(config) == (VIEWS,)
    plan = T.compile_transforms([VIEWS])
    assert [(p.out_height, p.out_width) for p in plan.views] == [(24, 24)] * 2 + [(12, 12)] * 3
    assert plan.image_bytes == 3 * (2 * 24 * 24 + 3 * 12 * 12)
    assert not plan.pixels and not plan.tensor and plan.batch is None  # each view's plan holds its own
    workers = plan.for_workers(with_pixels=False)  # batches going to a GPU: colour there, per view
    assert all(not view.pixels for view in workers.views)
    assert T.compile_transforms(T.from_config(T.to_config(workers.transforms))) == workers
    assert [seed for _, seed in plan.view_plans(3)] == [view_seed(3, v) for v in range(5)]


def test_a_plain_chain_is_one_view_of_the_loaders_seed() -> None:
    plan = T.compile_transforms(LOCAL)
    assert plan.each_view == (plan,) and plan.view_plans(3) == ((plan, 3),)


# Refusals


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: T.Views([]), r"Views: views must be 1\.\.32 non-empty lists"),
        (lambda: T.Views([[]]), "non-empty lists of fastload transforms"),
        (lambda: T.Views([["crop"]]), "non-empty lists of fastload transforms"),
        (lambda: T.Views([LOCAL] * 33), r"1\.\.32"),
        (lambda: T.Views([LOCAL, [T.Views([LOCAL])]]), r"views\[1\] must be a chain without Views"),
        (
            lambda: T.Views([[*LOCAL, T.MixUp(alpha=0.8, num_classes=3)]]),
            r"views\[0\] must be a chain without batch transforms \(MixUp mixes",
        ),
    ],
)
def test_views_that_cannot_run_are_refused_when_built(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_transforms_beside_a_views_are_refused() -> None:
    with pytest.raises(ConfigError, match="Views is the whole transform, but the chain also holds Cent"):
        T.compile_transforms([VIEWS, T.CenterCrop(8)])


def test_a_view_without_a_fixed_size_names_its_view(image_folder: Path) -> None:
    with pytest.raises(ConfigError, match="Views, view 1: the transform chain does not give every image"):
        FastLoader(image_folder, transform=T.Views([LOCAL, [T.Resize(16)]]), device="cpu")


def test_a_view_needing_normalized_images_needs_normalize(image_folder: Path) -> None:
    views = T.Views([LOCAL, [*LOCAL, T.RandomErasing()]])
    with pytest.raises(ConfigError, match="RandomErasing run on normalized float images"):
        FastLoader(image_folder, transform=views, device="cpu")


def test_a_backend_decoding_one_crop_per_image_is_refused(image_folder: Path) -> None:
    # DALI (and nvjpeg, which needs device="cuda" first) decode one crop per image.
    with pytest.raises(ConfigError, match="backend='dali' decodes one crop per image"):
        FastLoader(image_folder, transform=VIEWS, device="cpu", backend="dali")


def test_the_public_seed_of_a_view_is_the_one_views_draw_from() -> None:
    """`Views.seed_of` is what the job draws view v from (the users' handle on NOTE [views])."""
    from fastload._sample_random import view_seed

    assert T.Views.seed_of(7, 3) == view_seed(7, 3) != T.Views.seed_of(7, 2)
