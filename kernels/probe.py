"""Probe one case in this process: build inputs, call the kernel, check it, time it, make a record.

`probe_case` is what a worker subprocess runs for each case (see `worker.py`); it is also callable
in-process, which the runner benchmark uses to measure the isolation overhead.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass

import torch
from attnmatrix.matrix.cases import Case, check_duration
from attnmatrix.matrix.records import Record, Timing

from attnmatrix.vocabulary import DTYPES

from .base import Backend, load_backend
from .env import device_provenance
from .flops import problem_flops
from .problem import CPU_TIMING_SHAPES, RECIPE, TIMING_SHAPES, VALIDATION_SHAPES, Problem, Unsupported, make_problem
from .reference import compare, reference_attention
from .timing import exclusive_gpu, measure

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class ProbeConfig:
    timing: bool = True
    seed: int = 0
    budget_ms: float = 40.0  # per timed shape, after warm-up; at least 5 runs whatever it costs
    run_id: str | None = None
    timed_dtypes: tuple[str, ...] = DTYPES

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget_ms", check_duration(self.budget_ms, "budget_ms"))  # frozen

    def to_dict(self) -> dict:
        return {"timing": self.timing, "seed": self.seed, "budget_ms": self.budget_ms, "run_id": self.run_id,
                "timed_dtypes": list(self.timed_dtypes)}


def _raised_by_library(exc: BaseException) -> bool:
    """True if the innermost frame is outside attnmatrix: then it is the library refusing the case.

    An exception raised by our own adapter code is our bug, not the kernel's refusal, and must not
    be recorded as the kernel's word.
    """
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    fname = os.path.abspath(last.tb_frame.f_code.co_filename)
    return not fname.startswith(_PKG_DIR)


MESSAGE_CHARS = 2000


def _message(exc: BaseException, limit: int = MESSAGE_CHARS) -> str:
    """The exception in its own words, at most `limit` characters. A long message keeps its start
    and its end: a failed JIT build (FlashInfer's "Ninja build failed") prints the compiler's
    command lines first and the error itself last."""
    msg = f"{type(exc).__name__}: {str(exc).strip() or repr(exc)}"
    if len(msg) <= limit:
        return msg
    cut = " [...] "
    head = limit // 4
    return msg[:head] + cut + msg[len(msg) - (limit - head - len(cut)):]


def _out_of_memory(exc: BaseException) -> bool:
    """Memory exhaustion, however it surfaces: torch's CPU allocator raises a plain RuntimeError
    ("DefaultCPUAllocator: can't allocate memory"), which must not read as an adapter bug."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def device_fault(exc: BaseException) -> bool:
    """A CUDA error (illegal address, launch failure ...) is a kernel fault, never a refusal, and it
    leaves the process's CUDA context unusable: every later call fails with the same sticky error."""
    accel = getattr(torch, "AcceleratorError", None)
    return (accel is not None and isinstance(exc, accel)) or "CUDA error" in str(exc)


def _poison_allocator(device: str) -> None:
    """Fill freed device memory with NaN so an output the kernel never writes shows up as NaN."""
    if device != "cuda":
        return
    blk = torch.empty(256 * 2**20 // 2, dtype=torch.bfloat16, device="cuda")
    blk.fill_(float("nan"))
    del blk


def kernel_provenance(backend: Backend, base: dict) -> dict:
    prov = dict(base)
    prov["library"] = backend.library
    prov["kernel_version"] = backend.version()
    return prov


def probe_case(case: Case, config: ProbeConfig, base_provenance: dict | None = None,
               backend: Backend | None = None) -> Record:
    backend = backend or load_backend(case.backend)
    base = base_provenance or device_provenance(backend.device)
    prov = kernel_provenance(backend, base)

    def rec(outcome: str, **kw) -> Record:
        if backend.profile:  # the engine whose call this was (kernels/base.py)
            kw["extra"] = {**(kw.get("extra") or {}), "profile": backend.profile}
        return Record(case=case, outcome=outcome, tier="validated", provenance=prov,
                      entry=kw.pop("entry", None), run_id=config.run_id, **kw)

    why = backend.availability()
    if why:
        return rec("unavailable", reason=why)
    entry = backend.entry(case)
    device = backend.device
    problem: Problem = make_problem(case, VALIDATION_SHAPES[case.op], device=device, seed=config.seed)
    # Where the case's time went: the first call (JIT compile for FA4/FlashInfer, or a cache load),
    # the check against the reference, and the timed shapes. Sums of these split a sweep's wall time
    # into compile and run (`attnmatrix stats --section time`).
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    # A call that is refused or fails was still asked with the problem's mask: the record says which, as a
    # record of a call that ran does (an MLA prefill case's mask is the case's, matrix/audit.py check_mla_mask).
    asked = {"mask": problem.mask}
    try:
        fn = backend.prepare(problem)
        _poison_allocator(device)
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
    except Unsupported as e:
        return rec("rejected", reason=f"attnmatrix: the API cannot express this case: {e}", entry=entry, extra=asked)
    except Exception as e:  # noqa: BLE001 - every failure is an outcome
        if device_fault(e):
            # The worker exits after reporting this (see worker.py), so the next case gets a clean context.
            return rec("crash", reason="kernel fault: " + _message(e), entry=entry,
                       extra={"device_fault": True, **asked})
        if _out_of_memory(e):
            return rec("crash", reason="out of memory: " + _message(e), entry=entry, extra=asked)
        if _raised_by_library(e):
            return rec("rejected", reason=_message(e), entry=entry, extra=asked)
        return rec("crash", reason="attnmatrix adapter error: " + _message(e),
                   extra={"traceback": traceback.format_exc()[-4000:], **asked}, entry=entry)
    seconds["first_call"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    ref = reference_attention(problem)
    ran = {"mask": problem.mask, "out_dtype": str(out.dtype).removeprefix("torch.")}
    if tuple(out.shape) != tuple(ref.shape):
        return rec("wrong", reason=f"output shape {tuple(out.shape)} != expected {tuple(ref.shape)}",
                   entry=entry, extra=ran)
    if out.dtype != problem.out_dtype:
        # The case's dtype is the output's: an fp8 kernel that writes bfloat16 when float16 was asked has not
        # produced the case, however close its values are.
        return rec("wrong", reason=f"output dtype {ran['out_dtype']}, not the case's {problem.case.dtype}",
                   entry=entry, extra=ran)
    err = compare(problem, out, ref)
    ok = err.pop("ok")
    if not ok:
        if err["nan"] or err["max_abs_err"] is None:
            what = "NaN in output" if err["nan"] else "no finite output"
        else:
            what = f"max abs error {err['max_abs_err']:.4g} over tolerance"
        return rec("wrong", reason=f"{what} ({err['mismatched']} of {err['elements']} elements off)",
                   error=err, entry=entry, extra={"seconds": seconds, "problem": RECIPE.version, **ran})
    seconds["check"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    timings: list[Timing] = []
    untimed: dict[str, str] = {}
    uncaptured: dict[str, str] = {}
    lock_wait = 0.0
    if config.timing and case.dtype in config.timed_dtypes:
        shapes = TIMING_SHAPES if device == "cuda" else CPU_TIMING_SHAPES
        for shape in shapes[case.op]:
            tp = None
            try:
                # Inside the try: a timing shape too large for the memory left (its inputs or the kernel's
                # workspace) is a shape not timed, not a crash of the case that passed its check.
                tp = make_problem(case, shape, device=device, seed=config.seed + 1, draw_on_device=True)
                flops = problem_flops(tp)
                tfn = backend.prepare(tp)
                tfn()  # first call outside the lock: JIT compiles may take seconds
                with exclusive_gpu() as waited:
                    lock_wait += waited.seconds
                    m = measure(tfn, device=device, budget_ms=config.budget_ms)
            except Exception as e:  # noqa: BLE001 - a shape the kernel refuses is noted, not fatal
                if device_fault(e):  # a fault is no refusal: the kernel broke at this size, and the context with it
                    return rec("crash", reason=f"kernel fault at timed shape {shape.name} (the check shape passed): "
                               + _message(e), error=err, entry=entry,
                               extra={"device_fault": True, "seconds": seconds, **ran})
                untimed[shape.name] = _message(e, 300)
                if device == "cuda":
                    torch.cuda.empty_cache()
                continue
            finally:
                del tp
            # Ranked by GPU time; the host's cost per call is kept beside it.
            tflops = flops / (m.gpu_ms * 1e-3) / 1e12
            timings.append(Timing(shape.name, round(m.gpu_ms, 5), round(tflops, 3),
                                  None if m.host_ms is None else round(m.host_ms, 5), m.method))
            if m.note:
                uncaptured[shape.name] = m.note
            if device == "cuda":
                torch.cuda.empty_cache()
    if timings or untimed:
        seconds["timing"] = round(time.perf_counter() - started, 3)
        if lock_wait:  # part of "timing": other workers' timed loops on this GPU
            seconds["gpu_lock_wait"] = round(lock_wait, 3)
    # Which validation problem this pass was judged on (kernels/problem.py: version 2 and later can
    # tell every feature applied from ignored; kernels/sensitivity.py).
    extra: dict = {"seconds": seconds, "problem": RECIPE.version, **ran}
    if untimed:
        extra["untimed"] = untimed
    if uncaptured:  # timed by back-to-back launches instead of a CUDA graph, and why
        extra["not_captured"] = uncaptured
    return rec("pass", error=err, timings=tuple(timings), entry=entry, extra=extra)

