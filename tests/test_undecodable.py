"""A sample no decoder reads is reported in words, the same by every CPU backend: what the bytes
are (an empty file, text, a web page, a JPEG cut short, a known format its decoder refused), never a
repr of a Python object ("cannot identify image file <_io.BytesIO object at 0x...>"); the
decoder's exception stays the cause, so `SampleError`'s class is unchanged.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers import undefined_huffman_table
from PIL import Image

from fastload import transforms as T
from fastload._encoded_bytes import jpeg_cut_short
from fastload._loading.decoding.backend import SampleFailure, make_backend
from fastload._sample_random import sample_randoms
from fastload.transforms import compile_transforms

BACKENDS = ["native", "pil"]


def _encoded(fmt: str, **options: object) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (40, 48, 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt, **options)
    return out.getvalue()


JPEG, PNG = _encoded("JPEG"), _encoded("PNG")
CASES = {
    "empty": (b"", "empty file (0 bytes)"),
    "text": (b"hello world\n" * 10, "not an image: starts with b'hello wo' (text?) (120 bytes)"),
    "web page": (
        b"<!DOCTYPE html><html>403</html>",
        "not an image: starts with b'<!DOCTYP' (a web page?) (31 bytes)",
    ),
    "binary": (
        bytes(range(1, 40)),
        "not an image: starts with b'\\x01\\x02\\x03\\x04\\x05\\x06\\x07\\x08' (39 bytes)",
    ),
    "cut in its header": (JPEG[:150], "truncated JPEG: no end-of-image marker (150 bytes)"),
    "cut in its scan": (JPEG[:-400], f"truncated JPEG: no end-of-image marker ({len(JPEG) - 400} bytes)"),
    "progressive, cut": (
        _encoded("JPEG", progressive=True)[:-300],
        f"truncated JPEG: no end-of-image marker ({len(_encoded('JPEG', progressive=True)) - 300} bytes)",
    ),
    "PNG cut in its header": (PNG[:30], "cannot decode this PNG (30 bytes): cannot identify image file"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_sample_is_reported_in_words_naming_its_position(backend: str, case: str) -> None:
    blob, words = CASES[case]
    decoder = make_backend(backend, compile_transforms([T.Resize((16, 16))]))
    out = np.zeros((2, 16, 16, 3), np.uint8)
    with pytest.raises(SampleFailure) as failure:
        decoder.decode_batch([JPEG, blob], sample_randoms(0, 0, np.arange(2)), out)
    assert failure.value.position == 1
    assert str(failure.value) == words
    assert failure.value.__cause__ is not None  # the decoder's own exception, for its class


@pytest.mark.parametrize("backend", BACKENDS)
def test_damage_only_the_decoder_finds_says_the_format_and_the_decoders_words(backend: str) -> None:
    blob = undefined_huffman_table(JPEG)
    decoder = make_backend(backend, compile_transforms([T.Resize((16, 16))]))
    with pytest.raises(SampleFailure) as failure:
        decoder.decode_batch([blob], sample_randoms(0, 0, np.arange(1)), np.zeros((1, 16, 16, 3), np.uint8))
    assert str(failure.value).startswith(f"cannot decode this JPEG ({len(blob)} bytes): ")
    assert " object at 0x" not in str(failure.value)


def test_the_check_before_dali_calls_a_jpeg_cut_only_when_its_scan_has_no_end_marker() -> None:
    """`jpeg_cut_short` refuses a file before DALI sees it (NOTE [DALI's stderr]): never a good one."""
    assert not jpeg_cut_short(JPEG)
    assert not jpeg_cut_short(JPEG + b"\0" * 64)  # bytes after the end marker: some cameras write them
    assert not jpeg_cut_short(_encoded("JPEG", progressive=True))
    assert jpeg_cut_short(JPEG[:-2]) and jpeg_cut_short(JPEG[:100])
