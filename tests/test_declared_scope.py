"""Declared facts with a scope: one fact in declared.json, one declared record per cell of its scope."""

from __future__ import annotations

import json

import pytest
from attnmatrix.matrix.cases import ARCHS, DTYPES, HEAD_DIMS, MLA_TRIPLES
from attnmatrix.matrix.evidence import expand_fact, load_evidence, read_declared
from attnmatrix.matrix.policy import UNSUPPORTED, resolve

FACT = {"id": "no-sinks", "backend": "fa2", "archs": "*", "ops": "*", "dtypes": "*", "head_dims": "*",
        "feature_sets": "*", "requires": ["sinks"], "outcome": "rejected", "reason": "no sinks argument",
        "date": "2026-12-01", "sources": ["somewhere#L1"], "statement": "no sinks argument"}


def test_a_star_scope_covers_every_head_dim_op_and_dtype():
    recs = expand_fact(FACT)
    cells = {(r.case.arch, r.case.op, r.case.dtype, r.case.head_dim, r.case.head_dim_v) for r in recs}
    for arch in ARCHS:
        for dtype in DTYPES:
            for hd, hdv in HEAD_DIMS:
                assert (arch, "prefill", dtype, hd, hdv) in cells and (arch, "decode", dtype, hd, hdv) in cells
    assert all(r.case.has("sinks") for r in recs)
    assert all(r.reason == "no sinks argument" and r.tier == "declared" for r in recs)


def test_mla_prefill_in_a_star_scope_is_one_cell_per_triple():
    mla = [r.case for r in expand_fact(FACT) if r.case.op == "mla_prefill" and r.case.arch == "sm_90"
           and r.case.dtype == "bfloat16"]
    assert sorted(c.mla_triple for c in mla) == sorted(MLA_TRIPLES)


def test_requires_narrows_and_excludes_removes():
    paged = {r.case.page_size for r in expand_fact({**FACT, "requires": ["paged_kv"]})}
    assert paged == {16, 64, 128, 256}
    no_paged = expand_fact({**FACT, "requires": ["causal"], "excludes": ["paged_kv", "sinks"]})
    assert no_paged and not any(r.case.has("paged_kv") or r.case.has("sinks") for r in no_paged)


def test_listed_axes_still_work_and_stay_totals():
    fact = {k: v for k, v in FACT.items() if k != "requires"}
    recs = expand_fact({**fact, "ops": ["mla_prefill"], "head_dims": [[192, 128]], "feature_sets": [["causal"]],
                        "archs": ["sm_90"], "dtypes": ["bfloat16"]})
    assert [r.case.key for r in recs] == ["sm_90/fa2/mla_prefill/bfloat16/192x128/causal"]


@pytest.mark.parametrize("change,field", [
    ({"head_dims": "all"}, "head_dims"),
    ({"archs": []}, "archs"),
    ({"requires": "sinks"}, "requires"),
    ({"feature_sets": [["causal", "sinks"]]}, "requires"),  # requires narrows a "*" scope only
])
def test_a_malformed_scope_is_reported_with_its_field(tmp_path, change, field):
    fact = {k: v for k, v in {**FACT, **change}.items() if v is not None}
    path = tmp_path / "declared.json"
    path.write_text(json.dumps({"schema": 1, "facts": [fact]}))
    problems = []
    read_declared(path, problems)
    assert problems and problems[0].field == f"facts[0].{field}", problems


@pytest.mark.slow
def test_embedded_no_sinks_facts_answer_at_every_head_dim():
    m = resolve(load_evidence())
    for hd in (32, 80, 160, 224):
        cell = m.cells[("sm_89", "fa2", "decode", "bfloat16", hd, hd, ("causal", "sinks"))]
        assert cell.status == UNSUPPORTED
        cell = m.cells[("sm_120", "vllm_fa2", "prefill", "float16", hd, hd, ("causal", "sinks"))]
        assert cell.status == UNSUPPORTED and "s_aux" in cell.reason
