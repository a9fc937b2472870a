"""One version of an object at a URL as an index names it: `RemoteFile`, a typed value, and the
text entry that stands for it among an index's files.

An index's files are text (a local path, or an object's entry) because that text is what the
index's shared-memory segment holds and what a daemon's allowlist checks; the entry joins the
fields with NUL, which no path or URL an index accepts contains. Code that reads an object uses
the typed value (`RemoteFile.of(entry)`), never the text's parts.
"""

from __future__ import annotations

from typing import NamedTuple


class RemoteFile(NamedTuple):
    """An object at `url`, `size` bytes at `version` (its ETag or last-modified time: NOTE
    [conditional reads] in `remote.py`), read in chunks of `chunk_bytes` through the node cache
    (NOTE [node cache] in `node_cache.py`)."""

    url: str
    size: int
    version: str
    chunk_bytes: int

    @property
    def entry(self) -> str:
        """The text that stands for this object among an index's files."""
        return "\0".join((self.url, str(self.size), self.version.replace("\0", ""), str(self.chunk_bytes)))

    @property
    def chunks(self) -> int:
        """How many chunks the object is cut into."""
        return -(-self.size // self.chunk_bytes)

    @classmethod
    def of(cls, entry: str) -> RemoteFile | None:
        """The object an entry of an index's files stands for; None for a local path."""
        if "\0" not in entry:
            return None
        url, size, version, chunk = entry.split("\0")
        return cls(url, int(size), version, int(chunk))


def remote_file(url: str, size: int, version: str, chunk_bytes: int) -> str:
    """The entry of an index's files for an object at `url` (one version of it), read in chunks
    of `chunk_bytes` through the node cache."""
    return RemoteFile(url, size, version, chunk_bytes).entry
