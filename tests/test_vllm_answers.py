"""vLLM's answers (attnmatrix/engines/vllm/answers.py): the answers file's schema, stable text and refusals, and the
committed answers: that they cover the comparison's question space, hold the attention backend choices the
comparison relies on, and (where ATTNMATRIX_VLLM_WHEEL names a vLLM wheel or its extracted tree) equal a fresh run
of that release's code. The oracle that writes them: tests/test_vllm_oracle.py."""

from __future__ import annotations

import json
import os

import pytest

from attnmatrix.engines.vllm import answers as A
from attnmatrix.engines.vllm import names as V
from attnmatrix.engines.vllm import oracle as O
from attnmatrix.engines.vllm import release as R

# --- the answers file --------------------------------------------------------------------------------------------

def _doc() -> dict:
    return {"schema": A.ANSWERS_SCHEMA, "vllm": {"version": "9.9.9", "wheel": None, "wheel_sha256": None},
            "executed_files": [{"path": "vllm/a.py", "sha256": "0" * 64, "in_record": True}],
            "flash_attn_version": [
                {"capability": "9.0", "head_size": 128, "head_size_v": 128, "requires_alibi": False,
                 "has_sinks": False, "requires_softcap": False, "kv_cache_block_size": None, "version": 3, "log": []}],
            "mla_prefill": [
                {"capability": "9.0", "dims": [128, 64, 128], "dtype": "bfloat16", "priorities": ["FLASH_ATTN"],
                 "refused": [], "backend": "FLASH_ATTN", "fa_version": 3, "pads_v": False, "log": []}]}


def test_answers_file_round_trip_stable_text_and_lookup(tmp_path):
    p = tmp_path / "a.json"
    assert A.write_answers(_doc(), p) is True
    assert A.write_answers(_doc(), p) is False  # the same answers: the same bytes
    text = p.read_text()
    assert text == A.dumps_answers(json.loads(text))
    assert len([ln for ln in text.splitlines() if '"capability"' in ln]) == 2  # one answer per line
    a = A.load_answers(p)
    assert a.version == "9.9.9" and a.fa((9, 0), 128, 128)["version"] == 3 and a.fa((9, 0), 64, 64) is None
    assert a.mla((9, 0), (128, 64, 128), "bfloat16")["backend"] == "FLASH_ATTN"


def test_answers_file_refuses_to_replace_another_file(tmp_path):
    p = tmp_path / "notes.json"
    p.write_text('{"mine": true}\n')
    with pytest.raises(A.OracleError, match="not a vLLM answers file"):
        A.write_answers(_doc(), p)
    assert p.read_text() == '{"mine": true}\n'


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d.update(schema="other/1"), "schema"),
    (lambda d: d.pop("mla_prefill"), "missing fields mla_prefill"),
    (lambda d: d["flash_attn_version"][0].pop("version"), r"flash_attn_version\[0\]: missing version"),
])
def test_answers_file_errors_name_the_field(tmp_path, edit, match):
    d = _doc()
    edit(d)
    p = tmp_path / "a.json"
    p.write_text(json.dumps(d))
    with pytest.raises(A.OracleError, match=match):
        A.load_answers(p)


# --- the committed answers ---------------------------------------------------------------------------------------

def test_committed_answers_cover_the_comparisons_question_space():
    a = V.default_answers()
    assert a.version == V.PINNED_VLLM
    assert {q.key() for q in O.fa_queries()} == {
        O.FaQuery(A.parse_capability(r["capability"]), r["head_size"], r["head_size_v"], r["requires_alibi"],
                  r["has_sinks"], r["requires_softcap"], r["kv_cache_block_size"]).key()
        for r in a.doc["flash_attn_version"]}
    assert {q.key() for q in O.mla_queries()} == {
        (A.parse_capability(r["capability"]), tuple(r["dims"]), r["dtype"]) for r in a.doc["mla_prefill"]}
    assert {q.key() for q in O.backend_queries()} == {
        O.BackendQuery(A.parse_capability(r["capability"]), r["head_size"], r["dtype"], r["has_sink"],
                       r["has_sliding_window"], r["block_size"], r["kv_cache_dtype"]).key()
        for r in a.doc["attention_backend"]}
    assert a.doc["vllm"]["wheel_sha256"] and all(f["in_record"] for f in a.doc["executed_files"])


