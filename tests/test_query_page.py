"""The query page's published answers are the query engine's `explain`, the data page documents the downloads as
they are, citations become links, and the pages' evidence marks render in any font."""

from __future__ import annotations

import importlib.util
import json
import random
import re
from pathlib import Path

import pytest
from attnmatrix.generator import cell_data as CD
from attnmatrix.generator import decision_tables as DT
from attnmatrix.generator import links as L
from attnmatrix.generator import query_page as Q
from attnmatrix.generator import tables as T
from attnmatrix.generator.capabilities import engine_for
from test_pages import matrix

REPO = Path(__file__).resolve().parent.parent
QUERY_DIR = REPO / "site" / "data" / "query"


def decode(data: dict, key: str) -> dict[str, str]:
    """One published answer back as `explain` gives it: backend -> text, in order (the page does the same)."""
    flat = data["answers"][key]
    texts = ["".join(data["fragments"][f] for f in t) for t in data["texts"]]
    rows = [(data["backends"][flat[i]], texts[flat[i + 1]]) for i in range(0, len(flat), 2)]
    n = sum(t.startswith("supported ") for _, t in rows)
    out, pos = {}, 0
    for b, t in rows:
        if t.startswith("supported "):
            pos += 1
            t = t.replace("(#{} of {}, ", f"(#{pos} of {n}, ", 1)
        out[b] = t
    return out


def parse_key(key: str) -> tuple[str, int, int, tuple[str, ...]]:
    dtype, hd, hdv, feats = key.split("|")
    return dtype, int(hd), int(hdv), () if feats == "none" else tuple(feats.split("+"))


def test_every_published_answer_is_the_engines_explain():
    """On a hand-built matrix: every query of every published file decodes to explain_query's answer exactly."""
    m = matrix()
    eng = engine_for(m)
    files = Q.query_files(m, DT.decision_queries(m))
    assert f"{Q.QUERY_DIR}/index.json" in files
    n = 0
    for path, text in files.items():
        data = json.loads(text)
        if path.endswith("index.json"):
            assert [a["arch"] for a in data["archs"]] == ["sm_90", "cpu"]
            continue
        for key in data["answers"]:
            dtype, hd, hdv, feats = parse_key(key)
            got = decode(data, key)
            want = eng.explain_query(data["arch"], data["op"], dtype, hd, hdv, feats)
            assert list(got.items()) == list(want.items()), (path, key)
            n += 1
    # the probed cells and the decision tables' composed queries (e.g. sliding window + sinks) are all there
    assert n >= len({(c.case.arch, c.case.op, c.case.dtype, c.case.head_dim, c.case.features)
                     for c in T.public_cells(m)})
    sm90 = json.loads(files[f"{Q.QUERY_DIR}/sm_90-prefill-bfloat16.json"])
    assert "bfloat16|128|128|causal+sinks+sliding_window" in sm90["answers"]


def test_committed_answers_match_the_selector_on_a_sample():
    """The committed site's answers (what the browser shows) against the shipped selector's explain, on a fixed
    random sample of 400 queries over every GPU arch, op and dtype, through its public keyword API."""
    from attnmatrix import selector

    keys = []
    for f in sorted(QUERY_DIR.glob("*-*.json")):
        data = json.loads(f.read_text(encoding="utf-8"))
        if data["arch"] in selector.ARCHS:
            keys += [(f, data, k) for k in data["answers"]]
    assert len(keys) > 1000
    for f, data, key in random.Random(30).sample(keys, 400):
        dtype, hd, hdv, feats = parse_key(key)
        flags = {t for t in feats if ":" not in t}
        page = next((int(t.split(":")[1]) for t in feats if t.startswith("paged_kv:")), None)
        arch = data["arch"]
        cap = (int(arch[3:-1]), int(arch[-1]))
        if any(t.startswith("qk_rope:") for t in feats):  # no keyword for the rope split: the engine's own call
            want = selector._ENGINE.explain_query(arch, data["op"], dtype, hd, hdv, feats)
        else:
            want = selector.explain(cap, hd, hdv, op=data["op"], dtype=dtype, causal="causal" in flags,
                                    page_size=page, **{k: True for k in flags - {"causal"}})
            supported = [b for b, t in want.items() if t.startswith("supported ")]
            assert supported == selector.select_backends(cap, hd, hdv, op=data["op"], dtype=dtype,
                                                         causal="causal" in flags, page_size=page,
                                                         **{k: True for k in flags - {"causal"}})
        assert list(decode(data, key).items()) == list(want.items()), (f.name, key)


