"""The generator: deterministic output, headers, and strings from the data that cannot break out."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess

import pytest
from attnmatrix.generator import md_escape, pylit, render_all
from attnmatrix.generator import tables as T
from attnmatrix.matrix.evidence import Evidence, Ranking
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.records import parse_record
from conftest import vendored_selector

HOSTILE_REASON = ("it's \"quoted\" '''triple''' \"\"\"triple\"\"\" back\\slash \\n not a newline\nreal newline "
                  "{{ jinja }} {% block %} {# c #} <script>alert(1)</script> a | pipe `tick` **bold** [x](y) "
                  "__init__ ==mark== \r\n crlf \x00 nul \u2028 sep -->")
HOSTILE_SOURCE = "repo@abc:path/with|pipe.py#L1 \"\"\" <b>&amp;</b> {{ x }}\\"
HOSTILE_META = {"matrix_id": "id\"\"\"\n# injected -->", "kernel_versions": {"fa4": ["4.0.0b36\n\"\"\"x", "4.0.0"]},
                "files": ["results/a\nb.jsonl"]}
META = {"matrix_id": "0123abcd", "kernel_versions": {"fa4": ["4.0.0b36"], "fa2": ["2.8.3.post2"]},
        "files": ["matrix/data/declared.json", "matrix/data/results/h200.jsonl"]}
BACKENDS = {"fa4": {"label": "FlashAttention 4", "fa_version": 4, "mla_prefill": "FLASH_ATTN", "default_rank": 10},
            "fa2": {"label": "FlashAttention | 2 <b>", "fa_version": 2, "mla_prefill": "FLASH_ATTN",
                    "default_rank": 12},
            "sdpa_cudnn": {"label": "PyTorch SDPA cuDNN", "default_rank": 30},
            "fake_nan": {"label": "fake", "test_only": True, "default_rank": 99}}


def rec(arch, backend, feats, outcome="pass", *, hd=128, tier="validated", lat=None, reason=None, sources=(),
        op="prefill"):
    d = {"schema": 1, "outcome": outcome, "tier": tier,
         "case": {"arch": arch, "backend": backend, "op": op, "dtype": "bfloat16", "head_dim": hd,
                  "head_dim_v": hd, "features": list(feats)},
         "provenance": {"date": "2026-11-01"} if tier == "declared" else
         {"device": "H200", "kernel_version": "4.0.0b36", "torch": "2.11", "date": "2026-11-01", "library": "lib"}}
    if sources:
        d["sources"] = list(sources)
    if reason is not None:
        d["reason"] = reason
    if outcome == "pass" and tier == "validated":
        d["error"] = {"max_abs_err": 0.00123, "max_rel_err": 0.01}
    if lat is not None:
        d["timings"] = [{"shape": "s1", "latency_ms": lat, "tflops": 123.456}]
    return parse_record(d)


def records():
    return [
        rec("sm_90", "fa4", ("causal",), lat=0.5),
        rec("sm_90", "fa4", ("causal", "softcap"), "rejected", reason=HOSTILE_REASON, sources=(HOSTILE_SOURCE,)),
        rec("sm_90", "fa2", ("causal",), lat=0.7),
        rec("sm_90", "fa2", ("causal",), tier="declared", sources=("declared: README", HOSTILE_SOURCE)),
        rec("sm_90", "fa2", ("causal", "softcap"), tier="declared", sources=(HOSTILE_SOURCE,)),
        rec("sm_90", "sdpa_cudnn", ("causal",), lat=0.3),
        rec("sm_90", "sdpa_cudnn", ("causal",), "rejected", tier="declared", reason="declared no", sources=("doc",)),
        rec("sm_90", "sdpa_cudnn", ("causal", "paged_kv:16"), "rejected", reason="no paging"),
        rec("sm_90", "fa4", ("causal",), op="mla_prefill", hd=192, lat=0.9),
        rec("sm_100", "fa4", ("causal",), tier="compiled", outcome="compiled"),
        rec("sm_100", "fa2", ("causal",), tier="declared", sources=("PR #1",)),
        rec("sm_90", "fake_nan", ("causal",), "wrong", reason="NaN"),
        rec("cpu", "sdpa_cudnn", ("causal",), "unavailable", reason="no cuda"),
    ]


RANKINGS = [Ranking("rank\"1", ("sm_100",), "prefill", None, ((128, 128),), ("fa2", "fa4"), (HOSTILE_SOURCE,), "s")]


def matrix(recs=None):
    recs = records() if recs is None else recs
    return resolve(Evidence(records=recs, where=["t"] * len(recs), rankings=list(RANKINGS),
                            backends={k: dict(v) for k, v in BACKENDS.items()}))


def load_selector(text: str, tmp_path, name="gen_selector"):
    return vendored_selector(text, tmp_path, name)


def test_paths():
    out = render_all(matrix(), META)
    queries = [f"site/data/query/{n}.json" for n in (
        "cpu-decode-bfloat16", "cpu-prefill-bfloat16", "index", "sm_100-decode-bfloat16", "sm_100-prefill-bfloat16",
        "sm_90-decode-bfloat16", "sm_90-mla_prefill-bfloat16", "sm_90-prefill-bfloat16")]
    assert sorted(out) == sorted([
        "attnmatrix/selector.py", "site/archs/cpu.md", "site/archs/sm_100.md", "site/archs/sm_90.md",
        "site/changelog.md", "site/data.md", "site/data/cpu/sdpa_cudnn.json", "site/data/sm_100/fa2.json",
        "site/data/sm_100/fa4.json", "site/data/sm_90/fa2.json", "site/data/sm_90/fa4.json",
        "site/data/sm_90/sdpa_cudnn.json", "site/fa-version.md", "site/mla-prefill.md", "site/plots/sm_90-tflops.svg",
        "site/query.md", "site/snippets/coverage.md", "site/support-matrix.md", *queries])


def test_deterministic():
    a = render_all(matrix(), META)
    b = render_all(matrix(), META)
    assert a == b
    # the same evidence in another order gives the same bytes
    shuffled = records()
    random.Random(7).shuffle(shuffled)
    c = render_all(matrix(shuffled), dict(META, kernel_versions=dict(reversed(list(META["kernel_versions"].items())))))
    assert a == c
    # and the output depends on the data (the test can fail)
    d = render_all(matrix(records()[:-3]), META)
    assert d["attnmatrix/selector.py"] != a["attnmatrix/selector.py"]


def test_header_in_every_file():
    for path, text in render_all(matrix(), META).items():
        head = "\n".join(text.splitlines()[:12])
        assert re.search(r"do not edit by hand; run `attnmatrix generate`", head, re.I), path
        assert not re.search(r"\d{4}-\d{2}-\d{2}T|\d\d:\d\d:\d\d", text), path  # no timestamps
        if path.startswith("site/data/"):  # a download names its own content and its backend's versions
            data = json.loads(text)
            assert data["content_id"], path
            if "/query/" in path:  # the query page's answers: per arch, op and dtype, and their index
                assert path.endswith("index.json") or data["arch"] in path and data["op"] in path, path
            else:
                assert data["backend"] in path and data["arch"] in path, path
            continue
        assert "Generated by attnmatrix from matrix 0123abcd" in head, path
        assert "4.0.0b36" in head and "2.8.3.post2" in head, path


def test_hostile_strings_round_trip_through_the_selector(tmp_path):
    out = render_all(matrix(), HOSTILE_META)
    text = out["attnmatrix/selector.py"]
    compile(text, "selector.py", "exec")
    sel = load_selector(text, tmp_path)
    assert sel.MATRIX_ID == HOSTILE_META["matrix_id"]
    assert sel.KERNEL_VERSIONS == {"fa4": ["4.0.0", "4.0.0b36\n\"\"\"x"]} or \
        sel.KERNEL_VERSIONS == {"fa4": ["4.0.0b36\n\"\"\"x", "4.0.0"]}
    e = sel.explain((9, 0), 128, softcap=True)
    # the selector keeps the reason's first line (cut short) and an evidence id; the matrix keeps it all
    first_line = HOSTILE_REASON.splitlines()[0]
    assert e["fa4"].startswith(f"unsupported: causal+softcap: rejected (validated): {first_line[:60]}")
    assert "[evidence: validated:sm_90:" in e["fa4"]
    m = matrix()
    full = T.answer(m, T.Query("sm_90", "prefill", "bfloat16", 128, 128, ("causal", "softcap")), "fa4")
    assert any(c.reason == HOSTILE_REASON and HOSTILE_SOURCE in c.sources for c in full.cells)
    assert sel.select_backends((9, 0), 128, softcap=True) == ["fa2"]
    # the declared ranking's hostile id and source survive too
    assert HOSTILE_SOURCE in sel.explain((10, 0), 128)["fa2"] and 'rank"1' in sel.explain((10, 0), 128)["fa2"]
    # the injected "# injected" line stays inside a comment / string
    assert not re.search(r"^# injected", text, re.M)


def test_generated_selector_is_ruff_clean(tmp_path):
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff not installed")
    p = tmp_path / "selector.py"
    p.write_text(render_all(matrix(), HOSTILE_META)["attnmatrix/selector.py"], encoding="utf-8")
    r = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "E,F,W,I,B,UP", "--line-length", "120",
                        "--target-version", "py310", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _unescaped_pipes(line: str) -> int:
    return line.count("|")  # escaped pipes are entities, so every literal | is a column separator


def test_docs_escape_data():
    out = render_all(matrix(), HOSTILE_META)
    for path, text in out.items():
        if not path.endswith(".md"):
            continue
        body = text.split("-->", 1)[1]  # past the header comment
        assert "<script>" not in text and "{{" not in body and "{%" not in body, path
        assert "-->" not in body, path
        # every row of a table has as many separators as its header
        blocks, cur = [], []
        for ln in body.splitlines():
            if ln.startswith("|"):
                cur.append(ln)
            elif cur:
                blocks.append(cur)
                cur = []
        for b in blocks + ([cur] if cur else []):
            assert len({_unescaped_pipes(ln) for ln in b}) == 1, (path, b)
    page = out["site/archs/sm_90.md"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a &#124; pipe &#96;tick&#96; &#42;&#42;bold&#42;&#42; &#91;x&#93;(y)" in page
    assert "real newline" in page and "back&#92;slash" in page and "&#123;&#123; jinja &#125;&#125;" in page
    assert "repo@abc:path/with&#124;pipe.py#L1" in page
    assert "FlashAttention &#124; 2 &lt;b&gt;" in out["site/support-matrix.md"]


def test_md_escape_and_pylit_units():
    assert md_escape("a|b\nc<d>&`e`") == "a&#124;b<br>c&lt;d&gt;&amp;&#96;e&#96;"
    assert md_escape("sliding_window __init__") == "sliding_window &#95;&#95;init&#95;&#95;"
    assert md_escape("flash-attn==2.8") == "flash-attn=&#61;2.8"
    for v in ["'''\"\"\"\\\n{{", 1.5e-7, (1,), [None, True], {"a": (2, 3.0)}]:
        assert eval(pylit(v)) == v  # noqa: S307 - the point is that the literal evaluates back
    with pytest.raises(ValueError):
        pylit(float("nan"))


def test_docs_content():
    out = render_all(matrix(), META)
    sm = out["site/support-matrix.md"]
    assert "fake" not in sm.lower().replace("fake_nan", "") and "fake_nan" not in sm  # test-only backends left out
    # tiers are marked: fa4 is validated on sm_90 and compiled on sm_100
    fa4_row = next(ln for ln in sm.splitlines() if ln.startswith("| FlashAttention 4"))
    assert "[9.0](archs/sm_90.md) V" in fa4_row and "[10.0](archs/sm_100.md) C" in fa4_row
    assert "legend" in sm.lower() or "| Mark | Meaning |" in sm
    assert "[sm_90](archs/sm_90.md#fastest-validated-backend)" in sm
    arch = out["site/archs/sm_90.md"]
    # fastest validated backend per (op, head dim, features) where measured, to 2 significant figures
    grid = arch.split("## Fastest validated backend", 1)[1].split("##", 1)[0]
    assert "| prefill bfloat16 128 | sdpa_cudnn 0.30 |" in grid and "| mla_prefill bfloat16 192 | fa4 0.90 |" in grid
    assert "V 0.50" in arch  # fa4's causal cell: tier mark and latency
    assert "overruled (weaker evidence): declared rejected (doc)" in arch  # conflicts are shown
    # the per-cell JSON keeps what the page shortens: full-precision numbers, errors, every reason in full
    data = json.loads(out["site/data/sm_90/fa4.json"])
    rows = [dict(zip(data["columns"], r, strict=True)) for r in data["cells"]]
    causal = next(r for r in rows if r["op"] == "prefill" and r["features"] == ["causal"])
    assert causal["latency_ms"] == 0.5 and causal["max_abs_err"] == 0.00123 and causal["tflops"] == 123.5
    softcap = next(r for r in rows if r["features"] == ["causal", "softcap"])
    assert data["reasons"][softcap["reason"]] == HOSTILE_REASON
    assert data["sources"][softcap["sources"]][-1] == HOSTILE_SOURCE
    fa = out["site/fa-version.md"]
    assert "| 128 | FA4 |" in fa
    mla = out["site/mla-prefill.md"]
    assert "FLASH_ATTN" in mla


def test_reference_queries_match_policy():
    m = matrix()
    q = T.make_query("sm_90", 128, softcap=True)
    ordered, answers = T.query(m, q)
    assert [a.backend for a in ordered] == ["fa2"]
    assert {a.backend for a in answers} == {"fa2", "fa4", "sdpa_cudnn"}
    assert T.flash_attn_version(m, "sm_90", head_size=128) == 4
    # sm_100: compiled fa4 and declared fa2, both unmeasured: the declared ranking puts fa2 first
    assert T.flash_attn_version(m, "sm_100", head_size=128) == 2
