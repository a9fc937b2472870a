"""Why an encoded image cannot be decoded, in words: the one reason every backend reports.

A decoder's own error says little a user can act on (Pillow: "cannot identify image file
<_io.BytesIO object at 0x7f...>", for an empty file and a text file alike; DALI: "Failed to
decode sample #3"). When a backend's decoder refuses a sample, `sample_failure` looks at the
bytes themselves and says what they are: an empty file, something that is not an image (what it
starts with, and whether it looks like text or a web page), a JPEG cut short (no end-of-image
marker after its scan), or an image of a known format its decoder refused (with the decoder's
words, scrubbed of Python object reprs). The `SampleFailure` keeps the decoder's
exception as its cause, so `SampleError`'s class (`except OSError`, ...) is unchanged.

`jpeg_cut_short` is also asked before a JPEG is handed to DALI or nvJPEG (`boxes.sample_inputs`):
their decoders log every failure on the process's stderr from C++ (NOTE [DALI's stderr]).
"""

from __future__ import annotations

import re

from fastload._errors import FastloadError
from fastload._loading.backends import JPEG_MAGIC, SampleFailure

_SIGNATURES = (
    (JPEG_MAGIC, "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"BM", "BMP"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
)
_HEAD = 8  # bytes of a non-image quoted in its reason
_REPR = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-fA-F]+>")  # "<_io.BytesIO object at 0x7f...>"
_EOI, _SOS = b"\xff\xd9", 0xDA
# Markers with no length field: SOI, TEM and RST0-7 (a stray one between segments is skipped).
_STANDALONE = {0xD8, 0x01, *range(0xD0, 0xD8)}


def image_format(blob: bytes | memoryview) -> str | None:
    """The image format the bytes' signature names ("JPEG", "PNG", ...), or None."""
    head = bytes(blob[:12])
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    return next((name for magic, name in _SIGNATURES if head.startswith(magic)), None)


def jpeg_cut_short(blob: bytes | memoryview) -> bool:
    """Whether a JPEG's data stops before its end-of-image marker: the segments are walked to the
    image's first scan (past an EXIF thumbnail, which has its own scan and marker), and no EOI
    follows it. Trailing bytes after an EOI (some cameras add them) are not a cut."""
    data = bytes(blob)
    at, n = 2, len(data)
    while at + 4 <= n:
        if data[at] != 0xFF:
            return False  # not a marker where one must be: damaged, not cut (the decoder says why)
        marker = data[at + 1]
        if marker == 0xFF:  # fill bytes before a marker
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker == _SOS:
            return data.find(_EOI, at + 2) < 0
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return True  # the headers themselves are cut


def _looks_like(head: bytes) -> str:
    """" (text?)" or " (a web page?)" for bytes that read as such, else ""."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    if not text or not all(c.isprintable() or c in "\t\r\n" for c in text):
        return ""
    return " (a web page?)" if text.lstrip().lower().startswith(("<!doctype html", "<html")) else " (text?)"


def describe(blob: bytes | memoryview, error: BaseException | str) -> str:
    """What is wrong with `blob`, which a decoder refused with `error`, in one line of words (a
    fastload error, such as a CenterCrop larger than the image, already is: its own message)."""
    if isinstance(error, FastloadError):
        return str(error)
    size = len(blob)
    if size == 0:
        return "empty file (0 bytes)"
    kind = image_format(blob)
    if kind is None:
        head = bytes(blob[:64])
        return f"not an image: starts with {head[:_HEAD]!r}{_looks_like(head)} ({size} bytes)"
    if kind == "JPEG" and jpeg_cut_short(blob):
        return f"truncated JPEG: no end-of-image marker ({size} bytes)"
    words = _REPR.sub("", str(error)).replace("\n", " ").strip()
    for prefix in ("corrupt JPEG: ", "DALI could not decode the image: "):
        words = words.removeprefix(prefix)
    return f"cannot decode this {kind} ({size} bytes): {words or type(error).__name__}"


def sample_failure(position: int, blob: bytes | memoryview, error: BaseException) -> SampleFailure:
    """The SampleFailure of a decoder's `error` on `blob` at `position`: `describe`'s words, with
    `error` as its cause (`raise sample_failure(...) from error`)."""
    failure = SampleFailure(position, describe(blob, error))
    failure.__cause__ = error
    return failure
