"""Cross-compilation: compile-only probes of FA4 for GPU archs this machine does not have.

FA4 (CuTe DSL) compiles its forward kernel for any supported arch without a GPU, when three
variables are set before FA4 (and the CuTe DSL) are imported in the process:

- `FLASH_ATTENTION_ARCH`: which kernel family FA4 picks (`interface._get_device_arch`, cached
  per process). Parsed by `^(?:sm_?|SM_?)?(\\d+)(\\d)([af]?)$`: `sm_100a`, `sm100`, `100` all mean 100.
- `CUTE_DSL_ARCH`: the DSL's compilation target, read when the DSL's singletons are built (at import).
  Must be a name of `cutlass.base_dsl.Arch` *exactly* (`sm_90a`, `sm_100a`, ...): `100` is a
  `KeyError`. FA4's kernels also check the family: `sm_90` is refused ("Only SM 9.x is supported"),
  `sm_100` too ("Only SM 10.x and 11.x are supported"); the `a` targets are the ones that work.
- `FLASH_ATTENTION_NUM_SMS`: the target's SM count, for FA4's tiling/scheduling heuristics
  (SplitKV, 2-CTA and MLA routing); without a matching local GPU FA4 raises if it needs it.

We use one spelling for both arch variables: the target (e.g. `sm_100a`). Only the forward kernel is
compiled (backward aborts the process on a CPU-only torch). Each target runs in its own worker
processes (the arch is per process), through the isolated runner (`runner.run_cases`): a worker that
dies is recorded as `crash`, and results go to a resumable `ResultStore` JSONL file. The worker
dispatches to `worker_record` below when `ATTNMATRIX_MODE=xcompile` (see `worker.py`).

Some FA4 kernels ask the local GPU for its SM count *while compiling* (the static persistent tile
scheduler of dense non-causal SM100 attention, `tile_scheduler.py` `get_grid_shape` ->
`cutlass.utils.HardwareInfo()`, which needs the CUDA driver and ignores FLASH_ATTENTION_NUM_SMS). In a
worker that sees no GPU, `HardwareInfo` is replaced by a stand-in that answers the SM count with the
target's (FLASH_ATTENTION_NUM_SMS) and refuses any other query; a record that used it says so in
`extra.hardware_info_sm_count`. With the stand-in off (`hardware_shim=False`), such a case is recorded as
`unavailable` (cannot be compiled without the GPU), never as the kernel's refusal.

Records: tier `compiled`; outcome `compiled`, `rejected` (FA4's own words; for an assertion without
a message, the failing source line, which is FA4's own text too), `crash`, `timeout` or
`unavailable`; arch is the matrix key (`sm_100`) and `provenance.target` the exact target (`sm_100a`).

FA4's persistent compile cache (`FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`, directory
`FLASH_ATTENTION_CUTE_DSL_CACHE_DIR`, default `/tmp/$USER/flash_attention_cute_dsl_cache`) also works
under cross-compilation: pass `cache_dir` and every compiled kernel is exported there as a `.o`.
Entries live under `<dir>/<fingerprint>/fwd/<sha256(pickle(compile_key))>.o` (plus a `.lock`); the
fingerprint hashes the Python minor version, the cutlass-dsl and tvm-ffi versions and every FA4 `.py`
source, so a GPU process reuses an entry only with those identical (a cache made under Python 3.11 is
never looked up by a Python 3.12 process) and an identical compile key: the arch as a number (90, 100,
103: not the `a` suffix, not CUTE_DSL_ARCH), dtype, head dims, GQA ratio, causal/window flags, softcap
and sink presence, varlen/paged flags, tile sizes, 2-CTA/SplitKV/pack-GQA/scheduler decisions (which
depend on the shapes and the SM count, itself not in the key) and FA_LOG_LEVEL. A fresh process then
loads the `.o` instead of compiling (seen here on the CPU: 0.02 s instead of ~10 s).
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence

from attnmatrix.matrix.cases import Case, normalize_arch
from attnmatrix.matrix.records import Record
from attnmatrix.matrix.storage import ResultStore

from .env import device_provenance, package_version

MODE_ENV = "ATTNMATRIX_MODE"
MODE = "xcompile"
TARGET_ENV = "ATTNMATRIX_XCOMPILE_TARGET"
ARCH_ENVS = ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH")
NUM_SMS_ENV = "FLASH_ATTENTION_NUM_SMS"
CACHE_ENABLED_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
SHIM_ENV = "ATTNMATRIX_XCOMPILE_HW_SHIM"
DEVICE = "none (cross-compiled on CPU)"

# The compile target for each matrix arch, and the SM count of the part we assume for it. The SM
# count only steers FA4's heuristics (which kernel variant: SplitKV, 2-CTA, MLA routing); it is
# recorded in provenance and can be overridden.
TARGETS: dict[str, tuple[str, int]] = {
    "sm_80": ("sm_80", 108),  # A100
    "sm_90": ("sm_90a", 132),  # H100 / H200 SXM
    "sm_100": ("sm_100a", 148),  # B200
    "sm_103": ("sm_103a", 148),  # B300 (SM count assumed equal to B200's)
    "sm_110": ("sm_110a", 20),  # Jetson Thor
    "sm_120": ("sm_120", 170),  # RTX 5090
}
DEFAULT_TARGETS = ["sm_80", "sm_90a", "sm_100a", "sm_103a", "sm_110a", "sm_120"]


def normalize_target(arch: str) -> str:
    """`sm_100`, `10.0`, `sm100` -> `sm_100a` (the default target of that arch); an explicit target
    with a suffix (`sm_100a`, `sm_100f`) is kept as given."""
    s = str(arch).strip().lower()
    m = re.fullmatch(r"sm_?(\d{2,3})([af]?)", s)
    if m and m.group(2):
        return f"sm_{m.group(1)}{m.group(2)}"
    key = normalize_arch(s)
    if key in TARGETS:
        return TARGETS[key][0]
    if key == "cpu":
        raise ValueError("arch: 'cpu' is not a compile target")
    return key


def default_num_sms(target: str) -> int:
    key = normalize_arch(target)
    if key not in TARGETS:
        raise ValueError(f"no default SM count for {target!r}; pass num_sms")
    return TARGETS[key][1]


def target_env(target: str, num_sms: int | None = None, cache_dir: str | None = None,
               hardware_shim: bool = True) -> dict[str, str]:
    """Environment of a worker process that compiles for `target`."""
    target = normalize_target(target)
    env = {name: target for name in ARCH_ENVS}
    env[NUM_SMS_ENV] = str(num_sms or default_num_sms(target))
    env[MODE_ENV] = MODE
    env[TARGET_ENV] = target
    env[SHIM_ENV] = "1" if hardware_shim else "0"
    env["CUDA_VISIBLE_DEVICES"] = ""  # compile only, also on a machine with a GPU: nothing may run
    if cache_dir:
        env[CACHE_ENABLED_ENV] = "1"
        env[CACHE_DIR_ENV] = str(cache_dir)
    return env


def xcompile_provenance(target: str, num_sms: int | None = None, backend: str = "fa4") -> dict:
    """Provenance of a compile-only record; package metadata only, so FA4 need not be imported. The
    CuTe DSL's and tvm-ffi's versions are this environment's: the ones the kernels were compiled with."""
    from .base import load_backend

    be = load_backend(backend)
    prov = device_provenance("cpu")
    prov["host_cpu"] = prov.pop("device")
    prov.update({
        "device": DEVICE, "library": be.library, "kernel_version": be.version(),
        "cutlass_dsl": package_version("nvidia-cutlass-dsl") or "unknown", "target": target,
        "num_sms": str(num_sms or default_num_sms(target)),
    })
    tvm = package_version("apache-tvm-ffi")
    if backend != "fa4" and tvm:
        prov["tvm_ffi"] = tvm
    return prov


