"""The daemon's plugins: modules its administrator names, imported at start so that the source
kinds (and transforms) they declare can be served.

`fastload serve --plugin MODULE_OR_FILE.py` (repeatable) or `plugins = [...]` in the `[daemon]`
table names each: a module name (`mylab.kinds`, imported from the daemon's `sys.path`) or a
Python file (`/etc/fastload/kinds.py`, a relative one from where `serve` starts), imported as the
module named by its stem. The daemon imports them before its workers fork (they inherit what they
declared), and the process that opens a source for it (`opener`, a fresh one from the fork
server) imports them again before it reads the source's description. One that fails to import
stops `serve` with a ConfigError naming it.

NOTE [plugins are the administrator's]: a plugin runs code in the daemon, as its user. Only the
daemon's own configuration names one: a hello has no field for it (`daemon_link` refuses a field
it does not know), and a peer may name only the kinds already declared (any other is an "unknown
source kind"). A file whose stem is a module importable from elsewhere (`json.py`) is refused
rather than shadow that module.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from types import ModuleType
from typing import Any

from fastload._errors import ConfigError
from fastload._sizes import shown

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_WHAT_TO_DO = "fix it, or leave it out of `--plugin` / `plugins = [...]`"


def plugin_settings(value: Any) -> tuple[str, ...]:
    """The `plugins` setting checked: module names, and Python files made absolute (the opening
    process must find them from wherever it runs); ConfigError naming a bad one."""
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        raise ConfigError(f"plugins must be a list of module names or .py files, got {shown(value)}")
    checked = []
    for plugin in value:
        if plugin.endswith(".py"):
            checked.append(os.path.abspath(plugin))
        elif _MODULE_NAME.fullmatch(plugin):
            checked.append(plugin)
        else:
            raise ConfigError(f"plugin {plugin!r} is neither a module name (mylab.kinds) nor a .py file")
    return tuple(checked)


def import_plugins(plugins: tuple[str, ...]) -> None:
    """Import each plugin, in order (one already imported is not run again)."""
    for plugin in plugins:
        try:
            if plugin.endswith(".py"):
                _import_file(plugin)
            else:
                importlib.import_module(plugin)
        except ConfigError:
            raise
        except Exception as e:  # its own code failed: the admin's to fix, named
            raise ConfigError(
                f"plugin {plugin} failed to import ({type(e).__name__}: {e}): {_WHAT_TO_DO}"
            ) from e


def _import_file(path: str) -> ModuleType:
    """The Python file at `path`, imported as the module named by its stem."""
    name = os.path.basename(path)[: -len(".py")]
    if not os.path.isfile(path):
        raise ConfigError(f"plugin {path} is not a file: {_WHAT_TO_DO}")
    if not name.isidentifier():
        raise ConfigError(f"plugin {path}: {name!r} is not a module name; rename the file")
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, "__file__", None) and os.path.samefile(str(loaded.__file__), path):
            return loaded
        raise ConfigError(f"plugin {path}: a module named {name!r} is already imported; rename the file")
    found = importlib.util.find_spec(name)
    origin = found.origin if found is not None else None
    if origin is not None and os.path.realpath(origin) != os.path.realpath(path):
        raise ConfigError(
            f"plugin {path}: a module named {name!r} is importable from {origin}; rename the file"
        )
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugin {path} cannot be imported as a Python file: {_WHAT_TO_DO}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
