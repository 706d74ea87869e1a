"""The generated selector over a small hand-built matrix: the vendored module answers as the pages do."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest
from attnmatrix.generator import capabilities as C
from attnmatrix.generator import render_selector
from attnmatrix.generator import tables as T
from attnmatrix.matrix.cases import feature_name, page_size
from attnmatrix.matrix.evidence import Evidence, Ranking
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.records import parse_record
from conftest import vendored_selector

BACKENDS = {
    "fast": {"default_rank": 30},
    "slow": {"vllm": "TORCH_SDPA", "default_rank": 1},
    "bad": {"vllm": "BAD_ATTN", "default_rank": 1},
    "comp": {"default_rank": 5},
    "decl_a": {"vllm": "TORCH_SDPA", "default_rank": 1},
    "decl_b": {"vllm": "FLASHINFER", "default_rank": 2},
    "fa2": {"vllm": "FLASH_ATTN", "fa_version": 2, "mla_prefill": "FLASH_ATTN", "default_rank": 12},
    "fa3": {"vllm": "FLASH_ATTN", "fa_version": 3, "mla_prefill": "FLASH_ATTN", "default_rank": 11},
    "fa4": {"vllm": "FLASH_ATTN", "fa_version": 4, "mla_prefill": "FLASH_ATTN", "default_rank": 10},
    "trtllm_ragged": {"mla_prefill": "TRTLLM_RAGGED", "default_rank": 20},
    "flashinfer": {"mla_prefill": "FLASHINFER", "default_rank": 23},
    "sdpa_efficient": {"default_rank": 32},
    "sdpa_cpu": {"default_rank": 40},
    "fake_fast": {"test_only": True, "vllm": "FAKE", "default_rank": 0},
}


def rec(arch, backend, feats, outcome="pass", *, hd=128, hdv=None, op="prefill", tier="validated", lat=None,
        reason=None, dtype="bfloat16", sources=()):
    d = {"schema": 1, "outcome": outcome, "tier": tier,
         "case": {"arch": arch, "backend": backend, "op": op, "dtype": dtype, "head_dim": hd,
                  "head_dim_v": hd if hdv is None else hdv, "features": list(feats)},
         "provenance": {"date": "2026-11-01"} if tier == "declared" else
         {"device": "H200", "kernel_version": "1.0", "torch": "2.11", "date": "2026-11-01"}}
    if tier == "declared" and not sources:
        sources = (f"declared source for {backend}",)
    if sources:
        d["sources"] = list(sources)
    if outcome not in ("pass", "compiled"):
        d["reason"] = reason or f"{backend} refuses {'+'.join(feats) or 'none'}"
    if outcome == "pass" and tier == "validated":
        d["error"] = {"max_abs_err": 1e-3}
    if lat is not None:
        d["timings"] = [{"shape": "b1", "latency_ms": lat, "tflops": 10.0}]
    return parse_record(d)


CA, CS = ("causal",), ("causal", "softcap")


def records():
    H = "sm_90"
    return [
        rec(H, "fast", (), lat=0.9), rec(H, "fast", CA, lat=1.0), rec(H, "fast", CS, lat=1.5),
        rec(H, "slow", CA, lat=2.0), rec(H, "slow", CS, "rejected", reason="softcap: slow says no"),
        rec(H, "bad", CA, "rejected", reason="bad refuses everything"),
        rec(H, "bad", CS, "rejected", reason="bad refuses softcap too"),
        rec(H, "comp", CA, lat=1.2), rec(H, "comp", ("causal", "sinks"), "rejected", reason="sinks: comp says no"),
        rec(H, "comp", ("sliding_window",), "rejected", reason="window: comp says no"),
        rec(H, "comp", ("causal", "paged_kv:16"), lat=1.3),
        rec(H, "decl_a", CA, tier="declared"), rec(H, "decl_b", CA, tier="declared"),
        rec(H, "decl_a", CA, tier="declared", hd=64), rec(H, "decl_b", CA, tier="declared", hd=64),
        rec(H, "fake_fast", CA, lat=0.01),
        # FlashAttention: fa4 is fastest at 128 but refuses 64; fa3 refuses ALiBi, fa2 has it.
        rec(H, "fa4", CA, lat=0.5), rec(H, "fa4", CA, "rejected", hd=64, reason="fa4: no 64 here"),
        rec(H, "fa3", CA, lat=0.8), rec(H, "fa3", CA, hd=64, lat=0.4),
        rec(H, "fa3", ("alibi", "causal"), "rejected", reason="fa3 has no alibi"),
        rec(H, "fa2", CA, tier="declared"), rec(H, "fa2", CA, hd=64, tier="declared"),
        rec(H, "fa2", ("alibi", "causal"), tier="declared"),
        rec(H, "fa4", ("alibi", "causal"), "rejected", reason="fa4 has no alibi"),
        # MLA prefill at (192, 128): FLASH_ATTN twice (fa4, fa3), one without a vLLM name.
        *[rec("sm_100", b, CA, op="mla_prefill", hd=192, hdv=128, lat=lat)
          for b, lat in (("trtllm_ragged", 2.0), ("fa4", 1.0), ("fa3", 1.5), ("sdpa_efficient", 0.2))],
        rec("sm_100", "flashinfer", CA, op="mla_prefill", hd=192, hdv=128, tier="declared"),
        rec("sm_100", "fa2", CA, "rejected", op="mla_prefill", hd=192, hdv=128, reason="fa2: dv != d"),
        # A GPU arch with only declared, unmeasured evidence, and a declared ranking for it.
        rec("sm_100", "decl_a", CA, tier="declared"), rec("sm_100", "decl_b", CA, tier="declared"),
        rec("sm_100", "slow", CA, lat=3.0),
        rec("cpu", "sdpa_cpu", CA, lat=5.0),
    ]


RANKINGS = [Ranking("r1", ("sm_90", "sm_100"), "prefill", "bfloat16", ((128, 128),), ("decl_b", "decl_a", "slow"),
                    ("PR #1",), "decl_b beats decl_a")]


@pytest.fixture(scope="module")
def matrix():
    return resolve(Evidence(records=records(), where=["t"] * len(records()), rankings=list(RANKINGS),
                            backends={k: dict(v) for k, v in BACKENDS.items()}))


@pytest.fixture(scope="module")
def sel(matrix, tmp_path_factory):
    text = render_selector(matrix, {"matrix_id": "test-matrix", "kernel_versions": {"fa4": ["1.0"]}})
    return vendored_selector(text, tmp_path_factory.mktemp("sel"), "selector_under_test")


H100 = (9, 0)


def test_rejected_never_returned_and_latency_orders(sel):
    got = sel.select_backends(H100, 128)
    assert "bad" not in got
    # measured first, by latency; then the unmeasured, by the declared ranking (not by default rank)
    assert got == ["fa4", "fa3", "fast", "comp", "slow", "decl_b", "decl_a", "fa2"]
    assert sel.explain(H100, 128)["bad"].startswith("unsupported: causal: rejected (validated): bad refuses everything")


def test_test_only_backends_and_cpu_are_not_in_the_selector(sel, matrix):
    assert "fake_fast" not in sel.select_backends(H100, 128)
    assert "fake_fast" not in sel.explain(H100, 128)
    assert sel.ARCHS == ("sm_90", "sm_100")
    # even a matrix resolved with test-only backends does not leak them into the tables
    with_fakes = resolve(Evidence(records=records(), rankings=list(RANKINGS), backends=dict(BACKENDS)),
                         include_test_only=True)
    assert "fake_fast" not in repr(C.engine_data(with_fakes))


def test_declared_ranking_only_where_unmeasured(sel):
    # "slow" is listed last by the ranking but was measured on sm_90: latency decides, and measured comes first
    assert sel.select_backends(H100, 128)[:5] == ["fa4", "fa3", "fast", "comp", "slow"]
    # on sm_100 "slow" is measured too, so it still leads; the ranking orders the unmeasured ones
    assert sel.select_backends((10, 0), 128) == ["slow", "decl_b", "decl_a"]
    # no ranking applies at head size 64: default rank orders them
    assert sel.select_backends(H100, 64) == ["fa3", "decl_a", "decl_b", "fa2"]
    e = sel.explain(H100, 128)
    assert "by declared ranking r1 (PR #1)" in e["decl_b"]
    assert "by measured latency" in e["fast"] and "latency 1 ms" in e["fast"]
    assert "by default rank 12" in e["fa2"]


def test_composition_needs_every_component_and_reports_every_reason(sel):
    got = sel.select_backends(H100, 128, softcap=True)
    assert "fast" in got and "slow" not in got and "comp" not in got
    e = sel.explain(H100, 128, softcap=True)
    assert e["slow"].startswith("unsupported: causal+softcap: rejected (validated): softcap: slow says no")
    assert e["comp"] == "unknown: softcap: no evidence"
    # two failing components: both reasons are reported
    e = sel.explain(H100, 128, sinks=True, sliding_window=True)
    assert e["comp"].startswith("unsupported: ")
    assert "sinks: comp says no" in e["comp"] and "window: comp says no" in e["comp"]
    # composed latency is the slowest component's
    assert "latency 1.3 ms" in sel.explain(H100, 128, page_size=16)["comp"]
    assert sel.select_backends(H100, 128, page_size=16) == ["comp"]


def test_flash_attn_version(sel):
    assert sel.get_flash_attn_version(H100, head_size=128) == 4
    assert sel.get_flash_attn_version(H100, head_size=64) == 3
    # no head size: decide over 64 and 128; fa4 is refused at 64, so the first shared version is 3
    assert sel.get_flash_attn_version(H100) == 3
    assert sel.get_flash_attn_version(H100, requires_alibi=True, head_size=128) == 2
    assert sel.get_flash_attn_version(H100, head_size=96) is None  # no evidence at 96: never a guess
    assert sel.get_flash_attn_version((7, 5)) is None
    assert sel.get_flash_attn_version((7, 5), head_size=128) is None


def test_mla_prefill_priorities(sel):
    # fa4 1.0 < fa3 1.5 < trtllm 2.0 measured; sdpa_efficient (fastest) has no vLLM name; flashinfer declared
    assert sel.get_mla_prefill_backend_priorities((10, 0), 128, 64, 128) == ["FLASH_ATTN", "TRTLLM_RAGGED",
                                                                             "FLASHINFER"]
    assert sel.get_mla_prefill_backend_priorities((10, 0), 192, 64, 256) == []
    assert sel.get_mla_prefill_backend_priorities((12, 0), 128, 64, 128) == []
    assert sel.get_mla_prefill_backend_priorities(H100, 128, 64, 128) == []


def test_names_vllm_answers_in_the_engines_names(sel):
    # fa4, fa3 (FLASH_ATTN again), fast and comp (no vLLM name: left out), slow, decl_b, decl_a, fa2 (again)
    assert sel.select_backends(H100, 128, names="vllm") == ["FLASH_ATTN", "TORCH_SDPA", "FLASHINFER"]
    assert sel.select_backends(H100, 128, names=None) == sel.select_backends(H100, 128)
    # mla_prefill speaks vLLM's MLA prefill names: the fastest backend there (sdpa_efficient) has none
    assert sel.select_backends((10, 0), 192, 128, op="mla_prefill", names="vllm") == [
        "FLASH_ATTN", "TRTLLM_RAGGED", "FLASHINFER"]
    assert sel.select_backends((10, 0), 192, 128, op="mla_prefill", names="vllm") == \
        sel.get_mla_prefill_backend_priorities((10, 0), 128, 64, 128)
    assert sel.select_backends((7, 5), 128, names="vllm") == []
    assert sel.explain((7, 5), 128, names="vllm") == {}


def test_names_vllm_explain_groups_each_names_backends(sel):
    plain = sel.explain(H100, 128)
    named = sel.explain(H100, 128, names="vllm")
    # names with a supported backend first, in selection order; then BAD_ATTN, whose one backend is unsupported
    assert list(named) == ["FLASH_ATTN", "TORCH_SDPA", "FLASHINFER", "BAD_ATTN"]
    assert named["FLASH_ATTN"].splitlines() == [f"{b}: {plain[b]}" for b in ("fa4", "fa3", "fa2")]
    assert named["TORCH_SDPA"].splitlines() == [f"{b}: {plain[b]}" for b in ("slow", "decl_a")]
    assert named["BAD_ATTN"] == f"bad: {plain['bad']}" and plain["bad"].startswith("unsupported: ")
    assert "FAKE" not in named  # a test-only backend has no name in the selector either


def test_an_unknown_engine_name_is_refused_like_an_unknown_op(sel):
    sel.select_backends(H100, 128)  # a cached answer for the same query must not hide the bad argument
    for call in (sel.select_backends, sel.explain):
        with pytest.raises(ValueError, match="names: 'sglang' is not one of vllm"):
            call(H100, 128, names="sglang")
        with pytest.raises(ValueError, match="names"):
            call(H100, 128, names="attnmatrix")


def test_engine_names_are_derived_from_backends_json(sel, matrix):
    """The selector's names are backends.json's declarations of the public backends: one added declaration
    shows up, a backend without one has no name, and nothing is written by hand."""
    names = sel.DATA["engine_names"]["vllm"]
    assert names["prefill"] == names["decode"] == {
        "bad": "BAD_ATTN", "decl_a": "TORCH_SDPA", "decl_b": "FLASHINFER", "fa2": "FLASH_ATTN", "fa3": "FLASH_ATTN",
        "fa4": "FLASH_ATTN", "slow": "TORCH_SDPA"}
    assert names["mla_prefill"] == {"fa2": "FLASH_ATTN", "fa3": "FLASH_ATTN", "fa4": "FLASH_ATTN",
                                    "flashinfer": "FLASHINFER", "trtllm_ragged": "TRTLLM_RAGGED"}
    more = {**BACKENDS, "fast": {**BACKENDS["fast"], "vllm": "TRITON_ATTN"}}
    m2 = resolve(Evidence(records=records(), where=["t"] * len(records()), rankings=list(RANKINGS), backends=more))
    assert C.engine_data(m2)["engine_names"]["vllm"]["prefill"]["fast"] == "TRITON_ATTN"


def test_the_package_selectors_vllm_names_agree_with_the_vllm_mapping():
    """The committed selector's vLLM names and attnmatrix/engines/vllm/names.py read the same declarations: every
    backend a vLLM MLA prefill name runs carries that name, and every FlashAttention build vLLM runs is FLASH_ATTN."""
    from attnmatrix import selector
    from attnmatrix.engines.vllm.names import FLASH_ATTN, package_names

    names = selector.DATA["engine_names"]["vllm"]
    vllm = package_names()
    for n, b in vllm.mla_prefill.items():
        assert names["mla_prefill"][b] == n
    for b in vllm.fa_version.values():
        assert names["prefill"][b] == names["mla_prefill"][b] == FLASH_ATTN
    assert "fa2" not in names["prefill"] and "fa4" not in names["mla_prefill"]  # upstream builds: vLLM never runs them


def test_unknown_arch_is_conservative(sel):
    assert sel.select_backends((7, 5), 128) == []
    assert sel.explain((7, 5), 128) == {}


def test_arguments(sel):
    assert sel.select_backends([9, 0], 128) == sel.select_backends(H100, 128)  # unhashable capability still works
    assert sel.select_backends(H100, 128, dtype="torch.bfloat16") == sel.select_backends(H100, 128)
    assert sel.select_backends(H100, 128, dtype="bf16") == sel.select_backends(H100, 128)
    assert sel.select_backends(H100, 128.0) == sel.select_backends(H100, 128)
    # an unknown op and an unknown dtype are refused alike (never a silent [])
    for bad in (dict(op="prefil"), dict(dtype="float32"), dict(capability=(9,)), dict(head_size=0),
                dict(head_size=128.5), dict(head_size="128"), dict(page_size=True), dict(capability=(9.5, 0))):
        kw = {"capability": H100, "head_size": 128, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            sel.select_backends(kw.pop("capability"), kw.pop("head_size"), **kw)
    # each call returns a fresh list: mutating it does not change later answers
    first = sel.select_backends(H100, 128)
    first.clear()
    assert sel.select_backends(H100, 128) != []


FLAGS = ("causal", "sliding_window", "softcap", "alibi", "sinks", "gqa", "varlen", "fp8")


def _flags(features):
    kw = {f: any(feature_name(t) == f for t in features) for f in FLAGS}
    kw["page_size"] = page_size(features)
    return kw


def test_selector_data_is_the_engine_data_of_the_matrix(sel, matrix):
    """The generated module carries exactly the data the CLI and the pages query (the same engine answers)."""
    assert sel.DATA == C.engine_data(matrix)
    for cell in matrix.cells.values():
        c = cell.case
        if c.arch == "cpu" or T.is_test_only(matrix, c.backend):
            continue
        cap = (int(c.arch[3:-1]), int(c.arch[-1]))
        for extra in (None, "softcap", "sinks", "sliding_window", "alibi"):
            feats = tuple(sorted(set(c.features) | ({extra} if extra else set())))
            q = T.Query(c.arch, c.op, c.dtype, c.head_dim, c.head_dim_v, feats)
            kw = _flags(feats)
            assert sel.select_backends(cap, c.head_dim, c.head_dim_v, op=c.op, dtype=c.dtype, **kw) == \
                [a.backend for a in T.query(matrix, q)[0]]
            assert sel.explain(cap, c.head_dim, c.head_dim_v, op=c.op, dtype=c.dtype, **kw) == \
                T.explain_query(matrix, q)


def test_every_rule_covers_exactly_the_resolved_cells(matrix):
    """The rules are lossless: expanding them gives back every public cell's verdict, and nothing else."""
    data = C.engine_data(matrix, include_cpu=True)
    got = {}
    for backend, rules in data["rules"].items():
        for archs, ops, dtypes, sizes, fsets, verdict in rules:
            for arch, op, dt, d, f in itertools.product(archs, ops, dtypes, sizes, fsets):
                hd, hdv = d if isinstance(d, tuple) else (d, d)
                key = (arch, backend, op, dt, hd, hdv, f)
                assert key not in got, key
                got[key] = verdict
    want = {k: C.verdict(c) for k, c in matrix.cells.items() if not T.is_test_only(matrix, c.case.backend)}
    assert got == want


