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
from attnmatrix.matrix.cases import Case

from .problem import Problem, Unsupported

__all__ = ["Backend", "Unsupported", "load_backend", "BACKEND_MODULES", "known_backends"]


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

    def availability(self) -> str | None:
        """None if every module imports; otherwise why not, in the import system's words."""
        for mod in self.imports:
            try:
                importlib.import_module(mod)
            except Exception as e:  # noqa: BLE001 - any import failure makes it unavailable
                return f"cannot import {mod}: {type(e).__name__}: {e}"
        return None


# name -> "module:attribute". Lazy, so listing backends imports no kernel library.
BACKEND_MODULES: dict[str, str] = {
    "fa2": "attnmatrix.kernels.fa2:FA2",
    "fa3": "attnmatrix.kernels.fa3:FA3",
    "fa4": "attnmatrix.kernels.fa4:FA4",
    "flashinfer": "attnmatrix.kernels.flashinfer:FLASHINFER",
    "trtllm_ragged": "attnmatrix.kernels.trtllm:TRTLLM_RAGGED",
    "trtllm_context": "attnmatrix.kernels.trtllm:TRTLLM_CONTEXT",
    "trtllm_decode": "attnmatrix.kernels.trtllm:TRTLLM_DECODE",
    "sdpa_cpu": "attnmatrix.kernels.sdpa:SDPA_CPU",
    "sdpa_flash": "attnmatrix.kernels.sdpa:SDPA_FLASH",
    "sdpa_efficient": "attnmatrix.kernels.sdpa:SDPA_EFFICIENT",
    "sdpa_cudnn": "attnmatrix.kernels.sdpa:SDPA_CUDNN",
    "sdpa_math": "attnmatrix.kernels.sdpa:SDPA_MATH",
    "fake_segfault": "attnmatrix.kernels.fakes:SEGFAULT",
    "fake_hang": "attnmatrix.kernels.fakes:HANG",
    "fake_nan": "attnmatrix.kernels.fakes:NAN",
    "fake_wrong": "attnmatrix.kernels.fakes:WRONG",
    "fake_raise": "attnmatrix.kernels.fakes:RAISE",
    "fake_oom": "attnmatrix.kernels.fakes:OOM",
    "fake_device_fault": "attnmatrix.kernels.fakes:DEVICE_FAULT",
    "fake_chaos": "attnmatrix.kernels.fakes:CHAOS",
    "fake_ignores_causal": "attnmatrix.kernels.fakes:IGNORES_CAUSAL",
    "fake_ignores_sliding_window": "attnmatrix.kernels.fakes:IGNORES_SLIDING_WINDOW",
    "fake_ignores_softcap": "attnmatrix.kernels.fakes:IGNORES_SOFTCAP",
    "fake_ignores_alibi": "attnmatrix.kernels.fakes:IGNORES_ALIBI",
    "fake_ignores_sinks": "attnmatrix.kernels.fakes:IGNORES_SINKS",
    "fake_ignores_gqa": "attnmatrix.kernels.fakes:IGNORES_GQA",
    "fake_ignores_varlen": "attnmatrix.kernels.fakes:IGNORES_VARLEN",
    "fake_ignores_paged_kv": "attnmatrix.kernels.fakes:IGNORES_PAGED_KV",
    "fake_ignores_fp8": "attnmatrix.kernels.fakes:IGNORES_FP8",
}


def known_backends() -> list[str]:
    return sorted(BACKEND_MODULES)


def load_backend(name: str) -> Backend:
    try:
        target = BACKEND_MODULES[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r} (known: {', '.join(known_backends())})") from None
    mod, _, attr = target.partition(":")
    return getattr(importlib.import_module(mod), attr)
