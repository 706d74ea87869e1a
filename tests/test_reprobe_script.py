"""scripts/reprobe.py's pure parts: which committed passes were validated blind, and the re-time sample."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("reprobe", Path(__file__).parent.parent / "scripts" / "reprobe.py")
reprobe = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(reprobe)


def test_blind_lists_version_1_passes_that_could_not_see_a_feature(results_dir, make_record, write_jsonl, capsys):
    write_jsonl(results_dir / "a.jsonl", [
        # version 1 (no extra.problem): bf16 softcap prefill could not tell a kernel that ignores the cap
        make_record(backend="fa4", features=("causal", "softcap"), head_dim=64, latency_ms=1.0),
        # the same cell validated on version 2: nothing to re-probe
        make_record(backend="fa2", features=("causal", "softcap"), head_dim=64, extra={"problem": 2}),
        make_record(backend="fa4", features=("causal",), head_dim=64, arch="sm_100"),  # another arch
        make_record(backend="fa4", features=("causal", "sinks"), head_dim=64, outcome="rejected", reason="no"),
    ])
    rows = reprobe.blind_cases("sm_90", results_dir)
    assert [r["key"] for r in rows] == ["sm_90/fa4/prefill/bfloat16/64x64/causal+softcap"]
    assert [e["feature"] for e in rows[0]["blind"]] == ["softcap"] and rows[0]["problem"] == 1
    assert rows[0]["blind"][0]["margin"] < 10


def test_blind_command_writes_the_list_and_counts(results_dir, make_record, write_jsonl, tmp_path, capsys):
    write_jsonl(results_dir / "a.jsonl", [make_record(backend="trtllm_decode", op="decode", head_dim=64,
                                                      features=("causal", "sinks"))])
    out = tmp_path / "blind.jsonl"
    assert reprobe.main(["blind", "--results", str(results_dir), "-o", str(out)]) == 0
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["case"]["backend"] == "trtllm_decode" and row["blind"][0]["feature"] == "sinks"
    counts = json.loads(capsys.readouterr().err.split("\n", 1)[1])
    assert counts["blind_passes"] == 1 and counts["by_backend"] == {"trtllm_decode": 1}


def test_the_newest_pass_of_a_case_counts(results_dir, make_record, write_jsonl):
    write_jsonl(results_dir / "a.jsonl", [make_record(date="2026-11-01", latency_ms=2.0)])
    write_jsonl(results_dir / "b.jsonl", [make_record(date="2026-11-30", latency_ms=1.0)])
    (rec,) = reprobe.committed_passes("sm_90", results_dir).values()
    assert rec.latency_ms == 1.0


def test_the_retime_sample_spreads_over_backends_ops_and_dtypes(make_rec):
    recs = [make_rec(backend=b, op=op, dtype=dt, head_dim=hd, latency_ms=1.0)
            for b in ("fa2", "fa4") for op in ("prefill", "decode") for dt in ("bfloat16", "float16")
            for hd in (64, 128, 256)]
    recs.append(make_rec(backend="fa2", head_dim=32))  # untimed: never sampled
    passes = {r.key: r for r in recs}
    sample = reprobe._sample(passes, 8, seed=0)
    assert len({(c.backend, c.op, c.dtype) for c in sample}) == 8
    assert sample == reprobe._sample(passes, 8, seed=0)  # reproducible
    assert all(c.head_dim != 32 for c in reprobe._sample(passes, 100, seed=1))


def test_run_refuses_without_a_gpu(tmp_path):
    cases = tmp_path / "c.jsonl"
    cases.write_text(json.dumps({"case": {"arch": "sm_90", "backend": "fa4", "op": "prefill", "dtype": "bfloat16",
                                          "head_dim": 64, "head_dim_v": 64, "features": []}}) + "\n")
    with pytest.raises(SystemExit) as e:
        reprobe.main(["run", "--cases", str(cases), "-o", str(tmp_path / "o.jsonl")])
    assert e.value.code == 2 and not (tmp_path / "o.jsonl").exists()


def test_stale_passes_are_those_not_timed_as_gpu_time_cell_by_cell(make_rec):
    gpu_timed = make_rec(backend="fa4", head_dim=64, timings=[
        {"shape": "b1_s4096", "latency_ms": 0.5, "method": "cuda_graph"}])
    per_call = [make_rec(backend=b, head_dim=64, latency_ms=1.0) for b in ("sdpa_cudnn", "fa2")]
    untimed_fp16 = [make_rec(backend=b, head_dim=hd, dtype="float16") for b in ("fa2", "fa4") for hd in (64, 128)]
    lone = make_rec(backend="fa2", head_dim=128, latency_ms=1.0)
    passes = {r.key: r for r in [gpu_timed, *per_call, *untimed_fp16, lone]}
    keys = [c.key for c in reprobe.stale_cases(passes)]
    # the GPU-timed pass is left alone; bf16 cells first, the cell with more backends first, a cell's
    # backends together
    assert keys == ["sm_90/fa2/prefill/bfloat16/64x64/causal", "sm_90/sdpa_cudnn/prefill/bfloat16/64x64/causal",
                    "sm_90/fa2/prefill/bfloat16/128x128/causal",
                    "sm_90/fa2/prefill/float16/64x64/causal", "sm_90/fa4/prefill/float16/64x64/causal",
                    "sm_90/fa2/prefill/float16/128x128/causal", "sm_90/fa4/prefill/float16/128x128/causal"]


def test_retime_list_counts_without_a_gpu(capsys):
    assert reprobe.main(["retime", "--stale", "--list", "--backends", "sdpa_math"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cases"] == sum(out["by_backend_dtype"].values()) > 0
    assert all(k.startswith("sdpa_math ") for k in out["by_backend_dtype"])
