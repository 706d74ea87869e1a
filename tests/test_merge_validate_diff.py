"""Merging evidence files, consistency validation, and diffs between two resolved matrices."""

from __future__ import annotations

import json
from pathlib import Path

from attnmatrix.matrix.diff import diff_matrices
from attnmatrix.matrix.evidence import Evidence, load_backends, load_evidence, read_declared
from attnmatrix.matrix.merge import merge_records
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.storage import Problem
from attnmatrix.matrix.validate import validate_evidence

BACKENDS = load_backends()

# --- merge -------------------------------------------------------------------------------------


def test_exact_duplicates_dropped_and_order_canonical(make_rec) -> None:
    a, b, c = make_rec(head_dim=64), make_rec(head_dim=128), make_rec(head_dim=64, device="NVIDIA H100")
    merged, problems = merge_records([(b, "x.jsonl:1"), (a, "x.jsonl:2"), (a, "y.jsonl:7"), (c, "y.jsonl:8"),
                                      (b, "z.jsonl:1")])
    assert problems == []
    assert len(merged) == 3 and set(map(id, merged)) <= {id(a), id(b), id(c)}
    again, _ = merge_records([(c, "1"), (b, "2"), (a, "3")])
    assert again == merged  # canonical order, independent of input order


def test_contradiction_reported_with_both_locations(make_rec) -> None:
    passed = make_rec(run_id="run-1")
    crashed = make_rec(run_id="run-1", outcome="crash", reason="SIGSEGV")
    merged, problems = merge_records([(passed, "a.jsonl:3"), (crashed, "b.jsonl:9")])
    (p,) = problems
    assert (p.file, p.line, p.field, p.record) == ("b.jsonl", 9, "outcome", passed.key)
    assert "contradicts a.jsonl:3" in p.message and "outcome: 'pass' vs 'crash'" in p.message
    assert merged == [passed]


def test_same_case_from_different_runs_is_not_a_contradiction(make_rec) -> None:
    a = make_rec(run_id="run-1")
    b = make_rec(run_id="run-2", outcome="crash", reason="SIGSEGV")
    c = make_rec(run_id="run-1", kernel_version="2.8.4", outcome="rejected", reason="no")
    merged, problems = merge_records([(a, "a:1"), (b, "b:1"), (c, "c:1")])
    assert problems == [] and len(merged) == 3


def test_timing_difference_is_a_contradiction(make_rec) -> None:
    _, problems = merge_records([(make_rec(latency_ms=1.0), "a.jsonl:1"), (make_rec(latency_ms=1.1), "a.jsonl:2")])
    assert [(p.file, p.line) for p in problems] == [("a.jsonl", 2)]


# --- validate ----------------------------------------------------------------------------------


def _ev(records_where, rankings=()):
    return Evidence(records=[r for r, _ in records_where], where=[w for _, w in records_where],
                    rankings=list(rankings), backends=BACKENDS)


def test_validate_clean_evidence(make_rec) -> None:
    ev = _ev([(make_rec(), "a.jsonl:1"), (make_rec(tier="declared"), "declared.json#f1")])
    assert validate_evidence(ev) == []


def test_unknown_backend_flagged_with_file_and_line(make_rec) -> None:
    ev = _ev([(make_rec(), "a.jsonl:1"), (make_rec(backend="fa9"), "dir/a.jsonl:2")])
    (p,) = validate_evidence(ev)
    assert (p.file, p.line, p.field) == ("dir/a.jsonl", 2, "case.backend")
    assert "'fa9'" in p.message and p.record == "sm_90/fa9/prefill/bfloat16/128x128/causal"
    assert str(p).startswith("dir/a.jsonl:2 [sm_90/fa9/")


def test_validate_reports_every_problem(make_rec, make_record) -> None:
    from attnmatrix.matrix.records import parse_record

    no_error = make_record()
    del no_error["error"]
    ev = _ev([
        (make_rec(backend="nosuch"), "a.jsonl:1"),
        (make_rec(arch="cpu", backend="sdpa_cpu", tier="declared"), "a.jsonl:2"),
        (parse_record(no_error), "a.jsonl:3"),
        (make_rec(run_id="r"), "a.jsonl:4"),
        (make_rec(run_id="r", outcome="wrong"), "b.jsonl:5"),
    ])
    got = sorted((p.file, p.line, p.field) for p in validate_evidence(ev))
    assert got == [("a.jsonl", 1, "case.backend"), ("a.jsonl", 2, "tier"), ("a.jsonl", 3, "error"),
                   ("b.jsonl", 5, "outcome")]


