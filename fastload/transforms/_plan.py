"""A transform chain compiled into its plan: the output size known before any image is decoded,
the per-sample geometry the decoder folds into the decode (`SampleGeometry`), and the chain cut
into the stages that run after it (NOTE [transform stages]).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from fastload._errors import ConfigError
from fastload._sample_random import view_seed
from fastload.transforms._base import STAGES, RandomSource, Stage, Transform, pair
from fastload.transforms._declare import declaration_of
from fastload.transforms._geometric import (
    CenterCrop,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    SampleGeometry,
    shorter_edge,
)
from fastload.transforms._views import Views


@dataclass(frozen=True)
class TransformPlan:
    """A compiled transform chain: a fixed output size, a per-sample geometry sampler, and the
    chain cut into its stages (NOTE [transform stages]). A `Views` compiles to one plan per view
    (`views`; NOTE [views] in `_views`): its own stages are then empty, its size the first view's."""

    transforms: tuple[Transform, ...]
    out_height: int
    out_width: int
    interpolation: str
    views: tuple[TransformPlan, ...] = ()

    def _stage(self, stage: Stage) -> tuple[Transform, ...]:
        if self.views:
            return ()  # each view's plan holds its stages
        return tuple(t for t in self.transforms if t.stage == stage)

    @property
    def decode_once(self) -> bool:
        """Whether this is a `Views(..., decode="once")` plan: each image decoded once, every view
        cropped from it (NOTE [views] in `_views`)."""
        return bool(self.views) and getattr(self.transforms[0], "decode", "each") == "once"

    @property
    def each_view(self) -> tuple[TransformPlan, ...]:
        """Each view's plan: a Views plan's `views`, or this plan alone (a plain chain is one view)."""
        return self.views or (self,)

    def view_plans(self, seed: int) -> tuple[tuple[TransformPlan, int], ...]:
        """Each view's plan with the seed its draws come from: a plain chain is one view drawing
        from `seed` itself; a Views plan's view v draws from `view_seed(seed, v)` (NOTE [views])."""
        if not self.views:
            return ((self, seed),)
        return tuple((plan, view_seed(seed, v)) for v, plan in enumerate(self.views))

    @property
    def image_bytes(self) -> int:
        """The uint8 bytes of one sample's image(s): every view's, for a Views plan."""
        return sum(plan.out_height * plan.out_width * 3 for plan in self.each_view)

    @functools.cached_property
    def geometry(self) -> tuple[Transform, ...]:
        """Crops, resizes and flips: folded into the decode."""
        return self._stage("geometry")

    @functools.cached_property
    def pixels(self) -> tuple[Transform, ...]:
        """Per-sample uint8 pixel operations after the geometry (colour, policies)."""
        return self._stage("pixels")

    @functools.cached_property
    def tensor(self) -> tuple[Transform, ...]:
        """Per-sample operations on normalized images (RandomErasing)."""
        return self._stage("tensor")

    @functools.cached_property
    def batch(self) -> Transform | None:
        """The operation that mixes a batch's samples (MixUp, CutMix, RandomChoice of them), if any."""
        mixing = self._stage("batch")
        return mixing[0] if mixing else None

    @functools.cached_property
    def padded_crop(self) -> RandomCrop | None:
        """The chain's RandomCrop that may reach past the image (its padding fills the rest), if any."""
        padded = [t for t in self.geometry if isinstance(t, RandomCrop) and t.pads_image]
        return padded[0] if padded else None

    def for_workers(self, with_pixels: bool, with_tensor: bool = False) -> TransformPlan:
        """The part of the chain a worker runs: the geometry, the pixel stage `with_pixels`
        (batches that stay on the CPU), and the tensor stage `with_tensor` (CPU batches the workers
        normalize); the rest runs in the trainer's process. A Views plan: each view's part."""
        if self.views:
            views = tuple(plan.for_workers(with_pixels, with_tensor) for plan in self.views)
            (given,) = self.transforms
            assert isinstance(given, Views)
            whole = Views(tuple(plan.transforms for plan in views), decode=given.decode)
            return TransformPlan((whole,), self.out_height, self.out_width, self.interpolation, views)
        chain = self.geometry + (self.pixels if with_pixels else ()) + (self.tensor if with_tensor else ())
        return TransformPlan(chain, self.out_height, self.out_width, self.interpolation)

    def sample(self, height: int, width: int, rng: RandomSource) -> SampleGeometry:
        """Return the geometry for a source image of `height` x `width`, drawing from `rng`."""
        left, top, box_w, box_h = 0.0, 0.0, float(width), float(height)
        cur_h, cur_w = height, width
        flip = False
        clip = (0.0, 0.0, float(width), float(height))
        image_rect: tuple[int, int, int, int] | None = None
        for t in self.geometry:
            if isinstance(t, RandomHorizontalFlip):
                # torchvision draws torch.rand(1) < p; the order of draws is part of determinism.
                if rng.random() < t.p:
                    flip = not flip
                continue
            if isinstance(t, Resize):
                cur_h, cur_w = t.output_size(cur_h, cur_w)
                clip = (left, top, left + box_w, top + box_h)  # the whole current image is resampled
                continue
            if isinstance(t, (RandomResizedCrop, RandomCrop)):
                ct, cl, ch, cw = t.sample_box(cur_h, cur_w, rng)
                new_h, new_w = pair(t.size, "RandomCrop")
            elif isinstance(t, CenterCrop):
                ct, cl, ch, cw = t.box(cur_h, cur_w)
                new_h, new_w = ch, cw
            else:
                raise AssertionError(f"{t!r} is not a geometric transform")
            # Map the crop (in current-image pixels) back to the source; a flip before a crop
            # mirrors where the crop lands.
            sx, sy = box_w / cur_w, box_h / cur_h
            if flip:
                cl = cur_w - cl - cw
            if isinstance(t, RandomCrop) and t.pads_image:  # NOTE [padded crops]
                image_rect = (-cl, -ct, cur_w - cl, cur_h - ct)
            elif image_rect is not None:  # a crop of the padded crop
                image_rect = (image_rect[0] - cl, image_rect[1] - ct, image_rect[2] - cl, image_rect[3] - ct)
            left, top = left + cl * sx, top + ct * sy
            box_w, box_h = cw * sx, ch * sy
            cur_h, cur_w = new_h, new_w
            if isinstance(t, RandomResizedCrop):
                clip = (left, top, left + box_w, top + box_h)  # it resizes its crop, and only that
        return SampleGeometry(
            box=(left, top, left + box_w, top + box_h),
            out_height=cur_h,
            out_width=cur_w,
            flip=flip,
            interpolation=self.interpolation,
            clip=clip,
            image_rect=image_rect,
        )


