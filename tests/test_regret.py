"""vLLM's recorded answers, the comparison page, and the selection regret; and, over every cell of the embedded
matrix, the generated selector never returns a refused backend and picks the fastest validated one where
measured."""

from __future__ import annotations

import math

import pytest
from attnmatrix.generator import render_selector
from attnmatrix.generator import tables as T
from attnmatrix.matrix.backends import default_rank
from attnmatrix.matrix.cases import feature_name, page_size
from attnmatrix.matrix.evidence import Evidence, load_backends, load_evidence
from attnmatrix.matrix.policy import SUPPORTED, UNSUPPORTED, resolve
from attnmatrix.matrix.records import parse_record
from conftest import vendored_selector

from attnmatrix.engines import render_all
from attnmatrix.engines.vllm import comparison as VC
from attnmatrix.engines.vllm import names as V

# --- vLLM's answers, as the pinned release's own code gave them (matrix/data/vllm/) ------------------------
# Seed checks read off vLLM 0.33.0's source (fa_utils.py get_flash_attn_version; platforms/interface.py
# get_mla_prefill_backend_cls; mla/prefill/*.py validate_configuration): the committed answers must say the same.
ANSWERS = V.default_answers()
FA_CASES = [
    ((9, 0), 128, {}, 3),  # "Hopper (SM90): prefer FA3"
    ((9, 0), 128, dict(requires_alibi=True), 2),  # "Cannot use FA version 3 with ALiBi"
    ((9, 0), 512, {}, 4),  # "FA3 does not support head_size=512 on SM90": upgrade to FA4
    ((9, 0), 128, dict(has_sinks=True), 3),  # sinks alone: no upgrade
    ((10, 0), 128, {}, 4),  # "Blackwell (SM100+, restrict to SM100 for now): prefer FA4"
    ((10, 0), 192, {}, 2),  # "TMEM capacity limits, defaulting to FA version 2"
    ((10, 0), 256, {}, 4),  # the hd256 kernel
    ((10, 0), 256, dict(kv_cache_block_size=16), 2),  # hd256 kernel needs 128-token pages
    ((10, 0), 256, dict(kv_cache_block_size=128), 4),
    ((10, 0), 256, dict(has_sinks=True), 2),  # hd256 kernel: no sinks
    ((10, 0), 256, dict(requires_softcap=True), 2),  # hd256 kernel: no softcap
    ((10, 0), 128, dict(requires_alibi=True), 2),  # "Cannot use FA version 4 with ALiBi"
    ((11, 0), 128, {}, 2),  # major == 10 only for the FA4 default
    ((12, 0), 128, {}, 2),
    ((8, 0), 256, {}, 2),
]


@pytest.mark.parametrize(("cap", "hs", "kw", "want"), FA_CASES)
def test_vllm_flash_attn_version_answers(cap, hs, kw, want):
    assert ANSWERS.fa(cap, hs, hs, **kw)["version"] == want


MLA_CASES = [
    ((9, 0), (128, 64, 128), ["FLASH_ATTN"], "FLASH_ATTN", 3),  # the seed: vLLM answers FLASH_ATTN on Hopper
    ((10, 0), (192, 64, 256), ["TRTLLM_RAGGED", "FLASH_ATTN", "FLASHINFER", "TOKENSPEED_MLA"], "TRTLLM_RAGGED", None),
    ((10, 0), (128, 64, 128), ["FLASH_ATTN", "TRTLLM_RAGGED", "FLASHINFER", "TOKENSPEED_MLA"], "FLASH_ATTN", 4),
    ((10, 0), (256, 0, 256), ["FLASH_ATTN", "TRTLLM_RAGGED", "FLASHINFER", "TOKENSPEED_MLA"], "FLASH_ATTN", 2),
    ((12, 0), (128, 64, 128), ["FLASH_ATTN"], "FLASH_ATTN", 2),  # major 12 is not "Blackwell" here
]


@pytest.mark.parametrize(("cap", "dims", "order", "name", "fa"), MLA_CASES)
def test_vllm_mla_prefill_answers(cap, dims, order, name, fa):
    for dtype in ("bfloat16", "float16"):
        r = ANSWERS.mla(cap, dims, dtype)
        assert (r["priorities"], r["backend"], r["fa_version"]) == (order, name, fa)
    # FA2 pads V (vLLM's FLASH_ATTN MLA prefill constructor), FA3 on SM90 and FA4 do not
    assert ANSWERS.mla((12, 0), (128, 64, 128), "bfloat16")["pads_v"] is True
    assert ANSWERS.mla((9, 0), (128, 64, 128), "bfloat16")["pads_v"] is False


