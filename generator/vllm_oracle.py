"""vLLM's own answers: run a pinned vLLM release's selection code, read from its wheel, under small stand-ins.

The comparison page (`site/vllm-comparison.md`) puts vLLM's choice next to attnmatrix's. vLLM's choice is
not re-derived from a hand-written copy of its rules (which drifts with every release): this module loads the
release's own Python files and calls its own functions:

- `get_flash_attn_version` (`vllm/v1/attention/backends/fa_utils.py`) with the `is_fa_version_supported` it
  imports (`vllm/vllm_flash_attn/flash_attn_interface.py`, with the package `__init__.py` that re-exports it);
- the MLA prefill choice: the priority walk `Platform.get_mla_prefill_backend_cls`
  (`vllm/platforms/interface.py`), the backend enum (`mla/prefill/registry.py`), each backend's
  `validate_configuration` (`mla/prefill/base.py` and `flash_attn.py`, `trtllm_ragged.py`, `flashinfer.py`,
  `tokenspeed_mla.py`), the selector config (`mla/prefill/selector.py`), and `FlashAttnPrefillBackend.__init__`
  for the FlashAttention version it runs and whether it pads V.

The files execute in a private module namespace: nothing stays in `sys.modules` and no vLLM install is
needed. A `vllm.*` import resolves either to a file executed from the release (`EXECUTED`) or to one of the
stand-ins below (`STAND_INS`), which replace what cannot run on a machine without a GPU or without the rest
of vLLM. Any other `vllm.*` import fails loudly (OracleError, never an ImportError that vLLM's own
`try/except ImportError` would swallow). Third-party imports go to the real modules (torch on CPU is enough),
except the optional kernel libraries (`OPTIONAL_LIBRARIES`), which count as installed exactly when the
release's metadata makes them a dependency of `pip install vllm` on Linux.

What the answers stand for: vLLM's default configuration on CUDA (no `flash_attn_version` or
`mla_prefill_backend` set, `VLLM_BATCH_INVARIANT` off, no model-level softcap, unquantized KV cache), with
the release's dependencies installed. Every call's log lines (what vLLM would have logged) are kept with
its answer: they are vLLM's own words for why it left a default.

`write_answers` writes them as committed data with provenance (version, wheel name and sha256, path and
sha256 of every executed file, checked against the wheel's RECORD); `load_answers` reads them back for the
generator, which never needs the wheel.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import types
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANSWERS_SCHEMA = "attnmatrix-vllm-answers/1"
ANSWERS_DIR = "matrix/data/vllm"


def answers_path(version: str) -> str:
    return f"{ANSWERS_DIR}/vllm-{version}-answers.json"


class OracleError(RuntimeError):
    """vLLM's code asked for something the oracle does not provide, or the release/answers file is unusable."""


# --- the release: a wheel or its extracted tree -------------------------------------------------------