class TargetMismatch(RuntimeError):
    """This process is (or would be) set up for another arch: FA4 fixes the arch per process."""


def _ensure_process_target(target: str, num_sms: int) -> None:
    """Set the three variables if FA4/the DSL are not imported yet; else check they already match."""
    imported = [m for m in ("flash_attn.cute", "vllm.vllm_flash_attn.cute", "cutlass") if m in sys.modules]
    want = {**{n: target for n in ARCH_ENVS}, NUM_SMS_ENV: str(num_sms)}
    have = {n: os.environ.get(n) for n in want}
    if have == want:
        return
    if imported:
        raise TargetMismatch(f"cannot compile for {target}: {', '.join(imported)} already imported in this process "
                             f"with {have}; run it in a worker process (xcompile_cases)")
    os.environ.update(want)


class _TargetHardwareInfo:
    """Stands in for `cutlass.utils.HardwareInfo` in a process that compiles for a GPU it does not have:
    the SM count is the target's (FLASH_ATTENTION_NUM_SMS); any other query has no answer here."""

    queried = 0

    def __init__(self, device_id: int = 0, *args, **kwargs):
        self.device_id = device_id

    def get_device_multiprocessor_count(self) -> int:
        type(self).queried += 1
        return int(os.environ[NUM_SMS_ENV])

    def __getattr__(self, name: str):
        raise RuntimeError(f"cross-compiling without the target GPU: HardwareInfo.{name} cannot be answered")


