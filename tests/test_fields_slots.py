"""Declared fields in a ring slot: the layout of ragged leaves (NOTE [ragged leaves]) and the
trainer's side of it, without workers.

Protects: a fields layout puts the image first and the label second, each ragged field as a
bytes row of its largest member plus a length; it survives the JSON a daemon sends; the CPU and
(stand-in) CUDA deliveries hand out the ragged rows as str / parsed JSON / bytes lists, the label
as a tensor, in the declared order (dict or list), and the label leaf is found where MixUp needs it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_cuda_protocol import FakeCuda

from fastload._loading.jobs.field_rows import fields_layout
from fastload._loading.slots.delivery import CpuDelivery, CudaDelivery, ImageOutput
from fastload._loading.slots.layout import BatchLayout
from fastload._loading.slots.ring import Ring
from fastload.sources._indexes.field_extents import FieldExtents

TEXTS = ["a caption", "é" * 20]
METAS = [{"k": [1, 2]}, None]
RAW = [b"\x00\x01", b""]


def _fields(named: bool) -> FieldExtents:
    rows = [[len(t.encode()) for t in TEXTS], [len(json.dumps(m)) for m in METAS], [len(r) for r in RAW]]
    sizes = np.array(rows, np.int64)
    kinds = ("str", "image", "json", "label", "bytes")
    return FieldExtents(("text", "image", "meta", "label", "raw"), kinds, named, np.zeros_like(sizes), sizes)


def _filled(layout: BatchLayout, ring: Ring) -> int:
    slot = ring.acquire()
    assert slot is not None
    arrays = layout.arrays(ring.segments[slot].buf)
    arrays[0][:] = 9
    arrays[1][:] = [4, 2]
    rows = ([t.encode() for t in TEXTS], [json.dumps(m).encode() for m in METAS], RAW)
    for leaf, blobs in zip((2, 4, 6), rows, strict=True):
        for k, blob in enumerate(blobs):
            arrays[leaf][k, : len(blob)] = np.frombuffer(blob, np.uint8)
            arrays[leaf + 1][k] = len(blob)
    return slot


@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("cuda", [False, True])
def test_a_slot_of_fields_is_handed_out_as_declared(named: bool, cuda: bool) -> None:
    fields = _fields(named)
    layout = fields_layout(fields, np.zeros((4, 4, 3), np.uint8), 2)
    assert BatchLayout.from_json(layout.to_json()) == layout  # the daemon's wire keeps it
    assert layout.label_leaf() == 1 and layout.host_leaves == frozenset(range(2, 8))
    assert [leaf.shape for leaf in layout.leaves[2::2]] == [(fields.capacity(r),) for r in range(3)]
    ring = Ring(layout.slot_bytes, 2)
    delivery: CpuDelivery | CudaDelivery
    if cuda:
        delivery = CudaDelivery(ring, layout, ImageOutput(), torch.device("cpu"), cuda=FakeCuda(0))
    else:
        delivery = CpuDelivery(ring, layout, ImageOutput(), pin_memory=False)
    try:
        batch = delivery.deliver(_filled(layout, ring), 2)
        values = list(batch.values()) if named else batch
        assert (list(batch) if named else None) in (["text", "image", "meta", "label", "raw"], None)
        text, image, meta, label, raw = values
        assert text == TEXTS and meta == METAS and raw == RAW
        assert label.tolist() == [4, 2] and image.shape == (2, 3, 4, 4) and int(image.min()) == 9
    finally:
        delivery.close()
        ring.close()


def test_without_a_label_no_leaf_is_taken_for_one() -> None:
    sizes = np.array([[3, 4]], np.int64)
    fields = FieldExtents(("image", "text"), ("image", "str"), True, np.zeros_like(sizes), sizes)
    layout = fields_layout(fields, np.zeros((2, 2, 3), np.uint8), 2)
    assert layout.label_leaf() is None and layout.host_leaves == frozenset({1, 2})
