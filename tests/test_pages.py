"""The docs pages for people: capability summaries first, compact per-cell grids, the per-cell JSON, precision,
natural order, the fastest-backend grid on every measured arch (CPU included), and small readable diffs."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

import pytest
from attnmatrix.generator import page_format as PF
from attnmatrix.generator import pages as PG
from attnmatrix.generator import render_docs
from attnmatrix.matrix.evidence import Evidence
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.records import parse_record

REPO = Path(__file__).resolve().parent.parent
META = {"matrix_id": "pages0123", "kernel_versions": {"fa4": ["4.0.0b36"]}, "files": ["t.jsonl"]}
BACKENDS = {"fa4": {"label": "FlashAttention 4", "default_rank": 10},
            "fa2": {"label": "FlashAttention 2", "default_rank": 12},
            "sdpa_cpu": {"label": "PyTorch SDPA (CPU)", "default_rank": 40}}
LONG_REASON = "RuntimeError: build failed\n" + "x " * 400


def rec(arch, backend, feats=("causal",), outcome="pass", *, hd=128, op="prefill", lat=None, reason=None,
        tier="validated", sources=()):
    d = {"schema": 1, "outcome": outcome, "tier": tier,
         "case": {"arch": arch, "backend": backend, "op": op, "dtype": "bfloat16", "head_dim": hd,
                  "head_dim_v": hd, "features": list(feats)},
         "provenance": {"date": "2026-11-01"} if tier == "declared" else
         {"device": "CPU" if arch == "cpu" else "H200", "kernel_version": "4.0.0b36", "date": "2026-11-01",
          "torch": "2.11", "library": "lib"}}
    if sources:
        d["sources"] = list(sources)
    if reason is not None:
        d["reason"] = reason
    if outcome == "pass" and tier == "validated":
        d["error"] = {"max_abs_err": 0.00123}
    if lat is not None:
        d["timings"] = [{"shape": "s1", "latency_ms": lat, "tflops": 12.3456}]
    return parse_record(d)


def records():
    out = []
    for hd in (64, 128, 256):
        out += [rec("sm_90", "fa4", ("causal",), hd=hd, lat=0.1234 * hd / 64),
                rec("sm_90", "fa4", (), hd=hd, lat=0.2 * hd / 64),
                rec("sm_90", "fa4", ("causal", "softcap"), hd=hd, lat=0.15 * hd / 64),
                rec("sm_90", "fa4", ("causal", "alibi"), "rejected", hd=hd, reason=LONG_REASON),
                rec("sm_90", "fa2", ("causal",), hd=hd, lat=0.11 * hd / 64),
                rec("sm_90", "fa2", ("causal",), "rejected", op="decode", hd=hd, reason="decode: no"),
                rec("sm_90", "fa2", ("causal", "softcap"), "rejected", hd=hd, tier="declared", reason="no softcap",
                    sources=("Dao-AILab/flash-attention@abc:README.md:10",))]
        for p in (16, 64, 128, 256):
            out.append(rec("sm_90", "fa4", ("causal", f"paged_kv:{p}"), hd=hd, lat=0.13 * p / 16))
        out.append(rec("cpu", "sdpa_cpu", ("causal",), hd=hd, lat=20.0 + hd))
        out.append(rec("cpu", "sdpa_cpu", ("causal", "sliding_window"), hd=hd, lat=31.0 + hd))
    out.append(rec("sm_90", "fa4", ("causal",), "rejected", hd=512, reason="head dim 512 is not supported"))
    return out


def matrix(recs=None):
    recs = records() if recs is None else recs
    return resolve(Evidence(records=recs, where=["t"] * len(recs), backends={k: dict(v) for k, v in BACKENDS.items()}))


def page(m, arch):
    return next(p for p in PG.arch_pages(m) if p.arch == arch)


def test_two_significant_figures():
    assert [PF.sig2(x) for x in (0.33715, 7.47562, 30.7008, 1234.5, 0.0995, 0.996, 0.00012345, 0.3, 123.456)] == \
        ["0.34", "7.5", "31", "1200", "0.10", "1.0", "0.00012", "0.30", "120"]
    assert PF.sig2(None) == "" and PF.sig2(0.0) == "0"
    with pytest.raises(ValueError):
        PF.sig2(float("inf"))


def test_natural_order_of_feature_sets_and_head_sizes():
    sets = [("causal", "paged_kv:128"), ("causal", "paged_kv:16"), ("sliding_window",), (), ("causal", "softcap"),
            ("causal", "paged_kv:256"), ("causal",), ("causal", "paged_kv:64")]
    assert [PF.feature_label(f) for f in sorted(sets, key=PF.feature_set_key)] == [
        "none", "causal", "sliding_window", "causal + softcap", "causal + paged_kv:16", "causal + paged_kv:64",
        "causal + paged_kv:128", "causal + paged_kv:256"]
    assert [PF.dims_label(d) for d in sorted([(256, 256), (192, 128), (64, 64), (128, 128)], key=PF.dims_key)] == \
        ["64", "128", "256", "192×128"]


def test_capability_summary_answers_what_a_reader_asks():
    caps = {r.backend: r for r in page(matrix(), "sm_90").capabilities}
    fa4, fa2 = caps["fa4"], caps["fa2"]
    assert [i.label for i in fa4.head_sizes] == ["64", "128", "256"]  # 512 was refused: not listed
    assert [i.label for i in fa4.block_sizes] == ["16", "64", "128", "256"]  # numerically
    assert [(i.label, i.mark) for i in fa4.features] == [("causal", "V"), ("softcap", "V")]
    # alibi refused everywhere fa4 works, with the reason's id (the causal cell with alibi says nothing of causal)
    assert [(i.label, i.mark, i.where) for i in fa4.not_supported] == [("alibi", "X", "")]
    assert fa4.not_supported[0].reason and fa4.evidence == [("V", 21), ("X", 4)]
    # Ops = ops with supported cells: fa2's decode cells are all refused
    assert fa2.ops == ["prefill"]
    assert [(i.label, i.mark) for i in fa2.not_supported] == [("softcap", "X")]


def test_grid_and_legends_show_each_reason_and_source_once():
    m = matrix()
    p = page(m, "sm_90")
    g = next(g for g in p.grids if g.backend == "fa4")
    assert g.columns[:3] == ["none", "causal", "causal + softcap"]
    assert g.columns[-4:] == [f"causal + paged_kv:{n}" for n in (16, 64, 128, 256)]
    row = dict(zip(g.columns, dict(g.rows)["prefill bfloat16 128"], strict=True))
    assert row["causal"] == "V 0.25" and row["causal + paged_kv:128"] == "V 1.0"  # tier mark + 2 sig. figures
    alibi_id = row["causal + alibi"].split()[1]
    assert row["causal + alibi"] == f"X {alibi_id}"
    reasons = {rid: (text, backends, n) for rid, text, backends, n in p.reasons}
    text, backends, n = reasons[alibi_id]
    assert backends == ["fa4"] and n == 3 and len(text) <= PF.REASON_PREVIEW and text.startswith("RuntimeError")
    # the declared citation appears once in the page's source list, not once per cell
    out = render_docs(m, META)["site/archs/sm_90.md"]
    assert out.count("Dao-AILab/flash-attention@abc:README.md:10") == 1


def test_cpu_fastest_grid_is_filled():
    """The CPU is an arch like another for the fastest-backend grid: its timed cells are answered by the query."""
    grid = page(matrix(), "cpu").fastest
    assert grid is not None and grid.columns == ["causal", "causal + sliding_window"]
    assert dict(grid.rows)["prefill bfloat16 64"] == ["sdpa_cpu 84", "sdpa_cpu 95"]
    out = render_docs(matrix(), META)
    assert "| prefill bfloat16 64 | sdpa_cpu 84 | sdpa_cpu 95 |" in out["site/archs/cpu.md"]


def test_cells_json_keeps_everything_the_page_shortens():
    m = matrix()
    out = render_docs(m, META)
    text = out["site/data/sm_90/fa4.json"]
    data = json.loads(text)
    assert data["generated"].startswith("Generated by attnmatrix from the FlashAttention 4 evidence for sm_90")
    assert data["arch"] == "sm_90" and data["backend"] == "fa4" and len(data["content_id"]) == 12
    rows = [dict(zip(data["columns"], r, strict=True)) for r in data["cells"]]
    assert len(rows) == sum(1 for c in m.cells.values() if c.case.arch == "sm_90" and c.case.backend == "fa4")
    alibi = next(r for r in rows if r["features"] == ["alibi", "causal"] and r["head_dim"] == 64)
    assert data["reasons"][alibi["reason"]] == LONG_REASON  # in full
    causal = next(r for r in rows if r["features"] == ["causal"] and r["head_dim"] == 128)
    # figures to 4 significant digits; the per-shape timings with host time (null where none was recorded)
    assert causal["latency_ms"] == 0.2468 and causal["max_abs_err"] == 0.00123 and causal["tflops"] == 12.35
    assert causal["timings"] == [["s1", 0.2468, None]] and causal["host_ms"] is None
    assert data["timing_columns"] == ["shape", "latency_ms", "host_ms"]
    # one line per cell; the same ids as the arch page
    assert text.count("\n    [") == len(rows)
    assert alibi["reason"] in out["site/archs/sm_90.md"]


def test_a_download_names_its_own_content_not_the_whole_matrix():
    """A new fact about one backend changes that backend's download, not every download of the site."""
    a = render_docs(matrix(), META)
    b = render_docs(matrix(), dict(META, matrix_id="other0456", kernel_versions={"fa4": ["9.9"], "fa2": ["1.0"]}))
    downloads = [k for k in a if k.startswith("site/data/")]
    assert downloads and all(a[k] == b[k] for k in downloads)