def test_vllm_names_in_attnmatrix_names():
    assert [V.backend_for("FLASH_ATTN", v) for v in (2, 3, 4, None)] == ["vllm_fa2", "vllm_fa3", "vllm_fa4", None]
    assert V.backend_for("CUDNN") is None and V.backend_for("TOKENSPEED_MLA") is None
    assert V.backend_for("FLASHINFER") == "flashinfer_cutlass"  # the kernels vLLM builds, not FlashInfer's choice


def test_vllm_choice_for_matrix_cells():
    c = V.vllm_choice(ANSWERS, "sm_90", "prefill", "bfloat16", 128, 128, ("alibi", "causal"))
    assert (c.backend, c.label) == ("vllm_fa2", "FLASH_ATTN FA2") and "ALiBi" in c.why
    # on capability 10 vLLM's whole decision is FLASHINFER: the FA version helper's answer is not what it runs
    c = V.vllm_choice(ANSWERS, "sm_100", "decode", "bfloat16", 256, 256, ("sliding_window",))
    assert (c.backend, c.label, c.routed) == (None, "FLASHINFER", True)
    assert ANSWERS.fa((10, 0), 256, 256)["version"] == 4
    softcap = ANSWERS.fa((10, 0), 256, 256, requires_softcap=True)
    assert softcap["version"] == 2 and "soft capping" in " ".join(softcap["log"])
    c = V.vllm_choice(ANSWERS, "sm_100", "mla_prefill", "bfloat16", 256, 256, ("causal",))
    assert c.backend == "trtllm_ragged" and "256x0x256: FLASH_ATTN FA2" in c.why  # two triples, one (qk, v)
    assert V.vllm_choice(ANSWERS, "sm_100", "mla_prefill", "bfloat16", 192, 128, ("causal",)).backend == "vllm_fa4"
    assert V.vllm_choice(ANSWERS, "sm_75", "prefill", "bfloat16", 128, 128, ("causal",)).backend is None


def test_every_source_names_a_commit_or_a_released_wheel():
    """Anyone can check a citation: a full commit of the named repository, or a pinned PyPI release."""
    import re

    for s in V.VLLM_SOURCES:
        commit = re.fullmatch(r"[0-9a-f]{40}", s.ref)
        assert commit or re.fullmatch(r"pypi:[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+-]*", s.ref), s
        assert re.fullmatch(r"[\w./{},-]+(:\d+)?", s.path), s


# --- the comparison over a hand-built matrix ------------------------------------------------------------

BACKENDS = {
    "vllm_fa2": {"fa_version": 2, "mla_prefill": "FLASH_ATTN", "default_rank": 12},
    "vllm_fa3": {"fa_version": 3, "mla_prefill": "FLASH_ATTN", "default_rank": 11},
    "vllm_fa4": {"fa_version": 4, "mla_prefill": "FLASH_ATTN", "default_rank": 10},
    "trtllm_ragged": {"mla_prefill": "TRTLLM_RAGGED", "default_rank": 20},
    "sdpa_cudnn": {"default_rank": 30},
}
C = ("causal",)
MLA = ("causal", "qk_rope:64")


def rec(arch, backend, feats=C, outcome="pass", *, hd=128, hdv=None, op="prefill", tier="validated", lat=None,
        tflops=100.0, reason=None):
    d = {"schema": 1, "outcome": outcome, "tier": tier,
         "case": {"arch": arch, "backend": backend, "op": op, "dtype": "bfloat16", "head_dim": hd,
                  "head_dim_v": hd if hdv is None else hdv, "features": list(feats)},
         "provenance": {"date": "2026-11-01"} if tier == "declared" else
         {"device": "H200", "kernel_version": "1.0", "torch": "2.11", "date": "2026-11-01"}}
    if tier == "declared":
        d["sources"] = [f"declared source for {backend}"]
    if outcome not in ("pass", "compiled"):
        d["reason"] = reason or f"{backend} refuses"
    if outcome == "pass" and tier == "validated":
        d["error"] = {"max_abs_err": 1e-3}
    if lat is not None:
        d["timings"] = [{"shape": "s", "latency_ms": lat, "tflops": tflops}]
    return parse_record(d)


