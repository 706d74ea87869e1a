"""`attnmatrix stats`: counts of cells and records, a sweep's time and its best TFLOP/s, cross-compile counts, from
result files, as tables or JSON; bad input is refused with the file and line."""

from __future__ import annotations

import json
from pathlib import Path

from attnmatrix.matrix import stats as S
from click.testing import CliRunner, Result
from conftest import build_record, dump_jsonl

from attnmatrix.cli import main


def run(*args: object) -> Result:
    return CliRunner().invoke(main, ["stats", *map(str, args)])


def timed(head_dim: int, *, first_call: float, tflops: float, op: str = "prefill", peak: str = "600.0",
          backend: str = "fa4") -> dict:
    rec = build_record(backend=backend, head_dim=head_dim, op=op, latency_ms=1.0,
                       provenance={"matmul_peak_tflops": peak},
                       extra={"seconds": {"first_call": first_call, "check": 0.5, "timing": 2.0,
                                          "gpu_lock_wait": 0.25}})
    rec["timings"][0]["tflops"] = tflops
    return rec


def sweep(tmp_path: Path) -> Path:
    return dump_jsonl(tmp_path / "sweep.jsonl", [
        timed(64, first_call=3.0, tflops=400.0),
        timed(128, first_call=5.0, tflops=660.0),
        timed(256, first_call=0.2, tflops=500.0, op="decode"),
        build_record(backend="fa4", head_dim=512, outcome="rejected"),  # a refusal: no seconds
        build_record(backend="fa2", head_dim=64, arch="sm_80"),
    ])


def test_a_sweep_file_says_where_its_time_went_and_its_best_rate(tmp_path):
    r = run("--format", "json", sweep(tmp_path))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["schema"] == "attnmatrix.stats/1" and "compile" not in out  # no compile record: no section
    fa4 = out["time"]["fa4"]
    assert (fa4["records"], fa4["without_seconds"], fa4["first_call_s"], fa4["check_s"]) == (4, 1, 8.2, 1.5)
    assert (fa4["timing_s"], fa4["gpu_lock_wait_s"]) == (6.0, 0.8)
    assert (fa4["slow_first_calls"], fa4["slow_first_call_s"], fa4["median_slow_first_call_s"]) == (2, 8.0, 4.0)
    assert fa4["slow_first_call_s_per_case"] == {"prefill": {"cases": 2, "min": 3.0, "median": 4.0, "max": 5.0}}
    assert fa4["timing_s_per_case"]["decode"] == {"cases": 1, "median": 2.0, "max": 2.0}
    assert fa4["best_tflops"] == {"tflops": 660.0, "shape": "s0", "cell": "prefill bfloat16 128x128 causal",
                                  "arch": "sm_90", "peak_tflops": 600.0, "fraction_of_peak": 1.1}
    assert out["time"]["fa2"]["without_seconds"] == 1 and out["time"]["fa2"]["best_tflops"] is None


def test_cells_count_status_and_the_deciding_tier_per_arch_and_backend(tmp_path):
    f = dump_jsonl(tmp_path / "r.jsonl", [
        build_record(backend="fa4", head_dim=64),
        build_record(backend="fa4", head_dim=128, outcome="rejected"),
        build_record(backend="fa4", head_dim=128, tier="declared", outcome="pass"),  # the validated refusal wins
        build_record(backend="fa4", head_dim=256, tier="compiled", arch="sm_100"),
        build_record(backend="fa4", head_dim=96, outcome="unavailable", reason="not installed"),
    ])
    r = run("--format", "json", "--section", "cells", "--section", "files", f)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert set(out) == {"schema", "cells", "files"}
    assert out["cells"] == [
        {"arch": "sm_90", "backend": "fa4", "cells": 3,
         "status": {"supported": 1, "unsupported": 1, "unknown": 1},
         "tier": {"validated": 3, "compiled": 0, "shipped": 0, "declared": 0}},
        {"arch": "sm_100", "backend": "fa4", "cells": 1, "status": {"supported": 1, "unsupported": 0, "unknown": 0},
         "tier": {"validated": 0, "compiled": 1, "shipped": 0, "declared": 0}}]
    [row] = out["files"]
    assert row["file"].endswith("r.jsonl") and row["records"] == 5
    assert row["tier"] == {"validated": 3, "compiled": 1, "declared": 1}
    assert row["outcome"] == {"compiled": 1, "pass": 2, "rejected": 1, "unavailable": 1}


