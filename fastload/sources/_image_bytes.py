"""Whether a sample's encoded bytes are a whole image, told without decoding it: what a pack
checks of every sample it stores as the source's bytes (`pack` without `max_side` copies bytes;
with it, an image within `max_side` is stored as it is too).

Its one responsibility is that check, which must stay cheap (a few header bytes, and one search
backwards from the end for the end marker; see `pack`'s NOTE [broken bytes] for its cost). It
finds what fails a training run outright, as the loader's decoders do:

- an empty sample;
- bytes that are no image format the loader decodes (a text file, an HTML error page saved as
  `.jpg`): neither the magic of JPEG, PNG, GIF, WebP, BMP, TIFF, PPM/PGM nor, when Pillow is
  installed, anything Pillow recognises from the header;
- a JPEG cut short: no end-of-image marker after its first scan starts (libjpeg-turbo, as
  fastload's decoder runs it, fails on a scan that runs out of data, as Pillow does);
- a PNG with no IEND chunk, a WebP or BMP shorter than its header says, when Pillow cannot decode
  it either (such a suspect, rare, is decoded: Pillow decodes a PNG cut after its last pixel
  data, as training would).

It does not find damage a decoder recovers from (a garbled scan decodes to gray blocks in
training too), nor everything a decoder refuses: `fastload verify` decodes every sample.
"""

from __future__ import annotations

import io

from fastload._loading.backends import JPEG_MAGIC

_JPEG_EOI = b"\xff\xd9"
_JPEG_SOS = b"\xff\xda"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_IEND = b"IEND\xaeB`\x82"
_OTHER_MAGIC = (b"GIF87a", b"GIF89a", b"II*\x00", b"MM\x00*")


def damage(blob: bytes | memoryview) -> str | None:
    """Why `blob` is not a whole image (a phrase for an error message), or None when it looks
    like one (see the module docstring)."""
    data = blob if isinstance(blob, bytes) else bytes(blob)  # a view of a larger read: searched
    if not data:
        return "it is empty (0 bytes)"
    if data.startswith(JPEG_MAGIC):
        scan = data.find(_JPEG_SOS)
        if scan < 0 or data.rfind(_JPEG_EOI) < scan:
            return "a JPEG cut short (no end-of-image marker after its scan)"
        return None
    cut = _cut_short(data)
    if cut is not None:  # a suspect: decoded, as training would decode it
        return None if _pillow_decodes(data) else cut
    if data.startswith(_OTHER_MAGIC) or (len(data) > 2 and data[0:1] == b"P" and data[1:2] in b"123456"):
        return None
    if _pillow_recognises(data):
        return None
    return f"not an image (its first bytes, {data[:8].hex(' ')}, are no image format's)"


def _cut_short(data: bytes) -> str | None:
    """Why a PNG, WebP or BMP looks cut short from its end or header, or None."""
    if data.startswith(_PNG_MAGIC):
        return None if data.rfind(_PNG_IEND) > 0 else "a PNG cut short (no IEND chunk)"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        declared = int.from_bytes(data[4:8], "little") + 8
        return None if len(data) >= declared else f"a WebP cut short ({len(data)} of {declared} bytes)"
    if data.startswith(b"BM") and len(data) >= 6:
        declared = int.from_bytes(data[2:6], "little")
        return None if len(data) >= declared else f"a BMP cut short ({len(data)} of {declared} bytes)"
    return None


def _pillow_decodes(data: bytes) -> bool:
    """Whether Pillow (the loader's decoder of images other than JPEG) decodes `data` whole."""
    try:
        from PIL import Image
    except ImportError:
        return False
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except Exception:  # any decoder's error (OSError, ValueError, Pillow's own): not decodable
        return False
    return True


def _pillow_recognises(data: bytes) -> bool:
    """Whether Pillow (if installed) opens the header as an image of some format: a lazy open,
    no pixels decoded."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        return False
    try:
        with Image.open(io.BytesIO(data)):
            return True
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        return False
