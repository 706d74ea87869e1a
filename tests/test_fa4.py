"""FA4 backend: how a Problem maps onto flash_attn.cute's API (no GPU, no FA4 import needed), and on a
GPU, that the kernel agrees with the reference."""

from __future__ import annotations

import struct

import pytest
import torch
from attnmatrix.kernels import fa4
from attnmatrix.kernels.base import load_backend
from attnmatrix.kernels.problem import SOFTCAP, VALIDATION_SHAPES, Problem, Shape, Unsupported, make_problem
from attnmatrix.matrix.cases import Case


def problem(*features: str, op: str = "prefill", hd: int = 128, hdv: int | None = None,
            dtype: str = "bfloat16") -> Problem:
    case = Case("sm_90", "fa4", op, dtype, hd, hdv or hd, features)
    return make_problem(case, VALIDATION_SHAPES[op], device="cpu")


def test_registered():
    b = load_backend("fa4")
    assert b is fa4.FA4
    assert (b.name, b.library, b.device, b.imports) == ("fa4", "flash-attn-4", "cuda", ("flash_attn.cute",))
    assert b.compile_only is fa4.compile_only


@pytest.mark.parametrize("features,expected", [
    ((), "flash_attn.cute.flash_attn_func"),
    (("causal",), "flash_attn.cute.flash_attn_func"),
    (("causal", "varlen"), "flash_attn.cute.flash_attn_varlen_func"),
    (("causal", "paged_kv:16"), "flash_attn.cute.flash_attn_varlen_func"),
])
def test_entry(features, expected):
    assert fa4.entry(Case("sm_90", "fa4", "prefill", "bfloat16", 128, 128, features)) == expected


def test_dense_causal():
    p = problem("causal")
    call = fa4.build_call(p)
    assert call.func == "flash_attn_func"
    assert call.args[0] is p.q and call.args[1] is p.k and call.args[2] is p.v
    assert call.kwargs == {"softmax_scale": p.scale, "causal": True, "window_size": (None, None), "softcap": 0.0}


def test_window_softcap_sinks_gqa():
    p = problem("sliding_window")
    kw = fa4.build_call(p).kwargs
    assert kw["causal"] is False and kw["window_size"] == p.window and p.window[1] == 0
    assert fa4.build_call(problem("causal", "softcap")).kwargs["softcap"] == SOFTCAP
    p = problem("causal", "sinks")
    sink = fa4.build_call(p).kwargs["learnable_sink"]
    assert sink is p.sinks and sink.dtype == torch.float32 and sink.shape == (p.q.shape[2],)
    p = problem("causal", "gqa")
    args = fa4.build_call(p).args
    assert args[0].shape[2] == 4 * args[1].shape[2] == 4 * args[2].shape[2]  # native GQA: fewer k/v heads


def test_decode_uses_the_same_entry():
    p = problem("causal", op="decode")
    call = fa4.build_call(p)
    assert call.func == "flash_attn_func" and call.args[0].shape[1] == 1


def test_varlen_packs_and_unpacks():
    p = problem("causal", "varlen")
    call = fa4.build_call(p)
    assert call.func == "flash_attn_varlen_func"
    q, k, _ = call.args
    kw = call.kwargs
    assert kw["cu_seqlens_q"].dtype == torch.int32 and kw["cu_seqlens_k"].dtype == torch.int32
    assert q.shape[0] == int(kw["cu_seqlens_q"][-1]) == sum(p.seqlens_q)
    assert k.shape[0] == int(kw["cu_seqlens_k"][-1])
    assert isinstance(kw["max_seqlen_q"], int) and kw["max_seqlen_k"] == max(p.seqlens_k)
    out = call.post(torch.ones(q.shape[0], q.shape[1], p.v.shape[-1]))
    assert out.shape == p.q.shape[:3] + (p.v.shape[-1],)
    assert out[1, p.seqlens_q[1]:].abs().sum() == 0  # rows past a sequence's end are zero