@dataclass
class Release:
    """A vLLM release on disk: `root` holds `vllm/` and `vllm-<version>.dist-info/`."""

    root: Path
    version: str
    wheel_name: str | None  # the wheel file's name, None when given an extracted tree
    wheel_sha256: str | None
    record: dict[str, str]  # path -> sha256 hex, from the dist-info RECORD
    requires: list[str]  # Requires-Dist lines of METADATA

    def path(self, rel: str) -> Path:
        return self.root / rel

    def has(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def glob(self, pattern: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.glob(pattern))

    def requires_on_linux(self, dist: str) -> bool:
        """Whether `pip install vllm` on Linux x86_64 installs `dist` (a Requires-Dist with no extra)."""
        norm = re.sub(r"[-_.]+", "-", dist).lower()
        for line in self.requires:
            name = re.split(r"[\s;<>=!~\[(]", line.strip(), maxsplit=1)[0]
            if re.sub(r"[-_.]+", "-", name).lower() != norm:
                continue
            marker = line.partition(";")[2]
            if "extra ==" in marker:
                continue
            if "platform_system" in marker and "Linux" not in marker:
                continue
            return True
        return False


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_dist_info(root: Path) -> tuple[str, dict[str, str], list[str]]:
    infos = sorted(root.glob("vllm-*.dist-info"))
    if len(infos) != 1:
        raise OracleError(f"{root}: expected one vllm-<version>.dist-info folder, found {len(infos)}")
    meta = (infos[0] / "METADATA").read_text(encoding="utf-8")
    version = next((ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Version:")), None)
    if not version:
        raise OracleError(f"{infos[0]}/METADATA: no Version field")
    requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    record: dict[str, str] = {}
    rec = infos[0] / "RECORD"
    if rec.exists():
        for line in rec.read_text(encoding="utf-8").splitlines():
            parts = line.rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                digest = parts[1][len("sha256="):]
                record[parts[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return version, record, requires


@contextmanager
def open_release(path: str | os.PathLike) -> Iterator[Release]:
    """A vLLM wheel (`.whl`) or a folder holding its extracted `vllm/` and dist-info.

    A wheel's Python files, its dist-info and the names of its compiled extensions are extracted to a
    temporary folder (the extensions as empty files: only their presence is read), removed afterwards.
    """
    p = Path(path)
    if p.is_dir():
        if not (p / "vllm").is_dir():
            raise OracleError(f"{p}: no vllm/ package folder (expected an extracted vLLM wheel)")
        version, record, requires = _read_dist_info(p)
        yield Release(p, version, None, None, record, requires)
        return
    if not p.is_file() or not zipfile.is_zipfile(p):
        raise OracleError(f"{p}: not a vLLM wheel (.whl) nor an extracted wheel folder")
    tmp = Path(tempfile.mkdtemp(prefix="attnmatrix-vllm-"))
    try:
        with zipfile.ZipFile(p) as z:
            for name in z.namelist():
                if name.endswith("/") or ".." in name.split("/"):
                    continue
                top = name.split("/", 1)[0]
                if top == "vllm" and name.endswith(".py") or top.endswith(".dist-info"):
                    z.extract(name, tmp)
                elif top == "vllm" and name.endswith(".so"):
                    (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / name).touch()  # presence only: a compiled extension cannot run here
        version, record, requires = _read_dist_info(tmp)
        yield Release(tmp, version, p.name, _sha256(p), record, requires)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- stand-ins ------------------------------------------------------------------------------------------

class Unrunnable:
    """A name vLLM's code imports but the selection never calls (kernels, workspaces): calling it is an error."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise OracleError(f"{self._qualname} was called: it stands for a kernel or runtime object that "
                          "cannot run here, and vLLM's selection is not expected to call it")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Unrunnable(f"{self._qualname}.{name}")

    def __repr__(self) -> str:
        return f"<unrunnable {self._qualname}>"


def _on_missing_attribute(mod: types.ModuleType, missing: Callable[[str], Any]) -> types.ModuleType:
    """`mod` with a module `__getattr__`: a name it lacks is `missing(name)` (dunders stay AttributeErrors,
    so import machinery and introspection behave)."""

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return missing(attr)

    mod.__getattr__ = __getattr__  # type: ignore[method-assign]
    return mod


def _inert_module(name: str, doc: str) -> types.ModuleType:
    """A module whose every public attribute is Unrunnable: for kernel and runtime modules vLLM imports names
    from at module level but whose names the selection code never calls."""
    return _on_missing_attribute(types.ModuleType(name, doc), lambda attr: Unrunnable(f"{name}.{attr}"))


class RecordingLogger:
    """Stands for `vllm.logger.init_logger(...)`'s logger: keeps every message of the current call (the
    `*_once` variants too, since each query is its own run), so an answer carries vLLM's own reasons."""

    def __init__(self, ns: Namespace, name: str):
        self._ns, self.name = ns, name

    def _log(self, level: str, msg: Any, *args: Any, **_kw: Any) -> None:
        text = str(msg) % args if args else str(msg)
        self._ns.log.append(f"{level}: {text}")

    def debug(self, msg: Any, *a: Any, **k: Any) -> None:
        self._log("debug", msg, *a, **k)

    def info(self, msg: Any, *a: Any, **k: Any) -> None:
        self._log("info", msg, *a, **k)

    def warning(self, msg: Any, *a: Any, **k: Any) -> None:
        self._log("warning", msg, *a, **k)

    def error(self, msg: Any, *a: Any, **k: Any) -> None:
        self._log("error", msg, *a, **k)

    debug_once, info_once, warning_once = debug, info, warning
    warn = warning


# Each stand-in: module name -> (what it replaces and why, builder). The builder gets the namespace.
StandInBuilder = Callable[["Namespace"], types.ModuleType]


def _logger_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.logger")
    mod.init_logger = lambda name: RecordingLogger(ns, name)  # type: ignore[attr-defined]
    return mod


# vLLM's defaults for the environment variables the selection reads (vllm/envs.py), fixed here so the
# user's environment cannot change the answers.
ENV_DEFAULTS: dict[str, Any] = {"VLLM_BATCH_INVARIANT": False}


def _envs_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.envs")
    for k, v in ENV_DEFAULTS.items():
        setattr(mod, k, v)

    def unknown(attr: str) -> Any:
        raise OracleError(f"vllm.envs.{attr} was read: add vLLM's default for it to ENV_DEFAULTS")

    return _on_missing_attribute(mod, unknown)


def _platforms_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.platforms")
    mod.__path__ = []  # a package: vllm.platforms.interface is executed from the release
    mod.__package__ = "vllm.platforms"
    ns.modules["vllm.platforms"] = mod  # the interface's own imports may ask for the package
    interface = ns.import_module("vllm.platforms.interface")

    class StandInCudaPlatform(interface.Platform):  # type: ignore[name-defined,misc]
        """vLLM's Platform base class (executed from the release) as CUDA, with the device capability the
        query asks for instead of NVML's (CudaPlatform itself needs NVML, a GPU and vLLM's compiled ops)."""

        _enum = interface.PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return interface.DeviceCapability(*ns.capability)

    mod.current_platform = StandInCudaPlatform()  # type: ignore[attr-defined]
    return mod


def _config_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.config")
    mod.get_current_vllm_config_or_none = lambda: None  # type: ignore[attr-defined]
    return mod


def _import_utils_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.utils.import_utils")

    def resolve_obj_by_qualname(qualname: str) -> Any:
        module_name, _, obj = qualname.rpartition(".")
        ns.resolved.append(qualname)
        if ns.refuse_all:
            return ns.refusing_class(qualname)
        return getattr(ns.import_module(module_name), obj)

    mod.resolve_obj_by_qualname = resolve_obj_by_qualname  # type: ignore[attr-defined]
    return mod


def _kv_cache_interface_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.v1.kv_cache_interface")

    def is_quantized_kv_cache(dtype: Any) -> bool:
        raise OracleError("is_quantized_kv_cache was called: the default configuration has no cache config")

    mod.is_quantized_kv_cache = is_quantized_kv_cache  # type: ignore[attr-defined]
    return mod


def _extension(ns: Namespace, name: str) -> types.ModuleType:
    so = name.replace(".", "/")
    if not ns.release.glob(f"{so}*.so"):
        raise ImportError(f"{name}: the release ships no {so}*.so")
    return types.ModuleType(name, f"stand-in for the compiled extension {so}*.so shipped in the release")


STAND_INS: dict[str, tuple[str, StandInBuilder]] = {
    "vllm.logger": ("vLLM's logger; records each message with the answer (the real one configures global "
                    "logging)", _logger_mod),
    "vllm.envs": ("environment variables; vLLM's defaults (ENV_DEFAULTS), so the caller's environment cannot "
                  "change the answers", _envs_mod),
    "vllm.platforms": ("`current_platform`: the release's own Platform class as CUDA at the queried device "
                       "capability (the real CUDA platform reads it from the GPU through NVML)", _platforms_mod),
    "vllm.config": ("`get_current_vllm_config_or_none` returns None: vLLM's default configuration, no model "
                    "(the real config module imports the whole engine)", _config_mod),
    "vllm.utils.import_utils": ("`resolve_obj_by_qualname` resolves in the oracle's namespace (the real one "
                                "imports through sys.modules)", _import_utils_mod),
    "vllm.v1.kv_cache_interface": ("`is_quantized_kv_cache`, only called with a cache config, which the "
                                   "default configuration has not", _kv_cache_interface_mod),
    "vllm.vllm_flash_attn._vllm_fa2_C": ("vLLM's FA2 extension: importable exactly when the release ships "
                                         "the .so (it cannot load without a GPU build of torch)",
                                         lambda ns: _extension(ns, "vllm.vllm_flash_attn._vllm_fa2_C")),
    "vllm.vllm_flash_attn._vllm_fa3_C": ("vLLM's FA3 extension: importable exactly when the release ships "
                                         "the .so", lambda ns: _extension(ns, "vllm.vllm_flash_attn._vllm_fa3_C")),
}
# Kernel and runtime modules imported at module level for names the selection never calls.
INERT: dict[str, str] = {
    "vllm._custom_ops": "vLLM's compiled custom ops (reshape_and_cache_flash)",
    "vllm.model_executor.layers.quantization.utils.quant_utils": "quantization keys (imports distributed state)",
    "vllm.v1.attention.backends.utils": "attention metadata helpers (import the engine config and triton)",
    "vllm.v1.worker.workspace": "the GPU workspace manager",
    "vllm.utils.gpu_sync_debug": "a GPU synchronisation debug hook",
}
# Third-party kernel libraries vLLM's backends probe with an import in `is_available`: (distribution,
# modules). They count as installed exactly when the release's metadata requires the distribution on Linux.
OPTIONAL_LIBRARIES: dict[str, tuple[str, ...]] = {
    "flashinfer-python": ("flashinfer", "flashinfer.prefill"),
    "tokenspeed-mla": ("tokenspeed_mla",),
}

# The release's files that run, by module name (packages are empty namespaces: vLLM's `__init__` files
# import the engine, except vllm_flash_attn's, which only re-exports flash_attn_interface).
EXECUTED: tuple[str, ...] = (
    "vllm.platforms.interface",
    "vllm.v1.attention.backends.registry",
    "vllm.v1.attention.backends.fa_utils",
    "vllm.vllm_flash_attn",
    "vllm.vllm_flash_attn.flash_attn_interface",
    "vllm.model_executor.warmup.jit_warmup",
    "vllm.v1.attention.backends.mla.prefill.base",
    "vllm.v1.attention.backends.mla.prefill.registry",
    "vllm.v1.attention.backends.mla.prefill.selector",
    "vllm.v1.attention.backends.mla.prefill.flash_attn",
    "vllm.v1.attention.backends.mla.prefill.trtllm_ragged",
    "vllm.v1.attention.backends.mla.prefill.flashinfer",
    "vllm.v1.attention.backends.mla.prefill.tokenspeed_mla",
)


# --- the namespace -------------------------------------------------------------------------------------

class Namespace:
    """A private module namespace over one release: executes EXECUTED files, serves stand-ins for the rest."""

    def __init__(self, release: Release, executed: Iterable[str] | None = None,
                 stand_ins: dict[str, tuple[str, StandInBuilder]] | None = None,
                 inert: dict[str, str] | None = None):
        self.release = release
        self.executed_names = set(EXECUTED if executed is None else executed)
        self.stand_ins = STAND_INS if stand_ins is None else stand_ins
        self.inert = INERT if inert is None else inert
        self.modules: dict[str, types.ModuleType] = {}
        self.files: dict[str, str] = {}  # executed path -> sha256
        self.capability: tuple[int, int] = (9, 0)
        self.log: list[str] = []
        self.resolved: list[str] = []
        self.refuse_all = False
        self._builtins = dict(vars(builtins))
        self._builtins["__import__"] = self._import
        self._optional = {m: self.release.requires_on_linux(dist)
                          for dist, mods in OPTIONAL_LIBRARIES.items() for m in mods}

    # Python's import statement, for code executed here.
    def _import(self, name: str, globals: dict | None = None, locals: Any = None,
                fromlist: Iterable[str] | None = (), level: int = 0) -> types.ModuleType:
        if level:
            package = (globals or {}).get("__package__") or ""
            base = package.rsplit(".", level - 1)[0] if level > 1 else package
            name = f"{base}.{name}" if name else base
        top = name.split(".", 1)[0]
        if top == "vllm":
            mod = self.import_module(name)
            if fromlist:
                for attr in fromlist:
                    if attr != "*" and not hasattr(mod, attr):
                        try:
                            self.import_module(f"{name}.{attr}")
                        except ModuleNotFoundError:
                            pass  # Python then raises ImportError for the missing name
                return mod
            return self.import_module("vllm")
        if name in self._optional:
            if not self._optional[name]:
                raise ModuleNotFoundError(f"No module named {name!r} (not a dependency of this vLLM release)",
                                          name=name)
            mod = _inert_module(name, "an installed kernel library: present, its kernels never called")
            return mod if fromlist or "." not in name else _inert_module(top, "")
        return builtins.__import__(name, globals, locals, fromlist, level)

    def import_module(self, name: str) -> types.ModuleType:
        if name in self.modules:
            return self.modules[name]
        parent_name, _, leaf = name.rpartition(".")
        parent = self.import_module(parent_name) if parent_name else None
        if name in self.stand_ins:
            mod = self.stand_ins[name][1](self)
        elif name in self.inert:
            mod = _inert_module(name, self.inert[name])
        elif name in self.executed_names:
            mod = self._execute(name)
        elif any(e.startswith(name + ".") for e in (*self.executed_names, *self.stand_ins, *self.inert)):
            mod = types.ModuleType(name, "package namespace (its __init__ is not executed)")
            mod.__path__ = []
            mod.__package__ = name
        elif name.startswith("vllm.vllm_flash_attn._vllm_"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        else:
            raise OracleError(f"vLLM's code imports {name}, which is neither executed from the release nor a "
                              "stand-in (generator/vllm_oracle.py: EXECUTED, STAND_INS, INERT)")
        self.modules[name] = mod
        if parent is not None:
            setattr(parent, leaf, mod)
        return mod

    def _execute(self, name: str) -> types.ModuleType:
        rel = name.replace(".", "/")
        is_pkg = self.release.has(f"{rel}/__init__.py")
        rel = f"{rel}/__init__.py" if is_pkg else f"{rel}.py"
        path = self.release.path(rel)
        if not path.is_file():
            raise OracleError(f"{rel}: not in this vLLM release")
        source = path.read_bytes()
        digest = hashlib.sha256(source).hexdigest()
        if rel in self.release.record and self.release.record[rel] != digest:
            raise OracleError(f"{rel}: sha256 {digest} differs from the wheel's RECORD")
        mod = types.ModuleType(name)
        mod.__file__ = str(path)
        mod.__package__ = name if is_pkg else name.rpartition(".")[0]
        if is_pkg:
            mod.__path__ = [str(path.parent)]
        mod.__builtins__ = self._builtins  # type: ignore[attr-defined]
        self.modules[name] = mod  # before executing: a module may be imported while it runs
        # dataclasses reads sys.modules[cls.__module__] while a class is created: the module is visible there
        # for the time its file runs, and the previous entry (if any) comes back afterwards.
        previous = sys.modules.get(name)
        sys.modules[name] = mod
        try:
            exec(compile(source, str(path), "exec"), mod.__dict__)
        except BaseException:
            del self.modules[name]
            raise
        finally:
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
        self.files[rel] = digest
        return mod

    def refusing_class(self, qualname: str) -> type:
        """A backend class that refuses every configuration: lets the priority walk run to its end."""
        return type("Refusing", (), {"validate_configuration": classmethod(lambda cls, *a, **k: ["listing"]),
                                     "get_name": staticmethod(lambda: qualname)})


# --- queries ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FaQuery:
    """One call of get_flash_attn_version, as vLLM's FLASH_ATTN attention backend makes it."""

    capability: tuple[int, int]
    head_size: int
    head_size_v: int
    requires_alibi: bool = False
    has_sinks: bool = False
    requires_softcap: bool = False
    kv_cache_block_size: int | None = None

    def key(self) -> tuple:
        return (self.capability, self.head_size, self.head_size_v, self.requires_alibi, self.has_sinks,
                self.requires_softcap, -1 if self.kv_cache_block_size is None else self.kv_cache_block_size)


@dataclass(frozen=True)
class MlaQuery:
    capability: tuple[int, int]
    dims: tuple[int, int, int]  # qk_nope, qk_rope, v
    dtype: str

    def key(self) -> tuple:
        return (self.capability, self.dims, self.dtype)


class Oracle:
    """vLLM's selection functions from one release, callable per query."""

    def __init__(self, ns: Namespace):
        self.ns = ns
        self.fa_utils = ns.import_module("vllm.v1.attention.backends.fa_utils")

    def flash_attn_version(self, q: FaQuery) -> dict:
        """get_flash_attn_version(...) with the query's properties and supports_fa4_hd256=True, as the FLASH_ATTN
        attention backend calls it (vllm/v1/attention/backends/flash_attn.py in v0.33.0: the impl passes
        alibi/sinks/softcap, the metadata builder head_size_v and the KV block size; both pass
        supports_fa4_hd256=True)."""
        self.ns.capability, self.ns.log = q.capability, []
        version = self.fa_utils.get_flash_attn_version(
            requires_alibi=q.requires_alibi, head_size=q.head_size, head_size_v=q.head_size_v,
            has_sinks=q.has_sinks, requires_softcap=q.requires_softcap,
            kv_cache_block_size=q.kv_cache_block_size, supports_fa4_hd256=True)
        return {"capability": _cap(q.capability), "head_size": q.head_size, "head_size_v": q.head_size_v,
                "requires_alibi": q.requires_alibi, "has_sinks": q.has_sinks,
                "requires_softcap": q.requires_softcap, "kv_cache_block_size": q.kv_cache_block_size,
                "version": version, "log": list(self.ns.log)}

    def mla_prefill(self, q: MlaQuery) -> dict:
        """The automatic MLA prefill choice (Platform.get_mla_prefill_backend_cls) for these dims and dtype,
        the full priority list it walks, why each backend before the pick refused, and for FLASH_ATTN the
        FlashAttention version and V padding its constructor settles on."""
        import torch  # the release's MLA code is written against torch (CPU is enough)

        ns = self.ns
        ns.capability = q.capability
        base = ns.import_module("vllm.v1.attention.backends.mla.prefill.base")
        selector = ns.import_module("vllm.v1.attention.backends.mla.prefill.selector")
        platform = ns.import_module("vllm.platforms").current_platform
        nope, rope, v = q.dims
        config = selector.MLAPrefillSelectorConfig(
            dtype=getattr(torch, q.dtype),
            mla_dimensions=base.MLADimensions(qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v))
        # 1. The full priority list: the real walk, with every backend refusing.
        ns.resolved, ns.refuse_all, ns.log = [], True, []
        try:
            platform.get_mla_prefill_backend_cls(config)
        except ValueError:
            pass
        finally:
            ns.refuse_all = False
        enum = ns.import_module("vllm.v1.attention.backends.mla.prefill.registry").MLAPrefillBackendEnum
        by_path = {m.value: m.name for m in enum if m.value}
        priorities = [by_path.get(p, p) for p in ns.resolved]
        # 2. The real choice.
        ns.log = []
        try:
            chosen = platform.get_mla_prefill_backend_cls(config).get_name()
        except ValueError:
            chosen = None
        cap = platform.get_device_capability()
        refused = []
        for name in priorities:
            if name == chosen:
                break
            refused.append([name, list(enum[name].get_class().validate_configuration(cap, config))])
        out = {"capability": _cap(q.capability), "dims": list(q.dims), "dtype": q.dtype,
               "priorities": priorities, "refused": refused, "backend": chosen, "fa_version": None,
               "pads_v": None}
        if chosen == "FLASH_ATTN":
            ns.log = []
            cls = enum["FLASH_ATTN"].get_class()
            impl = cls(num_heads=16, scale=1.0, kv_lora_rank=512, qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                       v_head_dim=v, vllm_config=types.SimpleNamespace(
                           kernel_config=types.SimpleNamespace(enable_jit_warmup=False)))
            out["fa_version"] = impl.vllm_flash_attn_version
            out["pads_v"] = bool(impl.requires_v_padding)
        out["log"] = list(ns.log)
        return out


def _cap(c: tuple[int, int]) -> str:
    return f"{c[0]}.{c[1]}"


def parse_capability(s: str) -> tuple[int, int]:
    major, _, minor = s.partition(".")
    return int(major), int(minor)


# --- the query space the comparison page asks --------------------------------------------------------

def capability_of(arch: str) -> tuple[int, int]:
    """`sm_90` -> (9, 0), `sm_120` -> (12, 0)."""
    n = arch[3:].rstrip("af")
    return int(n[:-1]), int(n[-1])


def fa_params(features: Iterable[str]) -> dict:
    """The get_flash_attn_version arguments a matrix feature set stands for (the others do not enter it)."""
    from attnmatrix.matrix.cases import feature_name

    names = {feature_name(f): f for f in features}
    block = names.get("paged_kv")
    return {"requires_alibi": "alibi" in names, "has_sinks": "sinks" in names,
            "requires_softcap": "softcap" in names,
            "kv_cache_block_size": int(block.partition(":")[2]) if block else None}


def fa_queries() -> list[FaQuery]:
    """Every GPU arch x (head_dim, head_dim_v) x the distinct argument sets of the probed feature sets."""
    from attnmatrix.matrix.cases import ARCHS, BACKEND_FEATURE_SETS, FEATURE_SETS, HEAD_DIMS

    sets = [*FEATURE_SETS, *(f for fs in BACKEND_FEATURE_SETS.values() for f in fs)]
    params = {tuple(sorted(fa_params(fs).items(), key=lambda kv: kv[0])) for fs in sets}
    out = {FaQuery(capability_of(a), hd, hdv, **dict(p)) for a in ARCHS for hd, hdv in HEAD_DIMS for p in params}
    return sorted(out, key=FaQuery.key)


def mla_queries() -> list[MlaQuery]:
    from attnmatrix.matrix.cases import ARCHS, DTYPES, MLA_TRIPLES

    return sorted({MlaQuery(capability_of(a), t, d) for a in ARCHS for t in MLA_TRIPLES for d in DTYPES},
                  key=MlaQuery.key)


def run_answers(release: Release, progress: Callable[[str], None] | None = None) -> dict:
    """Run the release's selection code over the comparison's query space: the answers document."""
    ns = Namespace(release)
    oracle = Oracle(ns)
    fq, mq = sorted(set(fa_queries()), key=FaQuery.key), sorted(set(mla_queries()), key=MlaQuery.key)
    fa = []
    for i, q in enumerate(fq):
        fa.append(oracle.flash_attn_version(q))
        if progress and (i + 1) % 200 == 0:
            progress(f"get_flash_attn_version: {i + 1}/{len(fq)}")
    mla = [oracle.mla_prefill(q) for q in mq]
    if progress:
        progress(f"get_flash_attn_version: {len(fq)} answers; MLA prefill: {len(mq)} answers")
    files = [{"path": p, "sha256": h, "in_record": p in release.record} for p, h in sorted(ns.files.items())]
    return {
        "schema": ANSWERS_SCHEMA,
        "vllm": {"version": release.version, "wheel": release.wheel_name, "wheel_sha256": release.wheel_sha256},
        "command": f"attnmatrix vllm-answers --wheel {release.wheel_name or 'PATH'} -o {answers_path(release.version)}",
        "executed_files": files,
        "stand_ins": [{"module": k, "replaces": v[0]} for k, v in sorted(STAND_INS.items())]
        + [{"module": k, "replaces": f"inert: {v}"} for k, v in sorted(INERT.items())]
        + [{"module": ", ".join(mods), "replaces": f"installed iff the release requires {dist} on Linux: "
            + ("yes" if release.requires_on_linux(dist) else "no")} for dist, mods in OPTIONAL_LIBRARIES.items()],
        "assumes": "vLLM's default configuration on CUDA: no flash_attn_version or mla_prefill_backend set, "
                   "VLLM_BATCH_INVARIANT off, no model config (no model-level softcap, unquantized KV cache)",
        "flash_attn_version": fa,
        "mla_prefill": mla,
    }


# --- the answers file ---------------------------------------------------------------------------------------

def dumps_answers(doc: dict) -> str:
    """Stable text: sorted keys, one answer per line, so one changed answer changes one line."""
    keys = sorted(doc)
    lines = ["{"]
    for i, k in enumerate(keys):
        comma = "," if i < len(keys) - 1 else ""
        v = doc[k]
        if isinstance(v, list):
            lines.append(f"  {json.dumps(k)}: [")
            lines += [f"    {json.dumps(r, sort_keys=True, ensure_ascii=False)}" + ("," if j < len(v) - 1 else "")
                      for j, r in enumerate(v)]
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True, ensure_ascii=False)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def is_answers_file(path: str | os.PathLike) -> bool:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("schema") == ANSWERS_SCHEMA


def write_answers(doc: dict, path: str | os.PathLike) -> bool:
    """Atomic write. Refuses (OracleError) to replace a file that is not an answers file. True if changed."""
    from attnmatrix.matrix.storage import atomic_write_text

    p = Path(path)
    if p.exists() and not is_answers_file(p):
        raise OracleError(f"{p}: exists and is not a vLLM answers file (schema {ANSWERS_SCHEMA}); not replacing it")
    return atomic_write_text(p, dumps_answers(doc))


@dataclass(frozen=True)
class Answers:
    """A committed answers file, indexed for lookups."""

    path: str
    doc: dict

    @property
    def version(self) -> str:
        return self.doc["vllm"]["version"]

    def fa(self, capability: tuple[int, int], head_size: int, head_size_v: int, **params: Any) -> dict | None:
        return self._fa.get((_cap(capability), head_size, head_size_v, params.get("requires_alibi", False),
                             params.get("has_sinks", False), params.get("requires_softcap", False),
                             params.get("kv_cache_block_size")))

    def mla(self, capability: tuple[int, int], dims: tuple[int, int, int], dtype: str) -> dict | None:
        return self._mla.get((_cap(capability), tuple(dims), dtype))

    @property
    def _fa(self) -> dict:
        return self.__dict__.setdefault("_fa_index", {
            (r["capability"], r["head_size"], r["head_size_v"], r["requires_alibi"], r["has_sinks"],
             r["requires_softcap"], r["kv_cache_block_size"]): r for r in self.doc["flash_attn_version"]})

    @property
    def _mla(self) -> dict:
        return self.__dict__.setdefault("_mla_index", {
            (r["capability"], tuple(r["dims"]), r["dtype"]): r for r in self.doc["mla_prefill"]})


REQUIRED = {"schema", "vllm", "executed_files", "flash_attn_version", "mla_prefill"}
FA_FIELDS = {"capability", "head_size", "head_size_v", "requires_alibi", "has_sinks", "requires_softcap",
             "kv_cache_block_size", "version", "log"}
MLA_FIELDS = {"capability", "dims", "dtype", "priorities", "refused", "backend", "fa_version", "pads_v", "log"}


def load_answers(path: str | os.PathLike) -> Answers:
    """Read and check an answers file; OracleError names the file, record and field that is wrong."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise OracleError(f"{p}: unreadable vLLM answers file: {e}") from e
    if not isinstance(doc, dict) or doc.get("schema") != ANSWERS_SCHEMA:
        raise OracleError(f"{p}: schema is not {ANSWERS_SCHEMA}")
    missing = REQUIRED - set(doc)
    if missing:
        raise OracleError(f"{p}: missing fields {', '.join(sorted(missing))}")
    for kind, fields in (("flash_attn_version", FA_FIELDS), ("mla_prefill", MLA_FIELDS)):
        for i, r in enumerate(doc[kind]):
            if not isinstance(r, dict) or fields - set(r):
                lack = sorted(fields - set(r)) if isinstance(r, dict) else ["(not an object)"]
                raise OracleError(f"{p}: {kind}[{i}]: missing {', '.join(lack)}")
    return Answers(str(p), doc)
