"""The reference attention and the FLOP count, checked against computations that do not share their code.

Masks are checked through attention weights: with q = 0 every score is 0, so a row's weights are
uniform over the keys it may see, and with v = identity the output row *is* the weight row.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from attnmatrix.kernels.flops import allowed_pairs, attention_flops, problem_flops
from attnmatrix.kernels.problem import Problem, Shape, make_problem
from attnmatrix.kernels.reference import compare, mask_for, reference_attention
from attnmatrix.matrix.cases import Case

F64 = torch.float64


def _case(features=(), op="prefill", hd=16, hdv=16, dtype="float16") -> Case:
    return Case("cpu", "sdpa_cpu", op, dtype, hd, hdv, tuple(features))


def _problem(q, k, v, *, features=(), causal=False, window=None, softcap=0.0, alibi=None, sinks=None,
             seqlens_q=None, seqlens_k=None, scale=None) -> Problem:
    """A Problem around given float64 tensors (B, S, H, D), for hand-made examples."""
    b, sq, hq, d = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[-1]
    return Problem(
        case=_case(features, hd=d, hdv=dv), shape=Shape("t", b, sq, sk, hq, hkv), q=q, k=k, v=v,
        scale=(1.0 / math.sqrt(d)) if scale is None else scale, causal=causal, window=window, softcap=softcap,
        alibi_slopes=alibi, sinks=sinks, seqlens_q=seqlens_q, seqlens_k=seqlens_k, page_size=None, fp8=False,
        descale=None,
    )


def _weights(sq: int, sk: int, **kw) -> torch.Tensor:
    """The (sq, sk) attention weights of one head, read off with q = 0 and v = identity."""
    q = torch.zeros(1, sq, 1, 4, dtype=F64)
    k = torch.randn(1, sk, 1, 4, dtype=F64)
    v = torch.eye(sk, dtype=F64).view(1, sk, 1, sk)
    return reference_attention(_problem(q, k, v, **kw), dtype=F64)[0, :, 0, :]


def _uniform_rows(allowed: list[list[int]], sk: int) -> torch.Tensor:
    w = torch.zeros(len(allowed), sk, dtype=F64)
    for i, js in enumerate(allowed):
        if js:
            w[i, js] = 1.0 / len(js)
    return w


def _sdpa64(p: Problem, attn_mask=None, is_causal=False) -> torch.Tensor:
    q, k, v = (t.to(F64).transpose(1, 2) for t in (p.q, p.k, p.v))
    gqa = k.shape[1] != q.shape[1]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=p.scale,
                                         enable_gqa=gqa)
    return out.transpose(1, 2)


# --- against torch's SDPA (math, float64, CPU) ---------------------------------------------------

@pytest.mark.parametrize("features", [(), ("causal",), ("causal", "gqa"), ("gqa",)])
def test_matches_sdpa_square(features):
    p = make_problem(_case(features, hd=32, hdv=32), Shape("t", 2, 37, 37, 8, 8), seed=3)
    ref = reference_attention(p, dtype=F64)
    assert ref.shape == (2, 37, 8, 32)
    torch.testing.assert_close(ref, _sdpa64(p, is_causal=p.causal), rtol=1e-10, atol=1e-10)


def test_matches_sdpa_bottom_right_causal_sq_lt_sk():
    p = make_problem(_case(("causal", "gqa"), hd=32, hdv=24), Shape("t", 2, 5, 23, 8, 8), seed=4)
    # bottom-right: query i sees keys j <= i + (sk - sq); built here with tril, not with mask_for
    allowed = torch.ones(5, 23, dtype=torch.bool).tril(diagonal=23 - 5)
    torch.testing.assert_close(reference_attention(p, dtype=F64), _sdpa64(p, attn_mask=allowed),
                               rtol=1e-10, atol=1e-10)


def test_decode_sees_the_whole_cache():
    p = make_problem(_case(("causal",), op="decode"), Shape("t", 3, 1, 50, 4, 4), seed=5)
    full = _problem(p.q.to(F64), p.k.to(F64), p.v.to(F64))  # no mask at all
    torch.testing.assert_close(reference_attention(p, dtype=F64), reference_attention(full, dtype=F64))
    assert torch.equal(mask_for(p, 1, 50, torch.device("cpu")), torch.ones(1, 50, dtype=torch.bool))


# --- hand-computed masks, scores and biases -----------------------------------------------------

def test_causal_square_weights():
    want = _uniform_rows([list(range(i + 1)) for i in range(4)], 4)
    torch.testing.assert_close(_weights(4, 4, causal=True), want)


def test_causal_bottom_right_when_sq_lt_sk():
    # sq=2, sk=5: row 0 sees keys 0..3, row 1 sees all five (flash-attention's docstring example)
    torch.testing.assert_close(_weights(2, 5, causal=True), _uniform_rows([[0, 1, 2, 3], [0, 1, 2, 3, 4]], 5))


def test_fully_masked_rows_give_zero():
    # sq=5, sk=2, causal bottom-right: rows 0..2 see nothing and must be 0, not NaN
    w = _weights(5, 2, causal=True)
    torch.testing.assert_close(w, _uniform_rows([[], [], [], [0], [0, 1]], 2))
    assert not torch.isnan(w).any()


def test_sliding_window_left_only():
    want = _uniform_rows([list(range(max(0, i - 2), i + 1)) for i in range(6)], 6)
    torch.testing.assert_close(_weights(6, 6, window=(2, 0)), want)


def test_sliding_window_left_and_right_bottom_right_aligned():
    # sq=3, sk=6: aligned query positions are 3, 4, 5; window (1, 1) keeps i'-1 .. i'+1
    want = _uniform_rows([[2, 3, 4], [3, 4, 5], [4, 5]], 6)
    torch.testing.assert_close(_weights(3, 6, window=(1, 1)), want)


def test_window_and_causal_together():
    want = _uniform_rows([[0], [0, 1], [1, 2], [2, 3]], 4)
    torch.testing.assert_close(_weights(4, 4, causal=True, window=(1, 5)), want)


def test_softcap_one_query_two_keys():
    q = torch.tensor([2.0, 0.0], dtype=F64).view(1, 1, 1, 2)
    k = torch.tensor([[30.0, 0.0], [-5.0, 1.0]], dtype=F64).view(1, 2, 1, 2)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=F64).view(1, 2, 1, 2)
    cap, scale = 10.0, 0.5
    s = [cap * math.tanh(x * scale / cap) for x in (60.0, -10.0)]  # q.k = 60, -10
    e = [math.exp(x - max(s)) for x in s]
    want = torch.tensor([e[0], e[1]], dtype=F64) / sum(e)
    out = reference_attention(_problem(q, k, v, softcap=cap, scale=scale), dtype=F64)[0, 0, 0]
    torch.testing.assert_close(out, want)
    # without the cap the first key takes everything: the cap really changed the answer
    plain = reference_attention(_problem(q, k, v, scale=scale), dtype=F64)[0, 0, 0]
    assert plain[1] < 1e-12 < float(out[1])


def test_alibi_bias_bottom_right():
    slope = 0.7
    w = _weights(2, 4, alibi=torch.tensor([slope], dtype=torch.float32))
    for i, ia in enumerate((2, 3)):  # aligned positions of the two queries
        e = [math.exp(-slope * abs(ia - j)) for j in range(4)]
        torch.testing.assert_close(w[i], torch.tensor(e, dtype=F64) / sum(e))


def test_alibi_per_head_slopes():
    q = torch.zeros(1, 1, 2, 4, dtype=F64)
    k = torch.randn(1, 3, 2, 4, dtype=F64)
    v = torch.eye(3, dtype=F64).view(1, 3, 1, 3).expand(1, 3, 2, 3).contiguous()
    slopes = torch.tensor([0.0, 1.0])
    out = reference_attention(_problem(q, k, v, alibi=slopes), dtype=F64)[0, 0]
    torch.testing.assert_close(out[0], torch.full((3,), 1 / 3, dtype=F64))
    e = torch.tensor([math.exp(-2), math.exp(-1), 1.0], dtype=F64)
    torch.testing.assert_close(out[1], e / e.sum())


def test_sinks_add_to_the_denominator_only():
    sk, sink = 4, 1.5
    q = torch.zeros(1, 1, 1, 4, dtype=F64)
    k = torch.randn(1, sk, 1, 4, dtype=F64)
    v = torch.randn(1, sk, 1, 3, dtype=F64)
    out = reference_attention(_problem(q, k, v, sinks=torch.tensor([sink])), dtype=F64)[0, 0, 0]
    want = v[0, :, 0].sum(0) / (sk + math.exp(sink))
    torch.testing.assert_close(out, want)


def test_sinks_with_a_fully_masked_row():
    q = torch.zeros(1, 3, 1, 4, dtype=F64)
    k = torch.randn(1, 1, 1, 4, dtype=F64)
    v = torch.ones(1, 1, 1, 2, dtype=F64)
    out = reference_attention(_problem(q, k, v, causal=True, sinks=torch.tensor([0.0])), dtype=F64)[0, :, 0]
    torch.testing.assert_close(out[:2], torch.zeros(2, 2, dtype=F64))  # only the sink: output 0
    torch.testing.assert_close(out[2], torch.full((2,), 0.5, dtype=F64))  # e^0 / (e^0 + e^0)


def test_varlen_rows_are_each_sequence_alone_and_padding_is_zero():
    p = make_problem(_case(("causal", "varlen")), Shape("t", 3, 40, 40, 4, 4), seed=6)
    assert p.seqlens_k[0] == 40 and min(p.seqlens_k) < 40 and p.seqlens_q == p.seqlens_k
    ref = reference_attention(p, dtype=F64)
    for b in range(3):
        n = p.seqlens_q[b]
        alone = _problem(p.q[b:b + 1, :n].to(F64), p.k[b:b + 1, :n].to(F64), p.v[b:b + 1, :n].to(F64), causal=True)
        torch.testing.assert_close(ref[b, :n], reference_attention(alone, dtype=F64)[0])
        assert torch.count_nonzero(ref[b, n:]) == 0


def test_packed_and_unpack_round_trip():
    p = make_problem(_case(("varlen",)), Shape("t", 3, 20, 20, 2, 2), seed=7)
    assert (p.max_valid_q(), p.max_valid_k()) == (max(p.seqlens_q), max(p.seqlens_k))  # a varlen call's max_seqlen_*
    dense = make_problem(_case(()), Shape("t", 2, 5, 23, 2, 2), seed=7)
    assert (dense.max_valid_q(), dense.max_valid_k()) == (5, 23)
    q, k, v, cu_q, cu_k = p.packed()
    assert cu_q.dtype == torch.int32 and cu_q.tolist() == [0, *torch.tensor(p.seqlens_q).cumsum(0).tolist()]
    assert q.shape[0] == sum(p.seqlens_q) and k.shape[0] == sum(p.seqlens_k)
    back = p.unpack(q)
    for b, n in enumerate(p.seqlens_q):
        assert torch.equal(back[b, :n], p.q[b, :n]) and torch.count_nonzero(back[b, n:]) == 0


def test_compare_flags_wrong_and_nan_and_ignores_padding():
    p = make_problem(_case(("varlen",)), Shape("t", 2, 16, 16, 2, 2), seed=8)
    ref = reference_attention(p)
    assert compare(p, ref.to(p.out_dtype), ref)["ok"]
    bad = ref.clone()
    bad[0, 0, 0, 0] += 1.0
    assert not compare(p, bad, ref)["ok"]
    nan = ref.clone()
    nan[1, 0, 0, 0] = float("nan")
    r = compare(p, nan, ref)
    assert not r["ok"] and r["nan"] == 1
    pad = ref.clone()
    pad[1, p.seqlens_q[1]:] = 123.0  # rows past the end are not compared
    assert compare(p, pad, ref)["ok"]


# --- FLOP counting ------------------------------------------------------------------------------

def _brute_pairs(sq, sk, causal, window):
    i = torch.arange(sq).unsqueeze(1) + (sk - sq)
    j = torch.arange(sk).unsqueeze(0)
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window is not None:
        ok &= (j >= i - window[0]) & (j <= i + window[1])
    return int(ok.sum())


@pytest.mark.parametrize("sq,sk,causal,window", [
    (64, 64, False, None), (64, 64, True, None), (1, 100, True, None), (10, 100, True, None),
    (100, 10, True, None), (64, 64, False, (8, 0)), (64, 64, True, (8, 3)), (30, 70, False, (5, 5)),
    (300, 300, False, (256, 0)),
])
def test_allowed_pairs_matches_brute_force(sq, sk, causal, window):
    assert allowed_pairs(sq, sk, causal=causal, window=window) == _brute_pairs(sq, sk, causal, window)


def test_causal_is_about_half_of_dense():
    n = 4096
    dense = allowed_pairs(n, n, causal=False, window=None)
    causal = allowed_pairs(n, n, causal=True, window=None)
    assert causal == n * (n + 1) // 2
    assert abs(causal / dense - 0.5) < 1e-3


def test_window_counts_only_the_band():
    n, w = 8192, 256
    # row i keeps min(i, w) + 1 keys
    assert allowed_pairs(n, n, causal=False, window=(w, 0)) == sum(min(i, w) + 1 for i in range(n))
    assert allowed_pairs(n, n, causal=False, window=(w, 0)) < n * (w + 1)


def test_attention_flops_formula_and_varlen():
    f = attention_flops(batch=2, heads=3, seqlens_q=[4, 2], seqlens_k=[4, 2], head_dim=8, head_dim_v=16,
                        causal=False, window=None)
    assert f == 2 * 3 * (16 + 4) * (8 + 16)
    p = make_problem(_case(("causal", "varlen"), hd=32, hdv=16), Shape("t", 4, 64, 64, 2, 2), seed=9)
    want = sum(2 * 2 * (n * (n + 1) // 2) * (32 + 16) for n in p.seqlens_q)
    assert problem_flops(p) == want
    padded = make_problem(_case(("causal",), hd=32, hdv=16), Shape("t", 4, 64, 64, 2, 2), seed=9)
    assert problem_flops(p) < problem_flops(padded)


def test_problem_flops_counts_gqa_by_query_heads_and_decode():
    p = make_problem(_case(("causal", "gqa"), op="decode", hd=64, hdv=64), Shape("t", 2, 1, 100, 8, 8))
    assert p.k.shape[2] == 2
    assert problem_flops(p) == 2 * 8 * (2 * 100) * (64 + 64)


def test_a_problem_drawn_on_the_cpu_device_is_the_default_one():
    """`draw_on_device` only moves the draw for a GPU; on the CPU a problem is the same either way, so
    validation inputs (always drawn on the CPU) are the same on every device."""
    case = _case(("causal", "varlen", "sinks"), op="decode")
    shape = Shape("t", 3, 1, 50, 4, 4)
    a = make_problem(case, shape, seed=5)
    b = make_problem(case, shape, seed=5, draw_on_device=True)
    assert all(torch.equal(x, y) for x, y in ((a.q, b.q), (a.k, b.k), (a.v, b.v), (a.sinks, b.sinks)))
    assert a.seqlens_k == b.seqlens_k and a.k.float().std() > 0.5
