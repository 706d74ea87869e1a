"""benchmarks/retime_ratio.py: old per-call latency over GPU time, paired by case and shape."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("retime_ratio", Path(__file__).parent.parent / "benchmarks" /
                                               "retime_ratio.py")
retime_ratio = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(retime_ratio)


def test_each_old_shape_is_divided_by_its_gpu_time(results_dir, make_record, write_jsonl):
    gpu = [{"shape": "a", "latency_ms": 1.0, "method": "cuda_graph"}, {"shape": "b", "latency_ms": 2.0,
                                                                        "method": "cuda_graph"}]
    write_jsonl(results_dir / "old.jsonl", [
        make_record(backend="fa4", timings=[{"shape": "a", "latency_ms": 1.5}, {"shape": "b", "latency_ms": 5.0}]),
        make_record(backend="fa2", timings=[{"shape": "a", "latency_ms": 9.0}]),  # never re-timed: no pair
    ])
    write_jsonl(results_dir / "new.jsonl", [make_record(backend="fa4", date="2026-12-01", timings=gpu)])
    assert retime_ratio.ratios("sm_90", results_dir) == {"fa4": [1.5, 2.5]}
    assert retime_ratio.summary([1.5, 2.5])["median"] == 2.0
