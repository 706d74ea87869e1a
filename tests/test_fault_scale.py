"""Faults at scale, in CI: a `fake_chaos` sweep survives crashing kernels and two SIGKILLs of its runner.

The small sibling of `benchmarks/reliability.py` (same harness): 104 cases, every one of the six faults
injected at least once, the runner (`attnmatrix probe`) killed twice at random points and restarted.
The result file alone must show every case exactly once with the outcome its fault calls for.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest
from attnmatrix.kernels.fakes import CHAOS_EXPECTED, CHAOS_FAULTS, chaos_fault
from attnmatrix.matrix.storage import read_records

ROOT = Path(__file__).resolve().parents[1]
HEAD_DIMS = "104,120"  # 104 cases; by the hash of their keys, all six faults occur (asserted below)


def _harness():
    spec = importlib.util.spec_from_file_location("attnmatrix_reliability", ROOT / "benchmarks" / "reliability.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL/prctl semantics and /proc are Linux's")
def test_chaos_sweep_survives_faults_and_kills(tmp_path: Path) -> None:
    rel = _harness()
    cases = rel.sweep_cases(HEAD_DIMS, rel.DTYPES)
    faults = Counter(chaos_fault(c.key) for c in cases)
    assert 100 <= len(cases) <= 200
    assert all(faults[f] >= 1 for f in CHAOS_FAULTS), faults

    res = rel.run_reliability(tmp_path, head_dims=HEAD_DIMS, kills=2, seed=1, timeout_s=5.0, memory_limit_mb=1024,
                              workers=3, max_kill_delay_s=4.0, deadline_s=110.0, log=lambda s: None)

    assert res["kills"] == 2
    assert res["results_lost"] == 0 and res["lost_cases"] == []
    assert res["duplicates"] == 0 and res["foreign_records"] == 0
    assert res["records"] == res["cases"] == len(cases)
    assert res["outcome_mismatches"] == 0, res["mismatch_examples"]
    assert res["faults_survived"] == res["faults_injected_total"] == sum(faults[f] for f in CHAOS_FAULTS)
    assert res["correct_passed"] == res["correct_cases"] == faults[None]
    assert res["orphaned_workers"] == 0, "a worker outlived its SIGKILLed runner"
    assert res["validate_exit_code"] == 0

    # Independently of the harness's own bookkeeping: read the file and check every case.
    records = read_records(tmp_path / "chaos.jsonl")
    per_key = Counter(r.key for _, r in records)
    assert set(per_key) == {c.key for c in cases} and set(per_key.values()) == {1}
    for _, rec in records:
        fault = chaos_fault(rec.key)
        assert rec.outcome == CHAOS_EXPECTED[fault], (rec.key, fault, rec.outcome, rec.reason)
        if fault == "segfault":
            assert "SIGSEGV" in (rec.reason or "")
        elif fault == "oom":
            assert (rec.reason or "").startswith("out of memory")
        elif fault == "hang":
            assert "no result within" in (rec.reason or "")
