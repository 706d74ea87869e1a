"""The private module namespace the oracle executes a vLLM release's selection code in, and its stand-ins.

A `vllm.*` import resolves either to a file executed from the release (`EXECUTED`) or to one of the stand-ins
(`STAND_INS`, `INERT`), which replace what cannot run on a machine without a GPU or without the rest of vLLM.
Any other `vllm.*` import fails loudly (OracleError, never an ImportError that vLLM's own `try/except
ImportError` would swallow). Third-party imports go to the real modules (torch on CPU is enough), except the
optional kernel libraries (`OPTIONAL_LIBRARIES`), which count as installed exactly when the release's
metadata makes them a dependency of `pip install vllm` on Linux.
"""

from __future__ import annotations

import builtins
import hashlib
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any

from .answers import OracleError
from .release import Release

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
ENV_DEFAULTS: dict[str, Any] = {"VLLM_BATCH_INVARIANT": False, "VLLM_HAS_FLASHINFER_CUBIN": False}


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


# The fields of vLLM's default VllmConfig that the selection reads, at their defaults in the release
# (vllm/config/attention.py: AttentionConfig.use_trtllm_attention = None, i.e. not forced either way).
DEFAULT_CONFIG_FIELDS: dict[str, dict[str, Any]] = {"attention_config": {"use_trtllm_attention": None}}


def _default_config() -> Any:
    return types.SimpleNamespace(**{k: types.SimpleNamespace(**v) for k, v in DEFAULT_CONFIG_FIELDS.items()})


def _config_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.config")
    mod.__path__ = []  # a package: vllm.config.cache and vllm.config.utils are executed from the release
    mod.get_current_vllm_config_or_none = lambda: None  # type: ignore[attr-defined]
    mod.get_current_vllm_config = _default_config  # type: ignore[attr-defined]
    return _on_missing_attribute(mod, lambda attr: Unrunnable(f"vllm.config.{attr}"))


def _import_utils_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.utils.import_utils")

    def resolve_obj_by_qualname(qualname: str) -> Any:
        module_name, _, obj = qualname.rpartition(".")
        ns.resolved.append(qualname)
        if ns.refuse_all:
            return ns.refusing_class(qualname)
        return getattr(ns.import_module(module_name), obj)

    mod.resolve_obj_by_qualname = resolve_obj_by_qualname  # type: ignore[attr-defined]
    mod.import_pynvml = lambda: _inert_module("pynvml", "NVML: no GPU is read")  # type: ignore[attr-defined]
    return mod


def _kernel_decorator(qualname: str) -> Callable[..., Any]:
    """`@triton.jit` and `@triton.jit(...)`: the decorated kernel becomes Unrunnable (defined, never launched)."""

    def decorate(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return Unrunnable(f"{qualname}-decorated kernel {getattr(args[0], '__name__', '?')}")
        return decorate

    return decorate


def _triton_utils_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("vllm.triton_utils")
    triton = _inert_module("triton", "Triton: kernels are defined at import, never launched")
    for deco in ("jit", "autotune", "heuristics"):
        setattr(triton, deco, _kernel_decorator(f"triton.{deco}"))
    mod.triton = triton  # type: ignore[attr-defined]
    mod.tl = _inert_module("triton.language", "triton.language")  # type: ignore[attr-defined]
    mod.HAS_TRITON = True  # type: ignore[attr-defined]
    return _on_missing_attribute(mod, lambda attr: Unrunnable(f"vllm.triton_utils.{attr}"))


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
    "vllm.config": ("`get_current_vllm_config_or_none` returns None: vLLM's default configuration, no model; "
                    "`get_current_vllm_config` the default fields the selection reads (DEFAULT_CONFIG_FIELDS) "
                    "(the real config module imports the whole engine)", _config_mod),
    "vllm.utils.import_utils": ("`resolve_obj_by_qualname` resolves in the oracle's namespace (the real one "
                                "imports through sys.modules); `import_pynvml` gives an inert NVML",
                                _import_utils_mod),
    "vllm.vllm_flash_attn._vllm_fa2_C": ("vLLM's FA2 extension: importable exactly when the release ships "
                                         "the .so (it cannot load without a GPU build of torch)",
                                         lambda ns: _extension(ns, "vllm.vllm_flash_attn._vllm_fa2_C")),
    "vllm.vllm_flash_attn._vllm_fa3_C": ("vLLM's FA3 extension: importable exactly when the release ships "
                                         "the .so", lambda ns: _extension(ns, "vllm.vllm_flash_attn._vllm_fa3_C")),
    "vllm._C_stable_libtorch": ("vLLM's custom ops (the CUDA platform imports them to register them): importable "
                                "exactly when the release ships the .so",
                                lambda ns: _extension(ns, "vllm._C_stable_libtorch")),
    "vllm.triton_utils": ("Triton as the backends' modules use it at import: `@triton.jit` kernels are defined "
                          "and never launched", _triton_utils_mod),
    "vllm._qutlass_C": ("vLLM's QuTLASS ops: importable exactly when the release ships the .so",
                        lambda ns: _extension(ns, "vllm._qutlass_C")),
}