def _install_hardware_shim(cute_package: str = "flash_attn.cute") -> bool:
    """Replace HardwareInfo where an FA4 copy (its CuTe package, e.g. `flash_attn.cute`) reaches it, if
    this process sees no GPU. True if installed."""
    import importlib

    import torch

    if torch.cuda.is_available():
        return False
    import cutlass.utils
    import cutlass.utils.hardware_info as hw

    tile_scheduler = importlib.import_module(f"{cute_package}.tile_scheduler")

    for mod in (cutlass.utils, hw, tile_scheduler):
        if hasattr(mod, "HardwareInfo"):
            mod.HardwareInfo = _TargetHardwareInfo
    return True


def _needed_the_gpu(exc: BaseException) -> bool:
    """True if the failure came from asking the local GPU/driver something (cutlass HardwareInfo, the
    CUDA driver bindings) rather than from the kernel's own checks."""
    tb = exc.__traceback__
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
        if f.endswith("cutlass/utils/hardware_info.py") or "/cuda/bindings/" in f:
            return True
        tb = tb.tb_next
    return type(exc).__name__ == "DynamicLibNotFoundError"


def _library_reason(exc: BaseException) -> str:
    """The library's words, verbatim; for a bare `assert` (no message) the failing line of its source,
    which is the library's own text too, and where it is."""
    msg = str(exc).strip()
    name = type(exc).__name__
    if msg:
        return f"{name}: {msg}"[:2000]
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return f"{name}: {exc!r}"
    code = last.tb_frame.f_code
    line = linecache.getline(code.co_filename, last.tb_lineno).strip()
    where = code.co_filename
    m = re.search(r"(?:site|dist)-packages/(.*)$", where) or re.search(r"/(vllm/vllm_flash_attn/.*)$", where)
    where = m.group(1) if m else os.path.basename(where)
    return f"{name} (no message) at {where}:{last.tb_lineno}: {line}"[:2000]


def _raised_by_library(exc: BaseException) -> bool:
    here = os.path.dirname(os.path.abspath(__file__))
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and not os.path.abspath(last.tb_frame.f_code.co_filename).startswith(here)


def xcompile_case(case: Case, arch: str | None = None, *, num_sms: int | None = None, seed: int = 0,
                  run_id: str | None = None) -> Record:
    """Compile `case` for `arch` (a target such as `sm_100a`, or a matrix arch) in this process.

    The process must not have imported FA4 for another arch (`TargetMismatch`). Never raises for
    what the kernel does: every failure is a record.
    """
    import traceback

    from .base import load_backend
    from .problem import VALIDATION_SHAPES, Unsupported, make_problem

    target = normalize_target(arch or case.arch)
    num_sms = num_sms or default_num_sms(target)
    case = dataclasses.replace(case, arch=normalize_arch(target))
    prov = xcompile_provenance(target, num_sms, case.backend)
    backend = load_backend(case.backend)

    def rec(outcome: str, **kw) -> Record:
        if backend.profile:  # the engine whose call this was (kernels/base.py)
            kw["extra"] = {**(kw.get("extra") or {}), "profile": backend.profile}
        return Record(case=case, outcome=outcome, tier="compiled", provenance=prov, entry=backend.entry(case),
                      run_id=run_id, **kw)

    if backend.compile_only is None:
        return rec("unavailable", reason=f"attnmatrix: backend {backend.name!r} cannot compile without running")
    _ensure_process_target(target, num_sms)
    why = backend.availability()
    if why:
        return rec("unavailable", reason=why)
    problem = make_problem(case, VALIDATION_SHAPES[case.op], device="cpu", seed=seed)
    shim = (backend.cute_package is not None and os.environ.get(SHIM_ENV, "1") != "0"
            and _install_hardware_shim(backend.cute_package))
    queried = _TargetHardwareInfo.queried
    try:
        facts = backend.compile_only(problem)
    except Unsupported as e:
        return rec("rejected", reason=f"attnmatrix: the API cannot express this case: {e}")
    except Exception as e:  # noqa: BLE001 - every failure is an outcome
        if _needed_the_gpu(e):
            return rec("unavailable", reason="cannot be cross-compiled without the target GPU: the compile queries "
                       f"the local device ({_library_reason(e)})"[:2000])
        if _raised_by_library(e):
            return rec("rejected", reason=_library_reason(e))
        return rec("crash", reason=f"attnmatrix adapter error: {type(e).__name__}: {e}"[:2000],
                   extra={"traceback": traceback.format_exc()[-4000:]})
    if shim and _TargetHardwareInfo.queried > queried:
        facts = {**facts, "hardware_info_sm_count": num_sms}
    facts = {**facts, "mask": problem.mask}
    if facts.get("out_dtype", case.dtype) != case.dtype:
        # A compile of the case builds the kernel the case names; one that writes another dtype is not it.
        return rec("rejected", reason=f"attnmatrix: the kernel writes {facts['out_dtype']} output for this case, not "
                   f"the case's {case.dtype}", extra=facts)
    return rec("compiled", extra=facts)


