"""benchmarks/sweep_phases.py: a sweep's wall time by phase, on the CPU."""

from __future__ import annotations

import json
import sys

from attnmatrix.matrix import workloads as W
from conftest import load_script


def test_the_sweep_runs_as_regret_py_runs_it_with_its_phases_timed(tmp_path, monkeypatch, capsys):
    P = load_script("benchmarks/sweep_phases.py")
    monkeypatch.setattr(W, "BUCKETS", {"prefill": ((1, 64), (2, 128)), "decode": ((2, 64), (4, 128))})
    monkeypatch.setattr(W, "HELD_OUT", {"prefill": ((1, 96),), "decode": ((3, 100),)})
    config = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1}
    presets = tmp_path / "models.json"
    presets.write_text(json.dumps({"schema": 1, "models": {"tiny": {
        "family": "test", "repo": "test/tiny", "file": "config.json",
        "source": "https://huggingface.co/test/tiny/blob/main/config.json", "config": config, "tp": 1,
        "layers": [{"count": 1, "type": "global", "num_heads": 4, "num_kv_heads": 2, "head_dim": 32}]}}}))
    run, phases = tmp_path / "run.jsonl", tmp_path / "phases.json"
    from attnmatrix.kernels import interleaved_timing

    measure = interleaved_timing.measure_interleaved
    workload_timing = sys.modules["workload_timing"]  # the module the script and regret.py import
    originals = (workload_timing.prepare_calls, workload_timing.first_calls, workload_timing.release)
    status = P.main(["-o", str(phases), "--", "sweep", "--backends", "sdpa_cpu", "--ops", "decode",
                     "--presets", str(presets), "--rounds", "2", "-o", str(run)])
    assert status == 0 and interleaved_timing.measure_interleaved is measure  # the phases' wrappers are gone
    out = json.loads(phases.read_text())
    # one layer call, three points (two buckets and one held-out), each built and timed once; no graphs on a CPU
    assert out["count"] == {"check": 1, "copies_of": 3, "first_calls": 3, "measure_interleaved": 3,
                            "prepare_calls": 3, "release": 3, "time_workload": 1}
    # the calls made and first run at each point, per backend
    assert set(out["per_backend_seconds"]) == {"prepare_calls:sdpa_cpu", "first_calls:sdpa_cpu"}
    assert (workload_timing.prepare_calls, workload_timing.first_calls, workload_timing.release) == originals
    assert out["seconds"]["time_workload"] >= out["seconds"]["measure_interleaved"] >= 0
    assert out["captured_calls"] == {} and out["status"] == 0 and out["sweep"][0] == "sweep"
    timed = [json.loads(line) for line in run.read_text().splitlines()]
    assert sum(r["set"] in ("bucket", "held_out") and r.get("outcome") == "pass" for r in timed) == 3
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out


def test_a_points_first_calls_are_charged_to_the_backend_just_prepared():
    import dataclasses
    from types import SimpleNamespace

    P = load_script("benchmarks/sweep_phases.py")
    workload_timing = sys.modules["workload_timing"]

    @dataclasses.dataclass
    class Problem:
        case: object = None
        page_size: int | None = None
        one_window_size: bool = False

    ran = []
    backends = [SimpleNamespace(name=n, prepare=lambda p, n=n: (lambda: ran.append(n))) for n in ("a", "b")]
    phases = P.Phases()
    undo = phases.install()
    try:
        for backend in backends:  # as time_workload does at a point: each backend's calls made, then run once
            fns = workload_timing.prepare_calls(backend, SimpleNamespace(page_size=16),
                                                SimpleNamespace(one_window_size=True), [Problem(), Problem()])
            workload_timing.first_calls(fns)
    finally:
        undo()
    assert ran == ["a", "a", "b", "b"]
    assert set(phases.per_backend) == {"prepare_calls:a", "prepare_calls:b", "first_calls:a", "first_calls:b"}
    assert phases.count == {"prepare_calls": 2, "first_calls": 2}
