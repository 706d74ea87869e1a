"""benchmarks/batch_axis.py: placing a decode batch between two timed batches, judged on a scan of every batch."""

from __future__ import annotations

import json
import math

import pytest
from conftest import load_script


def _axis():
    return load_script("benchmarks/batch_axis.py")


def _scan_rows(times, heads=(8, 8), device="NVIDIA H200"):
    """A scan file's rows: times = {backend: {batch: ms}} at one context."""
    call = {"layer": "m:l", "op": "decode", "arch": "sm_90", "heads_q": heads[0], "heads_kv": heads[1],
            "device": device, "case": "sm_90/x/decode/bfloat16/128x128/none"}
    rows = [{**call, "backend": b, "set": "check", "outcome": "pass"} for b in times]
    rows += [{**call, "backend": b, "set": "scan", "outcome": "pass", "batch": n, "length": 2048, "ms": ms,
              "rounds": [ms, ms]} for b, t in times.items() for n, ms in t.items()]
    return rows


def _stepping(batches, per_sequence=8, per_wave=132):
    """A kernel whose time is its number of waves: flat within one, a step where the batch fills another."""
    return {b: 10.0 * math.ceil(b * per_sequence / per_wave) for b in batches}


def test_share_reads_log_space_or_waves():
    A = _axis()
    assert A.share(16, 16, 24) == 0.0 and A.share(16, 24, 24) == 1.0
    assert abs(A.share(16, 20, 24) - math.log(20 / 16) / math.log(24 / 16)) < 1e-12
    # 8 blocks a sequence, 132 a wave: batch 16 fills one wave, 17 to 33 the second
    assert A.share(16, 17, 24, (8, 132)) == 1.0
    assert A.share(12, 14, 16, (8, 132)) == math.log(14 / 12) / math.log(16 / 12)  # one wave all along: log space


def test_a_kernel_that_steps_by_waves_is_read_in_waves_and_a_smooth_one_is_not():
    A = _axis()
    batches = range(1, 97)
    smooth = {b: 10.0 + 0.6 * b for b in batches}
    assert A.wave_model([_stepping(A.GRIDS[next(iter(A.GRIDS))])], (32, 8), 132) == (8, 132)
    assert A.wave_model([{b: smooth[b] for b in (1, 2, 4, 8, 16, 32, 64)}], (32, 8), 132) is None
    # x doubles where the batch takes a second wave (17); y, a little slower in one wave, steps less: from batch 17
    # on y is faster, but interpolating between 16 and 24 reads x's step and y's as if both grew smoothly
    rows = _scan_rows({"x": _stepping(batches), "y": {b: 10.2 if b <= 16 else 18.0 for b in batches}})
    lines = A.batch_lines(rows)
    placed = A.place(lines, tuple(A.GRIDS.values())[0], 132)
    interp = {p[3]: p for p in placed["interpolate"]}
    waves = {p[3]: p for p in placed["waves"]}
    assert interp[17][4] == "x" and interp[17][0] > 1.1 and waves[17][4] == "y" and waves[17][0] == 1.0
    assert A.summary([p[0] for p in placed["waves"]])["max"] < A.summary([p[0] for p in placed["interpolate"]])["max"]


def test_main_writes_its_summary_and_names_a_missing_sm_count(tmp_path, capsys):
    A = _axis()
    scan = tmp_path / "scan-x-decode-batch.jsonl"
    scan.write_text("".join(json.dumps(r) + "\n" for r in _scan_rows({"x": _stepping(range(1, 41))})))
    out = tmp_path / "summary.json"
    assert A.main([str(scan), "-o", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["sms"] == 132 and result["lines"] == 1
    grid = result["grids"][next(iter(A.GRIDS))]
    # batches 1-40 less the grid's 10 up to 32, less 33-40, past the last grid batch the scan reached
    assert grid["rules"]["interpolate"]["points"] == 22
    # what a grid costs: its decode bucket points a layer call; the factor-1.5 axis first, the workload grid's as
    # many as the sweep times
    assert grid["decode_points"] == len(A.W.GRID_BY_1_5["decode"])
    workload = next(g for g in result["grids"].values() if g["batches"] == A.W.DECODE_BATCHES)
    assert workload["batches"] == A.W.DECODE_BATCHES and workload["decode_points"] == len(A.W.BUCKETS["decode"])
    costs = [result["grids"][name]["decode_points"] for name in A.GRIDS]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)  # each grid denser than the one before
    assert f"{grid['decode_points']} decode bucket points a layer call (1.00x" in capsys.readouterr().out
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in _scan_rows({"x": {1: 1.0, 2: 2.0}}, device="Some GPU")))
    with pytest.raises(SystemExit):
        A.main([str(other)])
    assert "no known SM count" in capsys.readouterr().err
    assert A.main([str(other), "--sms", "100"]) == 0


def test_two_calls_compared_point_by_point_at_captured_and_at_padded_batches():
    A = _axis()
    base = _scan_rows({"v": {4: 1.0, 5: 1.0, 8: 2.0}, "u": {5: 3.0}})
    padded = _scan_rows({"v": {4: 1.0, 5: 1.5, 8: 2.0}, "u": {5: 3.0}, "w": {5: 9.0}})
    ratios = A.call_ratios(padded, base)
    # vLLM runs 4 and 8 as they are and pads 5 to 8; a backend in one scan only is not compared
    assert ratios["v"]["captured"]["points"] == 2 and ratios["v"]["captured"]["max"] == 1.0
    assert ratios["v"]["padded"]["geomean"] == 1.5 and ratios["u"]["padded"]["max"] == 1.0 and "w" not in ratios
