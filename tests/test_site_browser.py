"""The published site in a real browser: headless Chromium renders the support matrix and the plots.

A hand-built matrix (timed GPU cells with a recorded matmul peak, CPU cells without, a previous matrix for the
changelog) is rendered into a temporary copy of the site (the real `site/` is never touched), built with
`mkdocs build --strict`, served on 127.0.0.1 and opened in Chromium (`/usr/bin/chromium`, Debian's
`chromium` package; `ATTNMATRIX_CHROMIUM` names another binary). Chromium resolves no host but 127.0.0.1,
so nothing leaves the machine. Without the binary, or without mkdocs, mkdocs-material and matplotlib, the
tests skip and say why.
"""

from __future__ import annotations

import contextlib
import functools
import html
import html.parser
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urljoin

import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path(os.environ.get("ATTNMATRIX_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
# Generated pages of the real site: the copy gets the hand-built matrix's instead.
GENERATED = ("support-matrix.md", "mla-prefill.md", "fa-version.md", "changelog.md", "vllm-comparison.md", "archs",
             "data", "plots", "query.md", "data.md", "snippets")

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.is_file(),
                       reason=f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium)"),
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("mkdocs", "material", "matplotlib")),
                       reason="mkdocs, mkdocs-material and matplotlib are needed (pip install 'attnmatrix[docs]')"),
]


# --- the site --------------------------------------------------------------------------------------