def test_cross_compiles_are_counted_per_target_with_their_seconds(tmp_path):
    def comp(hd: int, outcome: str = "compiled", **extra) -> dict:
        return build_record(tier="compiled", outcome=outcome, arch="sm_100", head_dim=hd, backend="fa4",
                            provenance={"cutlass_dsl": "4.8.1"}, extra=extra)

    f = dump_jsonl(tmp_path / "x.jsonl", [comp(64, compile_s=30.0, compile_cpu_s=6.0, kernels=1),
                                          comp(128, compile_s=40.0, compile_cpu_s=8.0, kernels=0),
                                          comp(512, "rejected"), build_record(backend="fa2")])
    r = run("--format", "json", "--section", "compile", f)
    assert r.exit_code == 0, r.output
    [row] = json.loads(r.stdout)["compile"]
    assert (row["target"], row["backend"], row["library"], row["cutlass_dsl"]) == ("sm_100a", "fa4",
                                                                                  "flash-attn-4 4.0.0b36", "4.8.1")
    assert row["outcome"] == {"compiled": 2, "rejected": 1} and row["kernels_built"] == 1
    assert row["compile_wall_s"] == {"cases": 2, "sum": 70.0, "median": 35.0, "max": 40.0}
    assert row["compile_cpu_s"]["median"] == 7.0
    assert list(row["by_head_dims"]) == ["64x64", "128x128", "512x512"]  # by size, not as text


def test_the_tables_read_as_tables(tmp_path):
    r = run(sweep(tmp_path))
    assert r.exit_code == 0, r.output
    for title in ("cells by status", "records per file", "where the time went", "slow first calls",
                  "best TFLOP/s per backend"):
        assert title in r.stdout
    best = next(line for line in r.stdout.splitlines() if line.startswith("fa4") and "b" in line and "660.0" in line)
    assert "1.10" in best and "prefill bfloat16 128x128 causal" in best


def test_without_paths_it_reads_the_matrix(tmp_path):
    r = run("--section", "files", "--format", "json")
    assert r.exit_code == 0, r.output
    files = {row["file"] for row in json.loads(r.stdout)["files"]}
    assert "matrix/data/declared.json" in files and any(f.startswith("matrix/data/results/") for f in files)
    assert "matrix: " in r.stderr


def test_a_broken_line_is_refused_with_its_file_and_line(tmp_path):
    f = dump_jsonl(tmp_path / "bad.jsonl", [build_record(), "{not json"])
    r = run(f)
    assert r.exit_code == 2 and "bad.jsonl" in r.output and ":2" in r.output


def test_a_file_without_records_is_a_usage_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r = run(empty)
    assert r.exit_code == 2 and "no records" in r.output


def test_help_teaches_the_sections_with_examples():
    r = CliRunner().invoke(main, ["stats", "--help"])
    assert r.exit_code == 0
    for section in S.SECTIONS:
        assert f"\n    {section} " in r.output
    assert "Examples:" in r.output and "attnmatrix stats --section time" in r.output


def test_source_file_of_an_evidence_location():
    assert S.source_file("/a/b.jsonl:12") == "/a/b.jsonl"
    assert S.source_file("/a/declared.json#fa2-sm_80") == "/a/declared.json"
    assert S.source_file("C:/odd/name") == "C:/odd/name"
