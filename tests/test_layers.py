"""The import graph of `fastload/`: no cycle between modules, and no import against the layers.

Every module of the package is parsed with `ast` (nothing is imported): its imports of
`fastload.*` anywhere in the file — at the top, inside a function (a lazy import), under
`if TYPE_CHECKING:` — relative ones resolved, `from package import submodule` counted as an
import of the submodule. A lazy import of an optional third-party package is not fastload's and
is not looked at; a lazy import of a higher fastload room is a violation like any other.

`LAYERS` is the one declaration of the layer order (docs/ARCHITECTURE.md, "Layers", says it in
words): a module's layer is that of the longest prefix naming it, and a module may import only
modules of its own layer or below (and, within a layer, without a cycle).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fastload"

# Layers, lowest first; the gaps leave room for rooms inside a layer, ordered too (each room's
# `__init__` says why it sits where it does): a room imports only its layer's rooms below it.
FOUNDATIONS, FORMATS, KERNELS = 0, 20, 30
# The rooms of `sources/`, sub-layers below the public face of FORMATS:
# storage < index < the `Source` seam < formats < packing.
SOURCE_STORAGE, SOURCE_INDEX, SOURCE_SEAM, SOURCE_FORMATS, SOURCE_PACKING = 11, 12, 13, 14, 15
# The rooms of `_loading/`, below its top (`assembly`, `loader`).
SLOTS, ORDER, JOBS, LINK, SETTINGS, RUNNING, TUNING, LOADER = 41, 42, 43, 44, 45, 46, 47, 49
SERVICES, ENTRY = 50, 60
LAYER_NAMES = {
    FOUNDATIONS: "foundations",
    SOURCE_STORAGE: "sources' storage",
    SOURCE_INDEX: "sources' index layer",
    SOURCE_SEAM: "the Source seam",
    SOURCE_FORMATS: "sources' formats",
    SOURCE_PACKING: "packing",
    FORMATS: "sources and transforms",
    KERNELS: "kernels",
    SLOTS: "the loader's slots room",
    ORDER: "the loader's order room",
    JOBS: "the loader's jobs room",
    LINK: "the loader's link room (the trainer's side of the daemon)",
    SETTINGS: "the loader's settings room",
    RUNNING: "the loader's running room",
    TUNING: "the loader's tuning room",
    LOADER: "the loader's facade",
    SERVICES: "the daemon's server, diagnostics, exporters",
    ENTRY: "the CLI and the public package",
}
# Module prefix -> layer; the longest prefix naming a module wins. Foundations are the package's
# top-level private modules (errors, machine, paths, sizes, shared memory, seeded randomness, the
# native decoder's binding, encoded bytes, labels, ...): each is one file that imports nothing of
# fastload's but other foundations.
LAYERS: dict[str, int] = {
    "fastload._errors": FOUNDATIONS,
    "fastload._machine": FOUNDATIONS,
    "fastload._cpu_quota": FOUNDATIONS,
    "fastload._paths": FOUNDATIONS,
    "fastload._sizes": FOUNDATIONS,
    "fastload._labels": FOUNDATIONS,
    "fastload._progress": FOUNDATIONS,
    "fastload._encoded_bytes": FOUNDATIONS,
    "fastload._shm": FOUNDATIONS,
    "fastload._native_jpeg": FOUNDATIONS,
    "fastload._sample_random": FOUNDATIONS,
    "fastload._bad_samples": FOUNDATIONS,
    "fastload._exclusion": FOUNDATIONS,
    "fastload._metrics_seam": FOUNDATIONS,
    "fastload._batch_counters": FOUNDATIONS,
    "fastload.sources": FORMATS,  # the public face (`sources/__init__.py`)
    "fastload.sources._storage": SOURCE_STORAGE,
    "fastload.sources._indexes": SOURCE_INDEX,
    "fastload.sources._base": SOURCE_SEAM,
    "fastload.sources._formats": SOURCE_FORMATS,
    "fastload.sources._packing": SOURCE_PACKING,
    "fastload.transforms": FORMATS,
    "fastload.samplers": FORMATS,  # the samplers' descriptions (the plans are `_loading.order`'s)
    "fastload._augment": KERNELS,
    "fastload._loading.decoding": KERNELS,
    "fastload._loading.slots": SLOTS,
    "fastload._loading.order": ORDER,
    "fastload._loading.jobs": JOBS,
    "fastload._loading.link": LINK,
    "fastload._loading.settings": SETTINGS,
    "fastload._loading.running": RUNNING,
    "fastload._loading.tuning": TUNING,
    "fastload._loading": LOADER,
    "fastload._daemon": SERVICES,
    "fastload._diagnostics": SERVICES,
    "fastload._demo": ENTRY,
    "fastload._cli_": ENTRY,
    "fastload.__main__": ENTRY,
    "fastload": ENTRY,  # the public package (`fastload/__init__.py`): FastLoader, sources, transforms
}


def _module_name(path: Path) -> tuple[str, str]:
    """(module, the package its relative imports start from) of a file under PACKAGE."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), ".".join(parts)
    return ".".join(parts), ".".join(parts[:-1])