def test_conflicting_declared_facts_flagged(make_rec) -> None:
    yes = make_rec(tier="declared", provenance={"declared_id": "fact-yes"})
    no = make_rec(tier="declared", outcome="rejected", reason="no", provenance={"declared_id": "fact-no"})
    other_version = make_rec(tier="declared", outcome="rejected", reason="no", kernel_version="1.0",
                             provenance={"declared_id": "fact-old"})
    ev = _ev([(yes, "d.json#fact-yes"), (no, "d.json#fact-no"), (other_version, "d.json#fact-old")])
    (p,) = validate_evidence(ev)
    assert (p.file, p.field) == ("d.json", "facts")
    assert "fact-no=rejected" in p.message and "fact-yes=pass" in p.message and "fact-old" not in p.message
    assert p.record == "sm_90/fa2/prefill/bfloat16/128x128/causal"  # the cell's case key


def test_declared_file_problems_are_located(tmp_path: Path) -> None:
    fact = {"id": "f1", "backend": "fa2", "archs": ["sm_90"], "ops": ["prefill"], "dtypes": ["bfloat16"],
            "head_dims": [[128, 128]], "feature_sets": [["causal"]], "outcome": "pass", "date": "2026-11-30",
            "sources": ["x@y:z#L1"]}
    bad_fact = {**fact, "id": "f2", "outcome": "rejected"}  # no reason and no statement
    missing = {k: v for k, v in fact.items() if k != "sources"} | {"id": "f3"}
    ranking = {"id": "r1", "archs": ["sm_90"], "op": "prefill", "head_dims": [[128, 128]], "order": ["fa9"],
               "sources": ["PR"]}
    path = tmp_path / "declared.json"
    path.write_text(json.dumps({"schema": 1, "facts": [fact, bad_fact, missing, fact], "rankings": [ranking]}))
    problems: list[Problem] = []
    ev = read_declared(path, problems)
    got = sorted((p.field, p.record) for p in problems)
    assert got == [("facts[1].reason", "f2"), ("facts[2].sources", "f3"), ("facts[3].id", "f1")]
    ev.backends = BACKENDS
    val = validate_evidence(ev)
    assert [(p.file, p.field, "fa9" in p.message) for p in val] == [(str(path), "rankings[r1].order", True)]


def test_embedded_matrix_is_valid() -> None:
    problems: list[Problem] = []
    ev = load_evidence(problems=problems)
    problems += validate_evidence(ev)
    assert problems == []
    assert ev.records


# --- diff --------------------------------------------------------------------------------------


def _m(records):
    return resolve(Evidence(records=list(records), where=["x"] * len(records), backends=BACKENDS))


def test_diff_reports_every_kind(make_rec) -> None:
    def r(hd, **kw):
        return make_rec(head_dim=hd, **kw)

    a = _m([r(32), r(64), r(96, outcome="rejected", reason="no"), r(128, latency_ms=1.0), r(160, latency_ms=1.0),
            r(192, latency_ms=1.0), r(224, tier="declared"), r(256, outcome="unavailable", reason="import")])
    b = _m([r(64), r(80), r(96), r(128, latency_ms=0.5), r(160, latency_ms=2.0), r(192, latency_ms=1.05),
            r(224, tier="compiled"), r(256, outcome="crash", reason="boom")])
    got = {(c.kind, c.key.split("/")[4]) for c in diff_matrices(a, b)}
    assert got == {
        ("removed", "32x32"), ("added", "80x80"), ("gained", "96x96"), ("faster", "128x128"),
        ("slower", "160x160"), ("tier", "224x224"), ("status", "256x256"),
    }
    back = {(c.kind, c.key.split("/")[4]) for c in diff_matrices(b, a)}
    assert ("lost", "96x96") in back and ("added", "32x32") in back and ("removed", "80x80") in back
    assert diff_matrices(a, a) == []


def test_diff_threshold(make_rec) -> None:
    a = _m([make_rec(latency_ms=1.0)])
    b = _m([make_rec(latency_ms=1.05)])
    assert diff_matrices(a, b) == []
    (c,) = diff_matrices(a, b, speed_threshold=0.01)
    assert c.kind == "slower" and c.to_json() == {"kind": "slower", "cell": c.key, "before": "1 ms",
                                                  "after": "1.05 ms"}
