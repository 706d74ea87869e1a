"""Timing: what the GPU spends on a call, and what the host spends issuing it, measured apart.

One CUDA-event pair and a synchronize around every call measures the host's launch cost as much as
the kernel: a Python wrapper that takes 0.3 ms to enqueue a 0.1 ms kernel reads 0.3 ms. Engines hide
that cost (CUDA graphs, launch-ahead), so a ranking by it penalises kernels for their wrappers. Here:

- GPU time: the call is captured N times into a CUDA graph and the graph is replayed between two
  events (N calls per replay, so the replay's own launch is spread over N); where the call cannot be
  captured (it synchronises, or a library refuses capture), N calls are launched back to back between
  two events while a spin kernel holds the GPU until all N are enqueued, so the GPU never waits for
  the host. The L2 cache is flushed before every repetition. The median repetition / N is the figure.
- Host time: the wall-clock time one call takes to return, issued back to back (the wrapper's Python
  and the library's host-side work: what a launch costs an engine that does not capture it).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
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


def gpu_lock_path(gpu: int) -> str:
    """The lock every process timing on GPU `gpu` of this machine takes turns on: a sweep's workers, the
    matmul peak, and a second sweep started beside the first."""
    return os.path.join(tempfile.gettempdir(), f"attnmatrix-gpu{gpu}.lock")


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


# How a figure was taken (records keep it per timed shape; records without it used one event pair and a
# synchronize per call, host time included).
GRAPH, LAUNCHES, WALL = "cuda_graph", "launches", "wall"
TIMING_METHODS = (GRAPH, LAUNCHES, WALL)

L2_FLUSH_BYTES = 256 * 2**20  # over any GPU's L2 (H100/H200: 50 MiB, B200: 126 MiB)


@dataclass(frozen=True)
class Measurement:
    gpu_ms: float  # per call: GPU time on a GPU, wall time on the CPU
    host_ms: float | None  # per call: time for the call to return, issued back to back (GPU only)
    method: str  # one of TIMING_METHODS
    calls: int  # calls per repetition
    reps: int  # repetitions the median is taken over
    note: str | None = None  # why a call was not captured, when it was not


def _host_ms(fn: Callable[[], object], calls: int) -> float:
    """Mean time for `fn` to return over `calls` back-to-back calls, the GPU idle at the start."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) * 1e3 / calls
    torch.cuda.synchronize()
    return host


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream() -> torch.cuda.Stream:
    """One side stream per device for every capture's warm-up: a new stream per capture would give libraries that
    keep a workspace per (handle, stream), cuBLAS among them, a new workspace each time."""
    dev = torch.cuda.current_device()
    if dev not in _SIDE_STREAMS:
        _SIDE_STREAMS[dev] = torch.cuda.Stream()
    return _SIDE_STREAMS[dev]


def not_captured_note(e: BaseException) -> str:
    """Why a call could not be captured, in one line: the cause where the capture was invalidated by it (a
    synchronising call) rather than the capture's own closing error."""
    cause = e.__context__ if "Invalidated" in str(e) and e.__context__ is not None else e
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return f"not captured: {type(cause).__name__}: {first}"[:300]


def _capture(fn: Callable[[], object], calls: int) -> torch.cuda.CUDAGraph:
    """`calls` calls of `fn` in one CUDA graph, warmed up on a side stream first as capture requires."""
    side = _side_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


_SLEEP_CYCLES_PER_MS: float | None = None


def _sleep_cycles_per_ms() -> float:
    """Clock cycles of `torch.cuda._sleep` per millisecond on this GPU (measured once)."""
    global _SLEEP_CYCLES_PER_MS
    if _SLEEP_CYCLES_PER_MS is None:
        cycles = 2_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)  # first launch loads the kernel
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_MS = cycles / max(start.elapsed_time(end), 1e-3)
    return _SLEEP_CYCLES_PER_MS


def _repetitions(per_rep_ms: float, budget_ms: float, min_reps: int, max_reps: int) -> int:
    return max(min_reps, min(max_reps, int(budget_ms / max(per_rep_ms, 1e-3))))