# NOTE [transform stages]: a chain runs in four stages, in this order, each where it is cheapest:
# "geometry" (crops, resizes, flips) folded into the decode, so that only kept pixels are decoded;
# "pixels" (colour, policies, the warps: RandomVerticalFlip, RandomRotation, RandomAffine,
# RandomPerspective) on the uint8 sample after it, batched: in the workers, in place in
# the slot, when batches stay on the CPU, and on the GPU after the copy (one kernel per operation
# over the batch) when they go to CUDA; "tensor" (RandomErasing) on normalized images, and "batch"
# (MixUp/CutMix) across the batch. For CPU batches with normalize (and local workers), the workers
# normalize their rows into a float32 slot and run the tensor stage there too (NOTE [float
# slots] in `_loading.jobs`); otherwise the tensor stage runs in the trainer's process on the
# batch's device, after normalization. The batch stage always runs in the trainer's process, since
# it needs the whole batch, where a worker has only its rows.
# Every random choice comes from (seed, epoch, sample index) (`_sample_random`), so a
# batch is the same whichever worker, device or stage ran it (within float rounding on a GPU).
# torchvision lets colour transforms and warps come before a crop; here they come after the
# geometry, and a chain in another order is refused (contrast, autocontrast and equalize read the
# whole image, a rotation's corners are filled where the crop would have kept pixels: moving them
# would silently change what they do).


# NOTE [padded crops]: a RandomCrop's box may reach past the image it cuts (its padding). The
# geometry keeps the box in source pixels, reaching past the image, and records where the image
# lies in the output (`SampleGeometry.image_rect`); the decoder decodes the part of the output
# inside the image into its place and fills the rest (`_loading/decoding/padding.py`): the
# constant fill, or the image's own border pixels (edge, reflect, symmetric), gathered from the
# decoded pixels: exactly torchvision's pad + crop on a crop of the source (the CIFAR recipe),
# within a level after a resize (the part's box resampled alone moves the filter's centres by an
# ulp, as Resize + CenterCrop). Nothing may resample the output afterwards (a resize would blend
# the fill into the image), so after a padded RandomCrop come only flips and crops that neither
# pad nor resize (CenterCrop, RandomCrop without padding), which move `image_rect`;
# `compile_transforms` refuses the rest. The GPU decoders (DALI, nvJPEG) refuse padding by name
# (`decoding.boxes.refuse_padding`).