def records(fa3_lat=2.0):
    H = "sm_90"
    return [
        # 128 causal: vLLM picks fa3 (measured, 2 ms); attnmatrix's FlashAttention pick is fa4 (1 ms); the fastest
        # validated backend is sdpa_cudnn (0.5 ms).
        rec(H, "vllm_fa4", lat=1.0, tflops=400.0), rec(H, "sdpa_cudnn", lat=0.5, tflops=800.0),
        rec(H, "vllm_fa3", lat=fa3_lat, tflops=200.0), rec(H, "vllm_fa2", tier="declared"),
        # 512: vLLM upgrades to fa4, which refuses it
        rec(H, "vllm_fa4", hd=512, outcome="rejected", reason="fa4: 512 is not supported on SM90"),
        rec(H, "sdpa_cudnn", hd=512, lat=4.0),
        # ALiBi: both pick fa2
        rec(H, "vllm_fa2", ("alibi", "causal"), lat=3.0), rec(H, "vllm_fa3", ("alibi", "causal"), "rejected"),
        rec(H, "vllm_fa4", ("alibi", "causal"), "rejected"),
        # MLA on Blackwell at GLM-5 dims (192, 64, 256): vLLM picks TRTLLM_RAGGED (declared); attnmatrix measured
        # fa4 first. The same dims by their (qk, v) totals alone ask vLLM nothing: no comparison row.
        rec("sm_100", "vllm_fa4", MLA, op="mla_prefill", hd=256, lat=1.5),
        rec("sm_100", "sdpa_cudnn", MLA, op="mla_prefill", hd=256, lat=3.0),
        rec("sm_100", "trtllm_ragged", MLA, op="mla_prefill", hd=256, tier="declared"),
        rec("sm_100", "vllm_fa4", op="mla_prefill", hd=256, lat=1.5),
    ]


def matrix(recs=None):
    recs = records() if recs is None else recs
    return resolve(Evidence(records=recs, where=["t"] * len(recs), backends={k: dict(v) for k, v in BACKENDS.items()}))


def _cmp(m, arch, op, hd, hdv, feats):
    return VC.compare_cell(m, T.Query(arch, op, "bfloat16", hd, hdv, feats), ANSWERS)


def test_comparison_cells_and_regret():
    m = matrix()
    c = _cmp(m, "sm_90", "prefill", 128, 128, C)
    assert (c.vllm.backend, c.amx_pick.backend, c.first.backend, c.fastest.backend) == (
        "vllm_fa3", "vllm_fa4", "sdpa_cudnn", "sdpa_cudnn")
    assert not c.agree and c.kind == "slower" and c.measured
    assert c.regret(c.first) == 1.0 and c.regret(c.vllm_pick) == pytest.approx(4.0)
    row = VC.disagreement_row(c)
    assert row.ratio == "2.00" and row.vllm_numbers == "2.0 ms · 200.0 TFLOP/s"
    assert row.amx_numbers == "1.0 ms · 400.0 TFLOP/s"
    assert "fastest validated here: sdpa_cudnn at 0.50 ms" in row.why
    c = _cmp(m, "sm_90", "prefill", 512, 512, C)
    assert c.vllm.backend == "vllm_fa4" and c.kind == "unsupported" and "512 is not supported on SM90" in VC.why(c)
    assert "FA3 does not support head_size=512 on SM90" in VC.why(c)
    c = _cmp(m, "sm_90", "prefill", 128, 128, ("alibi", "causal"))
    assert c.agree and c.kind is None
    c = _cmp(m, "sm_100", "mla_prefill", 256, 256, MLA)
    assert (c.vllm.backend, c.amx_pick.backend, c.kind) == ("trtllm_ragged", "vllm_fa4", "unmeasured")
    assert not [x for x in VC.comparisons(m) if x.query.op == "mla_prefill" and x.query.features == C]
    rows = {(r.arch, r.op): r for r in VC.regret_rows(VC.comparisons(m))}
    r = rows[("sm_90", "prefill")]
    assert (r.cells, r.amx_median, r.amx_max, r.vllm_measured, r.vllm_median) == (1, "1.00", "1.00", 1, "4.00")
    r = rows[("sm_100", "mla_prefill")]
    assert (r.cells, r.vllm_measured, r.vllm_unmeasured, r.amx_max) == (1, 0, 1, "1.00")
    text = VC.print_regret(m)  # what benchmarks/vllm_regret.py prints
    assert "sm_90    prefill          1        1.00    1.00              1        4.00     4.00" in text


