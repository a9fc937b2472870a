"""The one kernel registry: every transform's kernel by the name its declaration gives
(NOTE [kernels by name] in `fastload.transforms._declare`), and the one way to get a kernel
(`sample_op`, `batch_op`). A kernel made of its members' kernels (RandomApply, RandomChoice) is
handed this registry when it is made, so no kernel module imports it (it imports them).

fastload's kernels are the tables of `color_ops`, `policies`, `mixing`, `timm_ops`, `timm_policies` and
`warp_ops`; a program
adds its own with `register_kernel` (a transform declared outside fastload, with its kernel).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from fastload._augment import color_ops, mixing, policies, timm_ops, timm_policies, warp_ops
from fastload._augment.ops import BatchKernel, BatchOp, SampleKernel, SampleOp
from fastload._errors import ConfigError
from fastload.transforms import DECODE, Transform, Views, declaration_of
from fastload.transforms._plan import DECODED_GEOMETRY


class KernelRegistry:
    """Kernels by name: per-sample ones (pixel and tensor stages) and batch ones."""

    def __init__(self, sample: Mapping[str, SampleKernel], batch: Mapping[str, BatchKernel]) -> None:
        self._sample = dict(sample)
        self._batch = dict(batch)

    def register(self, name: str, make: SampleKernel | BatchKernel, *, mixes_batch: bool = False) -> None:
        """Add the kernel `name` (`make(transform, kernels)` -> its op; a `BatchOp` when
        `mixes_batch`, for a transform of the batch stage, else a `SampleOp`). Registering a name
        again replaces its kernel only with one of the same module and name (a module imported
        again); another is a ConfigError."""
        table: dict[str, Any] = self._batch if mixes_batch else self._sample
        earlier = table.get(name)
        if earlier is not None and _qualified(earlier) != _qualified(make):
            raise ConfigError(f"a kernel named {name!r} is already registered: give the new one another name")
        table[name] = make

    def _declared(self, t: Any) -> tuple[str, str]:
        """(kernel name, stage) that the type of `t` declares."""
        declared = declaration_of(type(t))
        if declared is None:
            raise ConfigError(f"{type(t).__name__} is not a declared transform: it has no kernel")
        return declared.kernel, declared.stage

    def sample_op(self, t: Any) -> SampleOp:
        """The batched kernel of a per-sample transform."""
        name, _ = self._declared(t)
        make = self._sample.get(name)
        if make is None:
            raise ConfigError(f"{type(t).__name__} has no batched kernel: none is registered as {name!r}")
        return make(t, self)

    def batch_op(self, t: Any) -> BatchOp:
        """The kernel of a batch transform."""
        name, _ = self._declared(t)
        make = self._batch.get(name)
        if make is None:
            raise ConfigError(f"{type(t).__name__} has no batch kernel: none is registered as {name!r}")
        return make(t, self)

    def has_kernel(self, cls: type) -> bool:
        """Whether the transform class `cls` is declared and its declared kernel exists."""
        declared = declaration_of(cls)
        if declared is None:
            return False
        if declared.kernel == DECODE:
            return cls in DECODED_GEOMETRY or cls is Views  # a Views' kernels are its views' (`check`)
        return declared.kernel in (self._batch if declared.stage == "batch" else self._sample)

    def check(self, transforms: Iterable[Transform]) -> None:
        """Check that every transform of a chain (and every member of one that holds others) has
        its kernel, where the chain is built, not later in a worker.

        Raises:
            ConfigError: naming the transform and the kernel it declares.
        """
        for t in transforms:
            if not self.has_kernel(type(t)):
                declared = declaration_of(type(t))
                kernel = "none" if declared is None else repr(declared.kernel)
                raise ConfigError(
                    f"{type(t).__name__} has no kernel (it declares {kernel}, which is not registered): "
                    "register it with fastload._augment.registry.register_kernel before building a loader"
                )
            self.check(_members(t))


def _members(t: Transform) -> list[Transform]:
    """The transforms a transform holds (RandomApply's, RandomChoice's, every view's of a Views)."""
    held: list[Transform] = []
    for field in dataclasses.fields(t):  # type: ignore[arg-type]
        value = getattr(t, field.name)
        if isinstance(value, tuple):
            for v in value:
                held.extend(v if isinstance(v, tuple) else (v,))
    return [v for v in held if isinstance(v, Transform)]


def _qualified(make: object) -> tuple[str, str]:
    return getattr(make, "__module__", ""), getattr(make, "__qualname__", repr(make))


KERNELS = KernelRegistry(
    {**color_ops.KERNELS, **policies.KERNELS, **mixing.KERNELS, **timm_ops.KERNELS, **timm_policies.KERNELS,
     **warp_ops.KERNELS},
    {**mixing.BATCH_KERNELS, **timm_ops.BATCH_KERNELS},
)
"""fastload's kernels, and those a program registers."""

sample_op = KERNELS.sample_op
batch_op = KERNELS.batch_op
check_kernels = KERNELS.check


def register_kernel(name: str, make: SampleKernel | BatchKernel, *, mixes_batch: bool = False) -> None:
    """Register the kernel a transform declared outside fastload names (`declare_transform(kernel=
    name)`): `make(transform, kernels)` returns its `SampleOp` (a `BatchOp` when `mixes_batch`);
    see `fastload._augment.ops` for the rules a kernel keeps."""
    KERNELS.register(name, make, mixes_batch=mixes_batch)
