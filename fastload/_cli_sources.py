"""What a command line's dataset arguments mean: SRC as a path, or a `FileList` with the list
options (`--root`, `--delimiter`, `--header`) the Python API spells `root=`, `delimiter=`,
`header=`."""

from __future__ import annotations

from fastload._errors import ConfigError
from fastload.sources import FileList, Source, as_source

# Delimiters a shell makes awkward to type, by name.
_NAMED = {"tab": "\t", "\\t": "\t", "space": " ", "comma": ",", "semicolon": ";"}


def pack_source(src: str, root: str | None, delimiter: str | None, header: bool | None) -> str | Source:
    """SRC as `pack` takes it: the path, or a FileList when a file list's options are given."""
    if root is None and delimiter is None and header is None:
        return src
    source = as_source(src)
    if not isinstance(source, FileList):
        raise ConfigError(
            f"--root, --delimiter and --header apply to a file list (.csv, .tsv, .txt); {src} is read as "
            f"a {source.kind} source: leave them out"
        )
    sep = _NAMED.get(delimiter.lower(), delimiter) if delimiter is not None else None
    return FileList(src, root=root, delimiter=sep, header=header)