def _test_matrix():
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_plots import make_matrix, measured_records
    finally:
        sys.path.pop(0)
    previous = make_matrix([r for r in measured_records() if r.case.backend != "sdpa_cudnn"])
    return make_matrix(), previous


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(base URL of the served site, temp root): the hand-built matrix rendered into a copy of the site."""
    from attnmatrix.engines import render_all

    root = tmp_path_factory.mktemp("site-copy")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copy(REPO / "CHANGELOG.md", root / "CHANGELOG.md")  # the project changelog page includes it
    shutil.copytree(REPO / "docs-examples", root / "docs-examples")
    shutil.copytree(REPO / "docs-hooks", root / "docs-hooks", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "site", root / "site", ignore=lambda d, names: [
        n for n in names if Path(d).resolve() == (REPO / "site").resolve() and n in GENERATED])
    m, previous = _test_matrix()
    meta = {"matrix_id": "browser0test", "kernel_versions": {"fa4": ["4.0.0b36"]},
            "files": ["matrix/data/results/test.jsonl"],
            "previous": {"matrix_id": "previous0001", "matrix": previous, "source": "hand-built"}}
    for rel, text in render_all(m, meta).items():
        if rel.startswith("site/"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
    out = root / "built"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                        "-d", str(out)], capture_output=True, text=True, cwd=root,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with serving(out) as url:
        yield url, root


@contextlib.contextmanager
def serving(directory: Path):
    """A built site served over HTTP on a free loopback port, for as long as the block runs; yields its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def chromium(tmp_path: Path, *args: str) -> str:
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    r = subprocess.run([str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


# --- reading the DOM -------------------------------------------------------------------------------

class _Dom(html.parser.HTMLParser):
    """Tables (rows of cell texts, and the code spans of each cell) and <img> attributes of a DOM dump."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[list[list[tuple[str, list[str]]]]] = []
        self.imgs: list[dict[str, str]] = []
        self._cell: list[str] | None = None
        self._codes: list[str] = []
        self._code: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables:
            self._cell, self._codes = [], []
        elif tag == "code" and self._cell is not None:
            self._code = []
        elif tag == "img":
            self.imgs.append({k: v or "" for k, v in attrs})

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append((" ".join("".join(self._cell).split()), self._codes))
            self._cell = None
        elif tag == "code" and self._code is not None:
            self._codes.append("".join(self._code))
            self._code = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._code is not None:
            self._code.append(data)


def parse(dom: str) -> _Dom:
    p = _Dom()
    p.feed(dom)
    return p


def table_with_header(dom: _Dom, first: str) -> list[list[tuple[str, list[str]]]]:
    for t in dom.tables:
        if t and t[0] and t[0][0][0] == first:
            return t
    raise AssertionError(f"no table with a {first!r} column; tables start with {[t[0][0][0] for t in dom.tables]}")


# A page that loads each plot as an image and writes what the browser made of it into the DOM.
PROBE_PAGE = """<!doctype html><html><body><pre id="out"></pre><script>
  const names = NAMES; const out = {};
  Promise.all(names.map(n => new Promise(done => {
    const img = new Image();
    img.onload = () => { out[n] = [img.naturalWidth, img.naturalHeight]; done(); };
    img.onerror = () => { out[n] = "error"; done(); };
    img.src = "plots/" + n;
  }))).then(() => { document.getElementById("out").textContent = "RESULT " + JSON.stringify(out); });
</script></body></html>
"""


# --- tests -----------------------------------------------------------------------------------------

def test_support_matrix_renders_a_row_per_backend_and_the_plots(site, tmp_path):
    base, _ = site
    from attnmatrix.generator import tables as T

    m, _ = _test_matrix()
    expected = sorted({c.case.backend for c in T.public_cells(m)})
    page = urljoin(base, "support-matrix/")
    dom = parse(chromium(tmp_path, "--dump-dom", page))

    backends = table_with_header(dom, "Backend")
    header = [text for text, _ in backends[0]]
    assert header[-1] == "Compute capability" and "Head sizes" in header
    rows = backends[1:]
    names = [codes[0] for (_, codes), *_ in rows]
    assert sorted(names) == expected and len(names) == len(set(names))  # one row per backend, no more
    fa4 = next(r for r in rows if r[0][1] == ["fa4"])
    assert fa4[0][0].startswith("FlashAttention 4") and "9.0" in fa4[-1][0]

    srcs = sorted(urljoin(page, i["src"]) for i in dom.imgs if "/plots/" in i.get("src", ""))
    assert srcs == [urljoin(base, f"plots/{n}") for n in ("cpu-tflops.svg", "sm_90-peak.svg", "sm_90-tflops.svg")]
    assert all(i.get("alt") for i in dom.imgs if "/plots/" in i.get("src", ""))


def test_plots_load_and_render_in_the_browser(site, tmp_path):
    """Every plot the pages embed decodes as an image in Chromium (no broken image)."""
    base, root = site
    plots = sorted(p.name for p in (root / "built" / "plots").glob("*.svg"))
    assert plots == ["cpu-tflops.svg", "sm_90-peak.svg", "sm_90-tflops.svg"]
    probe = root / "built" / "img-probe.html"
    probe.write_text(PROBE_PAGE.replace("NAMES", json.dumps(plots)), encoding="utf-8")
    dom = chromium(tmp_path, "--virtual-time-budget=15000", "--dump-dom", urljoin(base, "img-probe.html"))
    found = re.search(r'<pre id="out">RESULT (.*?)</pre>', dom)
    assert found, f"the probe page never finished loading the plots: {dom[-2000:]}"
    result = json.loads(html.unescape(found.group(1)))
    for name in plots:
        w, h = result[name]  # "error" for a broken image fails here
        assert (w, h) == (960, 720), (name, w, h)  # 720 x 540 pt


def test_arch_page_and_changelog_in_the_browser(site, tmp_path):
    base, _ = site
    page = urljoin(base, "archs/sm_90/")
    dom_text = chromium(tmp_path, "--dump-dom", page)
    arch = parse(dom_text)
    assert any(i.get("src", "").endswith("plots/sm_90-tflops.svg") for i in arch.imgs)
    # the decision tables come first (per op: head size x layer type -> the pick), then the capability summary:
    # one row per backend, with its ops, head sizes and features
    caps = table_with_header(arch, "Backend")
    first = [t[0][0][0] for t in arch.tables[:arch.tables.index(caps)]]
    assert first == ["Head size", "Head size"]  # prefill and decode
    assert table_with_header(arch, "Head size")[0][1][0] == "causal"
    header = [text for text, _ in caps[0]]
    assert header[:5] == ["Backend", "Cells", "Ops", "Dtypes", "Head sizes"] and "Features" in header
    rows = {r[0][1][0]: [text for text, _ in r] for r in caps[1:]}
    assert {"fa4", "fa2", "sdpa_cudnn"} <= set(rows)
    assert "128" in rows["fa4"][header.index("Head sizes")] and "prefill" in rows["fa4"][header.index("Ops")]
    # the fastest backend per cell, latencies to 2 significant figures, paged KV columns in numeric order
    fastest = table_with_header(arch, "Op, dtype, head size")
    assert any(cells[0][0] == "prefill bfloat16 128" for cells in fastest[1:])
    numbers = [x for row in fastest[1:] for text, _ in row[1:] for x in re.findall(r"\b\d+(?:\.\d+)?\b", text)]
    assert numbers and all(len(x.replace(".", "").strip("0")) <= 2 for x in numbers), numbers
    paged = [int(t.split(":")[1]) for t, _ in fastest[0] if "paged_kv:" in t]
    assert paged == sorted(paged)
    # per-cell detail is collapsed (one <details> per backend) and links a JSON file that parses
    assert dom_text.count("<details") == len(caps) - 1 and "<details open" not in dom_text
    links = sorted(set(re.findall(r'href="([^"]*data/sm_90/[a-z0-9_]+\.json)"', dom_text)))
    assert len(links) == len(caps) - 1
    import urllib.request

    with urllib.request.urlopen(urljoin(page, links[0]), timeout=30) as r:  # served from the built site
        data = json.loads(r.read().decode("utf-8"))
    assert data["arch"] == "sm_90" and data["cells"] and len(data["columns"]) == len(data["cells"][0])

    log = parse(chromium(tmp_path, "--dump-dom", urljoin(base, "changelog/")))
    summary = table_with_header(log, "Change")
    assert [c[0][0] for c in summary[1:]] == ["New cells"]
    cells = table_with_header(log, "Cell")
    assert len(cells) - 1 == 8 and all("/sdpa_cudnn/" in c[0][0] for c in cells[1:])


def test_screenshot_of_the_support_matrix(site, tmp_path):
    base, _ = site
    png = tmp_path / "support-matrix.png"
    chromium(tmp_path, "--window-size=1280,2000", "--hide-scrollbars", f"--screenshot={png}",
             urljoin(base, "support-matrix/"))
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    import matplotlib.image

    pixels = matplotlib.image.imread(str(png))
    assert pixels.shape[:2] == (2000, 1280)
    rgb = pixels[..., :3].reshape(-1, 3)
    assert rgb.std() > 0.05  # not a blank page
    assert len({tuple(p) for p in (rgb[::97] * 255).round().astype(int).tolist()}) > 20  # text, table, colours


# --- the query page and the tables, driven in the browser ------------------------------------------------

# A page that opens a site page in a same-origin frame of a given width and runs `steps` on it, writing what it
# found into its own DOM (a headless browser's --dump-dom then reads it).
DRIVER_PAGE = """<!doctype html><html><body>
<iframe id="f" style="width: WIDTHpx; height: 900px; border: 0" src="TARGET"></iframe>
<pre id="out"></pre><script>
const STEPS = STEPS_JSON;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(fn, what) {
  for (let i = 0; i < 400; i++) { const v = fn(); if (v) return v; await sleep(25); }
  throw new Error("timed out waiting for " + what);
}
function choose(d, id, value) {
  const s = d.getElementById(id);
  if (![...s.options].some((o) => o.value === value)) throw new Error(id + " has no option " + value);
  s.value = value; s.dispatchEvent(new Event("change"));
}
async function ask(d, q) {
  await until(() => d.getElementById("am-query").dataset.ready, "the query page");
  choose(d, "am-gpu", q.gpu); choose(d, "am-preset", q.preset || "");
  if (!q.preset) {
    choose(d, "am-op", q.op); choose(d, "am-dtype", q.dtype); choose(d, "am-hd", q.hd);
    d.querySelectorAll("#am-flags input").forEach((i) => { i.checked = q.flags.includes(i.value); });
    choose(d, "am-page", q.page || "");
  }
  const out = d.getElementById("am-result");
  await until(() => out.dataset.state === "done" && out.dataset.query === q.expect, "the answer to " + q.expect);
  return [...out.querySelectorAll(".am-answer")].map((b) => ({
    key: b.dataset.key, title: b.querySelector("h3").textContent,
    rows: [...b.querySelectorAll("[data-explain]")].map((e) => [e.dataset.backend, e.dataset.explain]),
    links: [...b.querySelectorAll("a[href^='https://']")].length, text: b.textContent.slice(0, 3000)}));
}
function wideTables(d) {
  d.querySelectorAll("details").forEach((x) => { x.open = true; });
  const bad = [];
  d.querySelectorAll(".md-content table").forEach((t, i) => {
    const box = t.closest(".md-typeset__scrollwrap") || t.parentElement;
    if (t.scrollWidth <= box.clientWidth + 1) return;
    const first = t.querySelector("tbody tr td, tr th");
    const sticky = first && getComputedStyle(first).position === "sticky";
    if (!sticky) bad.push(i + ": " + t.rows[0].textContent.slice(0, 60));
  });
  return bad;
}
document.getElementById("f").onload = async () => {
  const d = document.getElementById("f").contentDocument;
  const result = {answers: [], wide: null, marks: 0, titled: 0};
  try {
    for (const q of STEPS) result.answers.push(await ask(d, q));
    await sleep(200);
    result.wide = wideTables(d);
    const marks = [...d.querySelectorAll(".am-mark")];
    result.marks = marks.length; result.titled = marks.filter((m) => m.title).length;
    const ids = [...d.querySelectorAll('.md-content a[href^="#r"]')];
    result.reason_links = ids.length; result.previewed = ids.filter((a) => a.title.length > 8).length;
  } catch (err) { result.error = String(err); }
  document.getElementById("out").textContent = "RESULT " + JSON.stringify(result);
};
</script></body></html>
"""


def drive(tmp_path: Path, built: Path, base: str, target: str, steps: list[dict], width: int = 1440) -> dict:
    name = f"driver-{len(list(built.glob('driver-*.html')))}.html"
    (built / name).write_text(DRIVER_PAGE.replace("WIDTH", str(width)).replace("TARGET", target)
                              .replace("STEPS_JSON", json.dumps(steps)), encoding="utf-8")
    dom = chromium(tmp_path, f"--window-size={width + 40},1000", "--virtual-time-budget=60000", "--dump-dom",
                   urljoin(base, name))
    found = re.search(r'<pre id="out">RESULT (.*?)</pre>', dom, re.S)
    assert found, f"the driver page never finished: {dom[-2000:]}"
    result = json.loads(html.unescape(found.group(1)))
    assert "error" not in result, result["error"]
    return result


def _step(arch: str, product: str, hd: int, flags: list[str], op: str = "prefill", dtype: str = "bfloat16",
          page: str = "") -> dict:
    feats = sorted(flags + ([f"paged_kv:{page}"] if page else []))
    return {"gpu": f"{arch}|{product}", "op": op, "dtype": dtype, "hd": str(hd), "flags": flags, "page": page,
            "expect": f"{arch}/{op}/{dtype}|{hd}|{hd}|{'+'.join(feats) or 'none'}"}


def test_query_page_answers_what_the_engine_answers(site, tmp_path):
    """Driven through its controls: the hand-built matrix's answers, in the engine's order and words."""
    base, root = site
    from attnmatrix.generator.capabilities import engine_for

    m, _ = _test_matrix()
    eng = engine_for(m)
    steps = [_step("sm_90", "H100", 128, ["causal"]), _step("sm_90", "H200", 128, ["causal", "softcap"]),
             _step("sm_90", "H200", 64, [], op="decode")]
    result = drive(tmp_path, root / "built", base, "query/", steps)
    (missing,) = result["answers"].pop()  # a combination nothing was probed on: no answer invented, the command
    assert missing["rows"] == [] and "attnmatrix explain --arch sm_90 --op decode --dtype bfloat16 --head-size 64 " \
        "--no-causal" in missing["text"]
    for step, (block,) in zip(steps, result["answers"], strict=False):
        dtype, hd, _, feats = step["expect"].split("/", 2)[2].split("|")
        want = eng.explain_query("sm_90", step["op"], dtype, int(hd), int(hd),
                                 () if feats == "none" else tuple(feats.split("+")))
        assert block["rows"] == [list(x) for x in want.items()], step
        assert block["title"].startswith("sm_90 — H100 / H200")


def _real_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-site")
    out = root / "built"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(out)], capture_output=True, text=True, cwd=root,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


@pytest.fixture(scope="module")
def real_site(tmp_path_factory):
    """The committed site, built and served (the published data, not a hand-built matrix)."""
    out = _real_site(tmp_path_factory)
    with serving(out) as url:
        yield url, out


PRESETS = ("gpt-oss-120b", "gemma-2-27b", "llama-3.1-8b")


@pytest.mark.slow
def test_b200_head_dim_256_sliding_window_and_three_presets(real_site, tmp_path):
    """The question the page exists for, and three model presets, on the published data: each answer is the
    shipped selector's `explain` (and its order `select_backends`), with citation links."""
    from attnmatrix.matrix.models import load_models

    from attnmatrix import selector
    from attnmatrix.vocabulary import features_of

    base, built = real_site
    models = load_models()
    steps = [_step("sm_100", "B200", 256, ["causal", "sliding_window"])]
    steps += [{"gpu": "sm_100|B200", "preset": name, "expect": f"preset:{name}@sm_100"} for name in PRESETS]
    result = drive(tmp_path, built, base, "query/", steps)
    (b200,), *presets = result["answers"]
    want = selector.explain((10, 0), 256, sliding_window=True)
    assert b200["rows"] == [list(x) for x in want.items()]
    shown = [b for b, t in b200["rows"] if t.startswith("supported ")]
    assert shown and shown == selector.select_backends((10, 0), 256, sliding_window=True)
    assert b200["links"] > 0  # citations are links
    for name, blocks in zip(PRESETS, presets, strict=True):
        mdl = models[name]
        layers = [(ly, op) for ly in mdl.layers for op in ly.ops()]
        assert len(blocks) == len(layers), name
        for (ly, op), block in zip(layers, blocks, strict=True):
            feats = features_of(**ly.query_params(op, mdl.tp))
            want = selector._ENGINE.explain_query("sm_100", op, "bfloat16", ly.head_dim, ly.head_dim_v, feats)
            assert block["rows"] == [list(x) for x in want.items()], (name, op)


@pytest.mark.slow
@pytest.mark.parametrize("width", [1440, 390])
def test_wide_tables_keep_their_first_column_and_marks_have_titles(real_site, tmp_path, width):
    """At desktop and phone widths, every table wider than its box (per-cell grids opened) scrolls with a
    sticky first column; every evidence mark is a badge with a title."""
    base, built = real_site
    for target in ("archs/sm_90/", "support-matrix/"):
        result = drive(tmp_path, built, base, target, [], width=width)
        assert result["wide"] == [], (target, result["wide"])
        assert result["marks"] > 100 and result["titled"] == result["marks"], target
        if target.startswith("archs/"):  # reason ids preview their reason
            assert result["reason_links"] > 0 and result["previewed"] == result["reason_links"], result
