"""Copies of a staged function bound under other names: `from lib.prune import prune_wanda`.

Research code imports its functions by name (`from lib.prune import prune_wanda` in main.py,
`from .layer_inputs import capture` in the pruner). Patching the attribute where the function
lives misses those copies: they were bound when the importing module ran, which for the
modules a stage target imports is before the patch. So a target's replacement is also bound
in every loaded module's namespace that holds the original function object under any name,
and each binding is put back afterwards (only where it still holds the replacement: a module
that rebound the name itself keeps its own value).

Only module namespaces are searched (one pass over `sys.modules`, microseconds per module),
and those a module's functions run in without being in `sys.modules` (`search_also`: a script
multiprocessing's spawn ran again with runpy, whose functions keep runpy's namespace): copies
kept in local variables, default arguments or containers are not found.
"""
from __future__ import annotations

import sys
import types

Binding = tuple[dict, str, object, object]  # namespace, name, original, replacement
_also: list[dict] = []  # namespaces outside sys.modules that are searched too


def search_also(namespace: dict) -> None:
    """Search `namespace` too, for the rest of this process."""
    if not any(namespace is known for known in _also):
        _also.append(namespace)


def rebind(original, replacement, skip: dict | None = None) -> list[Binding]:
    """Bind `replacement` wherever a module-level name holds `original` (except in `skip`,
    the namespace patched already); returns what to restore."""
    done: list[Binding] = []
    namespaces = [getattr(module, "__dict__", None) for module in list(sys.modules.values())
                  if isinstance(module, types.ModuleType)]  # not lazy loaders and stand-ins
    for namespace in namespaces + _also:
        if not isinstance(namespace, dict) or namespace is skip:
            continue
        for name, value in list(namespace.items()):
            if value is original:
                namespace[name] = replacement
                done.append((namespace, name, original, replacement))
    return done


def restore(bindings: list[Binding]) -> None:
    for namespace, name, original, replacement in reversed(bindings):
        if namespace.get(name) is replacement:
            namespace[name] = original