def test_comparison_page_follows_the_data():
    meta = {"matrix_id": "cmp0test", "kernel_versions": {}}
    page = render_all(matrix(), meta)["site/vllm-comparison.md"]
    assert "| `sm_90` | prefill | 1 | 1.00 | 1.00 | 1 | 4.00 | 4.00 | 0 | 0 | 0 |" in page
    assert "regenerated from the matrix" in page and "How to read it" in page
    assert "vllm_fa3 (FLASH_ATTN FA3)" in page and "| 2.00 |" in page
    # a faster fa3 measurement changes the regret and the rows: nothing is hard-coded
    faster = render_all(matrix(records(fa3_lat=0.25)), meta)["site/vllm-comparison.md"]
    assert "| `sm_90` | prefill | 1 | 1.00 | 1.00 | 1 | 1.00 | 1.00 | 0 | 0 | 0 |" in faster
    assert "vllm_fa3 (FLASH_ATTN FA3)" not in faster  # now attnmatrix picks fa3 too: they agree
    assert render_all(matrix(), meta)["site/vllm-comparison.md"] == page  # deterministic


def test_comparison_page_names_the_release_each_vllm_build_was_probed_at():
    """The page compares a pinned vLLM release's choices; a build whose evidence is of another release says so."""
    m = matrix()
    m.backends["vllm_fa3"]["library"] = "vllm"
    assert VC.build_versions(m) == [("vllm_fa3", ["1.0"])]
    page = render_all(m, {"matrix_id": "cmp0test", "kernel_versions": {}})["site/vllm-comparison.md"]
    release = VC.release_info(ANSWERS, "x").version
    assert "evidence for vLLM's own builds is of these vLLM releases: `vllm_fa3` 1.0." in page
    assert f"Where that is not {release}, vLLM {release}'s choice is held against the older build's evidence" in page


# --- every cell of the embedded matrix --------------------------------------------------------------------

FLAGS = ("causal", "sliding_window", "softcap", "alibi", "sinks", "gqa", "varlen", "fp8")


def _flags(features):
    kw = {f: any(feature_name(t) == f for t in features) for f in FLAGS}
    kw["page_size"] = page_size(features)
    return kw


@pytest.fixture(scope="module")
def embedded():
    return resolve(load_evidence())


@pytest.fixture(scope="module")
def embedded_selector(embedded, tmp_path_factory):
    """The selector generated from the embedded matrix as it is now (`attnmatrix check` keeps the committed
    attnmatrix/selector.py byte-identical to this)."""
    return vendored_selector(render_selector(embedded, {"matrix_id": "embedded"}), tmp_path_factory.mktemp("sel"),
                             "embedded_selector")


@pytest.mark.slow
def test_embedded_matrix_first_choice_supported_never_rejected_and_fastest(embedded, embedded_selector):
    sel, n, measured = embedded_selector, 0, 0
    for q in VC._query_keys(embedded):
        cap = V.capability_of(q.arch)
        if any(feature_name(t) == "qk_rope" for t in q.features):  # an MLA triple: the engine's own query
            got = [a.backend for a in sel._ENGINE.query(q.arch, q.op, q.dtype, q.head_dim, q.head_dim_v,
                                                         tuple(sorted(q.features)))[0]]
        else:
            got = sel.select_backends(cap, q.head_dim, q.head_dim_v, op=q.op, dtype=q.dtype, **_flags(q.features))
        ordered, answers = T.query(embedded, q)
        status = {a.backend: a.status for a in answers}
        assert got == [a.backend for a in ordered], q
        assert all(status[b] == SUPPORTED for b in got), q  # the first choice (and every other) is supported
        assert not any(status[b] == UNSUPPORTED for b in got), q  # no rejected backend, ever
        timed = [a for a in ordered if a.latency_ms is not None and a.tier == "validated"]
        if len(timed) >= 2:  # a measured cell: the first choice is the fastest validated backend
            measured += 1
            first = next(a for a in ordered if a.backend == got[0])
            assert first.latency_ms / min(a.latency_ms for a in timed) == 1.0, q
            c = VC.compare_cell(embedded, q, ANSWERS)
            assert c.regret(c.first) == 1.0, q
        n += 1
    assert n > 1000 and measured > 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120",
                                  "sm_121"])
