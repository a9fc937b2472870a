"""Why an encoded image cannot be decoded, in words: the one reason every backend reports.

A decoder's own error says little a user can act on (Pillow: "cannot identify image file
<_io.BytesIO object at 0x7f...>", for an empty file and a text file alike; DALI: "Failed to
decode sample #3"). When a backend's decoder refuses a sample, `sample_failure` looks at the
bytes themselves and says what they are: an empty file, something that is not an image (what it
starts with, and whether it looks like text or a web page), a JPEG cut short (no end-of-image
marker after its scan), or an image of a known format its decoder refused (with the decoder's
words, scrubbed of Python object reprs). The `SampleFailure` keeps the decoder's
exception as its cause, so `SampleError`'s class (`except OSError`, ...) is unchanged.

What the bytes alone say is `_encoded_bytes`' (the one owner of signatures and the cut-short
check, shared with `fastload pack`); its `jpeg_cut_short` is also asked before a JPEG is handed to
DALI or nvJPEG (`boxes.sample_inputs`): their decoders log every failure on the process's stderr
from C++ (NOTE [DALI's stderr]).
"""

from __future__ import annotations

import re

from fastload._encoded_bytes import image_format, plainly_broken
from fastload._errors import FastloadError
from fastload._loading.backends import SampleFailure

__all__ = ["describe", "sample_failure"]

_REPR = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-fA-F]+>")  # "<_io.BytesIO object at 0x7f...>"


def describe(blob: bytes | memoryview, error: BaseException | str) -> str:
    """What is wrong with `blob`, which a decoder refused with `error`, in one line of words (a
    fastload error, such as a CenterCrop larger than the image, already is: its own message)."""
    if isinstance(error, FastloadError):
        return str(error)
    plain = plainly_broken(blob)
    if plain is not None:
        return plain
    words = _REPR.sub("", str(error)).replace("\n", " ").strip()
    for prefix in ("corrupt JPEG: ", "DALI could not decode the image: "):
        words = words.removeprefix(prefix)
    return f"cannot decode this {image_format(blob)} ({len(blob)} bytes): {words or type(error).__name__}"


def sample_failure(position: int, blob: bytes | memoryview, error: BaseException) -> SampleFailure:
    """The SampleFailure of a decoder's `error` on `blob` at `position`: `describe`'s words, with
    `error` as its cause (`raise sample_failure(...) from error`)."""
    failure = SampleFailure(position, describe(blob, error))
    failure.__cause__ = error
    return failure
