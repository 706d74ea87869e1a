"""How to load a backend's implementing module; what a backend is and which there are is `matrix/backends.py`.

`backends.json` names, per backend, the module attribute that implements it (`"module":
"attnmatrix.kernels.fa4:FA4"`); `load` imports it. The implementing module builds its `Backend` with
`Backend.declare(name, prepare, entry)`, which takes every identity field from the one loader, so nothing about
a backend is written twice. `register` is the plugin hook for backend objects that are not in backends.json (the
test suite's fakes): it declares the backend's metadata through `matrix.backends.register` and keeps the object.

This module imports neither torch nor any kernel library.
"""

from __future__ import annotations

import importlib
from typing import Any

from attnmatrix.matrix import backends as B

RegistryError = B.RegistryError

_plugin_objects: dict[str, Any] = {}


def register(backend: Any, *, label: str, default_rank: int = 99, test_only: bool = True, **meta: Any) -> None:
    """Register a backend object that is not in `backends.json` (a test fake); called by plugin modules on import."""
    entry = {"label": label, "library": backend.library, "device": backend.device,
             "imports": list(backend.imports), "module": f"{type(backend).__module__}:{backend.name}",
             "default_rank": default_rank, **({"test_only": True} if test_only else {}), **meta}
    B.register(backend.name, entry)
    _plugin_objects[backend.name] = backend


def unregister(name: str) -> None:
    """Forget a plugin backend and its object (tests that register one for a single test)."""
    B.unregister(name)
    _plugin_objects.pop(name, None)


def load(name: str) -> Any:
    """The `Backend` object of `name` (imports its module, and through it its kernel library's glue)."""
    i = B.info(name)
    if name in _plugin_objects:
        return _plugin_objects[name]
    mod, _, attr = i.module.partition(":")
    return getattr(importlib.import_module(mod), attr)