@pytest.mark.parametrize("new", [
    rec("sm_90", "fa2", ("causal", "softcap"), hd=128, lat=0.3),  # a validated pass overrules a declared refusal
    rec("sm_90", "fa4", ("causal",), hd=192, lat=0.4),  # a new head size: one new row per grid
], ids=["overrule", "new-row"])
def test_one_new_record_changes_a_few_lines_of_pages(new):
    """A new record in the probed space changes the lines it touches (its grid row, the fastest-backend row, the
    backend's summary row and legend lines), not the page. (A new feature set adds a column to every row.)"""
    base = render_docs(matrix(), META)
    more = render_docs(matrix([*records(), new]), META)
    changed = {p for p in base if base[p] != more.get(p)} | (set(more) - set(base))
    assert f"site/data/sm_90/{new.case.backend}.json" in changed and "site/archs/sm_90.md" in changed
    assert "site/archs/cpu.md" not in changed and "site/data/cpu/sdpa_cpu.json" not in changed
    for p in changed:
        diff = [ln for ln in difflib.unified_diff(base[p].splitlines(), more[p].splitlines(), lineterm="", n=0)
                if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
        # + the coverage line and a decision-table row of the arch page; the query page's answers gain a line per
        # new query (a new head size: each decision-table layer type) and per new text
        assert 0 < len(diff) <= (40 if p.startswith("site/data/query/") else 22), (p, diff)


def test_deterministic():
    a = render_docs(matrix(), META)
    b = render_docs(matrix(list(reversed(records()))), META)
    assert a == b


SITE_FILE_LIMIT = 300_000


def test_committed_site_files_are_small():
    big = {str(p.relative_to(REPO / "site")): p.stat().st_size for p in (REPO / "site").rglob("*")
           if p.is_file() and p.stat().st_size > SITE_FILE_LIMIT}
    assert not big, big


def test_explanations_on_pages_show_two_significant_figures():
    """The MLA and FA-version pages quote the engine's explanations; their latencies are rounded for readers."""
    from attnmatrix.generator.render import page_latencies

    assert page_latencies(["fa4: validated, latency 0.46704 ms, by measured latency", "fa3: unmeasured"]) == \
        ["fa4: validated, latency 0.47 ms, by measured latency", "fa3: unmeasured"]
    text = (REPO / "site" / "mla-prefill.md").read_text(encoding="utf-8")
    shown = re.findall(r"latency (\d+(?:\.\d+)?) ms", text)
    assert shown and all(len(x.replace(".", "").strip("0")) <= 2 for x in shown), shown
