"""Timing: GPU time apart from host time, a peak that is a peak, and records that keep both.

The pure parts run here; what needs a GPU is marked `gpu` (run on the H200: `pytest -m gpu`).
"""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from attnmatrix.kernels import interleaved_timing, timing
from attnmatrix.kernels.probe import ProbeConfig, probe_case
from attnmatrix.kernels.timing import GRAPH, LAUNCHES, WALL, Peak, find_peak, measure
from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.policy import resolve_cell
from attnmatrix.matrix.records import TIMING_METHODS, RecordError, parse_record
from attnmatrix.matrix.workloads import point_noise


def test_the_record_and_the_timer_name_the_same_methods():
    assert set(TIMING_METHODS) == set(timing.TIMING_METHODS)


def test_cpu_measure_is_wall_time_without_host_figure():
    m = measure(lambda: torch.ones(64, 64) @ torch.ones(64, 64), device="cpu", budget_ms=5, min_reps=3)
    assert m.method == WALL and m.host_ms is None and m.gpu_ms > 0 and m.reps >= 3 and m.calls == 1


def test_find_peak_runs_until_the_rate_stops_rising():
    rates = iter([100, 300, 600, 700, 702, 701, 703, 650, 10_000])
    best, calls = find_peak(lambda: next(rates), rise=0.005, patience=3, max_s=1e9)
    # 700 -> 702, 701, 703 are all within 0.5%: three flat calls after the last real rise, then stop
    assert (best, calls) == (703, 7)


def test_find_peak_gives_up_after_max_s():
    clock = itertools.count(0.0, 1.0)  # each look at the clock is one second later
    best, calls = find_peak(itertools.count(1.0).__next__, max_s=5.0, clock=lambda: next(clock))
    assert calls < 6 and best == calls


def test_peak_provenance_names_the_size_and_the_others():
    prov = Peak(777.04, 4096, {4096: 777.04, 8192: 668.2}).provenance()
    assert prov == {"matmul_peak_tflops": "777.0",
                    "matmul_peak_method": "bf16 n=4096, best of sizes 4096:777, 8192:668"}


def test_peak_provenance_names_the_data_that_reached_it_and_the_random_data_rate():
    prov = Peak(905.4, 8192, {4096: 890.0, 8192: 905.4}, "cuda_graph", "zeros",
                {"zeros": {4096: 890.0, 8192: 905.4}, "normal": {4096: 700.2, 8192: 686.0}}).provenance()
    assert prov == {"matmul_peak_tflops": "905.4",
                    "matmul_peak_method": "bf16 n=8192 zeros (cuda_graph), best of sizes 4096:890, 8192:905; "
                                          "normal data: 700 (4096:700, 8192:686)"}


def test_cpu_peak_is_measured_on_small_sizes_for_every_data_kind():
    peak = timing.matmul_peak("cpu", max_s_per_size=0.3)
    assert set(peak.detail) == {512, 1024} and peak.tflops == max(peak.detail.values()) > 0
    assert set(peak.by_data) == set(timing.PEAK_DATA) and peak.data in timing.PEAK_DATA
    assert peak.tflops == max(v for per in peak.by_data.values() for v in per.values())


# --- records -------------------------------------------------------------------------------------------------

def test_host_time_and_method_round_trip(make_record):
    d = make_record(latency_ms=[0.5, 1.0, 2.0])
    for t, host in zip(d["timings"], (0.3, 0.2, 0.25), strict=True):
        t.update(host_ms=host, method="cuda_graph")
    rec = parse_record(d)
    assert rec.latency_ms == 1.0 and rec.host_ms == 0.25
    assert rec.to_dict()["timings"][0] == {"shape": "s0", "latency_ms": 0.5, "tflops": 100.0, "host_ms": 0.3,
                                           "method": "cuda_graph"}
    cell = resolve_cell([rec]).to_json()
    assert cell["latency_ms"] == 1.0 and cell["host_ms"] == 0.25


def test_records_timed_before_host_time_still_read(make_record):
    rec = parse_record(make_record(latency_ms=[1.0, 2.0]))
    assert rec.host_ms is None and rec.timings[0].method is None and "host_ms" not in rec.to_dict()["timings"][0]
    assert resolve_cell([rec]).to_json()["host_ms"] is None


@pytest.mark.parametrize("field,value", [("host_ms", -1.0), ("host_ms", "fast"), ("method", "stopwatch")])
def test_bad_timing_fields_are_named(make_record, field, value):
    d = make_record(latency_ms=1.0)
    d["timings"][0][field] = value
    with pytest.raises(RecordError) as e:
        parse_record(d)
    assert [f for f, _ in e.value.problems] == [f"timings[0].{field}"]


def test_a_cpu_probe_records_wall_time_and_its_problem_version():
    case = Case("cpu", "sdpa_cpu", "prefill", "bfloat16", 32, 32, ("causal",))
    rec = probe_case(case, ProbeConfig(budget_ms=2.0))
    assert rec.outcome == "pass", rec.reason
    assert rec.timings and all(t.method == WALL and t.host_ms is None for t in rec.timings)
    assert rec.extra["problem"] == 2


# --- on a GPU --------------------------------------------------------------------------------------------------

def _do_bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


@pytest.mark.gpu
def test_graph_time_agrees_with_do_bench():
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    m = measure(lambda: a @ a, device="cuda")
    assert m.method == GRAPH and m.note is None
    assert 0.85 <= m.gpu_ms / _do_bench(lambda: a @ a) <= 1.15


