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


# --- an API that takes no page table cannot be supported with paged KV ----------------------------------------------


def test_no_page_table_backend_cannot_pass_with_paged_kv(make_rec) -> None:
    shipped = parse_record({"schema": 1, "tier": "shipped", "outcome": "shipped", "reason": "kernel k",
                            "case": {"arch": "sm_100", "backend": "trtllm_ragged", "op": "prefill",
                                     "dtype": "bfloat16", "head_dim": 192, "head_dim_v": 128,
                                     "features": ["causal", "paged_kv:64"]},
                            "provenance": {"library": "flashinfer-cubin", "kernel_version": "0.6.13",
                                           "date": "2026-06-24"}, "sources": ["pypi:flashinfer-cubin==0.6.13:x.h#L1"]})
    (p,) = A.check_page_table(Evidence(records=[shipped], where=["x.jsonl:3"], backends=BACKENDS))
    assert (p.file, p.line, p.field) == ("x.jsonl", 3, "outcome") and "takes no block table" in p.message
    refused = make_rec(backend="trtllm_ragged", features=("causal", "paged_kv:64"), outcome="rejected", reason="no")
    unpaged = make_rec(backend="trtllm_ragged", features=("causal",))
    fa2 = make_rec(backend="fa2", features=("causal", "paged_kv:256"))  # fa2 takes a block table
    ev = Evidence(records=[refused, unpaged, fa2], where=["a:1", "a:2", "a:3"], backends=BACKENDS)
    assert A.check_page_table(ev) == []


# --- no reason text carries a machine path --------------------------------------------------------------------------


def test_machine_paths_are_found_and_cut() -> None:
    from attnmatrix.matrix.machine_paths import machine_paths, scrub_machine_paths

    text = ("cubins are not installed (/root/.cache/flashinfer/cubins/f500/fmha/checksums.txt is missing); "
            "File \"/work/main/kernels/worker.py\"; `/usr/local/cuda/bin/nvcc`; "
            "/opt/venv/lib/python3.12/site-packages/flashinfer/jit/core.py")
    assert len(machine_paths(text)) == 4
    cut = scrub_machine_paths(text)
    assert machine_paths(cut) == []
    assert "<cache>/flashinfer/cubins/f500/fmha/checksums.txt" in cut and "<...>/kernels/worker.py" in cut
    assert "<site-packages>/flashinfer/jit/core.py" in cut and "<...>/bin/nvcc" in cut
    clean = "see https://github.com/a/b, SM100/SM110, q/k/v, head_dim / 8, flash_attn/cute/interface.py#L1"
    assert machine_paths(clean) == [] and scrub_machine_paths(clean) == clean


def test_a_machine_path_in_a_reason_is_a_problem_and_writing_cuts_it(make_rec, tmp_path) -> None:
    from attnmatrix.matrix.storage import read_records, write_records

    rec = make_rec(outcome="unavailable", reason="cubins are not installed (/root/.cache/fi/cubins/x.txt is missing)")
    (p,) = A.check_no_machine_paths(Evidence(records=[rec], where=["r.jsonl:7"], backends=BACKENDS))
    assert (p.file, p.line, p.field) == ("r.jsonl", 7, "reason")
    write_records(tmp_path / "r.jsonl", [rec])
    ((_, back),) = read_records(tmp_path / "r.jsonl")
    assert back.reason == "cubins are not installed (<cache>/fi/cubins/x.txt is missing)"
    assert A.check_no_machine_paths(Evidence(records=[back], where=["r.jsonl:1"], backends=BACKENDS)) == []


# --- a declared refusal that overrules a kernel overrules every cell that kernel answers ----------------------------


def _shipped(features, outcome="shipped"):
    return parse_record({"schema": 1, "tier": "shipped", "outcome": outcome, "reason": "kernel k",
                         "case": {"arch": "sm_100", "backend": "trtllm_context", "op": "prefill", "dtype": "bfloat16",
                                  "head_dim": 80, "head_dim_v": 80, "features": list(features)},
                         "provenance": {"library": "flashinfer-cubin", "kernel_version": "0.6.13",
                                        "date": "2026-06-24"},
                         "sources": ["pypi:flashinfer-cubin==0.6.13:x.h#L1"]})


