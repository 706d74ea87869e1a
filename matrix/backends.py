"""The one backends loader: every backend's identity and metadata, declared once, and the plugin hook.

A backend is declared by one entry of `matrix/data/backends.json`: its label, the library whose version is the
kernel version, the device it runs on (`cuda` or `cpu`), the modules that must import for it to be available,
the module attribute that implements it (`module`), its engine names (`vllm`), FA version, MLA prefill name
and default rank. This module reads and checks that file (every problem, with file and field) and answers
"which backends are there, and what is declared about them"; how to import a backend's implementing module is
`attnmatrix.kernels.registry`, the only thing kernels keep.

Backends that are not part of the product (the test suite's fault-injection fakes) are added at run time by a
plugin module that calls `register()` (through `kernels.registry.register`) when imported. Plugins are named
in the environment variable `ATTNMATRIX_BACKEND_PLUGINS` (comma-separated module names), so the runner's
worker subprocesses and Ray tasks, which inherit the environment, know them too.

Standard library only: listing backends, checking a backend name or reading its device costs a JSON read.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnmatrix.vocabulary import ARCH_FAMILY_RE, arch_family

BACKENDS_FILE = Path(__file__).resolve().parent / "data" / "backends.json"
PLUGINS_ENV = "ATTNMATRIX_BACKEND_PLUGINS"
DEVICES = ("cuda", "cpu")
# The identity fields a product backend declares (the rest of an entry is metadata for the generator).
REQUIRED_FIELDS = ("label", "library", "device", "imports", "module")
# The kernel's decode split follows the number of sequences it is launched with (matrix/vllm_graphs.py).
GRAPH_SPLITS_FIELD = "splits_see_graph_batch"
# The kernel runs some decode steps of a power-of-two cached length on a faster path than its trend
# (attnmatrix/selector_workloads.py FAST_PATH_OPS).
POWER_OF_TWO_FIELD = "fast_path_at_powers_of_two"
# The kernel computes a prefill's keys in whole 128-token tiles (attnmatrix/selector_workloads.py WHOLE_TILE_OPS).
WHOLE_TILES_FIELD = "prefill_in_whole_tiles"


class RegistryError(ValueError):
    """A backend entry is malformed or a name is unknown; the message names the backend and field."""


# --- default_rank -----------------------------------------------------------------------------------------
#
# `default_rank` orders supported backends where nothing is measured and no declared ranking applies (lower
# first). It is either an int (the same on every arch) or an object mapping keys to ints, where a key is
# "*" (every arch no other key names; required) or a capability-major family "sm_<major>x" ("sm_8x" covers
# sm_80, sm_86, sm_89; "sm_10x" covers sm_100, sm_103; "sm_12x" covers sm_120, sm_121). The family key wins
# over "*". Families, not single archs, because vLLM's defaults (get_flash_attn_version) are decided by the
# capability major. A backend without `default_rank` ranks DEFAULT_RANK_MISSING, after every listed one.

DEFAULT_RANK_FIELD = "default_rank"
DEFAULT_RANK_MISSING = 50
DEFAULT_RANK_ANY = "*"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def default_rank_problem(value: object) -> str | None:
    """What is wrong with a `default_rank` value, or None when it is well formed."""
    if _is_int(value):
        return None
    if not isinstance(value, dict):
        return (f"{value!r} is neither an int nor an object mapping \"*\" and capability-major families "
                "(\"sm_9x\", \"sm_10x\") to ints")
    for k, v in value.items():
        if k != DEFAULT_RANK_ANY and not (isinstance(k, str) and ARCH_FAMILY_RE.fullmatch(k)):
            return (f"unknown key {k!r} (a key is \"*\" or a capability-major family \"sm_<major>x\", "
                    "e.g. \"sm_8x\", \"sm_9x\", \"sm_10x\", \"sm_12x\")")
        if not _is_int(v):
            return f"the rank for {k!r} is {v!r}, not an int"
    if DEFAULT_RANK_ANY not in value:
        return "missing the \"*\" key (the rank on every arch no other key names)"
    return None


def default_rank(backends: dict[str, dict], backend: str, arch: str | None) -> int:
    """The documented default rank of `backend` on `arch` (lower first); `arch` None means "*" (no arch).

    The one reader of `default_rank`: the query engine's per-arch table (generator.capabilities, which the
    selector ships) and the generator's tables go through it. A malformed value raises ValueError naming the
    backend and the field (`read` reports the same message, with the file, before anything is read).
    """
    value = backends.get(backend, {}).get(DEFAULT_RANK_FIELD, DEFAULT_RANK_MISSING)
    problem = default_rank_problem(value)
    if problem is not None:
        raise ValueError(f"backend {backend!r}: {DEFAULT_RANK_FIELD}: {problem}")
    if not isinstance(value, dict):
        return value
    family = arch_family(arch)
    return value[family] if family in value else value[DEFAULT_RANK_ANY]


# --- engine names -----------------------------------------------------------------------------------------
#
# A backend declares the names under which an inference engine runs exactly its entry point: per engine, the
# field that holds that name for an op ("*": every op not listed). vLLM's attention backend (`vllm`: FLASH_ATTN,
# FLASHINFER, TORCH_SDPA) answers prefill and decode; its MLA prefill backend (`mla_prefill`: FLASH_ATTN,
# TRTLLM_RAGGED, FLASHINFER) answers mla_prefill. A backend without the field is one the engine does not run.

ENGINE_NAME_FIELDS: dict[str, dict[str, str]] = {"vllm": {"*": "vllm", "mla_prefill": "mla_prefill"}}


def engine_name(meta: dict, engine: str, op: str) -> str | None:
    """The name under which `engine` runs the backend declared by `meta` for `op`; None where it does not run
    it. The one reader of the engine-name fields (the selector's `engine_names`, the evidence audit)."""
    fields = ENGINE_NAME_FIELDS[engine]
    name = meta.get(fields.get(op, fields["*"]))
    return str(name) if name else None


def engine_names(backends: dict[str, dict], ops: tuple[str, ...]) -> dict[str, dict[str, dict[str, str]]]:
    """engine -> op -> backend -> the engine's name, for every op of `ops`, backends that have one, by name."""
    return {engine: {op: {b: n for b in sorted(backends) if (n := engine_name(backends[b], engine, op))}
                     for op in ops}
            for engine in sorted(ENGINE_NAME_FIELDS)}


# --- reading and checking backends.json -------------------------------------------------------------------


def identity_problems(name: str, meta: dict) -> list[tuple[str, str]]:
    """(field, message) for each identity field of an entry that is missing or malformed."""
    missing = [f for f in REQUIRED_FIELDS if f not in meta]
    if missing:
        return [(f"backends.{name}", f"missing {', '.join(missing)}")]
    out = []
    if meta["device"] not in DEVICES:
        out.append((f"backends.{name}.device", f"{meta['device']!r} is not one of {', '.join(DEVICES)}"))
    imports = meta["imports"]
    if not isinstance(imports, list) or not all(isinstance(m, str) and m for m in imports):
        out.append((f"backends.{name}.imports", f"expected a list of module names, got {imports!r}"))
    if not isinstance(meta["module"], str) or ":" not in meta["module"]:
        out.append((f"backends.{name}.module", f"expected 'package.module:ATTRIBUTE', got {meta['module']!r}"))
    return out


def declaring(entries: dict[str, dict], field: str) -> tuple[str, ...]:
    """The backends whose entry sets the flag `field` true, sorted."""
    return tuple(sorted(b for b, meta in entries.items() if meta.get(field) is True))


def power_of_two_paths(entries: dict[str, dict]) -> tuple[str, ...]:
    """The backends whose entry declares `fast_path_at_powers_of_two`: what the selector's decode placement reads
    without their power-of-two fast path (selector_workloads.fast_path_readings)."""
    return declaring(entries, POWER_OF_TWO_FIELD)


def whole_tile_backends(entries: dict[str, dict]) -> tuple[str, ...]:
    """The backends whose entry declares `prefill_in_whole_tiles`: what the selector's prefill placement reads at
    the end of the query's tile (selector_workloads.tile_end_readings)."""
    return declaring(entries, WHOLE_TILES_FIELD)


def read(path: Path) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    """(entries, problems) of a backends.json: every entry an object with a well-formed default_rank; an entry
    that declares an implementing `module` also its whole identity. Raises OSError/ValueError when the file
    cannot be read as a backends file at all."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("backends"), dict):
        raise ValueError("expected an object with a \"backends\" object")
    entries = dict(data["backends"])
    problems: list[tuple[str, str]] = []
    for name, meta in entries.items():
        if not isinstance(meta, dict):
            problems.append((f"backends.{name}", f"expected an object, got {meta!r}"))
            continue
        if (problem := default_rank_problem(meta.get(DEFAULT_RANK_FIELD, DEFAULT_RANK_MISSING))) is not None:
            problems.append((f"backends.{name}.{DEFAULT_RANK_FIELD}", problem))
        if "module" in meta:
            problems += identity_problems(name, meta)
        for field in (GRAPH_SPLITS_FIELD, POWER_OF_TWO_FIELD, WHOLE_TILES_FIELD):
            flag = meta.get(field)
            if flag is not None and not isinstance(flag, bool):
                problems.append((f"backends.{name}.{field}", f"expected true or false, got {flag!r}"))
    return entries, problems


# --- the registry: the product's backends and the plugins' ----------------------------------------------


@dataclass(frozen=True)
class BackendInfo:
    """A backend's identity: what `backends.json` (or a plugin) declares about it."""

    name: str
    label: str
    library: str
    device: str  # "cuda" or "cpu"
    imports: tuple[str, ...]
    module: str  # "package.module:ATTRIBUTE", imported lazily (kernels.registry.load)
    meta: dict  # the whole entry, as the generator and the resolution read it (vllm, default_rank, ...)


def _info(name: str, meta: Any, where: str) -> BackendInfo:
    if not isinstance(meta, dict):
        raise RegistryError(f"{where}: backends.{name}: expected an object, got {meta!r}")
    problems = identity_problems(name, meta)
    if problems:
        raise RegistryError("; ".join(f"{where}: {field}: {msg}" for field, msg in problems))
    return BackendInfo(name, meta["label"], meta["library"], meta["device"], tuple(meta["imports"]), meta["module"],
                       meta)


@functools.lru_cache(maxsize=1)
def _product() -> dict[str, BackendInfo]:
    entries, problems = read(BACKENDS_FILE)
    if problems:
        raise RegistryError("; ".join(f"{BACKENDS_FILE}: {field}: {msg}" for field, msg in problems))
    return {name: _info(name, meta, str(BACKENDS_FILE)) for name, meta in entries.items()}


_plugins: dict[str, BackendInfo] = {}
_loaded_env: str | None = None


def register(name: str, entry: dict) -> BackendInfo:
    """The plugin hook: declare a backend that is not in `backends.json` (a test fake), `entry` shaped like one
    of its entries. A plugin cannot redeclare a product backend."""
    if name in _product():
        raise RegistryError(f"backend {name!r} is declared in {BACKENDS_FILE.name}; a plugin cannot redeclare it")
    _plugins[name] = _info(name, entry, "plugin")
    return _plugins[name]


def unregister(name: str) -> None:
    """Forget a plugin backend (tests that register one for a single test)."""
    _plugins.pop(name, None)


def load_plugins() -> None:
    """Import the plugin modules named in ATTNMATRIX_BACKEND_PLUGINS (once per value of the variable)."""
    global _loaded_env
    env = os.environ.get(PLUGINS_ENV, "")
    if env == _loaded_env:
        return
    _loaded_env = env
    for mod in (m.strip() for m in env.split(",") if m.strip()):
        importlib.import_module(mod)


def backends() -> dict[str, BackendInfo]:
    """Every registered backend: the product's, then plugins', by name."""
    load_plugins()
    return {**_product(), **_plugins}


def names(*, include_plugins: bool = True) -> list[str]:
    return sorted(backends() if include_plugins else _product())


def info(name: str) -> BackendInfo:
    known = backends()
    if name not in known:
        raise RegistryError(f"unknown backend {name!r} (known: {', '.join(sorted(known))})")
    return known[name]


def plugin_metadata() -> dict[str, dict]:
    """name -> entry of every plugin backend: known to the evidence like declared ones."""
    load_plugins()
    return {name: dict(i.meta) for name, i in _plugins.items()}
