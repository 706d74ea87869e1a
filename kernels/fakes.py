"""Deliberately broken backends for testing the runner: each fails the way real kernels do.

They run on the CPU and take the same `Problem` as real backends, so every path of the runner
(crash, hang, NaN, wrong values, refusal, out-of-memory, a sticky device fault) is exercised end to end.

They are not product backends: importing this module registers them (kernels/registry.py), and the test
suite does so by naming it in ATTNMATRIX_BACKEND_PLUGINS (tests/conftest.py), which worker subprocesses inherit.
"""

from __future__ import annotations

import ctypes
import hashlib
import resource
import time
from collections.abc import Callable

import torch

from attnmatrix.vocabulary import FEATURES

from . import registry
from .base import Backend
from .problem import Problem
from .reference import reference_attention
from .sensitivity import active_features, ignoring


def _segfault(p: Problem) -> Callable[[], torch.Tensor]:
    return lambda: ctypes.string_at(0)  # reads address 0: SIGSEGV, as a bad kernel launch would


def _hang(p: Problem) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        while True:
            time.sleep(3600)

    return call


def _nan(p: Problem) -> Callable[[], torch.Tensor]:
    return lambda: torch.full(p.q.shape[:3] + (p.v.shape[-1],), float("nan"), dtype=p.out_dtype)


def _wrong(p: Problem) -> Callable[[], torch.Tensor]:
    # Plausible but wrong: the right answer for a doubled softmax scale.
    def call() -> torch.Tensor:
        p2 = Problem(**{**p.__dict__, "scale": p.scale * 2})
        return reference_attention(p2).to(p.out_dtype)

    return call


# A refusal raised from code that is not attnmatrix's, as a library's argument check would be.
_LIBRARY_CHECK = compile("raise ValueError('fake kernel: head_dim must be a multiple of 7')", "<fake-library>", "exec")


def _raise(p: Problem) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        exec(_LIBRARY_CHECK)  # noqa: S102
        raise AssertionError("unreachable")

    return call


def _oom(p: Problem) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        # Without the runner's address-space limit, stop at 2 GiB instead of eating the machine.
        cap = 2 * 2**30 if soft == resource.RLIM_INFINITY else 1 << 62
        hoard, total = [], 0
        while total < cap:
            hoard.append(torch.ones(64 * 2**20, dtype=torch.uint8))  # touched, so really resident
            total += 64 * 2**20
        raise MemoryError(f"fake kernel exhausted {total >> 20} MiB")

    return call


def _device_fault(p: Problem) -> Callable[[], torch.Tensor]:
    """Head dim 64 faults the way an out-of-bounds kernel does on a GPU (the error is sticky there, so
    the worker exits after reporting it); every other head dim is computed correctly."""
    if p.q.shape[-1] != 64:
        return lambda: reference_attention(p).to(p.out_dtype)

    def call() -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (fake kernel)")

    return call


def _entry(case) -> str:
    return "fake"


SEGFAULT = Backend("fake_segfault", "torch", "cpu", ("torch",), _segfault, _entry)
HANG = Backend("fake_hang", "torch", "cpu", ("torch",), _hang, _entry)
NAN = Backend("fake_nan", "torch", "cpu", ("torch",), _nan, _entry)
WRONG = Backend("fake_wrong", "torch", "cpu", ("torch",), _wrong, _entry)
RAISE = Backend("fake_raise", "torch", "cpu", ("torch",), _raise, _entry)
OOM = Backend("fake_oom", "torch", "cpu", ("torch",), _oom, _entry)
DEVICE_FAULT = Backend("fake_device_fault", "torch", "cpu", ("torch",), _device_fault, _entry)


# --- fake_chaos: a backend that is right most of the time and fails, now and then, in every way -------------
#
# Which cases fail, and how, is a pure function of the case key (a hash), so a sweep, its resumption after a
# kill and the check of its results all agree on what each case should have produced.
CHAOS_FAULTS = ("segfault", "hang", "oom", "raise", "nan", "wrong")
CHAOS_FAULT_PER_MILLE = 100  # ~10% of the cases get a fault, spread evenly over the six kinds
# The outcome the runner must record for each injected fault (None: the case is computed correctly).
CHAOS_EXPECTED = {None: "pass", "segfault": "crash", "hang": "timeout", "oom": "crash", "raise": "rejected",
                  "nan": "wrong", "wrong": "wrong"}


def chaos_fault(key: str) -> str | None:
    """The fault `fake_chaos` injects for the case with this key, or None when it behaves."""
    bucket = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % 1000
    if bucket >= CHAOS_FAULT_PER_MILLE:
        return None
    return CHAOS_FAULTS[bucket * len(CHAOS_FAULTS) // CHAOS_FAULT_PER_MILLE]


def _correct(p: Problem) -> Callable[[], torch.Tensor]:
    return lambda: reference_attention(p).to(p.out_dtype)


_CHAOS_PREPARE: dict[str | None, Callable[[Problem], Callable[[], torch.Tensor]]] = {
    None: _correct, "segfault": _segfault, "hang": _hang, "oom": _oom, "raise": _raise, "nan": _nan,
    "wrong": _wrong,
}


def _chaos(p: Problem) -> Callable[[], torch.Tensor]:
    return _CHAOS_PREPARE[chaos_fault(p.case.key)](p)


CHAOS = Backend("fake_chaos", "torch", "cpu", ("torch",), _chaos, _entry)


# --- fake_ignores_<feature>: right in every way but one ---------------------------------------------------
#
# Each computes the reference answer of the problem it is given, except that it drops one feature the
# way a kernel could (kernels/sensitivity.py: the first way listed for that feature). Validation must
# record every case that asks for that feature `wrong` (unless the feature cannot change the answer,
# as a causal mask over one decode token) and every other case `pass`.

def _ignores(feature: str) -> Callable[[Problem], Callable[[], torch.Tensor]]:
    def prepare(p: Problem) -> Callable[[], torch.Tensor]:
        if feature not in active_features(p):
            return _correct(p)
        _, output = ignoring(p, feature)[0]
        return lambda: output(torch.float32).to(p.out_dtype)

    return prepare


IGNORES = {f: Backend(f"fake_ignores_{f}", "torch", "cpu", ("torch",), _ignores(f), _entry) for f in FEATURES}
# One attribute per fake, for tests that name them.
IGNORES_CAUSAL = IGNORES["causal"]
IGNORES_SLIDING_WINDOW = IGNORES["sliding_window"]
IGNORES_SOFTCAP = IGNORES["softcap"]
IGNORES_ALIBI = IGNORES["alibi"]
IGNORES_SINKS = IGNORES["sinks"]
IGNORES_GQA = IGNORES["gqa"]
IGNORES_VARLEN = IGNORES["varlen"]
IGNORES_PAGED_KV = IGNORES["paged_kv"]
IGNORES_FP8 = IGNORES["fp8"]


for _backend, _label in ((SEGFAULT, "test fake: segfaults"), (HANG, "test fake: hangs"),
                         (NAN, "test fake: returns NaN"), (WRONG, "test fake: wrong values"),
                         (RAISE, "test fake: refuses"), (OOM, "test fake: exhausts memory"),
                         (DEVICE_FAULT, "test fake: a sticky device fault at head dim 64"),
                         (CHAOS, "test fake: mostly right, sometimes crashes, hangs, exhausts memory, refuses or "
                                 "is wrong"),
                         *((b, f"test fake: right, except that it ignores {f}") for f, b in IGNORES.items())):
    registry.register(_backend, label=_label)