def test_a_refusal_over_a_kernel_must_cover_its_other_cells(make_record) -> None:
    fact = _declared(make_record, "trtllm_context", ["NVIDIA/TensorRT-LLM@abc:trtllm_gen.py#L1"], arch="sm_100",
                     head_dim=80, features=("causal",), outcome="rejected", reason="[Context] Head size 80")
    recs = [fact, _shipped(("causal",)), _shipped(("causal", "gqa")), _shipped(())]
    ev = Evidence(records=recs, where=["declared.json#test-fact", "s:1", "s:2", "s:3"], backends=BACKENDS)
    (p,) = A.check_refusal_covers_kernel(ev)  # causal+gqa; the dense cell () is another mask, not covered
    assert p.record.endswith("causal+gqa") and p.field == "facts[test-fact].feature_sets" and p.file == "declared.json"
    wider = [_declared(make_record, "trtllm_context", ["NVIDIA/TensorRT-LLM@abc:trtllm_gen.py#L1"], arch="sm_100",
                       head_dim=80, features=f, outcome="rejected", reason="no")
             for f in (("causal",), ("causal", "gqa"))]
    ev = Evidence(records=[*wider, *recs[1:]], where=["d#test-fact", "d#test-fact", "s:1", "s:2", "s:3"],
                  backends=BACKENDS)
    assert A.check_refusal_covers_kernel(ev) == []


# --- what the entry point cannot express, it cannot express on any cell ----------------------------------------------


def test_an_api_refusal_covers_every_cell_with_the_feature(make_rec) -> None:
    why = "attnmatrix: the API cannot express this case: no descale parameter"
    refused = [make_rec(tier="compiled", backend="fa4", arch="sm_100", features=("causal", "fp8"), head_dim=hd,
                        outcome="rejected", reason=why) for hd in (64, 128)]
    old_pass = make_rec(tier="compiled", backend="fa4", arch="sm_100", features=("causal", "fp8"), op="mla_prefill",
                        head_dim=192, head_dim_v=128, outcome="compiled")
    unrelated = make_rec(tier="compiled", backend="fa4", arch="sm_100", features=("causal",), outcome="compiled")
    recs = [*refused, old_pass, unrelated]
    ev = Evidence(records=recs, where=[f"c.jsonl:{i + 1}" for i in range(len(recs))], backends=BACKENDS)
    (p,) = A.check_api_refusal_covers_feature(ev)
    assert (p.file, p.line, p.record) == ("c.jsonl", 3, old_pass.key) and "fp8" in p.message
    other_arch = make_rec(tier="compiled", backend="fa4", arch="sm_90", features=("causal", "fp8"), op="mla_prefill",
                          head_dim=192, head_dim_v=128, outcome="compiled")
    ev = Evidence(records=[*refused, other_arch, unrelated], where=["c:1", "c:2", "c:3", "c:4"], backends=BACKENDS)
    assert A.check_api_refusal_covers_feature(ev) == []


# --- the output dtype is part of validation -------------------------------------------------------------------------


def test_a_positive_record_of_another_output_dtype_is_a_problem(make_rec) -> None:
    fp16_fp8 = make_rec(backend="vllm_fa3", features=("causal", "fp8"), dtype="float16")
    bf16_fp8 = make_rec(backend="vllm_fa3", features=("causal", "fp8"), dtype="bfloat16")
    refused = make_rec(backend="vllm_fa3", features=("causal", "fp8"), dtype="float16", outcome="rejected", reason="x")
    # trtllm decode takes an out_dtype argument: no one fp8 output dtype
    trtllm = make_rec(backend="trtllm_decode", op="decode", features=("causal", "fp8"), dtype="float16")
    said = make_rec(backend="fa2", features=("causal",), dtype="float16", extra={"out_dtype": "bfloat16"})
    recs = [fp16_fp8, bf16_fp8, refused, trtllm, said]
    ev = Evidence(records=recs, where=[f"v.jsonl:{i + 1}" for i in range(len(recs))], backends=BACKENDS)
    assert [(p.line, p.field) for p in A.check_output_dtype(ev)] == [(1, "case.dtype"), (5, "case.dtype")]
    # vLLM's FA4 dequantizes fp8 K/V in the kernel on major 9 and writes the case's dtype there
    sm90 = make_rec(backend="vllm_fa4", features=("causal", "fp8"), dtype="float16", arch="sm_90")
    assert A.check_output_dtype(Evidence(records=[sm90], where=["v:1"], backends=BACKENDS)) == []


# --- MLA masks are what the case says -------------------------------------------------------------------------------


def test_an_mla_record_must_have_run_the_case_mask(make_rec) -> None:
    mla = {"op": "mla_prefill", "head_dim": 192, "head_dim_v": 128}
    old = make_rec(features=("qk_rope:64",), **mla)  # no extra.mask: from before masks followed the case
    wrong = make_rec(features=("qk_rope:64",), extra={"mask": "causal"}, **mla)
    right = make_rec(features=("qk_rope:64",), extra={"mask": "none"}, **mla)
    causal = make_rec(features=("causal", "qk_rope:64"), **mla)  # causal was always run causal
    decode = make_rec(op="decode", features=(), extra={"mask": "causal"})  # one query token: the same call
    recs = [old, wrong, right, causal, decode]
    ev = Evidence(records=recs, where=[f"m.jsonl:{i + 1}" for i in range(len(recs))], backends=BACKENDS)
    assert [p.line for p in A.check_mla_mask(ev)] == [1, 2]
