"""Why an encoded image cannot be decoded, in words: the one reason every backend reports.

A decoder's own error says little a user can act on (Pillow: "cannot identify image file
<_io.BytesIO object at 0x7f...>", for an empty file and a text file alike; DALI: "Failed to
decode sample #3"). When a backend's decoder refuses a sample, `sample_failure` looks at the
bytes themselves and says what they are: an empty file, something that is not an image (what it
starts with, and whether it looks like text or a web page), a JPEG cut short (no end-of-image
marker after its scan), or an image of a known format its decoder refused (with the decoder's
words, scrubbed of Python object reprs). The `SampleFailure` keeps the decoder's
exception as its cause, so `SampleError`'s class (`except OSError`, ...) is unchanged.

`SampleFailure` is defined here, beside the words, so that each backend imports this module and
never the package's `__init__` (which imports the backends). What the bytes alone say, and
`describe`'s words for a refused sample, are `_encoded_bytes`' (a foundation: the one owner of
signatures and the cut-short check, shared with `fastload pack`); its `jpeg_cut_short` is also
asked before a JPEG is handed to DALI or nvJPEG (`boxes.sample_inputs`): their decoders log
every failure on the process's stderr from C++ (NOTE [DALI's stderr]).
"""

from __future__ import annotations

from fastload._encoded_bytes import describe

__all__ = ["SampleFailure", "describe", "sample_failure"]

class SampleFailure(Exception):
    """Decoding the sample at `position` in the batch failed; `__cause__` says why."""

    def __init__(self, position: int, message: str) -> None:
        super().__init__(message)
        self.position = position


def sample_failure(position: int, blob: bytes | memoryview, error: BaseException) -> SampleFailure:
    """The SampleFailure of a decoder's `error` on `blob` at `position`: `describe`'s words, with
    `error` as its cause (`raise sample_failure(...) from error`)."""
    failure = SampleFailure(position, describe(blob, error))
    failure.__cause__ = error
    return failure
