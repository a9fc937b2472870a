"""Text a peer chose (a hello's dataset label, a source's name, a refusal that quotes them) made
safe for a log line, a metrics label or a terminal: one line, bounded.

`label` escapes what is not printable (newlines, carriage returns, terminal escapes, Unicode
line separators and bidirectional overrides: as `repr` writes them, `\\n`, `\\x1b`, `\\u202e`)
and backslashes (so that two texts never escape alike), and clips a long text to `LABEL_CHARS`
with an ellipsis and a short hash of the whole, so that distinct long labels stay distinct.
"""

from __future__ import annotations

import hashlib

LABEL_CHARS = 200


def _escaped(ch: str) -> str:
    if ch == "\\":
        return "\\\\"
    if ch.isprintable():
        return ch
    return repr(ch)[1:-1]


def label(text: object, limit: int = LABEL_CHARS) -> str:
    """`text` (made a str) escaped to one printable line of at most `limit` characters."""
    raw = text if isinstance(text, str) else str(text)
    escaped = "".join(map(_escaped, raw)) if not (raw.isprintable() and "\\" not in raw) else raw
    if len(escaped) <= limit:
        return escaped
    digest = hashlib.blake2b(raw.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    tail = f"... ({len(raw)} chars, #{digest})"
    return escaped[: max(0, limit - len(tail))] + tail
