"""`Views`: several views of one image, each its own transform chain (DINO's, iBOT's, SimCLR's
multi-crop) — the declaration and its checks. `compile_transforms` (`_plan`) compiles each chain
into its own plan; the image job reads a sample's bytes once and decodes each view (or, with
decode="once", the image once) into its own leaf of the slot (NOTE [views]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fastload._sample_random import view_seed
from fastload.transforms._base import Transform, reject
from fastload.transforms._declare import DECODE, declare_transform
from fastload.transforms._geometric import CenterCrop, RandomHorizontalFlip, RandomResizedCrop

DECODES = ("each", "once")
ONCE_INTERPOLATIONS = ("bilinear", "bicubic", "nearest")  # what torch resizes with (`decode_once`)

MAX_VIEWS = 32
"""The most views one `Views` takes (DINO uses 2 + 10; each view is a leaf of every batch)."""

# NOTE [views]: `Views(chains)` is a whole transform: each chain is compiled alone (it needs its own
# fixed size) and view v draws every random choice from its own seed, `view_seed(seed, v)`
# (`fastload._sample_random`), keyed by (epoch, index) as any chain is: deterministic for any worker
# count, and view v is pixel for pixel what the same chain alone gives a loader seeded with
# `view_seed(seed, v)`. A batch is [[view_0, ..., view_{n-1}], labels], each view a (B, H, W, 3)
# leaf of the slot (DINO's collate shape). Geometry, pixel and tensor stages run per view where a
# plain chain's would (the workers; the trainer's process for GPU batches); a batch stage
# (MixUp/CutMix) would mix labels the views share and is refused inside a view, as is a Views.
# A sample's bytes are read once per batch; each view is then decoded on its own, its crop fused
# into the decode (the backend's crop + resize, libjpeg-turbo's DCT scaling and cropped scanlines),
# because that is what keeps a view equal to its chain alone. It is not the cheapest decode for
# every recipe: on DINO's 2x224 + 6x96 over ImageNet-sized JPEGs (`tools/bench/bench_multicrop.py
# --decode-cost`, one thread, a shared machine) the 8 fused decodes took 10-15 ms an image, one
# full-size decode ~4.5 ms, and one full decode followed by 8 torch crops + resizes 5-9 ms: each
# view repeats the entropy decoding of the rows it spans, and a 224 view of 40-100% of the image
# gets little or no DCT scaling. So `Views(..., decode="once")` offers the other way
# (`_loading.decoding.decode_once`): one full-size decode per image, each view's box (the same
# draws, the same box) cropped from it and resized by torch, antialiased, as torchvision v2 resizes
# tensors: ~1 uint8 level from the fused view on average, but not its chain alone, so not the
# default. It takes views whose geometry is one RandomResizedCrop (and a flip): their boxes are
# whole pixels. A native resampler over decoded pixels would make it cheaper still.


def _view_chains(chains: object) -> tuple[tuple[Transform, ...], ...] | None:
    """The chains as tuples, or None when they are not a non-empty sequence of non-empty
    sequences of transforms."""
    if not isinstance(chains, Sequence) or isinstance(chains, (str, bytes)) or not chains:
        return None
    views = []
    for chain in chains:
        if isinstance(chain, Transform):
            chain = (chain,)
        if not isinstance(chain, Sequence) or isinstance(chain, (str, bytes)) or not chain:
            return None
        if not all(isinstance(t, Transform) for t in chain):
            return None
        views.append(tuple(chain))
    return tuple(views)


@declare_transform(
    stage="geometry",
    kernel=DECODE,
    example={"views": ((RandomResizedCrop(8), RandomHorizontalFlip()), (CenterCrop(4),))},
)
@dataclass(frozen=True)
class Views(Transform):
    """Several views of each image, each its own chain: a batch is ([view_0, ..., view_n-1], labels).

        global_ = [T.RandomResizedCrop(224, scale=(0.4, 1)), T.RandomHorizontalFlip(), ...]
        local_ = [T.RandomResizedCrop(96, scale=(0.05, 0.4)), T.RandomHorizontalFlip(), ...]
        FastLoader("data/train", transform=T.Views([global_] * 2 + [local_] * 6), ...)

    Each view draws from its own seed (`view_seed(seed, view)`, NOTE [views]): view v is what its
    chain alone gives under that seed. `normalize=` applies to every view.

    Args:
        views: one transform chain per view (1..32), each ending its geometry in a fixed size, none
            holding a Views or a batch transform (MixUp/CutMix).
        decode: "each" (the default) decodes each view's region on its own, fused with its crop,
            so that a view equals its chain alone; "once" decodes each image once at full size and
            crops and resizes every view from it with torch (antialiased, as torchvision v2 does
            on tensors): cheaper with many views, the same crops and draws, other pixels. With
            "once" each view's geometry is one RandomResizedCrop (bilinear, bicubic or nearest),
            optionally with RandomHorizontalFlip.
    """

    views: tuple[tuple[Transform, ...], ...]
    decode: str = "each"

    def __post_init__(self) -> None:
        accepted = f"1..{MAX_VIEWS} non-empty lists of fastload transforms, one per view"
        chains = _view_chains(self.views)
        if chains is None or len(chains) > MAX_VIEWS:
            raise reject("Views", "views", self.views, accepted)
        for v, chain in enumerate(chains):
            for t in chain:
                if isinstance(t, Views):
                    raise reject(
                        "Views", f"views[{v}]", chain,
                        "a chain without Views (one Views holds every view: list them all in it)",
                    )
                if t.stage == "batch":
                    raise reject(
                        "Views", f"views[{v}]", chain,
                        f"a chain without batch transforms ({type(t).__name__} mixes the samples of a "
                        "batch, whose labels the views share): mix the views in your training step",
                    )
        object.__setattr__(self, "views", chains)
        if self.decode not in DECODES:
            raise reject("Views", "decode", self.decode, " or ".join(map(repr, DECODES)))
        if self.decode == "once":
            for v, chain in enumerate(chains):
                _check_once(v, chain)

    @staticmethod
    def seed_of(seed: int, view: int) -> int:
        """The seed view `view` draws from under a loader's `seed`: view v of a batch equals the
        image of `FastLoader(transform=views[v], seed=Views.seed_of(seed, v))` (NOTE [views])."""
        return view_seed(seed, view)


def _check_once(v: int, chain: tuple[Transform, ...]) -> None:
    """A view decode="once" can crop from a whole decoded image: one RandomResizedCrop with an
    interpolation torch resizes with, and perhaps a RandomHorizontalFlip."""
    geometry = [t for t in chain if t.stage == "geometry"]
    crops = [t for t in geometry if isinstance(t, RandomResizedCrop)]
    if len(crops) != 1 or not all(isinstance(t, (RandomResizedCrop, RandomHorizontalFlip)) for t in geometry):
        raise reject(
            "Views", f"views[{v}]", chain,
            "a chain whose geometry is one RandomResizedCrop (and perhaps RandomHorizontalFlip) "
            "with decode='once'",
        )
    if crops[0].interpolation not in ONCE_INTERPOLATIONS:
        raise reject(
            "Views", f"views[{v}]", chain,
            f"a RandomResizedCrop with interpolation {', '.join(ONCE_INTERPOLATIONS)} with decode='once'",
        )
