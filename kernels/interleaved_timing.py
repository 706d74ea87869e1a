"""Timing several kernels in turns on one problem: the workload rankings' timer (benchmarks/regret.py).

`measure_interleaved` times each function from its own CUDA graph (`timing._capture`) with the L2 flushed
before each replay, as `timing.measure` does, but the functions take turns round by round on the same inputs,
so a drift of the GPU's clocks or temperature falls on all of them alike; `l2_copies` sizes the copies of small
inputs that keep each call's inputs out of L2.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .timing import GRAPH, L2_FLUSH_BYTES, LAUNCHES, WALL, _capture, _host_ms, _time_launches, not_captured_note


@dataclass(frozen=True)
class Interleaved:
    """Per-call times of one function, one figure per round (see `measure_interleaved`)."""

    rounds_ms: list[float]
    method: str  # one of TIMING_METHODS
    calls: int  # calls per replay
    note: str | None = None

    @property
    def ms(self) -> float:
        return statistics.median(self.rounds_ms)


def l2_copies(input_bytes: int, *, cap: int = 16) -> int:
    """How many copies of a call's inputs make each of back-to-back calls find its own inputs out of the L2 cache:
    together they span twice the device's L2 (1 for inputs that large already). At most `cap`: inputs under an
    eighth of the L2 stay partly in it from one turn of the copies to the next."""
    if not torch.cuda.is_available():
        return 1
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)
    if not l2 or input_bytes <= 0:
        return 1
    return max(1, min(cap, math.ceil(2 * l2 / input_bytes)))


def _cycle(fns: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """One callable that calls `fns` in turn, one per call (each copy of the inputs in turn)."""
    turn = itertools.cycle(fns)
    return lambda: next(turn)()


@dataclass
class _Plan:
    """How one function is timed in turns: its CUDA graph of `calls` calls, or (no graph) back-to-back launches
    behind a spin kernel sized by `host_ms`, the host's time per call."""

    calls: int
    graph: torch.cuda.CUDAGraph | None = None
    host_ms: float = 0.0
    note: str | None = None

    @property
    def method(self) -> str:
        return GRAPH if self.graph is not None else LAUNCHES


def _gpu_ms(run: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _calls_for(ms: float, replay_ms: float, max_calls: int) -> int:
    return max(1, min(max_calls, math.ceil(replay_ms / max(ms, 1e-4))))


def _plan(fns: Sequence[Callable[[], object]], replay_ms: float, max_calls: int) -> _Plan:
    """One call captured and replayed gives its GPU time, which sets how many calls the timed graph holds (a
    replay of about `replay_ms`: long against the events' resolution), taking the copies in `fns` in turn. A
    call that cannot be captured is sized by one launch's GPU time (its launch gap included)."""
    try:
        one = _capture(fns[0], 1)
    except Exception as e:  # noqa: BLE001 - a call that cannot be captured is timed the other way
        torch.cuda.synchronize()  # a device fault (not a capture refusal) surfaces here and propagates
        return _Plan(_calls_for(_gpu_ms(fns[0]), replay_ms, max_calls), host_ms=_host_ms(fns[0], 3),
                     note=not_captured_note(e))
    calls = _calls_for(min(_gpu_ms(one.replay) for _ in range(3)), replay_ms, max_calls)
    if calls == 1:
        return _Plan(1, one)
    del one
    return _Plan(calls, _capture(_cycle(fns), calls))


def measure_interleaved(fns: dict[str, Callable[[], object] | Sequence[Callable[[], object]]], *, device: str,
                        rounds: int = 6, replay_ms: float = 0.5, max_calls: int = 100) -> dict[str, Interleaved]:
    """GPU time per call of each function, the functions taking turns: round r replays every function once
    (its CUDA graph of N calls, the L2 flushed before it), starting from the r-th function, so a drift of the
    GPU's clocks or temperature over the measurement falls on every function alike and a ranking of the
    functions compares them under the same conditions. N is chosen per function so a replay lasts about
    `replay_ms`. A function that cannot be captured is timed by back-to-back launches behind a spin kernel
    (`measure`'s fallback). On the CPU: wall time of one call per round.

    A name may map to several callables (the same call on copies of its inputs): the N calls take them in
    turn, so with enough copies no call finds its inputs still in the L2 cache from the call before, as an
    engine's call for one layer does not find them there (`l2_copies`)."""
    fns = {n: list(f) if isinstance(f, (list, tuple)) else [f] for n, f in fns.items()}
    names = list(fns)
    if device != "cuda":
        out: dict[str, list[float]] = {n: [] for n in names}
        for n in names:
            fns[n][0]()
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                fns[n][r % len(fns[n])]()
                out[n].append((time.perf_counter() - t0) * 1e3)
        return {n: Interleaved(v, WALL, 1) for n, v in out.items()}
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    plans: dict[str, _Plan] = {}
    try:
        for n in names:
            for fn in fns[n]:
                fn()
            torch.cuda.synchronize()
            plans[n] = _plan(fns[n], replay_ms, max_calls)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            events = []
            for n in order:
                plan = plans[n]
                if plan.graph is None:
                    torch.cuda.synchronize()
                    ms, _ = _time_launches(_cycle(fns[n]), flush, plan.calls, plan.host_ms, 0.0, 1, 1)
                    times[n].append(ms)
                    continue
                flush.zero_()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                plan.graph.replay()
                e.record()
                events.append((n, s, e, plan.calls))
            torch.cuda.synchronize()
            for n, s, e, calls in events:
                times[n].append(s.elapsed_time(e) / calls)
        return {n: Interleaved(times[n], plans[n].method, plans[n].calls, plans[n].note) for n in names}
    finally:
        plans.clear()
        del flush
