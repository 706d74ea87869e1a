"""FlashInfer and TRT-LLM-via-FlashInfer backends: how a Problem maps onto FlashInfer's API.

A fake `flashinfer` package stands in for the real one (no GPU, no FlashInfer needed). Its entry
points take the real parameter names (a misspelt keyword fails), record what they were given, and
compute attention with the semantics FlashInfer documents (bottom-right causal, inclusive
`window_left`, softcap after scaling, one sink logit per head, pages read through indptr/indices/
last_page_len or a block table). So the output must match the reference: a wrong page table, a
wrong indptr or a wrong mask fails the test, not only a wrong keyword.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
from attnmatrix.kernels import flashinfer as fi
from attnmatrix.kernels import trtllm
from attnmatrix.kernels.base import load_backend
from attnmatrix.kernels.problem import SOFTCAP, VALIDATION_SHAPES, Problem, Unsupported, make_problem
from attnmatrix.kernels.reference import reference_attention
from attnmatrix.matrix.cases import Case


def problem(backend: str, *features: str, op: str = "prefill", hd: int = 128, hdv: int | None = None,
            window: tuple[int, int] | None = None, causal: bool | None = None) -> Problem:
    p = make_problem(Case("sm_90", backend, op, "bfloat16", hd, hdv or hd, features), VALIDATION_SHAPES[op])
    if window is not None:
        p.window = window
    if causal is not None:
        p.causal = causal
    return p


# ------------------------------------------------------------------ the fake library

def attend(q, k, v, scale, causal, left, softcap, sinks, alibi=None):
    """One sequence: q (sq, H, D), k/v (sk, Hkv, D/Dv) -> (sq, H, Dv) float32."""
    sq, h, _ = q.shape
    sk, hkv, _ = k.shape
    k = k.float().repeat_interleave(h // hkv, dim=1)
    v = v.float().repeat_interleave(h // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq).view(-1, 1) + (sk - sq)
    j = torch.arange(sk).view(1, -1)
    if alibi is not None:
        s = s + alibi.view(-1, 1, 1) * (j - i).float()
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        keep &= j <= i
    if left is not None and left >= 0:
        keep &= j >= i - left
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float().view(-1, 1, 1).expand(h, sq, 1)], dim=-1)
        v = torch.cat([v, torch.zeros(1, h, v.shape[-1])], dim=0)
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)


def gather_indptr(cache, indptr, indices, last, page_size, b):
    pages = indices[indptr[b]:indptr[b + 1]].long()
    n = (len(pages) - 1) * page_size + int(last[b])
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


def gather_table(cache, table, seq_lens, b):
    n = int(seq_lens[b])
    pages = table[b, : -(-n // cache.shape[1])].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


class FakeFlashInfer:
    """Installs `flashinfer` and the submodules the backends use into sys.modules."""

    def __init__(self, monkeypatch, tmp_path):
        self.calls: list[tuple[str, dict]] = []
        self.slopes = None  # what flashinfer.utils.get_alibi_slopes returns; None: the standard slopes
        top = types.ModuleType("flashinfer")
        top.__path__ = []
        mods = {name: types.ModuleType(f"flashinfer.{name}") for name in
                ("prefill", "decode", "utils", "jit", "jit.env", "artifacts")}
        fake = self

        class Ragged:
            def __init__(self, float_workspace_buffer, kv_layout="NHD", backend="auto"):
                fake.calls.append(("Ragged.__init__", {"kv_layout": kv_layout, "backend": backend,
                                                       "workspace": float_workspace_buffer}))

            def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
                     custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
                     use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None,
                     rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
                     o_data_type=None):
                self.kw = dict(locals())
                del self.kw["self"]
                fake.calls.append(("Ragged.plan", self.kw))

            def run(self, q, k, v, *, q_scale=None, k_scale=None, v_scale=None):
                kw = self.kw
                fake.calls.append(("Ragged.run", {"q": q, "k": k, "v": v}))
                qi, ki = kw["qo_indptr"], kw["kv_indptr"]
                alibi = fake.alibi(q.shape[1]) if kw["pos_encoding_mode"] == "ALIBI" else None
                outs = [attend(q[qi[b]:qi[b + 1]], k[ki[b]:ki[b + 1]], v[ki[b]:ki[b + 1]], kw["sm_scale"],
                               kw["causal"], kw["window_left"], kw["logits_soft_cap"], None, alibi)
                        for b in range(len(qi) - 1)]
                return torch.cat(outs).to(kw["o_data_type"])

        class PagedPrefill:
            def __init__(self, float_workspace_buffer, kv_layout="NHD", backend="auto"):
                fake.calls.append(("PagedPrefill.__init__", {"kv_layout": kv_layout, "backend": backend}))

            def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                     num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None,
                     packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                     sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
                     q_data_type="float16", kv_data_type=None, o_data_type=None):
                self.kw = dict(locals())
                del self.kw["self"]
                fake.calls.append(("PagedPrefill.plan", self.kw))

            def run(self, q, paged_kv_cache, *, q_scale=None, k_scale=None, v_scale=None, sinks=None):
                kw = self.kw
                kc, vc = paged_kv_cache
                fake.calls.append(("PagedPrefill.run", {"q": q, "k_cache": kc, "v_cache": vc, "sinks": sinks}))
                qi = kw["qo_indptr"]
                args = (kw["paged_kv_indptr"], kw["paged_kv_indices"], kw["paged_kv_last_page_len"], kw["page_size"])
                outs = [attend(q[qi[b]:qi[b + 1]], gather_indptr(kc, *args, b), gather_indptr(vc, *args, b),
                               kw["sm_scale"], kw["causal"], kw["window_left"], kw["logits_soft_cap"], sinks)
                        for b in range(len(qi) - 1)]
                return torch.cat(outs).to(kw["o_data_type"])

        class Decode:
            def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                         use_tensor_cores=False, backend="auto"):
                fake.calls.append(("Decode.__init__", {"kv_layout": kv_layout, "backend": backend}))

            def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                     pos_encoding_mode="NONE", window_left=-1, window_right=0, logits_soft_cap=None,
                     q_data_type="float16", kv_data_type=None, o_data_type=None, sm_scale=None):
                self.kw = dict(locals())
                del self.kw["self"]
                fake.calls.append(("Decode.plan", self.kw))

            def run(self, q, paged_kv_cache, *, q_scale=None, k_scale=None, v_scale=None, sinks=None,
                    window_left=None):
                kw = self.kw
                kc, vc = paged_kv_cache
                fake.calls.append(("Decode.run", {"q": q, "k_cache": kc, "sinks": sinks}))
                args = (kw["indptr"], kw["indices"], kw["last_page_len"], kw["page_size"])
                outs = [attend(q[b:b + 1], gather_indptr(kc, *args, b), gather_indptr(vc, *args, b), kw["sm_scale"],
                               False, kw["window_left"], kw["logits_soft_cap"], sinks)
                        for b in range(q.shape[0])]
                return torch.cat(outs).to(kw["o_data_type"])

        def trtllm_ragged_attention_deepseek(query, key, value, workspace_buffer, seq_lens, max_q_len, max_kv_len,
                                             bmm1_scale, bmm2_scale, o_sf_scale, batch_size, window_left,
                                             cum_seq_lens_q, cum_seq_lens_kv, enable_pdl, is_causal, return_lse,
                                             attention_sinks=None, out=None):
            kw = dict(locals())
            fake.calls.append(("trtllm_ragged_attention_deepseek", kw))
            qi, ki = cum_seq_lens_q, cum_seq_lens_kv
            for b in range(batch_size):
                o = attend(query[qi[b]:qi[b + 1]], key[ki[b]:ki[b + 1]], value[ki[b]:ki[b + 1]], bmm1_scale,
                           is_causal, window_left, 0.0, attention_sinks) * bmm2_scale
                out[qi[b]:qi[b + 1]] = o.to(out.dtype)
            return out

        def trtllm_batch_context_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_q_len,
                                               max_kv_len, bmm1_scale, bmm2_scale, batch_size, cum_seq_lens_q,
                                               cum_seq_lens_kv, window_left=-1, out=None, out_dtype=None,
                                               o_sf_scale=None, o_sf_vec_size=None, kv_layout="HND",
                                               enable_pdl=None, sinks=None, causal=True, window_right=-1):
            kw = dict(locals())
            fake.calls.append(("trtllm_batch_context_with_kv_cache", kw))
            assert kv_layout == "NHD"
            kc, vc = kv_cache
            qi = cum_seq_lens_q
            outs = [attend(query[qi[b]:qi[b + 1]], gather_table(kc, block_tables, seq_lens, b),
                           gather_table(vc, block_tables, seq_lens, b), bmm1_scale, causal, window_left, 0.0, sinks)
                    * bmm2_scale for b in range(batch_size)]
            return torch.cat(outs).to(out_dtype)

        def trtllm_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
                                              bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None,
                                              out_dtype=None, o_sf_scale=None, o_sf_vec_size=None, sinks=None,
                                              kv_layout="HND", enable_pdl=None, backend="auto", q_len_per_req=1):
            kw = dict(locals())
            fake.calls.append(("trtllm_batch_decode_with_kv_cache", kw))
            assert kv_layout == "NHD"
            kc, vc = kv_cache
            outs = [attend(query[b:b + 1], gather_table(kc, block_tables, seq_lens, b),
                           gather_table(vc, block_tables, seq_lens, b), bmm1_scale, False, window_left, 0.0, sinks)
                    * bmm2_scale for b in range(query.shape[0])]
            return torch.cat(outs).to(out_dtype)

        def get_alibi_slopes(n_heads, device=None):
            if fake.slopes is not None:
                return fake.slopes
            return torch.tensor([2 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)], dtype=torch.float32)

        mods["prefill"].BatchPrefillWithRaggedKVCacheWrapper = Ragged
        mods["prefill"].BatchPrefillWithPagedKVCacheWrapper = PagedPrefill
        mods["prefill"].trtllm_ragged_attention_deepseek = trtllm_ragged_attention_deepseek
        mods["prefill"].trtllm_batch_context_with_kv_cache = trtllm_batch_context_with_kv_cache
        mods["decode"].BatchDecodeWithPagedKVCacheWrapper = Decode
        mods["decode"].trtllm_batch_decode_with_kv_cache = trtllm_batch_decode_with_kv_cache
        mods["utils"].get_alibi_slopes = get_alibi_slopes
        mods["jit.env"].FLASHINFER_CUBIN_DIR = tmp_path / "cubins"
        mods["artifacts"].ArtifactPath = types.SimpleNamespace(TRTLLM_GEN_FMHA="abc123/fmha/trtllm-gen/")
        monkeypatch.setitem(sys.modules, "flashinfer", top)
        for name, mod in mods.items():
            monkeypatch.setitem(sys.modules, f"flashinfer.{name}", mod)
        self.cubin_dir = tmp_path / "cubins" / "abc123/fmha/trtllm-gen"

    def alibi(self, h):
        return sys.modules["flashinfer.utils"].get_alibi_slopes(h)

    def last(self, name: str) -> dict:
        for n, kw in reversed(self.calls):
            if n == name:
                return kw
        raise AssertionError(f"{name} was not called; calls: {[n for n, _ in self.calls]}")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    monkeypatch.delenv("FLASHINFER_NO_DOWNLOAD", raising=False)
    monkeypatch.setattr(fi, "WORKSPACE_BYTES", 4096)  # FlashInfer's 128 MiB is for real kernels
    return FakeFlashInfer(monkeypatch, tmp_path)


def run_and_check(backend: str, p: Problem) -> torch.Tensor:
    out = load_backend(backend).prepare(p)()
    ref = reference_attention(p)
    assert out.shape == ref.shape
    assert out.dtype == p.out_dtype
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    return out


# ------------------------------------------------------------------ registration and entries

@pytest.mark.parametrize("name,module,attr", [
    ("flashinfer", fi, "FLASHINFER"), ("trtllm_ragged", trtllm, "TRTLLM_RAGGED"),
    ("trtllm_context", trtllm, "TRTLLM_CONTEXT"), ("trtllm_decode", trtllm, "TRTLLM_DECODE"),
])
def test_registered(name, module, attr):
    b = load_backend(name)
    assert b is getattr(module, attr)
    assert (b.name, b.library, b.device, b.imports) == (name, "flashinfer-python", "cuda", ("flashinfer",))


def test_entries():
    def case(op, *f):
        return Case("sm_90", "flashinfer", op, "bfloat16", 128, 128, f)

    ragged = "flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper"
    paged = "flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper"
    assert fi.entry(case("prefill", "causal")) == ragged
    assert fi.entry(case("mla_prefill", "causal", "varlen")) == ragged
    assert fi.entry(case("prefill", "causal", "paged_kv:16")) == paged
    assert fi.entry(case("decode", "causal")) == "flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper"
    assert trtllm.TRTLLM_RAGGED.entry(case("mla_prefill")) == "flashinfer.prefill.trtllm_ragged_attention_deepseek"
    assert trtllm.TRTLLM_CONTEXT.entry(case("prefill")) == "flashinfer.prefill.trtllm_batch_context_with_kv_cache"
    assert trtllm.TRTLLM_DECODE.entry(case("decode")) == "flashinfer.decode.trtllm_batch_decode_with_kv_cache"


# ------------------------------------------------------------------ availability

def test_unavailable_names_the_missing_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import fails as if not installed
    for name in ("flashinfer", "trtllm_ragged", "trtllm_context", "trtllm_decode"):
        why = load_backend(name).availability()
        assert why is not None and why.startswith("cannot import flashinfer:"), why


def test_trtllm_gen_cubins_offline(fake, monkeypatch):
    assert trtllm.TRTLLM_RAGGED.availability() is None  # downloads allowed: FlashInfer fetches on first use
    monkeypatch.setenv("FLASHINFER_NO_DOWNLOAD", "1")
    why = trtllm.TRTLLM_RAGGED.availability()
    assert why is not None and "checksums.txt" in why and "FLASHINFER_NO_DOWNLOAD" in why
    assert trtllm.TRTLLM_CONTEXT.availability() == why
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert trtllm.TRTLLM_DECODE.availability() is None  # sm_90 decode is XQA, compiled from the wheel's sources
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))
    assert trtllm.TRTLLM_DECODE.availability() == why  # sm_100 decode is trtllm-gen
    fake.cubin_dir.mkdir(parents=True)
    (fake.cubin_dir / "checksums.txt").write_text("x")
    assert trtllm.TRTLLM_RAGGED.availability() is None
    assert fi.FLASHINFER.availability() is None


# ------------------------------------------------------------------ trtllm_ragged (MLA prefill)

def test_ragged_mla_192_128_causal(fake):
    p = problem("trtllm_ragged", "causal", op="mla_prefill", hd=192, hdv=128)
    run_and_check("trtllm_ragged", p)
    kw = fake.last("trtllm_ragged_attention_deepseek")
    b, s, h = 2, 300, 8
    assert kw["query"].shape == (b * s, h, 192) and kw["key"].shape == (b * s, h, 192)
    assert kw["value"].shape == (b * s, h, 128)
    assert kw["cum_seq_lens_q"].tolist() == [0, 300, 600] and kw["cum_seq_lens_q"].dtype == torch.int32
    assert kw["cum_seq_lens_kv"].tolist() == [0, 300, 600] and kw["seq_lens"].tolist() == [300, 300]
    assert kw["seq_lens"].dtype == torch.int32
    assert (kw["max_q_len"], kw["max_kv_len"], kw["batch_size"]) == (300, 300, 2)
    assert kw["bmm1_scale"] == pytest.approx(1 / math.sqrt(192)) and kw["bmm2_scale"] == 1.0
    assert kw["is_causal"] is True and kw["window_left"] == -1 and kw["return_lse"] is False
    assert kw["attention_sinks"] is None
    assert kw["out"].shape == (600, 8, 128) and kw["out"].dtype == torch.bfloat16
    assert kw["workspace_buffer"].dtype == torch.uint8


def test_ragged_varlen_and_sinks(fake):
    p = problem("trtllm_ragged", "causal", "varlen", "sinks", op="mla_prefill", hd=192, hdv=128)
    out = run_and_check("trtllm_ragged", p)
    kw = fake.last("trtllm_ragged_attention_deepseek")
    lens = p.seqlens_k
    assert kw["seq_lens"].tolist() == lens and kw["cum_seq_lens_kv"].tolist() == [0, lens[0], lens[0] + lens[1]]
    assert kw["max_kv_len"] == max(lens) and kw["attention_sinks"] is p.sinks
    assert out[1, lens[1]:].abs().sum() == 0  # rows past the second sequence's end stay zero


def test_ragged_window_is_causal_plus_left(fake):
    p = problem("trtllm_ragged", "sliding_window")
    assert p.window[1] == 0 and not p.causal
    run_and_check("trtllm_ragged", p)
    kw = fake.last("trtllm_ragged_attention_deepseek")
    assert kw["is_causal"] is True and kw["window_left"] == p.window[0]


# ------------------------------------------------------------------ trtllm_context and trtllm_decode

def test_context_paged_window(fake):
    p = problem("trtllm_context", "sliding_window", "paged_kv:64")
    run_and_check("trtllm_context", p)
    kw = fake.last("trtllm_batch_context_with_kv_cache")
    assert (kw["causal"], kw["window_left"], kw["window_right"]) == (True, p.window[0], -1)
    k_cache, v_cache = kw["kv_cache"]
    assert k_cache.shape == (2 * 5, 64, 8, 128) and kw["kv_layout"] == "NHD"
    assert kw["block_tables"].shape == (2, 5) and kw["block_tables"].dtype == torch.int32
    assert kw["seq_lens"].tolist() == [300, 300] and kw["out_dtype"] == torch.bfloat16


def test_context_without_paged_kv_uses_default_blocks(fake):
    run_and_check("trtllm_context", problem("trtllm_context", "causal", "gqa"))
    kw = fake.last("trtllm_batch_context_with_kv_cache")
    assert kw["kv_cache"][0].shape[1:] == (16, 2, 128)  # Problem.paged_kv's default block size; 8 // 4 kv heads


def test_decode_paged_64(fake):
    p = problem("trtllm_decode", "causal", "paged_kv:64", op="decode")
    out = run_and_check("trtllm_decode", p)
    assert out.shape == (4, 1, 8, 128)
    kw = fake.last("trtllm_batch_decode_with_kv_cache")
    assert kw["query"].shape == (4, 8, 128)
    assert kw["kv_cache"][0].shape == (4 * 11, 64, 8, 128) and kw["kv_layout"] == "NHD"
    assert kw["block_tables"].shape == (4, 11) and kw["block_tables"].dtype == torch.int32
    assert sorted(kw["block_tables"].flatten().tolist()) == list(range(44))
    assert kw["block_tables"].flatten().tolist() != list(range(44))  # shuffled: the table must be honoured
    assert kw["seq_lens"].tolist() == [700] * 4 and kw["max_seq_len"] == 700
    assert kw["backend"] == "auto" and kw["window_left"] == -1 and kw["sinks"] is None
    assert kw["bmm1_scale"] == pytest.approx(1 / math.sqrt(128)) and kw["bmm2_scale"] == 1.0


def test_decode_varlen_window_sinks(fake):
    p = problem("trtllm_decode", "causal", "varlen", "sinks", "paged_kv:16", op="decode")
    p.window = (256, 0)
    run_and_check("trtllm_decode", p)
    kw = fake.last("trtllm_batch_decode_with_kv_cache")
    assert kw["seq_lens"].tolist() == p.seqlens_k and kw["window_left"] == 256 and kw["sinks"] is p.sinks


# ------------------------------------------------------------------ flashinfer's own wrappers

def test_flashinfer_mla_prefill_ragged(fake):
    run_and_check("flashinfer", problem("flashinfer", "causal", op="mla_prefill", hd=192, hdv=128))
    init, plan = fake.last("Ragged.__init__"), fake.last("Ragged.plan")
    assert init["kv_layout"] == "NHD" and init["backend"] == "auto"
    assert plan["num_qo_heads"] == plan["num_kv_heads"] == 8
    assert (plan["head_dim_qk"], plan["head_dim_vo"], plan["causal"], plan["window_left"]) == (192, 128, True, -1)
    assert plan["qo_indptr"].tolist() == [0, 300, 600] and plan["kv_indptr"].dtype == torch.int32
    assert plan["sm_scale"] == pytest.approx(1 / math.sqrt(192)) and plan["logits_soft_cap"] is None
    assert plan["q_data_type"] == plan["kv_data_type"] == plan["o_data_type"] == torch.bfloat16
    assert plan["pos_encoding_mode"] == "NONE"


def test_flashinfer_window_and_softcap(fake):
    p = problem("flashinfer", "sliding_window")
    run_and_check("flashinfer", p)
    plan = fake.last("Ragged.plan")
    assert (plan["causal"], plan["window_left"]) == (True, p.window[0])
    run_and_check("flashinfer", problem("flashinfer", "causal", "softcap"))
    plan = fake.last("Ragged.plan")
    assert plan["logits_soft_cap"] == SOFTCAP and plan["causal"] is True and plan["window_left"] == -1


def test_flashinfer_decode_paged_64(fake):
    p = problem("flashinfer", "causal", "varlen", "paged_kv:64", op="decode")
    run_and_check("flashinfer", p)
    plan = fake.last("Decode.plan")
    counts = [-(-n // 64) for n in p.seqlens_k]
    assert plan["page_size"] == 64 and plan["head_dim"] == 128
    assert plan["indptr"].tolist() == [0, *torch.tensor(counts).cumsum(0).tolist()]
    assert plan["last_page_len"].tolist() == [n - (c - 1) * 64 for n, c in zip(p.seqlens_k, counts, strict=True)]
    assert plan["indices"].dtype == torch.int32 and len(plan["indices"]) == sum(counts)
    assert fake.last("Decode.run")["q"].shape == (4, 8, 128)


def test_flashinfer_paged_prefill_sinks_and_alibi(fake):
    p = problem("flashinfer", "causal", "sinks", "paged_kv:128")
    run_and_check("flashinfer", p)
    assert fake.last("PagedPrefill.plan")["page_size"] == 128
    assert fake.last("PagedPrefill.run")["sinks"] is p.sinks
    run_and_check("flashinfer", problem("flashinfer", "causal", "alibi"))
    assert fake.last("Ragged.plan")["pos_encoding_mode"] == "ALIBI"


# ------------------------------------------------------------------ what the APIs cannot express

@pytest.mark.parametrize("backend,op,features,words", [
    ("trtllm_ragged", "prefill", ("causal", "softcap"),
     "trtllm_ragged_attention_deepseek has no parameter for a logits softcap"),
    ("trtllm_context", "prefill", ("causal", "alibi"), "trtllm_batch_context_with_kv_cache has no parameter for ALiBi"),
    ("trtllm_decode", "decode", ("causal", "softcap"),
     "trtllm_batch_decode_with_kv_cache has no parameter for a logits softcap"),
    ("trtllm_decode", "prefill", ("causal",), "is a decode entry point"),
    ("trtllm_ragged", "prefill", ("causal", "paged_kv:64"), "trtllm_ragged_attention_deepseek takes no block table"),
    ("flashinfer", "prefill", ("causal", "sinks"), "BatchPrefillWithRaggedKVCacheWrapper.run has no attention-sink"),
])
def test_unsupported(fake, backend, op, features, words):
    with pytest.raises(Unsupported, match=words):
        load_backend(backend).prepare(problem(backend, *features, op=op))
    assert not [n for n, _ in fake.calls if not n.endswith("__init__")]  # nothing was run


def test_unsupported_shapes_and_windows(fake):
    with pytest.raises(Unsupported, match="one head_dim"):
        load_backend("trtllm_decode").prepare(problem("trtllm_decode", op="decode", hd=192, hdv=128))
    with pytest.raises(Unsupported, match="takes one head_dim"):
        load_backend("flashinfer").prepare(problem("flashinfer", op="decode", hd=192, hdv=128))
    for backend in ("trtllm_ragged", "flashinfer"):
        with pytest.raises(Unsupported, match="no right-window parameter"):
            load_backend(backend).prepare(problem(backend, window=(256, 8), causal=False))
    fake.slopes = torch.ones(8)
    with pytest.raises(Unsupported, match="takes no ALiBi slopes"):
        load_backend("flashinfer").prepare(problem("flashinfer", "causal", "alibi"))


def test_library_refusals_propagate(fake, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("Unsupported head dimensions: query=64, key=64, value=64.")

    monkeypatch.setattr(sys.modules["flashinfer.prefill"], "trtllm_ragged_attention_deepseek", refuse)
    call = load_backend("trtllm_ragged").prepare(problem("trtllm_ragged", "causal", hd=64))
    with pytest.raises(AssertionError, match="Unsupported head dimensions"):
        call()
