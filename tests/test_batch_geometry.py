"""The per-batch geometry (`transforms._batch_geometry`) is the per-sample walk, sample for sample."""

from __future__ import annotations

import numpy as np
import pytest

from fastload._sample_random import DRAWS, SampleDraws
from fastload.transforms import (
    CenterCrop,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    Transform,
    compile_transforms,
)
from fastload.transforms._batch_geometry import most_draws, sample_batch

CHAINS: dict[str, list[Transform]] = {
    "rrc": [RandomResizedCrop(224)],
    "rrc+flip": [RandomResizedCrop(224), RandomHorizontalFlip()],
    "flip+rrc": [RandomHorizontalFlip(0.7), RandomResizedCrop((160, 96))],
    # Wide scale and ratio ranges: many tries fail, so the central fallback and late tries run.
    "rrc-fallback": [RandomResizedCrop(64, scale=(0.9, 3.0), ratio=(0.05, 20.0)), RandomHorizontalFlip()],
    "rrc-narrow-ratio": [RandomResizedCrop(64, scale=(0.95, 1.0), ratio=(2.5, 3.0))],
    "resize+center": [Resize(256), CenterCrop(224)],
    "resize-max+center": [Resize(230, max_size=300), CenterCrop(20)],
    "pair-resize+rrc": [Resize((300, 200)), RandomResizedCrop(100), RandomHorizontalFlip()],
    "flip+resize+flip+center": [
        RandomHorizontalFlip(),
        Resize(160),
        RandomHorizontalFlip(0.3),
        CenterCrop(128),
    ],
    "resize+rrc+center": [Resize(300), RandomResizedCrop(256), CenterCrop(200)],
    # RandomCrop: its padding reaches past the image (`image_rect`), before or after flips.
    "crop-pad+flip": [RandomCrop(32, padding=4, pad_if_needed=True), RandomHorizontalFlip()],
    "flip+resize+crop-pad4+flip": [
        RandomHorizontalFlip(),
        Resize(40),
        RandomCrop((32, 24), padding=(1, 2, 3, 4), pad_if_needed=True),
        RandomHorizontalFlip(0.3),
    ],
    "rrc+crop-pad2": [RandomResizedCrop(64), RandomCrop(48, padding=(3, 5), padding_mode="reflect")],
    "crop+resize": [RandomHorizontalFlip(), RandomCrop(8), Resize((16, 12))],
}


def _sizes(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Image sizes from tiny to huge, with extreme aspect ratios among them."""
    heights = rng.integers(1, 3000, n)
    widths = rng.integers(1, 3000, n)
    heights[: n // 8] = rng.integers(1, 12, n // 8)  # tiny, and very wide
    widths[n // 8 : n // 4] = rng.integers(1, 12, n // 8)  # very tall
    return heights, widths


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_batch_geometry_is_the_per_sample_walk(name: str) -> None:
    plan = compile_transforms(CHAINS[name])
    rng = np.random.default_rng(7)
    checked = 0
    for seed in range(6):
        heights, widths = _sizes(rng, 400)
        if any(isinstance(t, (CenterCrop, RandomCrop)) for t in plan.geometry):
            heights, widths = heights + 300, widths + 300  # every image larger than its crop
        draws = SampleDraws(seed, 3, rng.permutation(100_000)[:400])
        batch = sample_batch(plan, heights, widths, draws.uniforms)
        assert batch is not None
        for i in range(len(heights)):
            g = plan.sample(int(heights[i]), int(widths[i]), draws[i])
            assert tuple(batch.boxes[i]) == g.box, (i, heights[i], widths[i])
            assert tuple(batch.clips[i]) == g.clip
            assert bool(batch.flips[i]) == g.flip
            assert (int(batch.out_heights[i]), int(batch.out_widths[i])) == (g.out_height, g.out_width)
            rect = None if batch.image_rects is None else tuple(int(v) for v in batch.image_rects[i])
            assert rect == g.image_rect
            assert bool(batch.needs_padding()[i]) == g.needs_padding
            checked += 1
    assert checked == 2400


def test_batch_geometry_leaves_to_the_walk_what_it_cannot_decide() -> None:
    draws = SampleDraws(0, 0, np.arange(4))
    heights, widths = np.array([500, 100, 400, 300]), np.array([400, 500, 300, 200])
    # A CenterCrop larger than an image: the per-sample walk raises, naming the size.
    assert sample_batch(compile_transforms([CenterCrop(150)]), heights, widths, draws.uniforms) is None
    # A chain that may use more draws than a task has per sample.
    long_chain = compile_transforms([RandomResizedCrop(64)] * 3)
    assert most_draws(long_chain) > DRAWS
    assert sample_batch(long_chain, heights, widths, draws.uniforms) is None
    assert most_draws(compile_transforms(CHAINS["rrc+flip"])) == 23