@pytest.mark.gpu
@pytest.mark.parametrize("capture", [True, False])
def test_host_overhead_is_kept_out_of_gpu_time(capture):
    """A wrapper that spends 2 ms in Python before a tiny kernel: the GPU time stays tiny, the host
    time shows the 2 ms, with the graph and with back-to-back launches alike."""
    x = torch.zeros(1024, device="cuda")

    def slow_wrapper():
        time.sleep(0.002)
        return x.add_(1)

    m = measure(slow_wrapper, device="cuda", budget_ms=20, capture=capture)
    assert m.method == (GRAPH if capture else LAUNCHES)
    assert m.host_ms >= 2.0 and m.gpu_ms < 0.2, m


@pytest.mark.gpu
def test_kernels_timed_in_turns_agree_with_do_bench_and_with_each_other():
    """Two matmuls, one 8x the work of the other, timed in turns: each agrees with triton's do_bench, the ratio
    is the work's, and the two halves of the rounds agree within a few percent."""
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    got = interleaved_timing.measure_interleaved({"small": lambda: a @ a, "big": lambda: b @ b}, device="cuda",
                                                 rounds=6)
    assert {m.method for m in got.values()} == {GRAPH} and all(len(m.rounds_ms) == 6 for m in got.values())
    assert 0.85 <= got["small"].ms / _do_bench(lambda: a @ a) <= 1.15
    assert 0.85 <= got["big"].ms / _do_bench(lambda: b @ b) <= 1.15
    assert 6 <= got["big"].ms / got["small"].ms <= 10
    for m in got.values():  # the noise of the sweep's rows: even vs odd rounds
        assert point_noise({"rounds": m.rounds_ms}) < 1.05


@pytest.mark.gpu
def test_copies_of_small_inputs_keep_each_call_out_of_l2():
    """Doubling 16 MiB (inside the L2) back to back on one buffer reads it from L2; on enough copies taken in turn
    each call reads from memory, and is slower (1.4x on an H200)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    size = 16 * 2**20
    assert l2 > size and interleaved_timing.l2_copies(size) == min(16, -(-2 * l2 // size)) > 1
    copies = interleaved_timing.l2_copies(size)
    bufs = [torch.randn(size // 2, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    fns = [(lambda t=t: t * 2) for t in bufs]
    got = interleaved_timing.measure_interleaved({"one": fns[0], "copies": fns}, device="cuda", rounds=6)
    assert got["copies"].ms > 1.2 * got["one"].ms, got


@pytest.mark.gpu
def test_a_call_that_synchronises_is_timed_by_launches_and_says_why():
    x = torch.zeros(1024, device="cuda")
    m = measure(lambda: float(x.add_(1).sum()), device="cuda", budget_ms=10)
    assert m.method == LAUNCHES and m.note and m.note.startswith("not captured")
    torch.cuda.synchronize()  # the failed capture left the device usable


@pytest.mark.gpu
def test_the_peak_is_the_best_size_after_warm_up():
    peak = timing.matmul_peak("cuda", sizes=(4096, 8192), max_s_per_size=3.0)
    assert peak.tflops == max(peak.detail.values()) and peak.n in (4096, 8192)
    assert peak.tflops > 100 and peak.timer in (GRAPH, LAUNCHES)
    assert f"({peak.timer})" in peak.provenance()["matmul_peak_method"]


@pytest.mark.gpu
def test_no_attention_kernel_outruns_the_peak():
    """SDPA's cuDNN kernel at head dim 192, b1_s8192, outran the random-data matmul rate on an H200
    (711 against 690-700 TFLOP/s): the peak a sweep records must stay above it."""
    from attnmatrix.kernels.base import load_backend
    from attnmatrix.kernels.flops import problem_flops
    from attnmatrix.kernels.problem import TIMING_SHAPES, make_problem
    from attnmatrix.matrix.cases import Case

    backend = load_backend("sdpa_cudnn")
    if backend.availability():
        pytest.skip(backend.availability())
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    shape = next(s for s in TIMING_SHAPES["prefill"] if s.name == "b1_s8192")
    prob = make_problem(Case(arch, "sdpa_cudnn", "prefill", "bfloat16", 192, 192, ()), shape, device="cuda",
                        draw_on_device=True)
    fn = backend.prepare(prob)
    attention = max(problem_flops(prob) / (measure(fn, device="cuda", budget_ms=200.0).gpu_ms * 1e-3) / 1e12
                    for _ in range(4))
    peak = timing.matmul_peak("cuda", sizes=(4096, 8192), max_s_per_size=3.0)
    assert attention < peak.tflops, (attention, peak.provenance())


def test_the_peak_takes_turns_with_sweeps_on_its_gpu(monkeypatch):
    """A sweep timing on GPU 1 and the peak measured for a second sweep on GPU 1 share one lock."""
    import subprocess

    seen = {}

    def fake_run(cmd, env, **kw):
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0, '{"matmul_peak_tflops": "700.0"}\n', "")

    monkeypatch.setattr(timing.subprocess, "run", fake_run)
    assert timing.peak_env(1)[timing.PEAK_ENV] == "700.0"
    assert seen["CUDA_VISIBLE_DEVICES"] == "1" and seen["ATTNMATRIX_GPU_LOCK"] == timing.gpu_lock_path(1)
