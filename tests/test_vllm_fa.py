"""vLLM's FlashAttention builds (`vllm_fa2`, `vllm_fa3`): how a case becomes vLLM's call, without a GPU.

vLLM is not installed here: a fake `vllm.vllm_flash_attn` records what `prepare` passes to
`flash_attn_varlen_func`, so the mapping (packed layout, paged cache, sinks, MLA V padding, fa_version)
is checked on the CPU. The extensions themselves run only on a GPU (scripts/vllm-fa-site.py puts them in a folder;
site/gpu-probing.md).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from attnmatrix.kernels.base import load_backend
from attnmatrix.kernels.problem import WINDOW, Shape, make_problem
from attnmatrix.kernels.vllm_fa import SINK_DTYPE, entry_for
from attnmatrix.matrix.cases import Case, CaseError, case_space

SMALL = {"prefill": Shape("t", 2, 24, 24, 4, 4), "mla_prefill": Shape("t", 2, 24, 24, 4, 4),
         "decode": Shape("t", 3, 1, 40, 4, 4)}


def _problem(backend, features=(), op="prefill", hd=32, hdv=32, dtype="bfloat16"):
    return make_problem(Case("sm_90", backend, op, dtype, hd, hdv, tuple(features)), SMALL[op], seed=1)


class FakeVarlen:
    """Stands in for vllm.vllm_flash_attn.flash_attn_varlen_func: records the call, echoes q's first
    feature into a (total_q, heads, v head dim) output so unpacking and cutting show."""

    def __init__(self):
        self.calls = []

    def __call__(self, q, k, v, **kw):
        self.calls.append((q, k, v, kw))
        return q[..., :1].expand(*q.shape[:-1], v.shape[-1]).clone()

    @property
    def last(self):
        assert len(self.calls) == 1, len(self.calls)
        return self.calls[0]


class FakeSchedule:
    """Stands in for get_scheduler_metadata: records its arguments, returns a plan the call must carry."""

    def __init__(self):
        self.calls = []

    def __call__(self, **kw):
        self.calls.append(kw)
        return torch.tensor([len(self.calls)], dtype=torch.int32)


@pytest.fixture
def fake_vllm(monkeypatch):
    fn = FakeVarlen()
    fn.schedule = FakeSchedule()
    vllm = types.ModuleType("vllm")
    pkg = types.ModuleType("vllm.vllm_flash_attn")
    pkg.flash_attn_varlen_func = fn
    pkg.get_scheduler_metadata = fn.schedule
    vllm.vllm_flash_attn = pkg
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.vllm_flash_attn", pkg)
    for ext in ("_vllm_fa2_C", "_vllm_fa3_C"):
        monkeypatch.setitem(sys.modules, f"vllm.vllm_flash_attn.{ext}", types.ModuleType(ext))
    return fn


# --- availability -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,ext", [("vllm_fa2", "_vllm_fa2_C"), ("vllm_fa3", "_vllm_fa3_C")])
def test_unavailable_without_its_extension(name, ext):
    why = load_backend(name).availability()
    assert why is not None and ext in why


def test_one_build_present_does_not_make_the_other_available(monkeypatch):
    # The package imports with either extension; each backend needs its own.
    pkg = types.ModuleType("vllm.vllm_flash_attn")
    pkg.__path__ = []
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.vllm_flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "vllm.vllm_flash_attn._vllm_fa3_C", types.ModuleType("_vllm_fa3_C"))
    assert load_backend("vllm_fa3").availability() is None
    assert "_vllm_fa2_C" in load_backend("vllm_fa2").availability()


def test_library_is_vllm_and_entry_names_the_version():
    assert load_backend("vllm_fa3").library == "vllm"
    c = Case("sm_90", "vllm_fa3", "decode", "bfloat16", 128, 128, ("causal", "paged_kv:32"))
    assert entry_for(c, 3) == "vllm.vllm_flash_attn.flash_attn_varlen_func(fa_version=3, block_table (block size 32))"
    assert load_backend("vllm_fa2").entry(Case("sm_90", "vllm_fa2", "prefill", "bfloat16", 64, 64, ())) == \
        "vllm.vllm_flash_attn.flash_attn_varlen_func(fa_version=2)"


# --- the call -----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend,version", [("vllm_fa2", 2), ("vllm_fa3", 3)])
def test_prefill_goes_in_packed_with_cu_seqlens(fake_vllm, backend, version):
    p = _problem(backend, ("causal",))
    out = load_backend(backend).prepare(p)()
    q, k, v, kw = fake_vllm.last
    assert q.shape == (2 * 24, 4, 32) and k.shape == (48, 4, 32) and v.shape == (48, 4, 32)
    assert kw["fa_version"] == version and kw["causal"] is True and kw["softmax_scale"] == p.scale
    assert kw["cu_seqlens_q"].tolist() == [0, 24, 48] and kw["cu_seqlens_k"].tolist() == [0, 24, 48]
    assert kw["max_seqlen_q"] == 24 and kw["max_seqlen_k"] == 24
    assert kw["window_size"] == [-1, -1] and kw["softcap"] == 0.0 and kw["alibi_slopes"] is None
    assert "block_table" not in kw and "s_aux" not in kw
    assert out.shape == (2, 24, 4, 32)
    assert torch.equal(out[..., 0], p.q[..., 0])  # unpacked back in (batch, seqlen) order


def test_window_softcap_alibi_passed_through(fake_vllm):
    fa3 = load_backend("vllm_fa3")
    fa3.prepare(_problem("vllm_fa3", ("sliding_window",)))()
    assert fake_vllm.calls[-1][3]["window_size"] == [WINDOW, 0]
    fa3.prepare(_problem("vllm_fa3", ("causal", "softcap")))()
    assert fake_vllm.calls[-1][3]["softcap"] > 0
    pa = _problem("vllm_fa3", ("causal", "alibi"))
    fa3.prepare(pa)()
    # FA3 refuses ALiBi in its own words ("Alibi is not supported in FA3"): the slopes go in regardless.
    assert fake_vllm.calls[-1][3]["alibi_slopes"] is pa.alibi_slopes


def test_varlen_keeps_ragged_lengths(fake_vllm):
    p = _problem("vllm_fa2", ("causal", "varlen"))
    out = load_backend("vllm_fa2").prepare(p)()
    _, _, _, kw = fake_vllm.last
    lens = [p.valid_q(i) for i in range(2)]
    assert kw["cu_seqlens_q"].tolist() == [0, lens[0], sum(lens)]
    assert out.shape == (2, 24, 4, 32)
    assert torch.all(out[1, lens[1]:] == 0)


@pytest.mark.parametrize("block", [16, 32, 64, 128])
@pytest.mark.parametrize("op", ["prefill", "decode"])
def test_paged_kv_uses_block_table_and_seqused_k(fake_vllm, block, op):
    p = _problem("vllm_fa3", ("causal", f"paged_kv:{block}"), op=op)
    out = load_backend("vllm_fa3").prepare(p)()
    q, k_cache, v_cache, kw = fake_vllm.last
    b, sk = p.shape.batch, p.shape.seqlen_k
    nblk = -(-sk // block)
    empty = 1 if op == "decode" else 0  # a decode step of 3 runs in vLLM's graph of 4 (graph_batch)
    assert k_cache.shape == (b * nblk, block, 4, 32) and v_cache.shape == k_cache.shape
    assert kw["block_table"].shape == (b + empty, nblk) and kw["block_table"].dtype == torch.int32
    assert kw["seqused_k"].tolist() == [sk] * b + [0] * empty and "cu_seqlens_k" not in kw
    assert q.shape == (b * p.shape.seqlen_q + empty, 4, 32)
    assert out.shape == p.q.shape[:-1] + (32,)


@pytest.mark.parametrize("batch,graph", [(1, 1), (3, 4), (5, 8), (8, 8), (9, 16), (250, 256), (257, 272),
                                         (512, 512), (513, 513)])
def test_a_decode_step_runs_in_the_graph_of_the_smallest_captured_batch_that_holds_it(batch, graph):
    from attnmatrix.kernels.vllm_fa import graph_batch

    case = Case("sm_90", "vllm_fa3", "decode", "bfloat16", 32, 32, ("paged_kv:16",))
    p = make_problem(case, Shape("t", batch, 1, 16, 1, 1), seed=1)
    assert graph_batch(p) == graph
    # not a uniform decode step, or no paged cache: as it is
    prefill = make_problem(Case("sm_90", "vllm_fa3", "prefill", "bfloat16", 32, 32, ("causal", "paged_kv:16")),
                           Shape("t", 3, 2, 16, 1, 1), seed=1)
    assert graph_batch(prefill) == 3


@pytest.mark.parametrize("name", ["vllm_fa2", "vllm_fa3"])
def test_the_padded_sequences_are_empty_and_the_output_is_the_steps_own(fake_vllm, name):
    p = _problem(name, ("paged_kv:16", "fp8"), op="decode")
    out = load_backend(name).prepare(p)()
    q, _, _, kw = fake_vllm.last
    assert kw["cu_seqlens_q"].tolist() == [0, 1, 2, 3, 3]  # the 4th sequence has no query token
    assert kw["seqused_k"].tolist()[-1] == 0 and kw["block_table"][-1].tolist() == [0] * kw["block_table"].shape[1]
    assert torch.all(q[3] == 0) and kw["k_descale"].shape == (4, 4)
    assert out.shape == p.q.shape[:-1] + (32,)
    # the fake kernel echoes q's first feature: the step's three rows come back, in order
    assert torch.equal(out[:, 0, :, 0], p.q[:, 0, :, 0].to(out.dtype))


def test_fa3_on_the_paged_cache_takes_vllms_split_bound_and_planned_schedule(fake_vllm):
    from dataclasses import replace

    from attnmatrix.kernels.vllm_fa import GRAPH_TOKENS, SPLIT_BOUND

    # a decode step (3 tokens, in the CUDA graph of 4): bound 32, the schedule planned once with the call's own terms
    p = _problem("vllm_fa3", ("paged_kv:16", "sliding_window"), op="decode")
    load_backend("vllm_fa3").prepare(p)()
    kw = fake_vllm.last[3]
    assert kw["num_splits"] == SPLIT_BOUND and kw["scheduler_metadata"].tolist() == [1]
    (plan,) = fake_vllm.schedule.calls
    assert plan["num_splits"] == SPLIT_BOUND and plan["batch_size"] == 4 and plan["page_size"] == 16
    assert plan["cache_seqlens"] is kw["seqused_k"] and plan["cu_seqlens_q"] is kw["cu_seqlens_q"]
    assert (plan["num_heads_q"], plan["num_heads_kv"], plan["headdim"]) == (4, 4, 32)
    assert plan["window_size"] == tuple(kw["window_size"]) != (-1, -1) and plan["causal"] == kw["causal"]
    # a model whose layers have several windows: the bound, no plan
    fake_vllm.calls.clear()
    fake_vllm.schedule.calls.clear()
    load_backend("vllm_fa3").prepare(replace(p, one_window_size=False))()
    kw = fake_vllm.last[3]
    assert kw["num_splits"] == SPLIT_BOUND and "scheduler_metadata" not in kw and not fake_vllm.schedule.calls
    # a step past the largest CUDA graph: FA3's own heuristic (0), still planned
    fake_vllm.calls.clear()
    big = make_problem(Case("sm_90", "vllm_fa3", "prefill", "bfloat16", 32, 32, ("causal", "paged_kv:16")),
                       Shape("t", 3, GRAPH_TOKENS // 3 + 1, GRAPH_TOKENS // 3 + 1, 4, 4), seed=1)
    load_backend("vllm_fa3").prepare(big)()
    kw = fake_vllm.last[3]
    assert "num_splits" not in kw and fake_vllm.schedule.calls[-1]["num_splits"] == 0 and "scheduler_metadata" in kw


@pytest.mark.parametrize("name,features", [("vllm_fa2", ("paged_kv:16",)), ("vllm_fa3", ("causal",))])
def test_fa2_and_an_unpaged_case_leave_the_split_to_the_kernel(fake_vllm, name, features):
    load_backend(name).prepare(_problem(name, features, op="decode" if name == "vllm_fa2" else "prefill"))()
    kw = fake_vllm.last[3]
    assert "num_splits" not in kw and "scheduler_metadata" not in kw and not fake_vllm.schedule.calls


def test_sinks_go_in_as_bf16_and_the_reference_sees_the_same_values(fake_vllm):
    p = _problem("vllm_fa3", ("causal", "sinks"), dtype="float16")
    original = p.sinks.clone()
    load_backend("vllm_fa3").prepare(p)()
    s_aux = fake_vllm.last[3]["s_aux"]
    assert s_aux.dtype == SINK_DTYPE and s_aux.shape == (4,)
    assert torch.equal(p.sinks, s_aux.float())  # the problem now holds exactly the kernel's sinks
    assert torch.allclose(p.sinks, original, rtol=1e-2)


def test_fp8_descales_per_sequence_and_kv_head(fake_vllm):
    p = _problem("vllm_fa3", ("causal", "fp8"))
    load_backend("vllm_fa3").prepare(p)()
    kw = fake_vllm.last[3]
    for name in ("q_descale", "k_descale", "v_descale"):
        assert kw[name].shape == (2, 4) and kw[name].dtype == torch.float32


def test_mla_prefill_fa2_pads_v_like_vllm(fake_vllm):
    p = _problem("vllm_fa2", ("causal", "qk_rope:64"), op="mla_prefill", hd=192, hdv=128)
    out = load_backend("vllm_fa2").prepare(p)()
    _, k, v, _ = fake_vllm.last
    assert k.shape[-1] == 192 and v.shape[-1] == 192
    assert torch.all(v[..., 128:] == 0)
    assert out.shape == (2, 24, 4, 128)


def test_mla_prefill_fa3_takes_v_as_is(fake_vllm):
    p = _problem("vllm_fa3", ("causal", "qk_rope:64"), op="mla_prefill", hd=192, hdv=128)
    out = load_backend("vllm_fa3").prepare(p)()
    _, _, v, _ = fake_vllm.last
    assert v.shape[-1] == 128 and out.shape == (2, 24, 4, 128)


# --- the case space -----------------------------------------------------------------------------

def test_qk_rope_token():
    c = Case("sm_90", "vllm_fa3", "mla_prefill", "bfloat16", 256, 256, ("causal", "qk_rope:0"))
    assert c.mla_triple == (256, 0, 256)
    with pytest.raises(CaseError, match="rope head dim"):
        Case("sm_90", "fa4", "mla_prefill", "bfloat16", 192, 128, ("qk_rope:064",))
    with pytest.raises(CaseError, match="MLA prefill"):
        Case("sm_90", "fa4", "prefill", "bfloat16", 192, 128, ("qk_rope:64",))
    with pytest.raises(CaseError, match="qk_nope"):
        Case("sm_90", "fa4", "mla_prefill", "bfloat16", 64, 64, ("qk_rope:64",))
    with pytest.raises(CaseError, match="rope head dim"):
        Case("sm_90", "fa4", "mla_prefill", "bfloat16", 192, 128, ("qk_rope",))


def test_space_asks_mla_per_triple():
    triples = {c.mla_triple for c in case_space(["sm_90"], ["fa4"]) if c.op == "mla_prefill"}
    assert triples == {(128, 64, 128), (192, 64, 256), (256, 0, 256), (64, 64, 128)}
    assert all(c.mla_triple for c in case_space(["sm_90"], ["fa4"]) if c.op == "mla_prefill")


def test_vllm_builds_also_get_block_size_32():
    pages = lambda b: {c.page_size for c in case_space(["sm_90"], [b]) if c.page_size}  # noqa: E731
    assert pages("vllm_fa3") == pages("vllm_fa2") == {16, 32, 64, 128, 256}
    assert pages("fa2") == {16, 64, 128, 256}
    # An explicit feature list is what it says: no additions.
    only = list(case_space(["sm_90"], ["vllm_fa3"], feature_sets=[("causal",)]))
    assert {c.features for c in only if c.op != "mla_prefill"} == {("causal",)}