def measure(fn: Callable[[], object], *, device: str, budget_ms: float = 40.0, min_reps: int = 5,
            max_reps: int = 100, calls: int = 10, warmup: int = 2, capture: bool = True) -> Measurement:
    """GPU time and host time per call of `fn` (see the module docstring); on the CPU, wall time.

    `budget_ms` bounds the timed repetitions (at least `min_reps` whatever they cost); each repetition
    runs `calls` calls. `capture=False` skips the CUDA graph (the back-to-back method only).
    """
    for _ in range(warmup):
        fn()
    if device != "cuda":
        times: list[float] = []
        spent = 0.0
        while len(times) < max_reps and (len(times) < min_reps or spent < budget_ms):
            t0 = time.perf_counter()
            fn()
            t = (time.perf_counter() - t0) * 1e3
            times.append(t)
            spent += t
        return Measurement(statistics.median(times), None, WALL, 1, len(times))
    host = _host_ms(fn, calls)
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    note = None
    graph = None
    if capture:
        try:
            graph = _capture(fn, calls)
        except Exception as e:  # noqa: BLE001 - a call that cannot be captured is timed the other way
            note = not_captured_note(e)
            torch.cuda.synchronize()  # a device fault (not a capture refusal) surfaces here and propagates
    try:
        if graph is not None:
            ms, reps = _time_graph(graph, flush, calls, budget_ms, min_reps, max_reps)
            method = GRAPH
        else:
            ms, reps = _time_launches(fn, flush, calls, host, budget_ms, min_reps, max_reps)
            method = LAUNCHES
    finally:
        del graph, flush
    return Measurement(ms, host, method, calls, reps, note)


def _time_graph(graph: torch.cuda.CUDAGraph, flush: torch.Tensor, calls: int, budget_ms: float,
                min_reps: int, max_reps: int) -> tuple[float, int]:
    def once() -> tuple[torch.cuda.Event, torch.cuda.Event]:
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        return start, end

    s, e = once()  # a first replay uploads the graph; it also sizes the run
    e.synchronize()
    reps = _repetitions(s.elapsed_time(e), budget_ms, min_reps, max_reps)
    events = [once() for _ in range(reps)]
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) / calls, reps