def _modules() -> dict[str, tuple[Path, str]]:
    return {name: (path, package) for path in PACKAGE.rglob("*.py") for name, package in [_module_name(path)]}


def _imports(path: Path, package: str, known: set[str]) -> set[tuple[str, int]]:
    """The fastload modules `path` imports, each with the line of its import."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            found.update((name, node.lineno) for name in names if name.split(".")[0] == "fastload")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "fastload":
                continue
            for alias in node.names:
                child = f"{target}.{alias.name}"
                found.add((child if child in known else target, node.lineno))
    return found


@functools.cache
def _graph() -> dict[str, dict[str, int]]:
    """Module -> {fastload module it imports: the line of that import} (parsed once per run)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, package) in modules.items():
        edges: dict[str, int] = {}
        for target, line in sorted(_imports(path, package, known)):
            while target not in known and "." in target:  # `import fastload.x.y` names a module
                target = target.rsplit(".", 1)[0]
            if target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def layer_of(module: str) -> int:
    """The layer of `module`: its longest prefix in LAYERS ("fastload" names the package alone)."""
    named = [p for p in LAYERS if module == p or module.startswith(p if p.endswith("_") else p + ".")]
    prefix = max((p for p in named if p != "fastload" or module == p), key=len, default=None)
    if prefix is None:
        raise AssertionError(f"{module} is in no layer: add its prefix to LAYERS (tests/test_layers.py)")
    return LAYERS[prefix]


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_layer() -> None:
    for module in _graph():
        layer_of(module)


def test_no_import_cycles() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    described = [
        " <-> ".join(cycle) + ": " + ", ".join(
            f"{a} imports {b} (line {graph[a][b]})" for a in cycle for b in cycle if b in graph[a]
        )
        for cycle in cycles
    ]
    assert not cycles, "import cycles in fastload/:\n" + "\n".join(described)


def test_no_import_against_the_layers() -> None:
    wrong = [
        f"{module} ({LAYER_NAMES[layer_of(module)]}) imports {target} ({LAYER_NAMES[layer_of(target)]}), "
        f"line {line}"
        for module, edges in sorted(_graph().items())
        for target, line in sorted(edges.items())
        if layer_of(target) > layer_of(module)
    ]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_the_checker_sees_lazy_relative_and_type_only_imports(tmp_path: Path) -> None:
    """The parse itself: a function-level relative import and one under TYPE_CHECKING count."""
    package = tmp_path / "fastload" / "sub"
    package.mkdir(parents=True)
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from fastload._loading import loader\n"
        "def f():\n    from ..sources import _tar\n    from . import sibling\n    import numpy\n"
    )
    (package / "mod.py").write_text(source)
    known = {"fastload.sub.sibling", "fastload.sources._tar", "fastload._loading.loader"}
    names = {name for name, _ in _imports(package / "mod.py", "fastload.sub", known)}
    assert names == known


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("fastload._errors", FOUNDATIONS),
        ("fastload.sources", FORMATS),
        ("fastload.sources._storage.remote", SOURCE_STORAGE),
        ("fastload.sources._indexes.extents", SOURCE_INDEX),
        ("fastload.sources._base", SOURCE_SEAM),
        ("fastload.sources._formats.tar", SOURCE_FORMATS),
        ("fastload.sources._packing.writer", SOURCE_PACKING),
        ("fastload._loading.decoding.native", KERNELS),
        ("fastload._loading.loader", LOADER),
        ("fastload._daemon.server", SERVICES),
        ("fastload._cli_sources", ENTRY),
        ("fastload", ENTRY),
    ],
)
def test_layer_of(module: str, layer: int) -> None:
    assert layer_of(module) == layer