DECODED_GEOMETRY = (RandomResizedCrop, Resize, CenterCrop, RandomCrop, RandomHorizontalFlip)
"""The geometric transforms `TransformPlan.sample` folds into the decode (their kernel, `DECODE`)."""


def _resamples_or_pads(t: Transform) -> bool:
    """A resize or a padded crop: what may not follow a padded RandomCrop."""
    return isinstance(t, (Resize, RandomResizedCrop)) or (isinstance(t, RandomCrop) and t.pads_image)


def compile_transforms(transforms: Sequence[Transform] | None) -> TransformPlan:
    """Check a transform chain and return its plan.

    Raises:
        ConfigError: an unknown transform, stages out of order (NOTE [transform stages]), more
            than one batch transform, a resize or padding after a padded RandomCrop, or a chain
            whose output size depends on the image (batches
            need one size: end the geometry with a crop or a fixed-size Resize).
    """
    chain = tuple(transforms or ())
    if any(isinstance(t, Views) for t in chain):
        return _compile_views(chain)
    out: tuple[int, int] | None = None
    interpolation = "bilinear"
    latest: Transform | None = None
    padded: RandomCrop | None = None
    for t in chain:
        if declaration_of(type(t)) is None or getattr(t, "stage", None) not in STAGES:
            raise ConfigError(
                f"{t!r} is not a fastload transform: use fastload.transforms (or pass a torchvision "
                "Compose of the transforms it supports, see fastload.transforms.from_torchvision); "
                "a transform of your own runs through the Dataset path (a torch Dataset that applies "
                "it, given to FastLoader), or is declared with its kernel (declare_transform)"
            )
        if t.stage == "geometry" and type(t) not in DECODED_GEOMETRY:
            raise ConfigError(
                f"{type(t).__name__} has no kernel: the decoder folds in only the geometric transforms "
                f"{', '.join(cls.__name__ for cls in DECODED_GEOMETRY)}"
            )
        if latest is not None and STAGES.index(t.stage) < STAGES.index(latest.stage):
            raise ConfigError(
                f"{type(t).__name__} ({t.stage} stage) comes after {type(latest).__name__} ({latest.stage} "
                f"stage): fastload runs a chain in the order {' -> '.join(STAGES)} (crops and flips, "
                "then colour and policies, then RandomErasing, then MixUp/CutMix); reorder the chain"
            )
        if t.stage == "batch" and latest is not None and latest.stage == "batch":
            raise ConfigError(
                "only one batch transform per chain: use RandomChoice([MixUp(...), CutMix(...)]) "
                "to pick one per batch"
            )
        if padded is not None and _resamples_or_pads(t):
            raise ConfigError(
                f"{type(t).__name__} comes after {padded!r}: after a padded RandomCrop only crops without "
                "padding and flips may come (a resize would blend the padding into the image: NOTE "
                "[padded crops]); resize before it"
            )
        latest = t
        if isinstance(t, RandomCrop):
            out = pair(t.size, "RandomCrop")
            padded = t if t.pads_image else padded
        elif isinstance(t, RandomResizedCrop):
            out = pair(t.size, "RandomResizedCrop")
            interpolation = t.interpolation
        elif isinstance(t, CenterCrop):
            out = pair(t.size, "CenterCrop")
        elif isinstance(t, Resize):
            out = None if shorter_edge(t.size) is not None else pair(t.size, "Resize")
            interpolation = t.interpolation
    if out is None:
        raise ConfigError(
            "the transform chain does not give every image the same size, but a batch needs one: "
            "end its crops and resizes with RandomResizedCrop, RandomCrop, CenterCrop or "
            "Resize((height, width))"
        )
    return TransformPlan(chain, out[0], out[1], interpolation)


def _compile_views(chain: tuple[Transform, ...]) -> TransformPlan:
    """A chain holding a Views: the Views alone, each view compiled on its own (NOTE [views])."""
    if len(chain) != 1:
        others = ", ".join(type(t).__name__ for t in chain if not isinstance(t, Views))
        raise ConfigError(
            f"Views is the whole transform, but the chain also holds {others or 'another Views'}: "
            "put each view's transforms inside its own chain, Views([chain_0, chain_1, ...])"
        )
    (whole,) = chain
    assert isinstance(whole, Views)
    views = []
    for v, view_chain in enumerate(whole.views):
        try:
            views.append(compile_transforms(view_chain))
        except ConfigError as e:
            raise ConfigError(f"Views, view {v}: {e}") from None
    first = views[0]
    return TransformPlan(chain, first.out_height, first.out_width, first.interpolation, tuple(views))
