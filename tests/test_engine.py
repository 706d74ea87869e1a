"""The query engine on plain data: like-for-like rankings, composition; vLLM's questions to it (VllmEngine): MLA
triples, FA version parameters."""

from __future__ import annotations

import pytest

from attnmatrix.selector_engine import SUPPORTED, UNKNOWN, UNSUPPORTED, Engine, measured_latencies
from attnmatrix.selector_vllm import VllmEngine


def data(cells, measured=None, backends=("fa2", "fa3", "fa4", "trtllm_ragged"), rankings=()):
    """Engine data from {(arch, backend): rules without their arch}: each rule is written for its one arch."""
    rules: dict[str, tuple] = {}
    for (arch, b), rs in cells.items():
        rules[b] = rules.get(b, ()) + tuple(((arch,), *r) for r in rs)
    return {
        "archs": ("sm_90", "sm_100"), "backends": {"sm_90": backends, "sm_100": backends},
        "default_rank": {"sm_90": {"fa3": 10, "fa4": 11, "fa2": 12}, "sm_100": {"fa4": 10, "fa2": 11}},
        "default_rank_missing": 50, "fa_version": {"fa2": 2, "fa3": 3, "fa4": 4},
        "engine_names": {"vllm": {"mla_prefill": {"fa2": "FLASH_ATTN", "fa4": "FLASH_ATTN",
                                                  "trtllm_ragged": "TRTLLM_RAGGED"}}},
        "fa_common_head_sizes": ((64, 64), (128, 128)), "declared_rankings": tuple(rankings),
        "rules": rules, "measured": measured or {},
    }


def test_like_for_like_latencies_compare_a_partial_backend_on_the_shapes_it_completed():
    got = measured_latencies({"fa2": {"a": 1.0, "b": 2.0, "c": 9.0}, "xqa": {"b": 1.5}})
    # xqa's 1.5 on shape b against fa2's 2.0 there: 0.75 of fa2, scaled to fa2's median (2.0); marked 1 of 3
    assert got == {"fa2": (2.0, 3, 3), "xqa": (1.5, 1, 3)}
    got = measured_latencies({"fa2": {"a": 0.1, "b": 0.2, "c": 9.0}, "xqa": {"c": 0.15}})
    assert got["fa2"][0] == 0.2 and got["xqa"][0] == pytest.approx(0.15 / 9.0 * 0.2)  # on shape c, xqa is faster
    got = measured_latencies({"fa2": {"a": 1.0}, "xqa": {"b": 3.0}})  # nothing shared: each its own median
    assert got == {"fa2": (1.0, 1, 1), "xqa": (3.0, 1, 1)}


def test_a_partial_backend_does_not_reorder_the_complete_ones():
    """sdpa_math ran out of memory on two of three shapes: fa4 and fa3 are still compared on all three (fa4
    first), not on the one shape math completed (where fa3 is faster), and math is placed from its ratio."""
    got = measured_latencies({"fa4": {"a": 0.1, "b": 0.2, "c": 0.6}, "fa3": {"a": 0.3, "b": 0.4, "c": 0.5},
                              "sdpa_math": {"c": 26.0}})
    assert got["fa4"] == (0.2, 3, 3) and got["fa3"] == (0.4, 3, 3)
    assert got["sdpa_math"] == (pytest.approx(26.0 / 0.55 * 0.3), 1, 3)  # ref on c: 0.55; ref median: 0.3
    a_fast_partial = measured_latencies({"fa2": {"a": 1.0, "b": 2.0, "c": 4.0}, "trtllm": {"a": 0.5}})
    assert a_fast_partial["trtllm"][0] == 1.0 < a_fast_partial["fa2"][0]  # half of fa2 where both ran


def test_order_by_measured_then_declared_then_default_and_the_mark():
    cells = {("sm_90", b): ((('prefill',), ('bfloat16',), (128,), (('causal',),), ('pass', 'validated', 'run1')),)
             for b in ("fa2", "fa3", "fa4", "trtllm_ragged")}
    measured = {"sm_90": {("prefill", "bfloat16", 128, 128, ("causal",)): (("fa2", 0.5), ("fa4", 0.7, 1, 3))}}
    ranking = ("r", ("sm_90",), "prefill", None, ((128, 128),), ("trtllm_ragged", "fa4"), ("PR #1",))
    e = Engine(data(cells, measured, rankings=[ranking]))
    assert e.select_backends((9, 0), 128) == ["fa2", "fa4", "trtllm_ragged", "fa3"]
    ex = e.explain((9, 0), 128)
    assert ex["fa4"].startswith("supported (#2 of 4, validated, latency 0.7 ms, by measured latency, completed 1 "
                                "of 3 timing shapes")
    assert "by declared ranking r (PR #1)" in ex["trtllm_ragged"] and "by default rank 10" in ex["fa3"]
    assert "evidence: causal: run1" in ex["fa2"]


