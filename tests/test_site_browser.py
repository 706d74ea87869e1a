"""The published site in a real browser: headless Chromium renders the support matrix and the plots.

A hand-built matrix (timed GPU cells with a recorded matmul peak, CPU cells without, a previous matrix for the
changelog) is rendered into a temporary copy of the site (the real `site/` is never touched), built with
`mkdocs build --strict`, served on 127.0.0.1 and opened in Chromium (`/usr/bin/chromium`, Debian's
`chromium` package; `ATTNMATRIX_CHROMIUM` names another binary). Chromium resolves no host but 127.0.0.1,
so nothing leaves the machine. Without the binary, or without mkdocs, mkdocs-material and matplotlib, the
tests skip and say why.
"""

from __future__ import annotations

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
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", root
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