@pytest.mark.parametrize("varlen", [False, True])
def test_paged_kv(varlen):
    feats = ("causal", "paged_kv:64") + (("varlen",) if varlen else ())
    p = problem(*feats)
    call = fa4.build_call(p)
    assert call.func == "flash_attn_varlen_func"
    q, k_cache, v_cache = call.args
    kw = call.kwargs
    assert "cu_seqlens_k" not in kw  # FA4: "page_table is not supported with cu_seqlens_k"
    b = p.shape.batch
    assert kw["page_table"].dtype == torch.int32 and kw["page_table"].shape == (b, -(-p.shape.seqlen_k // 64))
    assert k_cache.shape[1] == v_cache.shape[1] == 64
    assert kw["seqused_k"].tolist() == [p.valid_k(i) for i in range(b)]
    if varlen:
        assert q.dim() == 3 and "cu_seqlens_q" in kw
    else:
        assert q is p.q and "cu_seqlens_q" not in kw


def test_fp8_goes_through_without_descale():
    p = problem("causal", "fp8")
    p.descale = (1.0, 1.0, 1.0)  # unit descales are no descale: FA4's public API can take the case
    call = fa4.build_call(p)
    assert all(t.dtype == torch.float8_e4m3fn for t in call.args)
    assert not any("descale" in k for k in call.kwargs)


def test_alibi_is_unsupported_without_importing_fa4():
    with pytest.raises(Unsupported, match="no alibi_slopes parameter"):
        fa4.prepare(problem("causal", "alibi"))


def test_non_unit_descale_is_unsupported():
    p = problem("causal", "fp8")
    p.descale = (0.5, 1.0, 1.0)
    with pytest.raises(Unsupported, match="q_descale"):
        fa4.build_call(p)
    # The validation problem's descales are not 1 (a check with unit descales cannot see them dropped).
    with pytest.raises(Unsupported, match="q_descale"):
        fa4.build_call(problem("causal", "fp8"))


def test_head_dims_pass_through_unchanged():
    # FA4 decides what it supports: attnmatrix never filters head dims.
    for hd, hdv in [(512, 512), (192, 128), (32, 32)]:
        args = fa4.build_call(problem("causal", hd=hd, hdv=hdv)).args
        assert (args[0].shape[-1], args[2].shape[-1]) == (hd, hdv)


def _fatbin(entries: list[tuple[int, int, bytes]]) -> bytes:
    body = b""
    for kind, sm, payload in entries:
        hdr = struct.pack("<HHIQ", kind, 0x101, 64, len(payload)) + b"\0" * 12 + struct.pack("<I", sm)
        body += hdr.ljust(64, b"\0") + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _mlir_escape(b: bytes) -> str:
    return "".join(chr(c) if 32 <= c < 127 and chr(c) not in '"\\' else ("\\\\" if c == 0x5C else f"\\{c:02X}")
                   for c in b)


def test_cubin_facts_reads_the_embedded_fatbinary():
    blob = _fatbin([(1, 90, b"ptx text"), (2, 90, b"\x7fELF" + bytes(range(256)) * 3 + b'\\"')])
    ir = f'llvm.mlir.global internal constant @kernels_binary("{_mlir_escape(blob)}") {{addr_space = 0 : i32}}\n'

    class Compiled:
        __cubin__ = None
        ir_module = ir

    assert fa4.cubin_facts(Compiled()) == {"cubin_bytes": 4 + 768 + 2, "cubin_sm": 90}

    class Kept:
        __cubin__ = b"\x7fELF1234"

    assert fa4.cubin_facts(Kept()) == {"cubin_bytes": 8}
    assert fa4.cubin_facts(object()) == {}  # a kernel loaded from FA4's disk cache: nothing to read


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("features", [("causal",), ("sliding_window",), ("causal", "softcap"), ("causal", "sinks"),
                                      ("causal", "gqa"), ("causal", "varlen"), ("causal", "paged_kv:16")])
def test_fa4_matches_reference_on_gpu(features):
    pytest.importorskip("flash_attn.cute")
    from attnmatrix.kernels.reference import compare, reference_attention

    case = Case("sm_90", "fa4", "prefill", "bfloat16", 128, 128, features)
    p = make_problem(case, Shape("t", 2, 200, 200, 8, 8), device="cuda")
    out = fa4.prepare(p)()
    err = compare(p, out, reference_attention(p))
    assert err["ok"], err


@pytest.mark.slow
def test_fa2_shadowing_fa4_is_named_in_the_unavailable_reason(tmp_path) -> None:
    """FA2's regular `flash_attn` package hides FA4's namespace `flash_attn.cute` wherever both are installed:
    the reason says which package and what to do, in a fresh interpreter with a stand-in FA2 first on
    the path."""
    import subprocess
    import sys

    fake_fa2 = tmp_path / "flash_attn"
    fake_fa2.mkdir()
    (fake_fa2 / "__init__.py").write_text("__version__ = '2.8.3'\n")
    code = ("from attnmatrix.kernels.fa4 import FA4; print(FA4.availability())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)}).stdout
    assert "cannot import flash_attn.cute" in out
    assert f"regular package at {fake_fa2}" in out and "separate environments" in out
