"""Whether a sample's encoded bytes are a whole image, told without decoding it: what a pack
checks of every sample it stores as the source's bytes (`pack` without `max_side` copies bytes;
with it, an image within `max_side` is stored as it is too).

Its one responsibility is that check, which must stay cheap (a walk over a JPEG's header segments
and one search for its end marker; see `pack`'s NOTE [broken bytes] for its cost). It
finds what fails a training run outright, as the loader's decoders do:

- an empty sample;
- bytes that are no image format the loader decodes (a text file, an HTML error page saved as
  `.jpg`): no signature `_encoded_bytes` knows nor, when Pillow is installed, anything Pillow
  recognises from the header;
- a JPEG cut short: no end-of-image marker after its image's first scan (libjpeg-turbo, as
  fastload's decoder runs it, fails on a scan that runs out of data, as Pillow does);
- a PNG with no IEND chunk, a WebP or BMP shorter than its header says, when Pillow cannot decode
  it either (such a suspect, rare, is decoded: Pillow decodes a PNG cut after its last pixel
  data, as training would).

It does not find damage a decoder recovers from (a garbled scan decodes to gray blocks in
training too), nor everything a decoder refuses: `fastload verify` decodes every sample.
"""

from __future__ import annotations

import io

from fastload._encoded_bytes import image_format, plainly_broken


def damage(blob: bytes | memoryview) -> str | None:
    """Why `blob` is not a whole image (a phrase for an error message, in the words every decoder
    reports: `_encoded_bytes`), or None when it looks like one (see the module docstring)."""
    data = blob if isinstance(blob, bytes) else bytes(blob)  # a view of a larger read: searched
    cut = _cut_short(data)
    if cut is not None:  # a suspect: decoded, as training would decode it
        return None if _pillow_decodes(data) else cut
    broken = plainly_broken(data)
    if broken is not None and data and image_format(data) is None and _pillow_recognises(data):
        return None  # a format Pillow reads that has no signature there (PPM, ICO, ...)
    return broken


def _cut_short(data: bytes) -> str | None:
    """Why a PNG, WebP or BMP looks cut short from its end or header, or None."""
    kind = image_format(data)
    if kind == "PNG":
        return None if data.rfind(b"IEND\xaeB`\x82") > 0 else "truncated PNG: no IEND chunk"
    if kind == "WebP":
        declared = int.from_bytes(data[4:8], "little") + 8
        return None if len(data) >= declared else f"truncated WebP: {len(data)} of {declared} bytes"
    if kind == "BMP" and len(data) >= 6:
        declared = int.from_bytes(data[2:6], "little")
        return None if len(data) >= declared else f"truncated BMP: {len(data)} of {declared} bytes"
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
