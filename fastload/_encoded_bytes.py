"""What a sample's encoded bytes are, told from the bytes alone: the one owner of the image
signatures fastload knows, of the check that a JPEG is cut short, and of the words for bytes that
are no image at all.

Two users build on it: the backends, to say why a decoder refused a sample
(`_loading/decoding/undecodable.py`: "empty file (0 bytes)", "not an image: starts with
b'hello wo' (text?)", "truncated JPEG: no end-of-image marker", rather than a decoder's
"cannot identify image file <_io.BytesIO object at 0x...>"), and `fastload pack`, to keep broken
samples out of a pack without decoding them (`sources/_packing/image_bytes.py`). `describe` puts a decoder's
refusal
and what the bytes are in one line of words. A foundation: it imports only `_errors`.
"""

from __future__ import annotations

import re

from fastload._errors import FastloadError

JPEG_MAGIC = b"\xff\xd8\xff"  # how every decoder tells a JPEG from other formats

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
        if marker == _SOS:  # searched from the end, where the marker is: a forward search
            return data.rfind(_EOI) < at + 2  # through the scan's 0xFF bytes took ~2 µs per KB
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


def plainly_broken(blob: bytes | memoryview) -> str | None:
    """What is wrong with `blob`, where its bytes alone say so: empty, no image signature known
    here, or a JPEG cut short; None otherwise (which is not "decodable": a decoder may still
    refuse it). Formats without a signature here (PPM, ICO, ...) are "not an image" to it: a
    caller that accepts them asks its decoder first."""
    size = len(blob)
    if size == 0:
        return "empty file (0 bytes)"
    kind = image_format(blob)
    if kind is None:
        head = bytes(blob[:64])
        return f"not an image: starts with {head[:_HEAD]!r}{_looks_like(head)} ({size} bytes)"
    if kind == "JPEG" and jpeg_cut_short(blob):
        return f"truncated JPEG: no end-of-image marker ({size} bytes)"
    return None


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