def test_embedded_default_rank_puts_vllms_default_fa_version_first(arch):
    """backends.json's per-arch default_rank follows vLLM's recorded default FlashAttention version (no features, no
    head size): where nothing is measured and no ranking applies, attnmatrix and vLLM agree on it."""
    backends = load_backends()
    fa = T.fa_versions(resolve(Evidence(backends=backends)))
    first = min(fa, key=lambda b: (default_rank(backends, b, arch), b))
    answer = ANSWERS.fa(V.capability_of(arch), 128, 128)
    if answer is None:
        pytest.skip(f"no vLLM answer recorded for {arch}")
    expected = V.backend_for("FLASH_ATTN", answer["version"])
    if expected not in fa:  # vLLM's FA4 copy (vllm_fa4) answers only once it is registered
        pytest.skip(f"{expected} is not a registered backend")
    assert first == expected


@pytest.mark.slow
def test_embedded_neither_measured_only_where_vllm_leaves_its_default(embedded):
    """Every remaining "neither measured" FlashAttention disagreement is a cell where vLLM moved off its
    per-capability default for a feature (or a declared ranking orders attnmatrix's side)."""
    n = 0
    for c in VC.comparisons(embedded):
        if c.decision != VC.FA_DECISION or not c.covered or c.kind != "by_rank":
            continue
        default = V.backend_for("FLASH_ATTN", ANSWERS.fa(V.capability_of(c.query.arch), 128, 128)["version"])
        assert c.vllm.backend != default or T.applicable_ranking(embedded, c.query) is not None, c.label
        n += 1
    assert n < 50  # was 432 with one global order (FA4, FA3, FA2 first on every arch)


def test_embedded_regret_table_is_consistent(embedded):
    rows = VC.regret_rows(VC.comparisons(embedded))
    assert rows, "the embedded matrix has measured cells"
    for r in rows:
        assert r.amx_median == "1.00" and r.amx_max == "1.00", r
        assert r.vllm_measured + r.vllm_unmeasured + r.vllm_unsupported + r.vllm_no_evidence == r.cells, r
        if r.vllm_measured:
            assert float(r.vllm_median) >= 1.0 and float(r.vllm_max) >= float(r.vllm_median), r
            assert math.isfinite(float(r.vllm_max))


def test_a_padded_v_mla_prefill_is_answered_by_fa2s_plain_prefill(embedded):
    """vLLM runs FA2 for MLA prefill with V padded to the QK head size: that call is FA2's varlen prefill at
    (qk, qk), so the prefill cell's evidence answers for vLLM's pick."""
    padded = [c for c in VC.comparisons(embedded) if c.vllm.pads_v and c.query.arch == "sm_110"]
    assert padded
    for c in padded:
        q = c.query
        want = T.answer(embedded, T.Query(q.arch, "prefill", q.dtype, q.head_dim, q.head_dim, q.features),
                        c.vllm_pick.backend)
        assert c.vllm_pick.status == want.status, c.label


# --- the engines' home: vLLM's names derived from backends.json, its page among the generated files ---------

def test_vllm_names_are_read_off_backends_json():
    names = V.VllmNames.from_backends(load_backends())
    assert names.fa_version == {2: "vllm_fa2", 3: "vllm_fa3", 4: "vllm_fa4"}
    assert names.mla_prefill == {"FLASHINFER": "flashinfer_cutlass", "TRTLLM_RAGGED": "trtllm_ragged"}
    # a backend that declares a vLLM name answers for it; none is written twice
    extra = {**load_backends(), "my_mla": {"mla_prefill": "TOKENSPEED_MLA", "default_rank": 50}}
    assert V.VllmNames.from_backends(extra).backend_for("TOKENSPEED_MLA") == "my_mla"
    clash = {**load_backends(), "fa3_again": {"fa_version": 3, "default_rank": 50}}
    with pytest.raises(V.MappingError, match="fa_version: vLLM's FLASH_ATTN FA3 is already declared by"):
        V.VllmNames.from_backends(clash)


def test_engine_pages_join_the_generated_files():
    from attnmatrix.generator import render_all as render_generator_files

    from attnmatrix import engines

    meta = {"matrix_id": "cmp0test", "kernel_versions": {}}
    assert engines.engine_names() == ["vllm"]
    every = render_all(matrix(), meta)
    generator_only = render_generator_files(matrix(), meta)
    assert set(every) - set(generator_only) == {"site/vllm-comparison.md", "attnmatrix/engines/vllm/selection.py"}
    assert all(every[p] == t for p, t in generator_only.items())



def test_rerun_noise_is_the_measured_one():
    import json
    from pathlib import Path

    measured = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "rerun_variance.json")
                          .read_text(encoding="utf-8"))["latency_ratio"]["p95"]
    assert VC.RERUN_NOISE == measured
