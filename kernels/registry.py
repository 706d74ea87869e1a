"""The one backend registry: every backend's identity, declared once.

A backend is declared by one entry of `matrix/data/backends.json`: its name, label, the library whose
version is the kernel version, the device it runs on (`cuda` or `cpu`), the modules that must import for
it to be available, the module attribute that implements it (`module`), its vLLM name, FA version, MLA
prefill name and default rank. The implementing module builds its `Backend` with `Backend.declare(name,
prepare, entry)`, which takes every identity field from here: nothing about a backend is written twice.

Backends that are not part of the product (the test suite's fault-injection fakes) are registered at run
time by a plugin module that calls `register()` when imported. Plugins are named in the environment
variable `ATTNMATRIX_BACKEND_PLUGINS` (comma-separated module names), so the runner's worker subprocesses
and Ray tasks, which inherit the environment, know them too.

This module imports neither torch nor any kernel library: listing backends, checking a backend name or
reading its device costs a JSON read.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGISTRY_FILE = Path(__file__).resolve().parent.parent / "matrix" / "data" / "backends.json"
PLUGINS_ENV = "ATTNMATRIX_BACKEND_PLUGINS"
DEVICES = ("cuda", "cpu")
# The identity fields a product backend must declare (the rest of an entry is metadata for the generator).
REQUIRED_FIELDS = ("label", "library", "device", "imports", "module")


class RegistryError(ValueError):
    """A backend entry is malformed or a name is unknown; the message names the backend and field."""


@dataclass(frozen=True)
class BackendInfo:
    """A backend's identity: what `backends.json` (or a plugin) declares about it."""

    name: str
    label: str
    library: str
    device: str  # "cuda" or "cpu"
    imports: tuple[str, ...]
    module: str  # "package.module:ATTRIBUTE", imported lazily
    meta: dict  # the whole entry, as the generator and the resolution read it (vllm, default_rank, ...)

    @property
    def gpu_only(self) -> bool:
        return self.device == "cuda"


def _info(name: str, meta: Any, where: str) -> BackendInfo:
    if not isinstance(meta, dict):
        raise RegistryError(f"{where}: backends.{name}: expected an object, got {meta!r}")
    missing = [f for f in REQUIRED_FIELDS if f not in meta]
    if missing:
        raise RegistryError(f"{where}: backends.{name}: missing {', '.join(missing)}")
    if meta["device"] not in DEVICES:
        raise RegistryError(f"{where}: backends.{name}.device: {meta['device']!r} is not one of {', '.join(DEVICES)}")
    imports = meta["imports"]
    if not isinstance(imports, list) or not all(isinstance(m, str) and m for m in imports):
        raise RegistryError(f"{where}: backends.{name}.imports: expected a list of module names, got {imports!r}")
    if not isinstance(meta["module"], str) or ":" not in meta["module"]:
        raise RegistryError(f"{where}: backends.{name}.module: expected 'package.module:ATTRIBUTE', "
                            f"got {meta['module']!r}")
    return BackendInfo(name, meta["label"], meta["library"], meta["device"], tuple(imports), meta["module"], meta)


@functools.lru_cache(maxsize=1)
def _product() -> dict[str, BackendInfo]:
    data = json.loads(REGISTRY_FILE.read_text(encoding="utf-8"))
    return {name: _info(name, meta, str(REGISTRY_FILE)) for name, meta in data["backends"].items()}


_plugins: dict[str, BackendInfo] = {}
_plugin_objects: dict[str, Any] = {}
_loaded_env: str | None = None


def register(backend: Any, *, label: str, default_rank: int = 99, test_only: bool = True, **meta: Any) -> None:
    """Register a backend that is not in `backends.json` (a test fake); called by plugin modules on import."""
    if backend.name in _product():
        raise RegistryError(f"backend {backend.name!r} is declared in {REGISTRY_FILE.name}; a plugin cannot "
                            "redeclare it")
    entry = {"label": label, "library": backend.library, "device": backend.device,
             "imports": list(backend.imports), "module": f"{type(backend).__module__}:{backend.name}",
             "default_rank": default_rank, **({"test_only": True} if test_only else {}), **meta}
    _plugins[backend.name] = _info(backend.name, entry, "plugin")
    _plugin_objects[backend.name] = backend


def _load_plugins() -> None:
    global _loaded_env
    env = os.environ.get(PLUGINS_ENV, "")
    if env == _loaded_env:
        return
    _loaded_env = env
    for mod in (m.strip() for m in env.split(",") if m.strip()):
        importlib.import_module(mod)


def backends() -> dict[str, BackendInfo]:
    """Every registered backend: the product's, then plugins', by name."""
    _load_plugins()
    return {**_product(), **_plugins}


def names(*, include_plugins: bool = True) -> list[str]:
    return sorted(backends() if include_plugins else _product())


def info(name: str) -> BackendInfo:
    known = backends()
    if name not in known:
        raise RegistryError(f"unknown backend {name!r} (known: {', '.join(sorted(known))})")
    return known[name]


def metadata() -> dict[str, dict]:
    """name -> the backends.json entry, plugins included: what `Evidence.backends` holds."""
    return {name: dict(i.meta) for name, i in backends().items()}


def plugin_metadata() -> dict[str, dict]:
    _load_plugins()
    return {name: dict(i.meta) for name, i in _plugins.items()}


def load(name: str) -> Any:
    """The `Backend` object of `name` (imports its module, and through it its kernel library's glue)."""
    i = info(name)
    if name in _plugin_objects:
        return _plugin_objects[name]
    mod, _, attr = i.module.partition(":")
    return getattr(importlib.import_module(mod), attr)
