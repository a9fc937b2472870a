"""The one place the native extension (`fastload._jpeg`, built from native/) is imported.

Where it could not be built (no libjpeg-turbo headers at install time), fastload decodes with
Pillow instead — same geometry, same random draws, nearly the same pixels, slower — and says so
once, through the `fastload` logger.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

_log = logging.getLogger("fastload")
_notice_given = False

try:
    _jpeg: ModuleType | None = importlib.import_module("fastload._jpeg")
    _import_error: ImportError | None = None
except ImportError as e:  # pragma: no cover - depends on the install
    _jpeg = None
    _import_error = e


def native_jpeg() -> ModuleType | None:
    """The native JPEG module, or None (after a one-time notice) when it is not built."""
    global _notice_given
    if _jpeg is None and not _notice_given:
        _notice_given = True
        _log.warning(
            "fastload's native JPEG decoder is not built (%s); decoding with Pillow, which is "
            "slower. Install libjpeg-turbo's headers (Debian: libjpeg62-turbo-dev) and reinstall.",
            _import_error,
        )
    return _jpeg


def native_pass(name: str) -> Callable[..., Any] | None:
    """The extension's whole-batch pixel pass `name` (native/fl_pixels.c: `normalize_u8`,
    `color_jitter`, `mixup`), or None where the extension is not built or predates it. Its callers
    keep a torch path with the same bits, so there is nothing to warn about."""
    return getattr(_jpeg, name, None) if _jpeg is not None else None


def built_native_jpeg() -> ModuleType | None:
    """The native JPEG module, or None when it is not built, without the notice: for callers that
    only read JPEG headers with it (the DALI backend), whose decoding does not fall back."""
    return _jpeg