def test_composition_every_reason_and_unknown():
    p128 = (("prefill",), ("bfloat16",), (128,))
    cells = {("sm_90", "fa2"): ((*p128, (("causal",),), ("pass", "validated", "run1")),
                                (*p128, (("causal", "softcap"),), ("rejected", "validated", "run1", "no softcap")),
                                (*p128, (("alibi", "causal"),), ("rejected", "declared", "fa2-x", "no alibi")))}
    e = Engine(data(cells, backends=("fa2",)))
    a = e.answer("sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("alibi", "causal", "softcap"))
    assert a.status == UNSUPPORTED and a.tier == "validated"
    assert a.reasons == ["alibi+causal: rejected (declared): no alibi",
                         "causal+softcap: rejected (validated): no softcap"]
    assert e.explain((9, 0), 128, alibi=True)["fa2"] == \
        "unsupported: alibi+causal: rejected (declared): no alibi [evidence: fa2-x]"
    u = e.answer("sm_90", "fa2", "prefill", "bfloat16", 128, 128, ("causal", "gqa"))
    assert u.status == UNKNOWN and u.reasons == ["gqa: no evidence"]
    assert e.answer("sm_90", "fa2", "prefill", "bfloat16", 128, 128, ()).reasons == ["no mask: no evidence"]


MLA_192 = (("mla_prefill",), ("bfloat16",), ((192, 128),))
MLA = {("sm_100", "fa4"): ((*MLA_192, (("causal",),), ("pass", "compiled", "xc1")),),
       ("sm_100", "trtllm_ragged"): ((*MLA_192, (("causal",),), ("pass", "declared", "tr-mla")),)}


def test_mla_priorities_fall_back_to_the_totals_cell():
    e = VllmEngine(data(dict(MLA)))
    assert e.get_mla_prefill_backend_priorities((10, 0), 128, 64, 128) == ["FLASH_ATTN", "TRTLLM_RAGGED"]
    assert e.get_mla_prefill_backend_priorities((10, 0), 64, 128, 128) == ["FLASH_ATTN", "TRTLLM_RAGGED"]
    assert e.get_mla_prefill_backend_priorities((10, 0), 128, 64, 64) == []
    assert e.get_mla_prefill_backend_priorities((9, 0), 128, 64, 128) == []


def test_mla_priorities_answer_per_triple_where_a_cell_has_the_rope_split():
    cells = dict(MLA)
    cells[("sm_100", "trtllm_ragged")] = cells[("sm_100", "trtllm_ragged")] + (
        (*MLA_192, (("causal", "qk_rope:128"),), ("rejected", "declared", "tr-rope", "rope 128 no")),)
    e = VllmEngine(data(cells))
    assert e.get_mla_prefill_backend_priorities((10, 0), 128, 64, 128) == ["FLASH_ATTN", "TRTLLM_RAGGED"]
    assert e.get_mla_prefill_backend_priorities((10, 0), 64, 128, 128) == ["FLASH_ATTN"]
    a = e.answer("sm_100", "trtllm_ragged", "mla_prefill", "bfloat16", 192, 128, ("causal", "qk_rope:128"))
    assert a.status == UNSUPPORTED and a.reasons == ["causal+qk_rope:128: rejected (declared): rope 128 no"]
    b = e.answer("sm_100", "fa4", "mla_prefill", "bfloat16", 192, 128, ("causal", "qk_rope:128"))
    assert b.status == SUPPORTED and [f for f, _ in b.cells] == [("causal",)]


def test_flash_attn_version_softcap_and_block_size():
    p128 = (("prefill",), ("bfloat16",), (128,))
    cells = {
        ("sm_90", "fa3"): ((*p128, (("causal",), ("causal", "softcap")), ("pass", "declared", "fa3-h")),
                           (*p128, (("causal", "paged_kv:16"),), ("rejected", "declared", "fa3-p", "16 no"))),
        ("sm_90", "fa2"): ((*p128, (("causal",), ("causal", "paged_kv:16")), ("pass", "declared", "fa2-a")),
                           (*p128, (("causal", "softcap"),), ("rejected", "declared", "fa2-s", "no"))),
    }
    e = VllmEngine(data(cells, backends=("fa2", "fa3")))
    assert e.get_flash_attn_version((9, 0), head_size=128) == 3
    assert e.get_flash_attn_version((9, 0), head_size=128, kv_cache_block_size=16) == 2
    assert e.get_flash_attn_version((9, 0), head_size=128, requires_softcap=True) == 3
    assert e.get_flash_attn_version((9, 0), head_size=128, requires_softcap=True, kv_cache_block_size=16) is None
    assert e.get_flash_attn_version((9, 0)) is None  # no evidence at 64: never a guess
    with pytest.raises(ValueError):
        e.get_flash_attn_version((9, 0), head_size=128, kv_cache_block_size=-16)
