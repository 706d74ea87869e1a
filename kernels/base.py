"""What a backend is: a named way to call one library's attention entry point on a `Problem`.

A backend module builds the library's arguments from the problem and returns a zero-argument
callable that runs the kernel. It never decides support itself: what the library refuses is
recorded in the library's own words. Only where the library's API has no parameter at all for a
feature does a backend raise `Unsupported`, and the record says that this is attnmatrix speaking.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from attnmatrix.matrix import backends as B
from attnmatrix.matrix.cases import Case

from . import registry
from .problem import Problem, Unsupported

__all__ = ["Backend", "Unsupported", "load_backend", "known_backends"]


@dataclass(frozen=True)
class Backend:
    name: str
    library: str  # the distribution whose version is the kernel version (e.g. "flash-attn-4")
    device: str  # "cuda" or "cpu"
    imports: tuple[str, ...]  # modules that must import for the backend to be available
    prepare: Callable[[Problem], Callable[[], torch.Tensor]]
    entry: Callable[[Case], str]  # the library function the case calls, for the record
    # Optional: compile the kernels for a case without running them (FA4's CuTe DSL can).
    compile_only: Callable[[Problem], dict] | None = None
    # The CuTe DSL package of an FA4 copy (`flash_attn.cute`, `vllm.vllm_flash_attn.cute`): where
    # cross-compilation answers the kernels' compile-time SM-count query (see xcompile.py).
    cute_package: str | None = None
    # The engine whose call this backend makes (`vllm`), for the records' `extra.profile`; None: the library's
    # own API as its documentation shows it.
    profile: str | None = None

    @classmethod
    def declare(cls, name: str, prepare: Callable[[Problem], Callable[[], torch.Tensor]],
                entry: Callable[[Case], str], **kw) -> Backend:
        """The backend `name` with its identity (library, device, imports) from the one loader."""
        i = B.info(name)
        return cls(name, i.library, i.device, i.imports, prepare, entry, **kw)

    def availability(self) -> str | None:
        """None if every module imports; otherwise why not, in the import system's words."""
        for mod in self.imports:
            try:
                importlib.import_module(mod)
            except Exception as e:  # noqa: BLE001 - any import failure makes it unavailable
                return f"cannot import {mod}: {type(e).__name__}: {e}"
        return None

    def version(self) -> str:
        """The kernel's version for provenance: the library distribution's."""
        from .env import package_version

        return package_version(self.library) or "unknown"


def known_backends() -> list[str]:
    """Every registered backend (matrix/backends.py), test plugins included when they are loaded."""
    return B.names()


def load_backend(name: str) -> Backend:
    try:
        return registry.load(name)
    except B.RegistryError as e:
        raise KeyError(str(e)) from None


def load_device_backends(names: str) -> tuple[dict[str, Backend], str, str, str]:
    """(backends by name, their one device, its arch, its name) for a comma-separated `--backends` list; an unknown
    name, or backends of two devices, exit with a message naming them."""
    from .env import local_arch

    try:
        backends = {b: load_backend(b) for b in names.split(",")}
    except KeyError as e:
        raise SystemExit(f"--backends: unknown backend {e} (matrix/data/backends.json lists them)") from None
    devices = {b.device for b in backends.values()}
    if len(devices) != 1:
        raise SystemExit(f"--backends {names}: one device at a time (got {sorted(devices)})")
    device = devices.pop()
    return backends, device, local_arch(device), torch.cuda.get_device_name() if device == "cuda" else "cpu"
