"""Matrix snapshots: what the changelog diffs against must round-trip what a diff compares."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnmatrix.matrix.diff import diff_matrices
from attnmatrix.matrix.evidence import Evidence, load_backends
from attnmatrix.matrix.history import dump_snapshot, load_snapshot
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.records import parse_record
from attnmatrix.matrix.storage import InputError


def _rec(backend: str, hd: int, outcome: str, latency: float | None = None) -> dict:
    d = {"schema": 1, "tier": "validated", "outcome": outcome,
         "case": {"arch": "sm_90", "backend": backend, "op": "prefill", "dtype": "bfloat16", "head_dim": hd,
                  "head_dim_v": hd, "features": ["causal"]},
         "provenance": {"device": "H200", "kernel_version": "1.0", "torch": "2.11", "date": "2026-11-30"}}
    if outcome == "pass":
        d["error"] = {"max_abs_err": 0.001}
        d["timings"] = [{"shape": "s", "latency_ms": latency}]
    else:
        d["reason"] = "refused"
    return d


def _matrix(*dicts: dict):
    ev = Evidence(backends=load_backends())
    for i, d in enumerate(dicts):
        ev.add(parse_record(d), f"t.jsonl:{i + 1}")
    return resolve(ev)


def test_snapshot_round_trips_what_diff_compares(tmp_path: Path) -> None:
    m = _matrix(_rec("fa4", 128, "pass", 1.0), _rec("fa2", 128, "rejected"), _rec("fa4", 256, "pass", 2.0))
    path = tmp_path / "previous.jsonl"
    path.write_text(dump_snapshot(m, "abc"), encoding="utf-8")
    mid, back = load_snapshot(path, m.backends)
    assert mid == "abc"
    assert diff_matrices(back, m) == []
    assert dump_snapshot(back, "abc") == dump_snapshot(m, "abc")
    assert sorted(c.latency_ms for c in back.cells.values() if c.latency_ms) == [1.0, 2.0]


def test_snapshot_diff_sees_changes(tmp_path: Path) -> None:
    old = _matrix(_rec("fa4", 128, "pass", 1.0), _rec("fa2", 128, "rejected"))
    path = tmp_path / "previous.jsonl"
    path.write_text(dump_snapshot(old, "old"), encoding="utf-8")
    _, back = load_snapshot(path, old.backends)
    new = _matrix(_rec("fa4", 128, "pass", 2.0), _rec("fa2", 128, "pass", 1.0), _rec("fa4", 256, "pass", 1.0))
    kinds = sorted(c.kind for c in diff_matrices(back, new))
    assert kinds == ["added", "gained", "slower"]


def test_broken_snapshot_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "previous.jsonl"
    path.write_text('{"schema": 1, "matrix_id": "x"}\n{"case": {}}\n', encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_snapshot(path, {})
    assert e.value.problems[0].line == 2