def test_b200_head_dim_256_sliding_window_is_published():
    data = json.loads((QUERY_DIR / "sm_100-prefill-bfloat16.json").read_text(encoding="utf-8"))
    from attnmatrix import selector

    assert decode(data, "bfloat16|256|256|causal+sliding_window") == selector.explain((10, 0), 256,
                                                                                       sliding_window=True)
    index = json.loads((QUERY_DIR / "index.json").read_text(encoding="utf-8"))
    sm100 = next(a for a in index["archs"] if a["arch"] == "sm_100")
    assert "B200" in sm100["products"] and sm100["title"].startswith("sm_100 — B200")


# --- the data page -------------------------------------------------------------------------------------------

_TYPES = {"string": str, "integer": int, "number": (int, float), "array of strings": list,
          "array of arrays": list}


def documented_columns(page: str) -> list[tuple[str, str]]:
    rows = re.findall(r"^\| `([a-z_]+)` \| ([a-z ]+) \| ", page, re.M)
    assert rows, "the data page has no column table"
    return rows


def check_value(column: str, kind: str, v: object) -> None:
    if v is None:
        assert kind.endswith(" or null"), (column, kind)
        return
    base = kind.removesuffix(" or null")
    assert isinstance(v, _TYPES[base]) and not isinstance(v, bool), (column, kind, v)
    if base == "array of strings":
        assert all(isinstance(x, str) for x in v), (column, v)


def test_data_page_schema_matches_the_files():
    """Every committed download has exactly the documented columns, in order, each value of the documented type,
    every timing entry in the documented timing columns, figures at most 4 significant digits."""
    page = (REPO / "site" / "data.md").read_text(encoding="utf-8")
    cols = documented_columns(page)
    assert [c for c, _ in cols] == list(CD.CELL_COLUMNS)
    kinds = dict(cols)
    files = sorted((REPO / "site" / "data").glob("*/*.json"))
    cells_files = [f for f in files if f.parent.name != "query"]
    assert len(cells_files) > 50
    for f in cells_files:
        d = json.loads(f.read_text(encoding="utf-8"))
        assert d["schema"] == CD.CELLS_SCHEMA and f"`{CD.CELLS_SCHEMA}`" in page
        assert d["columns"] == [c for c, _ in cols], f
        assert d["timing_columns"] == list(CD.TIMING_COLUMNS) and all(f"`{c}`" in page for c in d["timing_columns"])
        for row in d["cells"]:
            for c, v in zip(d["columns"], row, strict=True):
                check_value(c, kinds[c], v)
                if isinstance(v, float):
                    assert len(f"{v:.15g}".lstrip("-0.").replace(".", "").rstrip("0")) <= 4 or \
                        float(f"{v:.4g}") == v, (f, c, v)
            cell = dict(zip(d["columns"], row, strict=True))
            assert cell["reason"] is None or cell["reason"] in d["reasons"]
            assert cell["sources"] is None or cell["sources"] in d["sources"]
            for t in cell["timings"]:
                assert len(t) == len(CD.TIMING_COLUMNS) and isinstance(t[0], str) and t[1] > 0, (f, t)


