"""Declarative image transforms with torchvision's names, parameters and semantics.

Transforms are data, not callables: a chain of them is compiled once into a `TransformPlan`,
which knows the output size up front (so batch buffers are sized before any image is decoded)
and cuts the chain into stages that each run where they are cheapest (NOTE [transform stages]
in `_plan`): crops, resizes and horizontal flips folded into the decode; colour operations,
policies and the warps (vertical flips, rotations, affine and perspective: `_warps`) batched on
the uint8 samples (in the workers, or on the GPU after the copy); RandomErasing after
normalization; MixUp/CutMix across the batch, labels becoming soft targets. `Views` holds several
chains, one per view of each image (DINO's multi-crop: NOTE [views] in `_views`). `from_torchvision`
converts a torchvision pipeline (v1 or v2) of the transforms fastload has into these, and timm's
`create_transform` recipes and `Mixup` (`TimmRandAugment`, `TimmAutoAugment`, `TimmAugMix`,
`TimmMixup` in its three modes, `three_augment`: DeiT III's, with timm's semantics).

Each transform is declared once, on its class (`declare_transform` in `_declare`: its name, stage,
kernel, an example and its torchvision conversion); the JSON spec, `from_torchvision` and the
kernel registry read the declarations.

Every random choice is drawn from (seed, epoch, sample index), so results do not depend on which
worker ran a sample, nor on how many workers there are. Every parameter is checked once, when a
transform is built (by a user, or from a client's JSON): a bad value is a `ConfigError` naming the
transform, the parameter, the value and what is accepted, instead of an error on every sample.
"""

from fastload.transforms._base import MAX_SIDE as MAX_SIDE
from fastload.transforms._base import RandomSource as RandomSource
from fastload.transforms._base import Transform
from fastload.transforms._color import (
    ColorJitter,
    GaussianBlur,
    Grayscale,
    RandomAutocontrast,
    RandomEqualize,
    RandomGrayscale,
    RandomPosterize,
    RandomSolarize,
)
from fastload.transforms._config import from_config as from_config
from fastload.transforms._config import to_config as to_config
from fastload.transforms._declare import DECODE as DECODE
from fastload.transforms._declare import Declaration as Declaration
from fastload.transforms._declare import declaration_of as declaration_of
from fastload.transforms._declare import declare_transform as declare_transform
from fastload.transforms._declare import declared_transforms as declared_transforms
from fastload.transforms._geometric import (
    CenterCrop,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from fastload.transforms._geometric import SampleGeometry as SampleGeometry
from fastload.transforms._mixing import CutMix, MixUp, RandomChoice, RandomErasing
from fastload.transforms._plan import TransformPlan as TransformPlan
from fastload.transforms._plan import compile_transforms as compile_transforms
from fastload.transforms._policies import AugMix, AutoAugment, RandAugment, TrivialAugmentWide
from fastload.transforms._timm_policies import TimmAugMix, TimmAutoAugment, three_augment
from fastload.transforms._timm_transforms import RandomApply, TimmMixup, TimmRandAugment
from fastload.transforms._torchvision import from_torchvision
from fastload.transforms._views import Views
from fastload.transforms._warps import RandomAffine, RandomPerspective, RandomRotation, RandomVerticalFlip

# The transforms, and `from_torchvision` (a torchvision pipeline as fastload's). The loader's
# machinery re-exported above (`compile_transforms`, `TransformPlan`, `SampleGeometry`,
# `RandomSource`, `to_config`, `from_config`, `MAX_SIDE`) is used inside fastload and is not part
# of the public API; nor, yet, is the declaration of a transform (`declare_transform`,
# `declared_transforms`, `declaration_of`, `DECODE`, `Declaration`: the extension point, NOTE
# [kernels by name] in `_declare`). tests/test_transform_contract.py checks this list against
# the declarations.
__all__ = [
    "AugMix",
    "AutoAugment",
    "CenterCrop",
    "ColorJitter",
    "CutMix",
    "GaussianBlur",
    "Grayscale",
    "MixUp",
    "RandAugment",
    "RandomAffine",
    "RandomApply",
    "RandomAutocontrast",
    "RandomChoice",
    "RandomCrop",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomPerspective",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomRotation",
    "RandomSolarize",
    "RandomVerticalFlip",
    "Resize",
    "TimmAugMix",
    "TimmAutoAugment",
    "TimmMixup",
    "TimmRandAugment",
    "Transform",
    "TrivialAugmentWide",
    "Views",
    "from_torchvision",
    "three_augment",
]

