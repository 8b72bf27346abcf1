"""Importing a module the user named (a stage target's, a --label hook's): any failure is one
line naming what was asked for, never a traceback from the module's own code."""
from __future__ import annotations

import importlib
import types


def import_named(module_name: str, what: str = "stage target") -> types.ModuleType:
    """The module, or ValueError with a one-line message starting with `what`."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            raise ValueError(f"{what}: no module named {module_name!r}") from None
        raise ValueError(f"{what}: importing {module_name!r} failed: {error}") from None
    except Exception as error:  # the module's own code failed while importing
        raise ValueError(f"{what}: importing {module_name!r} failed: "
                         f"{type(error).__name__}: {error}") from None