def test_whole_matrix_download_is_every_cell():
    spec = importlib.util.spec_from_file_location("site_hooks", REPO / "docs-hooks" / "site_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    text, csv_text = hooks.whole_matrix(REPO / "site" / "data")
    whole = json.loads(text)
    assert whole["columns"] == ["arch", "backend", *CD.CELL_COLUMNS]
    files = [json.loads(f.read_text(encoding="utf-8")) for f in (REPO / "site" / "data").glob("*/*.json")
             if f.parent.name != "query"]
    assert whole["cells"] == len(whole["rows"]) == sum(len(d["cells"]) for d in files)
    assert all(r[whole["columns"].index("reason")] in (None, *whole["reasons"]) for r in whole["rows"])
    import csv
    import io

    rows = list(csv.reader(io.StringIO(csv_text)))
    assert rows[0] == whole["columns"] and len(rows) - 1 == whole["cells"]
    page = (REPO / "site" / "data.md").read_text(encoding="utf-8")
    assert "(data/matrix.json)" in page and "(data/matrix.csv)" in page


# --- links and marks -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, url", [
    ("Dao-AILab/flash-attention PR #2412", "https://github.com/Dao-AILab/flash-attention/pull/2412"),
    ("flashinfer-ai/flashinfer issue #2143 (comment)", "https://github.com/flashinfer-ai/flashinfer/issues/2143"),
    ("NVIDIA/TensorRT-LLM@fd82d9dfbcd8341b80d62d21bb5fee697d992e5f:tensorrt_llm/a.py#L10-L12",
     "https://github.com/NVIDIA/TensorRT-LLM/blob/fd82d9dfbcd8341b80d62d21bb5fee697d992e5f/tensorrt_llm/a.py#L10-L12"),
    ("Dao-AILab/flash-attention@0e79d71175346c7151f49ab6287084a052bc9613:hopper/flash_api.cpp#mha_fwd",
     "https://github.com/Dao-AILab/flash-attention/blob/0e79d71175346c7151f49ab6287084a052bc9613/hopper/flash_api.cpp"),
    ("pypi:flash-attn==2.8.3.post2(sdist):setup.py#L70", "https://pypi.org/project/flash-attn/2.8.3.post2/"),
    ("pypi:flash-attn-4==4.0.0b36:flash_attn/cute/interface.py#L124", "https://pypi.org/project/flash-attn-4/4.0.0b36/"),
    ("validated: H200, torch 2.11, 2026-11-01", None),
])
def test_citations_become_links(source, url):
    assert L.source_url(source) == url


def test_arch_pages_link_their_citations():
    text = (REPO / "site" / "archs" / "sm_100.md").read_text(encoding="utf-8")
    assert re.search(r"\]\(https://github\.com/[^)]+/(blob/[0-9a-f]{40}/|pull/\d+)", text)
    assert "](https://pypi.org/project/" in text


def test_marks_render_without_an_emoji_font():
    """Marks are ASCII letters (site/javascripts/marks.js makes badges of them); no generated page uses a
    character only an emoji font has."""
    assert all(m.isascii() for m in [*T.TIER_MARK.values(), T.UNSUPPORTED_MARK, T.UNKNOWN_MARK])
    assert set(T.MARK_MEANING) == {*T.TIER_MARK.values(), T.UNSUPPORTED_MARK, T.UNKNOWN_MARK}
    emoji = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F]")
    for p in [*(REPO / "site").glob("*.md"), *(REPO / "site" / "archs").glob("*.md")]:
        found = emoji.findall(p.read_text(encoding="utf-8"))
        assert not found, (p.name, sorted(set(found)))
    js = (REPO / "site" / "javascripts" / "marks.js").read_text(encoding="utf-8")
    for mark, meaning in T.MARK_MEANING.items():  # the badges' titles say what the generator's marks mean
        assert re.search(rf'(?:\b{re.escape(mark)}|"{re.escape(mark)}"): "{meaning}"', js), mark


def test_mla_page_answers_one_query_per_triple():
    """Each row of the MLA page is keyed by its (qk_nope, qk_rope, v) triple, and its priorities are the
    selector's answer for exactly that triple."""
    from attnmatrix import selector

    text = (REPO / "site" / "mla-prefill.md").read_text(encoding="utf-8")
    assert "Only the sum" not in text
    rows = 0
    for section in text.split("\n## ")[1:]:
        arch = section.split("\n", 1)[0].strip()
        cap = (int(arch[3:-1]), int(arch[-1]))
        for nope, rope, v, pri in re.findall(r"^\| (\d+), (\d+), (\d+) \| [^|]* \| ([^|]*) \|", section, re.M):
            want = selector.get_mla_prefill_backend_priorities(cap, int(nope), int(rope), int(v))
            assert (pri.split(" → ") if want else pri) == (want or "none: no supported backend"), (arch, nope, rope)
            rows += 1
    assert rows >= 4 * len(selector.ARCHS)
