"""How backends map a `Problem` onto their library's API.

FA2 and FA3 are not installed here: a tiny fake module records what `prepare` passes, so the
mapping (argument names, values, which entry point) is checked without a GPU. SDPA runs for real
on the CPU, end to end through `probe_case`.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
import warnings

import pytest
import torch
from attnmatrix.kernels.base import load_backend
from attnmatrix.kernels.probe import ProbeConfig, probe_case
from attnmatrix.kernels.problem import SOFTCAP, WINDOW, Shape, Unsupported, make_problem
from attnmatrix.kernels.reference import compare, reference_attention
from attnmatrix.kernels.sdpa import _mask, _torch_reasons
from attnmatrix.matrix.cases import Case

SMALL = {"prefill": Shape("t", 2, 24, 24, 4, 4), "decode": Shape("t", 3, 1, 40, 4, 4)}


def _problem(backend, features=(), op="prefill", hd=32, hdv=32, dtype="bfloat16", shape=None):
    case = Case("sm_90", backend, op, dtype, hd, hdv, tuple(features))
    return make_problem(case, shape or SMALL[op], seed=1)


class Recorder:
    """Stands in for a library module: records each call, returns a zero output of the right shape."""

    def __init__(self, names, raise_with=None, tuple_out=False):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.raise_with = raise_with
        self.tuple_out = tuple_out
        for name in names:
            setattr(self, name, self._fn(name))

    def _fn(self, name):
        def fn(q, k, v, *args, **kw):
            self.calls.append((name, (q, k, v, *args), kw))
            if self.raise_with:
                raise self.raise_with
            dv = v.shape[-1]
            out = q[..., :1].expand(*q.shape[:-1], dv).clone()  # echo q's first feature: unpacking shows
            return (out, None) if self.tuple_out else out

        return fn

    @property
    def last(self):
        assert len(self.calls) == 1, self.calls
        return self.calls[0]


FA_NAMES = ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache")


@pytest.fixture
def fake_fa2(monkeypatch):
    iface = Recorder(FA_NAMES)
    pkg = types.ModuleType("flash_attn")
    pkg.flash_attn_interface = iface
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", iface)
    return iface


@pytest.fixture
def fake_fa3(monkeypatch):
    iface = Recorder(FA_NAMES, tuple_out=True)  # some FA3 releases return (out, lse)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", iface)
    return iface


def _installed(mod: str) -> bool:
    try:
        importlib.import_module(mod)
        return True
    except Exception:  # noqa: BLE001
        return False


# --- availability -------------------------------------------------------------------------------

@pytest.mark.parametrize("name,module", [("fa2", "flash_attn.flash_attn_interface"), ("fa3", "flash_attn_interface")])
def test_unavailable_names_the_module(name, module):
    if _installed(module):
        pytest.skip(f"{module} is installed here")
    why = load_backend(name).availability()
    assert why is not None and module in why


def test_fa2_is_not_fooled_by_the_fa4_namespace_package(monkeypatch):
    # flash-attn-4 installs flash_attn/cute only, which makes a bare `import flash_attn` succeed.
    if _installed("flash_attn.flash_attn_interface"):
        pytest.skip("FA2 is installed here")
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    assert load_backend("fa2").availability() is not None


def test_available_with_the_fake(fake_fa2, fake_fa3):
    assert load_backend("fa2").availability() is None
    assert load_backend("fa3").availability() is None


# --- FA2 ----------------------------------------------------------------------------------------

def test_fa2_causal(fake_fa2):
    p = _problem("fa2", ("causal",))
    out = load_backend("fa2").prepare(p)()
    name, args, kw = fake_fa2.last
    assert name == "flash_attn_func"
    assert args[0] is p.q and args[1] is p.k and args[2] is p.v
    assert kw["causal"] is True and kw["softmax_scale"] == p.scale
    assert tuple(kw["window_size"]) == (-1, -1) and kw["softcap"] == 0.0 and kw["alibi_slopes"] is None
    assert out.shape == (2, 24, 4, 32)


def test_fa2_window_softcap_alibi_gqa(fake_fa2):
    fa2 = load_backend("fa2")
    fa2.prepare(_problem("fa2", ("sliding_window",)))()
    fa2.prepare(_problem("fa2", ("causal", "softcap")))()
    pa = _problem("fa2", ("causal", "alibi"))
    fa2.prepare(pa)()
    pg = _problem("fa2", ("causal", "gqa"))
    fa2.prepare(pg)()
    (_, _, win), (_, _, cap), (_, _, ali), (_, gargs, _) = fake_fa2.calls
    assert tuple(win["window_size"]) == (WINDOW, 0) and win["causal"] is False
    assert cap["softcap"] == SOFTCAP and cap["causal"] is True
    assert ali["alibi_slopes"] is pa.alibi_slopes
    assert ali["alibi_slopes"].dtype == torch.float32 and ali["alibi_slopes"].shape == (4,)
    assert gargs[1].shape[2] == 1 and gargs[0].shape[2] == 4  # kv heads passed as they are


def test_fa2_paged_decode_uses_kvcache_with_block_table(fake_fa2):
    p = _problem("fa2", ("causal", "paged_kv:16"), op="decode")
    out = load_backend("fa2").prepare(p)()
    name, (q, k_cache, v_cache), kw = fake_fa2.last
    assert name == "flash_attn_with_kvcache" and q is p.q
    table = kw["block_table"]
    assert table.dtype == torch.int32 and table.shape == (3, 3)  # ceil(40 / 16) blocks per sequence
    assert not torch.equal(table.flatten().sort().values, table.flatten())  # shuffled, not the identity
    assert k_cache.shape == (9, 16, 4, 32)
    assert kw["cache_seqlens"].dtype == torch.int32 and kw["cache_seqlens"].tolist() == [40, 40, 40]
    for b in range(3):  # the table really points at each sequence's keys
        assert torch.equal(k_cache[table[b, 1]], p.k[b, 16:32])
        assert torch.equal(v_cache[table[b, 2], :8], p.v[b, 32:40])
    assert kw["causal"] is True and out.shape == (3, 1, 4, 32)


def test_fa2_varlen_passes_cu_seqlens_and_unpacks(fake_fa2):
    p = _problem("fa2", ("causal", "varlen"), shape=Shape("t", 3, 20, 20, 2, 2))
    out = load_backend("fa2").prepare(p)()
    name, (q, k, v, cu_q, cu_k, max_q, max_k), kw = fake_fa2.last
    assert name == "flash_attn_varlen_func"
    lens = p.seqlens_q
    assert min(lens) < 20
    assert cu_q.dtype == torch.int32 and cu_q.tolist() == [0, lens[0], lens[0] + lens[1], sum(lens)]
    assert cu_k.tolist() == cu_q.tolist() and max_q == max(lens) and max_k == max(p.seqlens_k)
    assert q.shape == (sum(lens), 2, 32) and "block_table" not in kw
    # the fake echoes q's first feature: valid rows line up with their sequence, padding is zero
    for b, n in enumerate(lens):
        assert torch.equal(out[b, :n, :, 0], p.q[b, :n, :, 0])
        assert torch.count_nonzero(out[b, n:]) == 0


def test_fa2_paged_varlen_uses_varlen_with_block_table(fake_fa2):
    p = _problem("fa2", ("causal", "varlen", "paged_kv:16"), shape=Shape("t", 2, 20, 20, 2, 2))
    load_backend("fa2").prepare(p)()
    name, (q, k, v, cu_q, cu_k, *_), kw = fake_fa2.last
    assert name == "flash_attn_varlen_func"
    assert k.shape == (4, 16, 2, 32) and kw["block_table"].shape == (2, 2)
    assert cu_k.tolist() == [0, p.seqlens_k[0], sum(p.seqlens_k)]


def test_fa2_sinks_unsupported_and_nothing_called(fake_fa2):
    with pytest.raises(Unsupported, match="sinks"):
        load_backend("fa2").prepare(_problem("fa2", ("causal", "sinks")))
    assert fake_fa2.calls == []


def test_fa2_fp8_and_head_dim_v_are_passed_for_fa2_to_judge(fake_fa2):
    fa2 = load_backend("fa2")
    fa2.prepare(_problem("fa2", ("causal", "fp8")))()
    fa2.prepare(_problem("fa2", ("causal",), hd=48, hdv=32))()
    (_, a8, _), (_, adim, _) = fake_fa2.calls
    assert a8[0].dtype == torch.float8_e4m3fn
    assert adim[0].shape[-1] == 48 and adim[2].shape[-1] == 32


@pytest.mark.parametrize("features,op,entry", [
    (("causal",), "prefill", "flash_attn.flash_attn_func"),
    (("causal",), "decode", "flash_attn.flash_attn_func"),
    (("causal", "paged_kv:16"), "decode", "flash_attn.flash_attn_with_kvcache"),
    (("causal", "varlen"), "prefill", "flash_attn.flash_attn_varlen_func"),
    (("causal", "varlen", "paged_kv:256"), "prefill", "flash_attn.flash_attn_varlen_func"),
])
def test_fa2_entry(features, op, entry, fake_fa2):
    case = Case("sm_90", "fa2", op, "bfloat16", 64, 64, features)
    assert load_backend("fa2").entry(case) == entry
    p = make_problem(case, SMALL[op] if "varlen" not in features else Shape("t", 2, 20, 20, 2, 2))
    load_backend("fa2").prepare(p)()
    assert entry.endswith(fake_fa2.last[0])  # the entry named is the one called


def test_fa2_refusal_is_recorded_in_its_own_words(monkeypatch):
    iface = Recorder(FA_NAMES, raise_with=RuntimeError("FlashAttention only support fp16 and bf16 data type"))
    pkg = types.ModuleType("flash_attn")
    pkg.flash_attn_interface = iface
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", iface)
    backend = dataclasses.replace(load_backend("fa2"), device="cpu")
    case = Case("sm_90", "fa2", "decode", "bfloat16", 64, 64, ("causal", "fp8"))
    rec = probe_case(case, ProbeConfig(timing=False), base_provenance={}, backend=backend)
    assert rec.outcome == "rejected"
    assert rec.reason == "RuntimeError: FlashAttention only support fp16 and bf16 data type"
    assert rec.entry == "flash_attn.flash_attn_func"


# --- FA3 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("feature", ["alibi", "sinks"])
def test_fa3_unsupported(feature, fake_fa3):
    with pytest.raises(Unsupported, match="FlashAttention 3"):
        load_backend("fa3").prepare(_problem("fa3", ("causal", feature)))
    assert fake_fa3.calls == []


def test_fa3_causal_window_softcap(fake_fa3):
    fa3 = load_backend("fa3")
    p = _problem("fa3", ("causal", "softcap"))
    out = fa3.prepare(p)()
    fa3.prepare(_problem("fa3", ("sliding_window",)))()
    (name, args, kw), (_, _, win) = fake_fa3.calls
    assert name == "flash_attn_func" and args[0] is p.q
    assert kw["causal"] is True and kw["softcap"] == SOFTCAP and kw["softmax_scale"] == p.scale
    assert "alibi_slopes" not in kw and "q_descale" not in kw
    assert tuple(win["window_size"]) == (WINDOW, 0) and win["causal"] is False
    assert out.shape == (2, 24, 4, 32)  # the (out, lse) tuple was unwrapped


def test_fa3_paged_uses_page_table(fake_fa3):
    p = _problem("fa3", ("causal", "paged_kv:16"), op="decode")
    load_backend("fa3").prepare(p)()
    name, (q, k_cache, _), kw = fake_fa3.last
    assert name == "flash_attn_with_kvcache" and q is p.q
    assert kw["page_table"].dtype == torch.int32 and k_cache.shape == (9, 16, 4, 32)
    assert kw["cache_seqlens"].tolist() == [40, 40, 40] and "block_table" not in kw


def test_fa3_paged_varlen_packs_q_into_kvcache(fake_fa3):
    p = _problem("fa3", ("causal", "varlen", "paged_kv:16"), shape=Shape("t", 2, 20, 20, 2, 2))
    out = load_backend("fa3").prepare(p)()
    name, (q, _, _), kw = fake_fa3.last
    assert name == "flash_attn_with_kvcache"
    assert q.shape[0] == sum(p.seqlens_q) and kw["cu_seqlens_q"].tolist()[-1] == sum(p.seqlens_q)
    assert kw["max_seqlen_q"] == max(p.seqlens_q) and kw["cache_seqlens"].tolist() == p.seqlens_k
    assert out.shape == (2, 20, 2, 32)


def test_fa3_varlen(fake_fa3):
    p = _problem("fa3", ("causal", "varlen"), shape=Shape("t", 3, 20, 20, 2, 2))
    load_backend("fa3").prepare(p)()
    name, (q, k, v, cu_q, cu_k, max_q, max_k), _ = fake_fa3.last
    assert name == "flash_attn_varlen_func" and cu_q.dtype == torch.int32 and max_k == max(p.seqlens_k)


def test_fa3_fp8_descales(fake_fa3):
    p = _problem("fa3", ("causal", "fp8", "gqa"))
    load_backend("fa3").prepare(p)()
    _, args, kw = fake_fa3.last
    assert args[0].dtype == torch.float8_e4m3fn
    for name in ("q_descale", "k_descale", "v_descale"):
        assert kw[name].shape == (2, 1) and kw[name].dtype == torch.float32  # (batch, heads_kv)


# --- SDPA, for real on the CPU ------------------------------------------------------------------

def _cpu(name):
    return dataclasses.replace(load_backend(name), device="cpu")


@pytest.mark.parametrize("features,op", [
    (("causal",), "prefill"), (("sliding_window",), "prefill"), (("causal", "alibi"), "prefill"),
    (("causal", "gqa"), "decode"),
])
def test_sdpa_cpu_passes_against_the_reference(features, op):
    case = Case("cpu", "sdpa_cpu", op, "float16", 64, 64, features)
    rec = probe_case(case, ProbeConfig(timing=False), base_provenance={}, backend=_cpu("sdpa_cpu"))
    assert rec.outcome == "pass", rec.reason


def test_sdpa_without_a_parameter_is_attnmatrix_speaking():
    case = Case("cpu", "sdpa_cpu", "prefill", "float16", 64, 64, ("causal", "softcap"))
    rec = probe_case(case, ProbeConfig(timing=False), base_provenance={}, backend=_cpu("sdpa_cpu"))
    assert rec.outcome == "rejected" and rec.reason.startswith("attnmatrix:") and "softcap" in rec.reason


def test_sdpa_kernel_refusal_is_torchs_not_an_adapter_crash():
    # No cuDNN kernel on the CPU: torch refuses from inside its op; that must read as torch's refusal.
    case = Case("cpu", "sdpa_cudnn", "prefill", "float16", 64, 64, ("causal",))
    rec = probe_case(case, ProbeConfig(timing=False), base_provenance={}, backend=_cpu("sdpa_cudnn"))
    assert rec.outcome == "rejected", rec.reason
    assert not rec.reason.startswith("attnmatrix")


def test_sdpa_bottom_right_causal_when_sq_lt_sk():
    from torch.nn.attention.bias import CausalBias

    p = _problem("sdpa_cpu", ("causal",), dtype="float16", shape=Shape("t", 2, 30, 70, 4, 4))
    mask, is_causal = _mask(p)
    assert isinstance(mask, CausalBias) and not is_causal
    out = load_backend("sdpa_cpu").prepare(p)()
    assert compare(p, out, reference_attention(p))["ok"]


def test_sdpa_masks():
    sq_eq = _problem("sdpa_cpu", ("causal",))
    assert _mask(sq_eq) == (None, True)
    assert _mask(_problem("sdpa_cpu", ("causal",), op="decode")) == (None, False)
    win, causal = _mask(_problem("sdpa_cpu", ("sliding_window",)))
    assert win.dtype == torch.bool and win.shape == (24, 24) and not causal
    assert torch.equal(win, torch.ones(24, 24, dtype=torch.bool).tril())  # the window (256, 0) spans all 24
    bias, causal = _mask(_problem("sdpa_cpu", ("causal", "alibi")))
    assert bias.shape == (1, 4, 24, 24) and bias.dtype == torch.bfloat16 and not causal
    assert bias[0, 0, 0, 1] == float("-inf") and bias[0, 0, 5, 5] == 0 and bias[0, 0, 5, 2] < 0


def _warn(msg):
    return warnings.WarningMessage(msg, UserWarning, "x.py", 1)


def test_torch_reasons_picks_the_restricted_kernels_section():
    seen = [_warn(m) for m in (
        "Memory efficient kernel not used because:",
        "Memory efficient attention has been runtime disabled. (Triggered internally at sdp_utils.cpp:1.)",
        "Flash attention kernel not used because:",
        "Flash attention does not support non-null attn_mask.",
        "cuDNN attention kernel not used because:",
        "cuDNN attention has been runtime disabled.",
    )]
    assert _torch_reasons("FLASH_ATTENTION", seen) == (
        "Flash attention kernel not used because: Flash attention does not support non-null attn_mask.")
    assert _torch_reasons("EFFICIENT_ATTENTION", seen) == (
        "Memory efficient kernel not used because: Memory efficient attention has been runtime disabled.")
    assert _torch_reasons("CUDNN_ATTENTION", seen).startswith("cuDNN attention kernel not used because:")
    assert _torch_reasons(None, [_warn("something else")]) == "something else"


# --- the mask and the output dtype are what the case says ---------------------------------------------------------


@pytest.mark.parametrize("features,mask", [((), "none"), (("causal",), "causal")])
def test_mla_prefill_runs_the_case_mask(features, mask):
    case = Case("cpu", "sdpa_cpu", "mla_prefill", "float16", 64, 32, (*features, "qk_rope:32"))
    assert make_problem(case, SMALL["prefill"]).causal == (mask == "causal")
    rec = probe_case(case, ProbeConfig(timing=False), base_provenance={}, backend=_cpu("sdpa_cpu"))
    assert rec.outcome == "pass", rec.reason
    assert rec.extra["mask"] == mask and rec.extra["out_dtype"] == "float16"


def test_an_output_of_another_dtype_is_wrong_however_close():
    """vLLM's FA3 writes bfloat16 for fp8 inputs whatever the case asks: the values may be right, the case is not."""
    sdpa = _cpu("sdpa_cpu")

    def prepare(p):
        call = sdpa.prepare(p)
        return lambda: call().to(torch.bfloat16)

    backend = dataclasses.replace(sdpa, prepare=prepare)
    case = Case("cpu", "sdpa_cpu", "prefill", "float16", 64, 64, ("causal",))
    rec = probe_case(case, ProbeConfig(timing=False), base_provenance={}, backend=backend)
    assert rec.outcome == "wrong" and rec.reason == "output dtype bfloat16, not the case's float16"
    assert rec.extra["out_dtype"] == "bfloat16"
