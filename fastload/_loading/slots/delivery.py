"""The trainer side of a ready slot: turn it into the user's batch, and free it when safe.

`CpuDelivery` returns tensors that are views over the slot (no copy); the slot is released by a
finalizer when the last of them dies, so a batch is never overwritten while the user can see
it. `CudaDelivery` registers every slot as pinned memory once, copies it `non_blocking` on a
side stream, converts/normalizes there, makes the user's stream wait on an event, and releases
the slot when that event has completed; it never synchronises the host.

Images travel NHWC uint8 (or float32, normalized by CPU batches' workers: NOTE [float slots] in
`jobs`); `present_batch` turns them into NCHW by a permute, which *is* the
channels_last memory format, so no transpose runs unless contiguous NCHW is asked for. The chain's
stages that the trainer's process owns (`TrainerStages`: the pixel stage when batches go to a GPU,
RandomErasing and MixUp/CutMix after normalization) run there too, on the batch's device, each
view's own for a `Views` (one image leaf per view, the labels after them).
"""

from __future__ import annotations

import ctypes
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastload._augment.program import TrainerStages
from fastload._loading.decoding.host_normalize import HostNormalizer
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring import Ring
from fastload._shm import Segment


@dataclass(frozen=True)
class ImageOutput:
    """How image batches are presented: optional normalize, its float dtype, memory format."""

    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    dtype: torch.dtype = torch.float32
    memory_format: torch.memory_format = torch.channels_last

    def affine(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(scale, bias) such that x * scale + bias == (x / 255 - mean) / std, or None."""
        if self.mean is None or self.std is None:
            return None
        mean = torch.tensor(self.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
        return 1.0 / (255.0 * std), -mean / std


SampleIds = tuple[int, np.ndarray]
"""A batch's epoch and sample indices: what its trainer-side random draws are keyed by."""


def present_batch(
    nhwc: torch.Tensor,
    labels: torch.Tensor | None,
    output: ImageOutput,
    affine: tuple[torch.Tensor, torch.Tensor] | None,
    stages: TrainerStages | None,
    ids: SampleIds | None,
    host_normalize: HostNormalizer | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """NHWC uint8 images -> NCHW (channels_last unless asked otherwise): the trainer's pixel stage,
    normalization (by `host_normalize` for CPU batches), then RandomErasing and MixUp/CutMix
    (labels becoming soft targets). NHWC float32 images were normalized by the workers (NOTE
    [float slots] in `jobs`): only the stages after normalization run, in place."""
    x = nhwc.permute(0, 3, 1, 2)
    normalized = nhwc.dtype == torch.float32
    if stages is not None and ids is not None and not normalized:
        x = stages.before_normalize(x, *ids)
    if affine is not None:
        if normalized:
            pass  # by the workers
        elif host_normalize is not None:
            x = host_normalize(x.permute(0, 2, 3, 1))
        else:
            scale, bias = affine
            x = x.to(torch.float32).mul_(scale).add_(bias)
        if stages is not None and ids is not None:  # labels: None when a batch carries none
            x, labels = stages.after_normalize(x, labels, *ids)
        if output.dtype != torch.float32:
            x = x.to(output.dtype)
    if output.memory_format == torch.contiguous_format:
        x = x.contiguous()
    elif x.dim() == 4 and not x.is_contiguous(memory_format=torch.channels_last):
        x = x.contiguous(memory_format=torch.channels_last)  # a kernel gave back another layout
    return x, labels


ViewStages = Sequence[TrainerStages | None] | TrainerStages | None
"""What of the chain runs in the trainer's process: one `TrainerStages` (or None) per image leaf
of a batch, in order (a `Views`' views; a plain chain's one), the labels' leaf after them."""


def _per_view(stages: ViewStages) -> tuple[TrainerStages | None, ...]:
    """`stages` as one entry per image leaf, None where nothing runs in the trainer's process."""
    each = (stages,) if stages is None or isinstance(stages, TrainerStages) else tuple(stages)
    return tuple(s if s else None for s in each)


def _slot_arrays(
    ring: Ring, slot: int, layout: BatchLayout, count: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    # frombuffer holds a buffer export on the mapping while any view of `base` lives, so
    # Segment.close cannot unmap a slot under a batch the user still holds (np.ndarray(buffer=mmap)
    # takes no export: reading such a batch after close() would touch unmapped memory).
    base = np.frombuffer(ring.segments[slot].buf, dtype=np.uint8, count=ring.slot_bytes)
    return base, layout.arrays(base, count)


class CpuDelivery:
    """Batches as CPU tensors over the slot; `pin_memory` copies them to pinned memory instead."""

    def __init__(
        self,
        ring: Ring,
        layout: BatchLayout,
        images: ImageOutput | None,
        pin_memory: bool,
        stages: ViewStages = None,
    ) -> None:
        self._ring = ring
        self._layout = layout
        self._images = images
        self._affine = images.affine(torch.device("cpu")) if images else None
        self._normalize = HostNormalizer(*self._affine) if self._affine is not None else None
        self._pin = pin_memory
        self._stages = _per_view(stages)

    def on_new_slot(self, segment: Segment) -> None:
        """CPU batches need nothing per slot."""

    def on_slot_removed(self, segment: Segment) -> None:
        """Nothing was kept per slot (`on_new_slot`'s counterpart)."""

    def deliver(self, slot: int, count: int, ids: SampleIds | None = None) -> Any:
        """The batch in `slot` (its first `count` rows); `ids` key the trainer-side random draws."""
        base, arrays = _slot_arrays(self._ring, slot, self._layout, count)
        weakref.finalize(base, self._ring.release, slot)
        lists = self._layout.decode_ragged(arrays)  # NOTE [ragged leaves]: copied out of the slot
        host = self._layout.host_leaves
        tensors = [torch.from_numpy(a) for a in arrays]
        del base, arrays
        in_slot = tensors[0].data_ptr()
        n = len(self._stages)  # the image leaves (a Views' views), labels after them
        label_leaf = self._layout.label_leaf(n)
        if self._images is not None:
            images, affine = self._images, self._affine
            for v, stages in enumerate(self._stages):
                labels = tensors[label_leaf] if stages is not None and label_leaf is not None else None
                # Float slots (NOTE [float slots] in `jobs`): MixUp/CutMix mix the slot's images in
                # place; safe, since the slot is this batch's alone until its last view dies.
                tensors[v], labels = present_batch(
                    tensors[v], labels, images, affine, stages, ids, self._normalize
                )
                if labels is not None and label_leaf is not None:
                    tensors[label_leaf] = labels
        if self._pin:
            tensors = [t if i in host else t.pin_memory() for i, t in enumerate(tensors)]
        elif self._affine is not None and tensors[0].data_ptr() != in_slot:
            # Normalizing (or a dtype) copied the images; copy the (small) rest so the slot is free at once.
            rest = (t if i in host else t.clone() for i, t in enumerate(tensors) if i >= n)
            tensors = [*tensors[:n], *rest]
        return self._layout.build(tensors, lists)

    def poll(self) -> None:
        """Nothing to poll: CPU slots come back through finalizers."""

    def close(self) -> None:
        """Nothing to release."""


class CudaDelivery:
    """Pinned slots copied `non_blocking` on a side stream; released when the copy completes.

    `cuda` is the `torch.cuda` module; tests on machines without a GPU pass a stand-in with the
    same few names (Stream, Event, current_stream, stream, cudart) to check the protocol.
    """

    def __init__(
        self,
        ring: Ring,
        layout: BatchLayout,
        images: ImageOutput | None,
        device: torch.device,
        cuda: Any = torch.cuda,
        on_copied: Callable[[float], None] | None = None,
        stages: ViewStages = None,
    ) -> None:
        self._ring = ring
        self._stages = _per_view(stages)
        self._layout = layout
        self._images = images
        self._device = device
        self._cuda = cuda
        self._stream = cuda.Stream(device=device)
        self._affine = images.affine(device) if images else None
        self._on_copied = on_copied
        # (copy-start event, copy-done event, slot), in copy order
        self._pending: deque[tuple[Any, Any, int]] = deque()
        self._registered: dict[str, int] = {}  # a registered slot's segment name -> its address
        self._cudart: Any = cuda.cudart()
        for segment in ring.segments.values():
            self.on_new_slot(segment)

    @property
    def pending(self) -> int:
        """Slots whose copies have not been seen complete yet."""
        return len(self._pending)

    def on_new_slot(self, segment: Segment) -> None:
        """Register a slot as page-locked (pinned) memory, once, so copies are true async DMA."""
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(segment.buf))
        err = self._cudart.cudaHostRegister(ptr, segment.size, 0)
        if int(err) == 0:
            self._registered[segment.name] = ptr

    def on_slot_removed(self, segment: Segment) -> None:
        """Unregister a slot the ring is about to unlink (a free one: no copy reads it)."""
        ptr = self._registered.pop(segment.name, None)
        if ptr is not None:
            self._cudart.cudaHostUnregister(ptr)

    def deliver(self, slot: int, count: int, ids: SampleIds | None = None) -> Any:
        """The batch in `slot` copied to the device; `ids` key the trainer-side random draws."""
        _, arrays = _slot_arrays(self._ring, slot, self._layout, count)
        lists = self._layout.decode_ragged(arrays)  # NOTE [ragged leaves]: they stay on the host
        stay = self._layout.host_leaves
        host = [torch.from_numpy(a) for a in arrays]
        user_stream = self._cuda.current_stream(self._device)
        with self._cuda.stream(self._stream):
            started = self._cuda.Event(enable_timing=True)
            started.record(self._stream)
            on_device = [
                t if i in stay else t.to(self._device, non_blocking=True) for i, t in enumerate(host)
            ]
            n = len(self._stages)  # the image leaves (a Views' views), labels after them
            label_leaf = self._layout.label_leaf(n)
            if self._images is not None:
                for v, stages in enumerate(self._stages):
                    labels = on_device[label_leaf] if stages is not None and label_leaf is not None else None
                    on_device[v], labels = present_batch(
                        on_device[v], labels, self._images, self._affine, stages, ids
                    )
                    if labels is not None and label_leaf is not None:
                        on_device[label_leaf] = labels
            copied = self._cuda.Event(enable_timing=True)
            copied.record(self._stream)
        user_stream.wait_event(copied)
        for t in on_device:
            if t.is_cuda:  # tell the caching allocator the user's stream uses it too
                t.record_stream(user_stream)
        self._pending.append((started, copied, slot))
        return self._layout.build(on_device, lists)

    def poll(self) -> None:
        """Release the slots whose copies have completed (event queries, no host sync)."""
        while self._pending and self._pending[0][1].query():
            started, copied, slot = self._pending.popleft()
            self._ring.release(slot)
            if self._on_copied is not None:
                self._on_copied(started.elapsed_time(copied) / 1000.0)

    def close(self) -> None:
        """Wait for copies in flight, then unregister the pinned slots."""
        self._stream.synchronize()
        self.poll()
        for ptr in self._registered.values():
            self._cudart.cudaHostUnregister(ptr)
        self._registered.clear()


def make_delivery(
    ring: Ring,
    layout: BatchLayout,
    images: ImageOutput | None,
    device: torch.device,
    pin_memory: bool,
    on_copied: Callable[[float], None] | None = None,
    stages: ViewStages = None,
) -> CpuDelivery | CudaDelivery:
    """The delivery for `device`: CUDA when it is a CUDA device, CPU otherwise.

    `on_copied(seconds)` hears each completed host-to-device copy's duration (CUDA only);
    `stages` is what of the transform chain runs in the trainer's process, one per image leaf.
    """
    if device.type == "cuda":
        return CudaDelivery(ring, layout, images, device, on_copied=on_copied, stages=stages)
    return CpuDelivery(ring, layout, images, pin_memory, stages)
