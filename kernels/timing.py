"""Timing: warm up, then the median of many runs, with CUDA events on a GPU."""

from __future__ import annotations

import contextlib
import fcntl
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

_lock_listener: Callable[[bool], None] | None = None


def set_lock_listener(listener: Callable[[bool], None] | None) -> None:
    """Be told when this process starts (True) and stops (False) waiting for its GPU's lock.

    The worker forwards this to the runner, which stops a case's clock while it waits: the wait is
    other workers' timed loops (of this sweep or of another on the same GPU), not this kernel's time.
    """
    global _lock_listener
    _lock_listener = listener


@dataclass
class LockWait:
    seconds: float = 0.0


@contextlib.contextmanager
def exclusive_gpu() -> Iterator[LockWait]:
    """Hold this GPU's lock (set by the runner) so no other worker's kernels overlap a timed loop.

    Yields how long this process waited for the lock."""
    waited = LockWait()
    path = os.environ.get("ATTNMATRIX_GPU_LOCK")
    if not path:
        yield waited
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if _lock_listener:
                _lock_listener(True)
            t0 = time.perf_counter()
            try:
                fcntl.flock(f, fcntl.LOCK_EX)
            finally:
                waited.seconds = time.perf_counter() - t0
                if _lock_listener:
                    _lock_listener(False)
        try:
            yield waited
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def time_ms(fn: Callable[[], object], *, device: str, budget_ms: float = 150.0, min_reps: int = 5,
            max_reps: int = 100, warmup: int = 2) -> float:
    """Median milliseconds per call of `fn`, run at least `min_reps` times within ~`budget_ms`."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        times: list[float] = []
        spent = 0.0
        while len(times) < max_reps and (len(times) < min_reps or spent < budget_ms):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            t = start.elapsed_time(end)
            times.append(t)
            spent += t
        return statistics.median(times)
    times = []
    spent = 0.0
    while len(times) < max_reps and (len(times) < min_reps or spent < budget_ms):
        t0 = time.perf_counter()
        fn()
        t = (time.perf_counter() - t0) * 1e3
        times.append(t)
        spent += t
    return statistics.median(times)


def matmul_peak_tflops(device: str, n: int = 8192, dtype: torch.dtype = torch.bfloat16,
                       warmup_s: float = 2.0) -> float:
    """The measured bf16 matmul rate of this device, so attention figures read as a fraction of it.

    Matmuls run for `warmup_s` before timing: an idle GPU starts at low clocks (an H200 idles at
    345 MHz), and a peak measured before they ramp up is too low. The first H200 sweep measured
    680 TFLOP/s with two warm-up calls, under FA4's own 747; this warm-up is the fix.
    """
    if device != "cuda":
        n = 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup_s:
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
    ms = time_ms(lambda: a @ b, device=device, budget_ms=500.0, min_reps=20)
    return 2 * n**3 / (ms * 1e-3) / 1e12