def _requests_mod(ns: Namespace) -> types.ModuleType:
    mod = types.ModuleType("requests", "HTTP for the executed code: no request leaves the machine")

    def get(url: str, *args: Any, **kwargs: Any) -> Any:
        ns.log.append(f"oracle: GET {url} answered 200 (assumed reachable: ARTIFACTORY_REACHABLE)")
        if not ARTIFACTORY_REACHABLE:
            raise ConnectionError(f"{url}: not reachable (ARTIFACTORY_REACHABLE is False)")
        return types.SimpleNamespace(status_code=200)

    mod.get = get  # type: ignore[attr-defined]
    return mod


# vLLM checks that FlashInfer's trtllm-gen cubins can be had (vllm/utils/flashinfer.py has_nvidia_artifactory: one
# HTTP request to NVIDIA's artifactory unless flashinfer-cubin is installed). The answers stand for a machine where
# they can: the request is answered here, never sent.
ARTIFACTORY_REACHABLE = True
# Third-party modules the executed code gets instead of the real ones: (what and why, builder).
THIRD_PARTY_STAND_INS: dict[str, tuple[str, StandInBuilder]] = {
    "requests": ("HTTP: NVIDIA's artifactory answers as reachable (ARTIFACTORY_REACHABLE); nothing is sent",
                 _requests_mod),
}
# Kernel and runtime modules imported at module level for names the selection never calls.
INERT: dict[str, str] = {
    "vllm._custom_ops": "vLLM's compiled custom ops (reshape_and_cache_flash)",
    "vllm.model_executor.layers.quantization.utils.quant_utils": "quantization keys (imports distributed state)",
    "vllm.v1.attention.backends.utils": "attention metadata helpers (import the engine config and triton)",
    "vllm.v1.worker.workspace": "the GPU workspace manager",
    "vllm.utils.gpu_sync_debug": "a GPU synchronisation debug hook",
    # imported by the attention backends' modules and the CUDA platform, for kernels, workspaces and runtime state
    "vllm.utils.platform_utils": "CUDA device properties (read from the GPU)",
    "vllm.utils.torch_utils": "torch helpers (dtype sizes, pinned memory, custom-op registration)",
    "vllm.model_executor.layers.attention": "the Attention layer module (imports the model executor)",
    "vllm.v1.attention.ops": "attention kernels (Triton, CUDA)",
    "vllm.v1.attention.ops.dcp": "decode context-parallel kernels",
    "vllm.v1.attention.ops.merge_attn_states": "the attention-state merge kernel",
    "vllm.v1.attention.ops.triton_prefill_attention": "a Triton prefill kernel",
    "vllm.v1.attention.ops.triton_reshape_and_cache_flash": "a Triton KV-cache write kernel",
    "vllm.v1.attention.ops.triton_unified_attention": "a Triton attention kernel",
    "vllm.v1.attention.ops.flydsl_turboquant_decode": "a TurboQuant decode kernel",
    "vllm.v1.attention.ops.triton_turboquant_decode": "a TurboQuant decode kernel",
    "vllm.v1.attention.ops.triton_turboquant_store": "a TurboQuant KV-cache write kernel",
    "vllm.model_executor.layers.quantization.turboquant": "TurboQuant quantization (weights)",
    "vllm.model_executor.layers.quantization.turboquant.centroids": "TurboQuant centroids (weights)",
    "vllm.distributed": "distributed state",
    "vllm.distributed.parallel_state": "distributed state (tensor/context parallel groups)",
    "vllm.v1.worker.cp_utils": "context-parallel helpers of the GPU worker",
    "vllm.v1.utils": "GPU buffers",
    "vllm._aiter_ops": "ROCm AITER kernels",
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
    # the attention backend choice of a decoder layer: the CUDA platform's priority list and walk, each
    # backend's validate_configuration, and what they read (KV cache dtypes, FlashInfer's TRT-LLM availability)
    "vllm.platforms.cuda",
    "vllm.v1.attention.backend",
    "vllm.v1.attention.selector",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.flashinfer",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.attention.backends.flex_attention",
    "vllm.v1.attention.backends.turboquant_attn",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.kv_cache_layout",
    "vllm.v1.kv_cache_spec_registry",
    "vllm.config.cache",
    "vllm.config.utils",
    "vllm.utils.flashinfer",
    "vllm.utils.math_utils",
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
        if name in THIRD_PARTY_STAND_INS:
            if name not in self.modules:
                self.modules[name] = THIRD_PARTY_STAND_INS[name][1](self)
            return self.modules[name]
        optional = self._optional.get(name, self._optional.get(top))
        if optional is not None:
            if not optional:
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
                              "stand-in (attnmatrix/engines/vllm/namespace.py: EXECUTED, STAND_INS, INERT)")
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
