"""The evidence audit checks (matrix/audit.py): each is clean on the committed matrix and fails on the mistake it
guards against; and the committed selector keeps vLLM's MLA prefill seed rules (PR #42669) from evidence."""

from __future__ import annotations

import json

import pytest
from attnmatrix.matrix import audit as A
from attnmatrix.matrix.evidence import DATA_DIR, Evidence, Ranking, load_backends, load_evidence
from attnmatrix.matrix.records import parse_record

BACKENDS = load_backends()


@pytest.fixture(scope="module")
def committed() -> Evidence:
    return load_evidence()


@pytest.mark.slow
@pytest.mark.parametrize("check", A.CHECKS, ids=lambda c: c.__name__)
def test_committed_matrix_passes(committed, check) -> None:
    assert [str(p) for p in check(committed)] == []


def _ranking(order, sources=("vllm-project/vllm PR #34732",), op="mla_prefill") -> Ranking:
    return Ranking(id="r", archs=("sm_100",), op=op, dtype="bfloat16", head_dims=((192, 128),), order=tuple(order),
                   sources=tuple(sources), statement="", where="declared.json")


def _declared(make_record, backend, sources, **kw):
    return parse_record(make_record(tier="declared", backend=backend, sources=list(sources), **kw))


# --- a declared ranking or fact names the backend its cited source is about ---------------------------------------


def test_vllm_sourced_ranking_must_name_vllms_backend() -> None:
    bad = A.check_cited_backend(Evidence(rankings=[_ranking(["fa4", "trtllm_ragged"])], backends=BACKENDS))
    assert [(p.field, p.message.split(" is ")[0]) for p in bad] == [("rankings[r].order", "'fa4'")]
    assert A.check_cited_backend(Evidence(rankings=[_ranking(["vllm_fa4", "trtllm_ragged"])], backends=BACKENDS)) == []
    # a ranking that also cites the kernel's own source may speak of the upstream kernel
    mixed = _ranking(["fa4", "trtllm_ragged"],
                     sources=("vllm-project/vllm PR #34732", "Dao-AILab/flash-attention PR #1"))
    assert A.check_cited_backend(Evidence(rankings=[mixed], backends=BACKENDS)) == []
    # the op decides which vLLM name counts: trtllm_context has a vLLM name for prefill, none for MLA prefill
    assert A.check_cited_backend(Evidence(rankings=[_ranking(["trtllm_context"])], backends=BACKENDS)) != []


def test_vllm_sourced_fact_must_name_a_backend_vllm_runs(make_record) -> None:
    fact = _declared(make_record, "fa2", ["pypi:vllm==0.33.0(wheel):vllm/x.py#L1"])
    ev = Evidence(records=[fact], where=["declared.json#test-fact"], backends=BACKENDS)
    (p,) = A.check_cited_backend(ev)
    assert (p.file, p.field) == ("declared.json", "facts[test-fact].backend")
    fork = _declared(make_record, "fa2", ["vllm-project/flash-attention@abc:csrc/x.cpp#L1"])
    assert A.check_cited_backend(Evidence(records=[fork], where=["d#test-fact"], backends=BACKENDS)) == []
    assert A.is_vllm_source("vllm-project/vllm@4ba787ec9 (v0.33.0):vllm/a.py#L1")
    assert not A.is_vllm_source("vllm-project/vllm-ascend PR #1")


# --- the seed rules of vLLM PR #42669, from evidence ----------------------------------------------------------------


def test_mla_prefill_seed_rule() -> None:
    from attnmatrix.selector import get_mla_prefill_backend_priorities

    assert get_mla_prefill_backend_priorities((10, 0), 128, 64, 128)[0] == "FLASH_ATTN"
    assert get_mla_prefill_backend_priorities((10, 0), 192, 64, 256)[0] == "TRTLLM_RAGGED"


def test_mla_prefill_follows_the_pinned_vllm_release_everywhere() -> None:
    """On every capability and MLA triple vLLM 0.33.0 answered (by running its own selector), the committed
    selector's first name is vLLM's choice and its names come in the order of vLLM's priority list: FLASH_ATTN
    first on major 10 except GLM-5's (192, 64, 256), which goes to TRTLLM_RAGGED; FLASH_ATTN alone elsewhere."""
    from attnmatrix.selector import get_mla_prefill_backend_priorities

    answers = json.loads((DATA_DIR / "vllm" / "vllm-0.33.0-answers.json").read_text())["mla_prefill"]
    assert answers
    for r in answers:
        cap = tuple(int(x) for x in r["capability"].split("."))
        ours = get_mla_prefill_backend_priorities(cap, *r["dims"])
        assert ours[:1] == [r["backend"]], (r["capability"], r["dims"], ours, r["backend"])
        assert [n for n in r["priorities"] if n in ours] == ours, (r["capability"], r["dims"], ours, r["priorities"])