def test_selector_imports_no_torch_and_nothing_of_ours(sel):
    code = textwrap.dedent(f"""
        import importlib.util, os, sys
        sys.path.insert(0, os.path.dirname({sel.__path_for_tests__!r}))
        spec = importlib.util.spec_from_file_location("s", {sel.__path_for_tests__!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.select_backends((9, 0), 128)
        bad = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "attnmatrix", "jinja2")))
        print(bad)
        sys.exit(1 if bad else 0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# --- per-arch default ranks ------------------------------------------------------------------------

PER_ARCH_BACKENDS = {
    "fa2": {"fa_version": 2, "default_rank": {"*": 10, "sm_9x": 12, "sm_10x": 11}},
    "fa3": {"fa_version": 3, "default_rank": {"*": 12, "sm_9x": 10, "sm_10x": 12}},
    "fa4": {"fa_version": 4, "default_rank": {"*": 11, "sm_9x": 11, "sm_10x": 10}},
    "sdpa_efficient": {"default_rank": 32},
}
PER_ARCH = ("sm_80", "sm_90", "sm_100", "sm_120")


def per_arch_records():
    out = [rec(a, b, CA, tier="declared") for a in PER_ARCH for b in ("fa2", "fa3", "fa4", "sdpa_efficient")]
    # at head size 64 on sm_90, fa2 is measured: it comes before the unmeasured fa3 that ranks first by default
    out += [rec("sm_90", "fa2", CA, hd=64, lat=3.0), rec("sm_90", "fa3", CA, hd=64, tier="declared")]
    return out


@pytest.fixture(scope="module")
def per_arch(tmp_path_factory):
    m = resolve(Evidence(records=per_arch_records(), where=["t"] * len(per_arch_records()),
                         backends={k: dict(v) for k, v in PER_ARCH_BACKENDS.items()}))
    return m, vendored_selector(render_selector(m, {"matrix_id": "per-arch"}), tmp_path_factory.mktemp("sel"),
                            "selector_per_arch")


def test_selector_applies_default_rank_per_arch(per_arch):
    m, sel = per_arch
    assert sel.select_backends((8, 0), 128) == ["fa2", "fa4", "fa3", "sdpa_efficient"]
    assert sel.select_backends((9, 0), 128) == ["fa3", "fa4", "fa2", "sdpa_efficient"]
    assert sel.select_backends((10, 0), 128) == ["fa4", "fa2", "fa3", "sdpa_efficient"]
    assert sel.select_backends((12, 0), 128) == ["fa2", "fa4", "fa3", "sdpa_efficient"]
    assert [sel.get_flash_attn_version(cap, head_size=128) for cap in ((8, 0), (9, 0), (10, 0), (12, 0))] == \
        [2, 3, 4, 2]
    # the explanation names the rank on the queried arch
    assert "by default rank 10" in sel.explain((8, 0), 128)["fa2"]
    assert "by default rank 12" in sel.explain((9, 0), 128)["fa2"]
    assert "by default rank 11" in sel.explain((10, 0), 128)["fa2"]
    assert "by default rank 32" in sel.explain((9, 0), 128)["sdpa_efficient"]
    # a measurement still wins over the default rank
    assert sel.select_backends((9, 0), 64) == ["fa2", "fa3"]
    assert sel.get_flash_attn_version((9, 0), head_size=64) == 2
    # the table the selector carries is the per-arch resolution of backends.json's default_rank
    assert sel.DATA["default_rank"]["sm_90"] == {"fa2": 12, "fa3": 10, "fa4": 11, "sdpa_efficient": 32}
    assert sel.DATA["default_rank"]["sm_120"] == {"fa2": 10, "fa3": 12, "fa4": 11, "sdpa_efficient": 32}


def test_per_arch_selector_agrees_with_the_pages(per_arch):
    m, sel = per_arch
    for arch, hd in itertools.product(PER_ARCH, (64, 128)):
        cap = (int(arch[3:-1]), int(arch[-1]))
        for feats in ((), CA):
            q = T.Query(arch, "prefill", "bfloat16", hd, hd, feats)
            assert sel.select_backends(cap, hd, **_flags(feats)) == [a.backend for a in T.query(m, q)[0]]
            assert sel.explain(cap, hd, **_flags(feats)) == T.explain_query(m, q)


def test_head_and_page_sizes_are_bounded_as_the_matrix_bounds_them(sel):
    """The selector refuses what every command refuses (matrix/cases.py check_head_size / check_page_size)."""
    from attnmatrix.matrix.cases import MAX_HEAD_DIM, MAX_PAGE_SIZE

    for bad in (0, -1, MAX_HEAD_DIM + 1, 99999999999999999999999):
        with pytest.raises(ValueError, match="head_size"):
            sel.select_backends(H100, bad)
    with pytest.raises(ValueError, match="page_size"):
        sel.select_backends(H100, 128, page_size=MAX_PAGE_SIZE + 1)
    # MLA dims are a model's: out of range is a question whose answer is none (vLLM's own answer), not bad input
    for dims in ((0, 0, 0), (128, 64, MAX_HEAD_DIM + 1), (MAX_HEAD_DIM, 64, 128), (-1, 64, 128), (128, 64, 0)):
        assert sel.get_mla_prefill_backend_priorities((10, 0), *dims) == [], dims
    for bad in ((128, 64, "128"), (128, 64.5, 128), (True, 64, 128)):
        with pytest.raises(ValueError):
            sel.get_mla_prefill_backend_priorities((10, 0), *bad)
    assert sel.select_backends(H100, MAX_HEAD_DIM) == []  # in bounds, no evidence: nothing, not an error