def worker_record(case: Case, config, base_provenance: dict | None = None, backend=None) -> Record:
    """What a worker runs per case when `ATTNMATRIX_MODE=xcompile` (same signature as `probe_case`)."""
    target = os.environ.get(TARGET_ENV) or os.environ.get("CUTE_DSL_ARCH") or case.arch
    sms = os.environ.get(NUM_SMS_ENV)
    return xcompile_case(case, target, num_sms=int(sms) if sms else None, seed=config.seed, run_id=config.run_id)


class _CompiledTierStore:
    """The runner's view of the store: records it makes itself for a dead or hung worker (tier
    `validated`, the worker's provenance) become compile-only records of the target."""

    def __init__(self, store: ResultStore, target: str, num_sms: int):
        self.store, self.target, self.num_sms = store, target, num_sms

    def __contains__(self, key: str) -> bool:
        return key in self.store

    def append(self, rec: Record) -> None:
        if rec.tier != "compiled":
            prov = xcompile_provenance(self.target, self.num_sms, rec.case.backend)
            prov["date"] = rec.provenance.get("date", prov["date"])
            rec = dataclasses.replace(rec, tier="compiled", provenance=prov)
        self.store.append(rec)


def xcompile_cases(
    cases: Iterable[Case], store: ResultStore | str | os.PathLike, targets: Sequence[str] | None = None, *,
    workers: int = 1, timeout_s: float = 900.0, num_sms: dict[str, int] | None = None,
    cache_dir: str | None = None, hardware_shim: bool = True, seed: int = 0, run_id: str | None = None,
    progress: Callable[[Record], None] | None = None,
) -> dict:
    """Compile every case for every target in worker processes; returns {target: RunSummary}.

    With `targets`, each case is compiled for each target (its arch replaced); without, each case's
    own arch picks its default target (`sm_100` -> `sm_100a`). Targets run one after another, each
    with `workers` processes (all with that target's environment). Cases already in the store are
    skipped (resume). `cache_dir` turns on FA4's persistent cache there; `hardware_shim` answers FA4's
    compile-time SM-count query with the target's (see the module docstring).
    """
    from .probe import ProbeConfig
    from .runner import RunnerConfig, run_cases

    own = not isinstance(store, ResultStore)
    st = ResultStore(store) if own else store
    by_target: dict[str, list[Case]] = {}
    for c in cases:
        for t in ([normalize_target(x) for x in targets] if targets else [normalize_target(c.arch)]):
            by_target.setdefault(t, []).append(dataclasses.replace(c, arch=normalize_arch(t)))
    out = {}
    try:
        for target, tcases in by_target.items():
            sms = (num_sms or {}).get(target) or default_num_sms(target)
            cfg = RunnerConfig(workers=workers, timeout_s=timeout_s, device="cpu",
                               probe=ProbeConfig(timing=False, seed=seed, run_id=run_id),
                               extra_env=target_env(target, sms, cache_dir, hardware_shim))
            out[target] = run_cases(tcases, _CompiledTierStore(st, target, sms), cfg, progress)
    finally:
        if own:
            st.close()
    return out