def _time_launches(fn: Callable[[], object], flush: torch.Tensor, calls: int, host_ms: float,
                   budget_ms: float, min_reps: int, max_reps: int) -> tuple[float, int]:
    # The spin kernel outlasts the host's enqueueing of `calls` calls, so the timed calls run back to
    # back on the GPU however slow the wrapper is (a call that synchronises still waits, and is slower).
    hold_ms = 1.5 * calls * host_ms + 0.2
    cycles = int(min(hold_ms, 1000.0) * _sleep_cycles_per_ms())
    times: list[float] = []
    spent = 0.0
    while len(times) < max_reps and (len(times) < min_reps or spent < budget_ms):
        flush.zero_()
        torch.cuda._sleep(cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        t = start.elapsed_time(end)
        times.append(t)
        spent += t
    return statistics.median(times) / calls, len(times)


# --- the device's own ceiling ---------------------------------------------------------------------------

PEAK_SIZES = (4096, 6144, 8192, 12288, 16384)
# The data the peak's products run on. A matmul's rate depends on its operands' values: random data
# toggles more transistors per operation, the GPU reaches its power limit and lowers its clocks, while
# low-entropy operands let it keep them (Horace He, "Strangely, Matrix Multiplications on GPUs Run Faster
# When Given 'Predictable' Data", thonking.ai, 2024). On an H200, FA4 on random Q/K/V reaches 790 TFLOP/s
# while a cuBLAS product on random data holds 685 at its 700 W limit (1,500 MHz) and 805-875 on zeros
# (1,740-1,965 MHz; benchmarks/results/sm_90-matmul-peak-h200-20261201.txt): the ceiling is the best
# over both kinds, and the random-data rate is recorded beside it.
PEAK_DATA = ("normal", "zeros")
PEAK_OPERANDS: dict[str, Callable[..., torch.Tensor]] = {
    "normal": lambda n, **kw: torch.randn(n, n, **kw),
    "uniform": lambda n, **kw: torch.rand(n, n, **kw),
    "ones": lambda n, generator, **kw: torch.ones(n, n, **kw),
    "zeros": lambda n, generator, **kw: torch.zeros(n, n, **kw),
}


@dataclass(frozen=True)
class Peak:
    tflops: float
    n: int  # the square size that reached it
    detail: dict  # best TFLOP/s per size (over every data kind and timer)
    timer: str = ""  # the timing method that reached it (one of TIMING_METHODS)
    data: str = ""  # the operands' kind that reached it (one of PEAK_DATA)
    by_data: dict | None = None  # data kind -> {size: best TFLOP/s}

    def provenance(self) -> dict[str, str]:
        how = f"bf16 n={self.n}" + (f" {self.data}" if self.data else "") + (f" ({self.timer})" if self.timer else "")
        method = f"{how}, best of sizes " + _sizes(self.detail)
        for kind, per in sorted((self.by_data or {}).items()):
            if kind != self.data and per:
                method += f"; {kind} data: {max(per.values()):.0f} ({_sizes(per)})"
        return {"matmul_peak_tflops": f"{self.tflops:.1f}", "matmul_peak_method": method}


def _sizes(per: dict) -> str:
    return ", ".join(f"{n}:{v:.0f}" for n, v in sorted(per.items()))


def find_peak(rate: Callable[[], float], *, rise: float = 0.005, patience: int = 3, max_s: float = 6.0,
              clock: Callable[[], float] = time.perf_counter) -> tuple[float, int]:
    """Call `rate` until it stops rising: `patience` calls in a row without beating the best by more than
    `rise` (relative), or `max_s` seconds. Returns (best, calls). Clocks ramp up under load, so a
    figure taken once, cold, is not the ceiling."""
    best, calls, flat, t0 = -math.inf, 0, 0, clock()
    while flat < patience and clock() - t0 < max_s:
        r = rate()
        calls += 1
        if r > best * (1 + rise):
            flat = 0
        else:
            flat += 1
        best = max(best, r)
    return best, calls


def matmul_peak(device: str = "cuda", sizes: tuple[int, ...] = PEAK_SIZES, dtype: torch.dtype = torch.bfloat16,
                max_s_per_size: float = 6.0, data: tuple[str, ...] = PEAK_DATA) -> Peak:
    """The highest bf16 matmul rate this device reaches: each size and data kind (`PEAK_DATA`) is run
    until its rate stops rising (clocks ramp up: an H200 idles at 345 MHz), timed both in a CUDA graph
    and by back-to-back launches (cuBLAS inside a graph capture may run other kernels than outside one),
    and the best size, data and timer win. A peak below what an attention kernel reaches is no peak."""
    if device != "cuda":
        sizes = (512, 1024)
    by_data: dict[str, dict[int, float]] = {}
    timer: dict[tuple[str, int], str] = {}
    # A generator of its own: a CUDA graph capture that failed earlier in this process (a call that
    # cannot be captured) can leave the default CUDA generator unusable outside capture.
    gen = torch.Generator(device=device).manual_seed(0)
    for kind, n in itertools.product(data, sizes):
        try:
            a = PEAK_OPERANDS[kind](n, generator=gen, device=device, dtype=dtype)
            b = PEAK_OPERANDS[kind](n, generator=gen, device=device, dtype=dtype)
        except torch.OutOfMemoryError:
            continue

        methods: list[str] = []

        def rate(a=a, b=b, n=n, methods=methods, capture=True) -> float:
            # One measurement at a time under the GPU's lock: a sweep already timing on this GPU must not
            # see its loops overlap the peak's products, nor the peak theirs.
            with exclusive_gpu():
                m = measure(lambda: a @ b, device=device, budget_ms=200.0, min_reps=5, calls=10, warmup=1,
                            capture=capture)
            methods.append(m.method)
            return 2 * n**3 / (m.gpu_ms * 1e-3) / 1e12

        per = by_data.setdefault(kind, {})
        for capture in ((True, False) if device == "cuda" else (True,)):
            methods.clear()
            best, _ = find_peak(lambda capture=capture: rate(capture=capture), max_s=max_s_per_size)
            if best > per.get(n, -math.inf):
                per[n], timer[kind, n] = best, methods[-1]
        del a, b
    kind, n_best = max(((k, n) for k, per in by_data.items() for n in per), key=lambda kn: by_data[kn[0]][kn[1]])
    detail = {n: max(per[n] for per in by_data.values() if n in per) for per in by_data.values() for n in per}
    return Peak(by_data[kind][n_best], n_best, detail, timer[kind, n_best], kind, by_data)


PEAK_ENV = "ATTNMATRIX_MATMUL_PEAK_TFLOPS"
PEAK_METHOD_ENV = "ATTNMATRIX_MATMUL_PEAK_METHOD"


def peak_env(gpu: int | None = None, timeout_s: float = 300.0) -> dict[str, str]:
    """Measure the peak once for a sweep, in a subprocess on `gpu` (the sweep's parent must not hold a
    CUDA context), as the environment its workers read (`kernels.env.device_provenance`).
    Empty when it could not be measured; the sweep goes on without it."""
    code = ("import json; from attnmatrix.kernels.timing import matmul_peak; "
            "print(json.dumps(matmul_peak('cuda').provenance()))")
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        env["ATTNMATRIX_GPU_LOCK"] = gpu_lock_path(gpu)
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    try:
        prov = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else {}
    except ValueError:
        return {}
    if "matmul_peak_tflops" not in prov:
        return {}
    return {PEAK_ENV: prov["matmul_peak_tflops"], PEAK_METHOD_ENV: prov.get("matmul_peak_method", "")}
