"""The one declaration of a transform: `@declare_transform(...)` on its class says its name (the
JSON spec's "type"), its stage, the kernel that runs it, an example of its parameters, and how a
torchvision transform of that name converts to it. Everything that used to keep its own list of
transforms (the JSON spec's names, `from_torchvision`'s table, the plan's known types, the kernel
registry's keys) reads these declarations instead.

The parameters are the class's dataclass fields: what its JSON spec carries (`to_config`), what
`from_config` accepts, and, by design, torchvision's parameter names.

NOTE [kernels by name]: a transform cannot import its kernel (the kernels, `fastload._augment`, sit
above the transforms in the layers: they import the declarations, never the other way). So a
declaration names its kernel, a string, and the kernel registry (`fastload._augment.registry`)
holds the kernels by that name. Whether every declared kernel exists is checked where both are
known: when a loader builds its plan (`registry.check_kernels`, in the trainer's process, before any
worker starts) and, for every declared transform at once, by `tests/test_transform_contract.py`.
A geometric transform's kernel is the decode itself (`DECODE`: `TransformPlan.sample` folds it into
the decoder's crop and resize), which knows the transforms in `_plan.DECODED_GEOMETRY` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from fastload._errors import ConfigError
from fastload.transforms._base import STAGES, Stage, Transform

if TYPE_CHECKING:
    from fastload.transforms._torchvision_reading import Place

DECODE = "decode"
"""The kernel of a geometric transform: folded into the decode (NOTE [kernels by name])."""

TorchvisionConversion = Callable[[Any, "Place"], "Transform | tuple[Transform, ...]"]
"""How a torchvision transform (v1 or v2, read from the attributes it stores) becomes fastload's:
given it and its place in the chain (the units of the images it gets); most give one transform,
RandomApply gives none, its members or fastload's RandomApply."""

T = TypeVar("T", bound=Transform)


@dataclass(frozen=True, eq=False)
class Declaration:
    """What a transform declares about itself (`declare_transform`); one per class, so equal only
    to itself."""

    cls: type[Transform]
    name: str
    stage: Stage
    kernel: str
    example: Mapping[str, object]
    torchvision: TorchvisionConversion | None

    @property
    def parameters(self) -> tuple[str, ...]:
        """Its parameters, in order: the fields its JSON spec carries."""
        return tuple(field.name for field in dataclasses.fields(self.cls))  # type: ignore[arg-type]

    def make_example(self) -> Transform:
        """A small valid instance, from `example` (what the contract test runs)."""
        return self.cls(**self.example)


_DECLARED: dict[str, Declaration] = {}


def declare_transform(
    *,
    stage: Stage,
    kernel: str | None = None,
    example: Mapping[str, object] | None = None,
    torchvision: TorchvisionConversion | None = None,
    name: str | None = None,
) -> Callable[[type[T]], type[T]]:
    """Declare a transform class (a frozen dataclass subclass of `Transform`), once:

        @declare_transform(stage="pixels", kernel="Posterize", example={"bits": 3})
        @dataclass(frozen=True)
        class Posterize(Transform):
            bits: int

    Args:
        stage: where the loader runs it (NOTE [transform stages] in `_plan`).
        kernel: the name its kernel is registered under in `fastload._augment.registry` (`DECODE`
            for a geometric transform, NOTE [kernels by name]); required.
        example: keyword arguments of a small valid instance (the contract test runs it); {} when
            its defaults make one.
        torchvision: how a torchvision transform named `name` converts to it (`from_torchvision`);
            None where torchvision has none.
        name: the name in its JSON spec (and torchvision's class name); the class's by default.

    Raises:
        ConfigError: not a frozen dataclass subclass of Transform, no kernel, an unknown stage or
            example parameter, or a name another class already declared.
    """

    def register(cls: type[T]) -> type[T]:
        declared = name or cls.__name__
        where = f"transform {declared} ({cls.__module__}.{cls.__qualname__})"
        if not (isinstance(cls, type) and issubclass(cls, Transform)):
            raise ConfigError(f"{where}: a transform is a subclass of fastload.transforms.Transform")
        params = getattr(cls, "__dataclass_params__", None)
        if "__dataclass_fields__" not in cls.__dict__ or params is None or not params.frozen:
            raise ConfigError(
                f"{where}: a transform is frozen data: put @dataclass(frozen=True) under @declare_transform"
            )
        if stage not in STAGES:
            raise ConfigError(f"{where}: stage must be one of {', '.join(STAGES)}, got {stage!r}")
        if not isinstance(kernel, str) or not kernel:
            raise ConfigError(
                f"{where} declares no kernel: name the kernel that runs it (registered with "
                "fastload._augment.registry.register_kernel), so that a chain using it cannot fail "
                "later, in a worker"
            )
        if (kernel == DECODE) != (stage == "geometry"):
            raise ConfigError(
                f"{where}: kernel {DECODE!r} (folded into the decode) is the kernel of the geometry "
                "stage, and of it only"
            )
        fields = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(example or {}) - fields)
        if unknown:
            raise ConfigError(f"{where}: its example has no parameter {', '.join(unknown)}")
        earlier = _DECLARED.get(declared)
        if earlier is not None and _qualified(earlier.cls) != _qualified(cls):
            raise ConfigError(
                f"{where}: the name {declared!r} is already declared by "
                f"{earlier.cls.__module__}.{earlier.cls.__qualname__}: give it another name"
            )
        cls.stage = stage
        _DECLARED[declared] = Declaration(
            cls, declared, stage, kernel, MappingProxyType(dict(example or {})), torchvision
        )
        return cls

    return register


def _qualified(cls: type) -> tuple[str, str]:
    """A class's identity across a re-import of its module (the same module and name)."""
    return cls.__module__, cls.__qualname__


def declared_transforms() -> Mapping[str, Declaration]:
    """Every declared transform, by name (fastload's own, and any a program declared)."""
    return MappingProxyType(_DECLARED)


def declaration_of(cls: type) -> Declaration | None:
    """The declaration of the transform class `cls` itself (a subclass declares its own), or None."""
    found = _DECLARED.get(getattr(cls, "__name__", ""))
    if found is not None and found.cls is cls:
        return found
    return next((d for d in _DECLARED.values() if d.cls is cls), None)
