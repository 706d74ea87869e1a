"""The isolated runner, end to end with real worker subprocesses.

One sweep mixes a real CPU kernel with every deliberately broken fake backend; another is killed
with SIGKILL mid-way and resumed. Worker start-up (importing torch) dominates, so the case count is
kept small.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from attnmatrix.kernels.probe import ProbeConfig
from attnmatrix.kernels.runner import RunnerConfig, run_cases
from attnmatrix.matrix.cases import Case
from attnmatrix.matrix.storage import ResultStore, read_records
from click.testing import CliRunner

from attnmatrix.cli import main

FEATS = ("causal",)


def _case(backend: str, head_dim: int = 64) -> Case:
    return Case("cpu", backend, "prefill", "bfloat16", head_dim, head_dim, FEATS)


@pytest.mark.slow
def test_mixed_sweep_every_failure_mode(tmp_path: Path) -> None:
    backends = ["sdpa_cpu", "fake_segfault", "fake_hang", "fake_nan", "fake_wrong", "fake_raise", "fake_oom"]
    cases = [_case(b) for b in backends]
    # The timeout has to cover a real first call on a loaded 2-core machine (sdpa_cpu's first call imports
    # torch.nn.attention.bias, seconds on its own); fake_hang costs exactly this long.
    cfg = RunnerConfig(workers=2, timeout_s=15, memory_limit_mb=2000, device="cpu",
                       probe=ProbeConfig(timing=False, run_id="test-run"))
    out = tmp_path / "mixed.jsonl"
    seen = []
    with ResultStore(out) as store:
        summary = run_cases(cases + cases[:2], store, cfg, progress=seen.append)  # duplicates are ignored
    assert summary.total == len(cases) and summary.skipped == 0 and summary.ran == len(cases)

    recs = read_records(out)
    keys = [r.key for _, r in recs]
    assert sorted(keys) == sorted(c.key for c in cases) and len(set(keys)) == len(keys)
    assert sorted(r.key for r in seen) == sorted(keys)
    by = {r.case.backend: r for _, r in recs}
    assert {b: r.outcome for b, r in by.items()} == {
        "sdpa_cpu": "pass", "fake_segfault": "crash", "fake_hang": "timeout", "fake_nan": "wrong",
        "fake_wrong": "wrong", "fake_raise": "rejected", "fake_oom": "crash",
    }
    assert summary.outcomes == Counter({"crash": 2, "wrong": 2, "pass": 1, "rejected": 1, "timeout": 1})
    # segfault, hang: the worker is replaced (and so is none of the others)
    assert summary.workers_replaced == 2
    assert all(r.tier == "validated" and r.run_id == "test-run" for _, r in recs)
    assert all(r.provenance.get("device") and r.provenance.get("torch") for _, r in recs)

    ok = by["sdpa_cpu"]
    assert ok.error["nan"] == 0 and ok.error["max_abs_err"] < ok.error["atol"] and ok.timings == ()
    assert ok.entry == "torch.nn.functional.scaled_dot_product_attention[cpu]"

    assert by["fake_segfault"].reason.startswith("worker killed by signal SIGSEGV while running the case")
    assert by["fake_hang"].reason == "no result within 15 s (case); worker killed"

    nan = by["fake_nan"]
    assert nan.error["nan"] == nan.error["elements"] == nan.error["mismatched"] > 0
    assert nan.reason == f"NaN in output ({nan.error['elements']} of {nan.error['elements']} elements off)"

    wrong = by["fake_wrong"]
    assert wrong.error["nan"] == 0 and wrong.error["max_abs_err"] > 10 * wrong.error["atol"]
    assert 0 < wrong.error["mismatched"] <= wrong.error["elements"]
    assert wrong.reason.startswith(f"max abs error {wrong.error['max_abs_err']:.4g} over tolerance (")

    # the library's own words, verbatim, not attnmatrix's
    assert by["fake_raise"].reason == "ValueError: fake kernel: head_dim must be a multiple of 7"

    # Under RLIMIT_AS torch's CPU allocator fails first, with a RuntimeError: recorded as out of memory,
    # not as a refusal and not as an attnmatrix adapter bug.
    oom = by["fake_oom"].reason
    assert oom.startswith("out of memory: RuntimeError: ") and "can't allocate memory" in oom, oom

    # Resuming the finished sweep probes nothing.
    with ResultStore(out) as store:
        again = run_cases(cases, store, cfg)
    assert (again.total, again.skipped, again.ran) == (len(cases), len(cases), 0)
    assert len(out.read_text().splitlines()) == len(cases)


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _tail(tmp_path: Path) -> str:
    return (tmp_path / "killed-run.log").read_text(errors="replace")[-2000:]


PROBE_ARGS = ["probe", "--device", "cpu", "--backends", "sdpa_cpu", "--head-dims", "32,64,80,96,128",
              "--features", "none,causal,causal+gqa", "--dtypes", "bfloat16", "--no-timing", "--timeout", "120"]
# head dims x feature sets x (prefill, decode), plus MLA prefill at 128x128 (Mistral Small 4's (64, 64, 128) triple)
N_CASES = 5 * 3 * 2 + 3


def test_kill_9_then_resume(tmp_path: Path) -> None:
    out = tmp_path / "sweep.jsonl"
    cmd = [sys.executable, "-m", "attnmatrix.cli", *PROBE_ARGS, "-o", str(out), "--json"]
    log = open(tmp_path / "killed-run.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and proc.poll() is None:
            workers.update(_children(proc.pid))
            if out.exists() and out.read_bytes().count(b"\n") >= 3:
                break
            time.sleep(0.01)
        workers.update(_children(proc.pid))
        assert proc.poll() is None, f"the sweep ended before it could be killed: {_tail(tmp_path)}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    # The workers outlive their parent only until they next touch their pipes; do not leave them behind.
    for _ in range(300):
        if not any(_alive(w) for w in workers):
            break
        time.sleep(0.05)
    for w in workers:
        if _alive(w):
            os.kill(w, signal.SIGKILL)

    raw = out.read_bytes()
    before = raw[: raw.rfind(b"\n") + 1]  # complete lines; a torn tail is cut on resume
    n_before = before.count(b"\n")
    assert 3 <= n_before < N_CASES

    result = CliRunner().invoke(main, [*PROBE_ARGS, "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["cases"] == N_CASES
    assert summary["resumed"] == n_before and summary["probed"] == N_CASES - n_before
    assert summary["outcomes"] == {"pass": N_CASES - n_before}

    after = out.read_bytes()
    assert after.startswith(before)  # what was on disk is untouched, not re-run
    recs = read_records(out)
    keys = [r.key for _, r in recs]
    assert len(keys) == N_CASES == len(set(keys))
    assert all(r.outcome == "pass" for _, r in recs)
    run_ids = {r.run_id for _, r in recs}
    assert len(run_ids) == 2  # the killed run's records kept their run id; the rest came from the re-run


def _strict(const: str) -> object:
    raise ValueError(f"{const} is not JSON (RFC 8259)")


def test_nan_output_record_is_strict_json() -> None:
    from attnmatrix.kernels.probe import probe_case
    from attnmatrix.matrix.storage import dump_record

    rec = probe_case(_case("fake_nan"), ProbeConfig(timing=False), {"date": "2026-11-30", "device": "cpu",
                                                                   "torch": "x"})
    assert rec.outcome == "wrong" and rec.error["nan"] > 0
    json.loads(dump_record(rec), parse_constant=_strict)


@pytest.mark.slow
def test_a_device_fault_is_blamed_on_its_own_case_only(tmp_path: Path) -> None:
    """A sticky device fault ends its worker right after the result (worker.py). The cases behind it
    must go to a fresh worker, not be recorded as crashes of a worker that died before taking them:
    on the H200 this once turned one FA4 fault into 22 false `crash` records."""
    cases = [_case("fake_device_fault", hd) for hd in (64, 32, 128, 96, 80, 160)]
    cfg = RunnerConfig(workers=1, timeout_s=60, device="cpu", probe=ProbeConfig(timing=False, run_id="t"))
    with ResultStore(tmp_path / "f.jsonl") as store:
        summary = run_cases(cases, store, cfg)
    by = {r.case.head_dim: r for _, r in read_records(tmp_path / "f.jsonl")}
    assert sorted(by) == [32, 64, 80, 96, 128, 160]
    assert by[64].outcome == "crash" and by[64].reason.startswith("kernel fault: ")
    assert {hd: r.outcome for hd, r in by.items() if hd != 64} == dict.fromkeys((32, 80, 96, 128, 160), "pass")
    assert summary.outcomes == Counter({"pass": 5, "crash": 1})


def test_out_of_memory_on_a_shared_gpu_is_retried_not_recorded(monkeypatch) -> None:
    """Workers sharing a GPU hold each other's cached memory: an OOM is retried (cache handed back,
    a pause) before it may become a record, and a third OOM is recorded as such."""
    from attnmatrix.kernels import worker
    from attnmatrix.matrix.records import Record

    monkeypatch.setattr(time, "sleep", lambda s: None)
    case = _case("sdpa_cpu")

    def flaky(outcomes):
        it = iter(outcomes)
        return lambda c, cfg, base, backend: Record(case=c, outcome=(o := next(it)), tier="validated",
                                                    provenance={"device": "x"},
                                                    reason="out of memory: CUDA" if o == "crash" else None)

    rec = worker._run_with_memory_retry(flaky(["crash", "pass"]), case, None, {}, None, "cuda")
    assert rec.outcome == "pass"
    rec = worker._run_with_memory_retry(flaky(["crash", "crash", "crash", "pass"]), case, None, {}, None, "cuda")
    assert rec.outcome == "crash" and rec.reason.startswith("out of memory")
    rec = worker._run_with_memory_retry(flaky(["crash", "pass"]), case, None, {}, None, "cpu")
    assert rec.outcome == "crash"  # on the CPU the limit is the worker's own: no retry


def test_a_fault_reported_after_the_case_is_that_cases_crash(monkeypatch) -> None:
    """CUDA reports a kernel's illegal access at the next synchronising call, which can be the worker's
    cache release after the case returned (FA4, head dim 224 with paged KV, on the H200). The fault is
    that case's `crash`; before, the worker died and the record read 'worker exited with status 1'."""
    import torch
    from attnmatrix.kernels import worker
    from attnmatrix.matrix.records import Record

    case = _case("sdpa_cpu")

    def probe(outcome, reason=None, **extra):
        return lambda c, cfg, base, backend: Record(case=c, outcome=outcome, tier="validated", extra=extra,
                                                    reason="kernel fault: CUDA error" if extra else reason)

    def fault():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nSearch for `cudaErrorIllegalAddress'")

    monkeypatch.setattr(torch.cuda, "empty_cache", fault)
    rec = worker._run_with_memory_retry(probe("pass"), case, None, {}, None, "cuda")
    assert rec.outcome == "crash" and rec.extra["device_fault"] is True and rec.extra["outcome_before_fault"] == "pass"
    assert rec.reason == ("kernel fault reported after the case: RuntimeError: CUDA error: an illegal memory access "
                          "was encountered; its record said 'pass'")
    # a refusal that left a fault behind keeps the kernel's own words (FlashInfer's prefill does this at head dim 80)
    refusal = "FlashInfer Internal Error: Invalid configuration : NUM_MMA_Q=2 NUM_MMA_D_QK=5"
    rec = worker._run_with_memory_retry(probe("rejected", refusal), case, None, {}, None, "cuda")
    assert rec.outcome == "crash" and rec.reason.endswith(f"its record said 'rejected': {refusal}")
    # a fault the probe already caught keeps the probe's own words
    rec = worker._run_with_memory_retry(probe("crash", device_fault=True), case, None, {}, None, "cuda")
    assert rec.reason == "kernel fault: CUDA error"
    # anything else at the release is not a kernel fault and is not swallowed
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: (_ for _ in ()).throw(RuntimeError("driver gone")))
    with pytest.raises(RuntimeError, match="driver gone"):
        worker._run_with_memory_retry(probe("pass"), case, None, {}, None, "cuda")


def test_a_fault_at_a_timed_shape_is_a_crash_not_an_untimed_note() -> None:
    """A kernel that passes the check shape and faults at a larger timed shape broke: a `crash` saying
    which shape, never a `pass` with that shape noted as untimed."""
    from attnmatrix.kernels.base import Backend
    from attnmatrix.kernels.probe import probe_case
    from attnmatrix.kernels.problem import VALIDATION_SHAPES
    from attnmatrix.kernels.reference import reference_attention

    check_len = VALIDATION_SHAPES["prefill"].seqlen_q

    def prepare(p):
        def call():
            if p.q.shape[1] != check_len:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return reference_attention(p).to(p.out_dtype)
        return call

    backend = Backend("sdpa_cpu", "torch", "cpu", (), prepare, lambda c: "fake.entry")
    rec = probe_case(_case("sdpa_cpu"), ProbeConfig(), {"device": "cpu"}, backend)
    assert rec.outcome == "crash" and rec.extra["device_fault"] is True
    assert rec.reason.startswith("kernel fault at timed shape ") and "(the check shape passed)" in rec.reason
    untimed = probe_case(_case("sdpa_cpu"), ProbeConfig(timing=False), {"device": "cpu"}, backend)
    assert untimed.outcome == "pass"



def test_a_timing_shape_whose_inputs_do_not_fit_is_untimed_not_a_crash(monkeypatch) -> None:
    """Out of memory while building a timing shape's inputs (other workers hold the GPU's memory) is that
    shape not timed: the case that passed its check stays a `pass`, the other shapes are still timed."""
    import attnmatrix.kernels.probe as probe_mod
    import torch
    from attnmatrix.kernels.problem import CPU_TIMING_SHAPES

    big = CPU_TIMING_SHAPES["prefill"][0].name
    real = probe_mod.make_problem

    def make_problem(case, shape, **kw):
        if shape.name == big:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB.")
        return real(case, shape, **kw)

    monkeypatch.setattr(probe_mod, "make_problem", make_problem)
    rec = probe_mod.probe_case(_case("sdpa_cpu"), ProbeConfig(), {"device": "cpu"})
    assert rec.outcome == "pass", rec.reason
    assert rec.extra["untimed"] == {big: "OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB."}
    assert [t.shape for t in rec.timings] == [s.name for s in CPU_TIMING_SHAPES["prefill"][1:]]


def test_a_long_refusal_keeps_its_end() -> None:
    """A failed JIT build puts the compiler's error after pages of command lines: the recorded reason
    keeps the start (what failed) and the end (why), within the limit."""
    from attnmatrix.kernels.probe import MESSAGE_CHARS, _message

    exc = RuntimeError("Ninja build failed. Ninja output:\n" + "nvcc -O3 -DX " * 500
                       + "\nmha_sm90.cu(42): error: static assertion failed: head dim 160")
    msg = _message(exc)
    assert len(msg) == MESSAGE_CHARS
    assert msg.startswith("RuntimeError: Ninja build failed.") and msg.endswith("static assertion failed: head dim 160")
    assert _message(ValueError("short")) == "ValueError: short"


@pytest.mark.slow
def test_waiting_for_the_gpu_lock_does_not_count_against_the_case(tmp_path: Path, monkeypatch) -> None:
    """Workers sharing a GPU take turns for timed loops. A case that waits for the lock longer than its
    whole time limit is not a timeout: its kernel did not run long, other sweeps' timed loops held
    the GPU. The wait is recorded in `extra.seconds.gpu_lock_wait`."""
    import fcntl
    import threading

    lock = tmp_path / "gpu0.lock"
    monkeypatch.setenv("ATTNMATRIX_GPU_LOCK", str(lock))  # the workers inherit it, as on a GPU
    hold_s, limit_s = 20.0, 12.0
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        release = threading.Timer(hold_s, fcntl.flock, (held, fcntl.LOCK_UN))
        release.start()
        cfg = RunnerConfig(workers=1, timeout_s=limit_s, device="cpu", probe=ProbeConfig(run_id="t"))
        try:
            with ResultStore(tmp_path / "w.jsonl") as store:
                summary = run_cases([_case("sdpa_cpu")], store, cfg)
        finally:
            release.cancel()
    [(_, rec)] = read_records(tmp_path / "w.jsonl")
    assert summary.outcomes == Counter({"pass": 1}), rec.reason
    assert rec.timings and rec.extra["seconds"]["gpu_lock_wait"] > hold_s - limit_s
