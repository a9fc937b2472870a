"""CPU normalization: one native pass into reused buffers, equal to torch's three passes.

Protects the values a model trained on CPU-normalized batches sees (bit-identical to the torch
path) and the safety of reusing buffers: a buffer takes a later batch only once no view of the
batch it held is alive (a kept slice included).
"""

from __future__ import annotations

import gc

import pytest
import torch

from fastload._loading.decoding.host_normalize import HostNormalizer
from fastload._loading.slots.delivery import ImageOutput
from fastload._native_jpeg import native_jpeg

OUTPUT = ImageOutput(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
needs_native = pytest.mark.skipif(native_jpeg() is None, reason="the native extension is not built")


def _batch(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (4, 9, 7, 3), dtype=torch.uint8, generator=g)


def test_equals_torchs_three_passes_bit_for_bit() -> None:
    scale, bias = OUTPUT.affine(torch.device("cpu"))  # type: ignore[misc]
    normalize = HostNormalizer(scale, bias)
    x = _batch(0)
    expected = x.permute(0, 3, 1, 2).to(torch.float32).mul_(scale).add_(bias)
    got = normalize(x)
    assert got.shape == (4, 3, 9, 7) and got.dtype == torch.float32
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, expected)
    everything = torch.arange(256, dtype=torch.uint8).repeat(3).view(1, 16, 16, 3)  # every value
    assert torch.equal(normalize(everything), everything.permute(0, 3, 1, 2).float().mul_(scale).add_(bias))


@needs_native
def test_a_buffer_is_reused_only_once_every_view_is_gone() -> None:
    normalize = HostNormalizer(*OUTPUT.affine(torch.device("cpu")))  # type: ignore[misc]
    first = normalize(_batch(1))
    kept = first[1:2]  # the user keeps a slice of the batch
    pointer = first.data_ptr()
    del first
    gc.collect()
    second = normalize(_batch(2))
    assert second.data_ptr() != pointer  # the slice still reads the first buffer
    before = kept.clone()
    third = normalize(_batch(3))
    assert torch.equal(kept, before)
    del kept, second, third
    gc.collect()
    free = normalize._free[4 * _batch(0).numel()]
    assert len(free) == 3  # all three came back once nothing viewed them
    fourth = normalize(_batch(4))
    assert len(free) == 2 and fourth.data_ptr() != 0  # a later batch took one of them
    del fourth
    reused = {normalize(_batch(5)).data_ptr() for _ in range(3)}
    assert len(reused) == 1  # dropped at once: the same buffer serves every batch


@pytest.mark.parametrize("native", [True, False])
def test_into_rows_equals_the_batch_pass_bit_for_bit(native: bool) -> None:
    # Workers normalize their rows straight into a float slot (NOTE [float slots] in `jobs`).
    if native and native_jpeg() is None:
        pytest.skip("the native extension is not built")
    scale, bias = OUTPUT.affine(torch.device("cpu"))  # type: ignore[misc]
    normalize = HostNormalizer(scale, bias)
    if not native:
        normalize._normalize_u8 = None  # the torch path
    x = _batch(3)
    out = torch.full(x.shape, float("nan"), dtype=torch.float32)
    normalize.into(x.numpy(), out.numpy())
    expected = x.permute(0, 3, 1, 2).to(torch.float32).mul_(scale).add_(bias)
    assert torch.equal(out.permute(0, 3, 1, 2), expected)
