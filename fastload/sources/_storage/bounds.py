"""The limits every source holds to before it reads or allocates, and the checks that apply them.

Its one responsibility is bounds (NOTE [source bounds]): a source's input (a list file, a shard, a
manifest, an HDF5 file's metadata) comes from whoever wrote it, and through a daemon from whoever
sent the hello, so every size it declares is checked against a stated limit before memory is
taken for it, and every refusal names the file and what to do, in a message of bounded length.

NOTE [source bounds]: the limits, and why they are where they are:

- `MAX_SAMPLE_BYTES` (1 GiB): one sample (a file, a tar member, a pack extent). The largest
  encoded images in use (gigapixel PNG/TIFF scans) are a few hundred MB; a pack's data files
  are 1 GiB. A sample must be a regular file (or a range of one): a device (`/dev/zero`), a FIFO
  or a socket is refused when opened (opened non-blocking, so a FIFO with no writer cannot wait).
- `MAX_LIST_BYTES` (1 GiB): a file list (ImageNet's is ~40 MB; 20 M lines fit).
- `MAX_SHARDS` (2^20): the paths a source's shard patterns expand to, all patterns together,
  counted before any is made (64 patterns of a million names each would pass a bound per pattern).
- `MAX_TARGET_BYTES` (2 GiB): the targets held in memory (int64 class indices or float32
  multi-hot rows), counted from declared shapes before allocation: 268 M class indices, or
  ImageNet-21k's 14 M images x 38 classes of dense rows; beyond, targets need another form.
- labels are ASCII decimal integers in [0, 2^63): `1_000` and non-ASCII digits, which Python's
  `int()` takes, are refused, and so is anything past int64.
- `MAX_MESSAGE_CHARS` (300): a value quoted in an error (a label, a key) is clipped to this.
- `MAX_FIELD_CHARS` (4096, PATH_MAX): a string field of a source description a daemon is sent
  (NOTE [fields from a peer] in `_base`).
- `MAX_SHARD_GLOBS` (4096): the expanded shard patterns with a wildcard, each a directory listed
  (`train-{0000..0999}-*.tar` is 1000); counted with `MAX_SHARDS` across all of a source's
  patterns, before any name is made or any directory listed.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Protocol

MAX_SAMPLE_BYTES = 1 << 30
MAX_LIST_BYTES = 1 << 30


class Opener(Protocol):
    """What `open_regular` opens through: `beneath.Beneath` (a confined daemon's roots), typed by
    what is called so that this module does not import `_storage/beneath.py` (which imports it)."""

    def open(self, path: str) -> int: ...
MAX_SHARDS = 1 << 20
MAX_TARGET_BYTES = 2 << 30
MAX_LABEL = (1 << 63) - 1
MAX_MESSAGE_CHARS = 300
MAX_FIELD_CHARS = 4096
MAX_SHARD_GLOBS = 1 << 12

_ASCII_INT = re.compile(r"[+-]?[0-9]{1,19}")


def field_text_problem(text: str) -> str:
    """What makes `text`, a string field a peer sent (a path, a name), unusable: too long, a NUL,
    not a file name (a lone surrogate that surrogateescape does not make); "" when nothing."""
    if len(text) > MAX_FIELD_CHARS:
        return f"is {len(text):,} characters long, over the limit of {MAX_FIELD_CHARS:,}"
    if "\0" in text:
        return "holds a NUL character"
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return "is not a valid file name (it holds a lone surrogate)"
    return ""


def clip(value: object, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`repr`-free text of `value` for a message, at most about `limit` characters."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text):,} characters in all)"


def quoted(value: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`value!r`, clipped (a label or key from the input, quoted in a message)."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value):,} characters in all)"


def parse_label(text: str) -> int | None:
    """An ASCII decimal integer label in [0, MAX_LABEL] (surrounding whitespace allowed), else
    None: `1_000`, `٣`, `1e3`, `-5` and `2**63` are not labels."""
    text = text.strip()
    if _ASCII_INT.fullmatch(text) is None:
        return None
    value = int(text)
    return value if 0 <= value <= MAX_LABEL else None


def is_int_text(text: str) -> bool:
    """Whether `text` is written as an ASCII decimal integer (of any size or sign)."""
    return re.fullmatch(r"\s*[+-]?[0-9]+\s*", text) is not None


def open_regular(
    path: str, limit: int, what: str = "sample", beneath: Opener | None = None
) -> tuple[int, os.stat_result]:
    """A read-only descriptor of `path` and its fstat, when it is a regular file of at most
    `limit` bytes; OSError otherwise (ENODEV-like for a device, FIFO or socket; EFBIG when too
    large), naming the file. Opened non-blocking: a FIFO without a writer does not wait; through
    `beneath` when given (a confined daemon's job: EXDEV when it leads outside the roots)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK) if beneath is None else beneath.open(path)
    try:
        info = os.fstat(fd)
        check_regular(path, info, limit, what)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def check_regular(path: str, info: os.stat_result, limit: int, what: str = "sample") -> None:
    """OSError unless `info` is a regular file of at most `limit` bytes."""
    if not stat.S_ISREG(info.st_mode):
        raise OSError(
            errno.EINVAL,
            f"{clip(path)} is not a regular file (a {_kind(info.st_mode)}): a {what} must be a file",
        )
    if info.st_size > limit:
        raise OSError(
            errno.EFBIG,
            f"{clip(path)} is {info.st_size:,} bytes, over the {limit:,}-byte limit of a {what}",
        )


def read_bounded(fd: int, limit: int, path: str, what: str = "sample") -> bytes:
    """Everything left in `fd`, refusing (EFBIG) past `limit` bytes: for files whose size is not
    known up front (procfs reports 0), or that grow while read."""
    chunks = []
    got = 0
    while chunk := os.read(fd, min(1 << 20, limit + 1 - got)):
        chunks.append(chunk)
        got += len(chunk)
        if got > limit:
            raise OSError(errno.EFBIG, f"{clip(path)} holds over {limit:,} bytes, the limit of a {what}")
    return b"".join(chunks)


def identity(info: os.stat_result) -> tuple[int, int, int, int, int]:
    """What tells one version of a file from another: (device, inode, size, mtime, ctime in ns).
    A copy that keeps the modification time (`rsync -a`, `cp -p`) still changes the inode or the
    change time."""
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"