WHEEL = os.environ.get("ATTNMATRIX_VLLM_WHEEL")


@pytest.mark.skipif(not WHEEL, reason="set ATTNMATRIX_VLLM_WHEEL to a vLLM wheel or its extracted tree")
def test_committed_answers_equal_a_fresh_run_of_the_release():
    committed = V.default_answers().doc
    with R.open_release(WHEEL) as rel:
        assert rel.version == committed["vllm"]["version"]
        fresh = O.run_answers(rel)
    for k in ("flash_attn_version", "mla_prefill", "attention_backend", "executed_files"):
        assert fresh[k] == committed[k], k
    # the seed checks, from vLLM's own code: FLASH_ATTN on Hopper for DeepSeek's dims; TRTLLM_RAGGED first for
    # GLM-5's on (10, 0)
    mla = {(r["capability"], tuple(r["dims"]), r["dtype"]): r for r in fresh["mla_prefill"]}
    assert mla[("9.0", (128, 64, 128), "bfloat16")]["priorities"] == ["FLASH_ATTN"]
    assert mla[("10.0", (192, 64, 256), "bfloat16")]["backend"] == "TRTLLM_RAGGED"


# Seed checks of the whole decision, read off vLLM 0.33.0's source (platforms/cuda.py _get_backend_priorities:
# FLASHINFER first on capability major 10, FLASH_ATTN first elsewhere; flash_attn.py supports_sink: capability
# 9.0 and up; flashinfer.py get_supported_head_sizes: 64, 128, 256, ...): the committed answers must say the same.
BACKEND_CASES = [
    ((9, 0), 128, {}, "FLASH_ATTN", []),
    ((10, 0), 128, {}, "FLASHINFER", []),
    ((12, 0), 128, {}, "FLASH_ATTN", []),
    ((8, 0), 128, {"has_sink": True}, "TRITON_ATTN", ["FLASH_ATTN", "FLASHINFER"]),
    ((9, 0), 96, {}, "FLASH_ATTN", []),
]


@pytest.mark.parametrize("cap, head, params, backend, refused_before", BACKEND_CASES)
def test_committed_attention_backend_choices(cap, head, params, backend, refused_before):
    r = V.default_answers().backend(cap, head, "bfloat16", **params)
    assert r["backend"] == backend, r
    first = r["priorities"].index(backend)
    assert [n for n, _ in r["refused"] if r["priorities"].index(n) < first] == refused_before
    assert r["priorities"][0] == ("FLASHINFER" if cap[0] == 10 else "FLASH_ATTN")


def test_a_routed_cell_is_not_a_flash_attention_answer():
    a = V.default_answers()
    c = V.vllm_choice(a, "sm_100", "prefill", "bfloat16", 128, 128, ("causal",))
    assert (c.backend, c.label, c.routed) == (None, "FLASHINFER", True)
    c = V.vllm_choice(a, "sm_80", "decode", "bfloat16", 128, 128, ("causal", "sinks"))
    assert (c.label, c.routed) == ("TRITON_ATTN", True) and "sink not supported on compute capability" in c.why
    c = V.vllm_choice(a, "sm_90", "prefill", "bfloat16", 128, 128, ("causal",))
    assert (c.backend, c.routed) == ("vllm_fa3", False) and "picks FLASH_ATTN" in c.why
    # a V head size of its own: the backend choice at the query/key head size, the version helper with both
    c = V.vllm_choice(a, "sm_90", "prefill", "bfloat16", 192, 128, ("causal",))
    assert not c.routed and "picks FLASH_ATTN" in c.why and c.backend == "vllm_fa3"
