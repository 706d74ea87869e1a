"""Render the generated files: tables (generator.tables) -> Jinja2 templates -> file texts.

Escaping is not left to the templates' discipline. Each environment has a `finalize` hook that every
`{{ expression }}` passes through:

- Python templates: every value is written as a Python literal (`pylit`: repr for str/int/float,
  recursively for tuples, lists and dicts), so a reason with quotes, triple quotes, backslashes,
  newlines or `{{` can never end a string or inject code;
- Markdown templates: every value is escaped for a table cell (`md_escape`).

Only values wrapped in `Raw` (markup the generator builds itself, from escaped parts) pass unchanged.
"""

from __future__ import annotations

import html
import json
import re
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jinja2
from attnmatrix.matrix import policy
from attnmatrix.matrix.policy import ResolvedMatrix

from attnmatrix.vocabulary import QUERY_PARAMS, capability_label

from . import capabilities as C
from . import cell_data as CD
from . import decision_tables as DT
from . import links as L
from . import page_format as PF
from . import pages as PG
from . import plots as P
from . import pyliteral as PL
from . import query_page as Q
from . import support_matrix as SM
from . import tables as T

TEMPLATES = Path(__file__).parent / "templates"

SELECTOR_PATH = "attnmatrix/selector.py"
# The vendored selector: the generated module and the hand-written modules it imports (attnmatrix.<name>), copied
# side by side as plain files (standard library only).
SELECTOR_MODULES = ("selector", "selector_engine", "selector_vllm", "selector_workloads", "vocabulary")
SUPPORT_MATRIX_PATH = "site/support-matrix.md"
MLA_PREFILL_PATH = "site/mla-prefill.md"
FA_VERSION_PATH = "site/fa-version.md"
ARCH_PAGE_DIR = "site/archs"
CHANGELOG_PATH = "site/changelog.md"
QUERY_PAGE_PATH = "site/query.md"
DATA_PAGE_PATH = "site/data.md"
COVERAGE_SNIPPET_PATH = "site/snippets/coverage.md"  # included by the home page and the support matrix
PLOT_DIR = P.PLOT_DIR


class Raw(str):
    """Text the generator built itself from escaped parts: the finalize hooks pass it through."""


# --- Python literals ------------------------------------------------------------------------------

def pylit(v: Any) -> str:
    """A Python literal for `v` that evaluates back to an equal value (text the generator built passes as is)."""
    return str(v) if isinstance(v, Raw) else PL.literal(v)


def py_block(v: Any, indent: int, key: Any = None) -> Raw:
    """`key: value,` (or `value,`) as lines of at most the project's line length (generator/pyliteral.py)."""
    return Raw(PL.block(v, indent, prefix="" if key is None else PL.literal(key) + ": "))


def py_comment(v: Any) -> Raw:
    """Text safe inside a `#` comment or a docstring: one line, no quotes or backslashes left raw."""
    # JSON string escapes (\n, \\, \", \uXXXX) are also valid Python escapes: in a comment they are inert text,
    # in a docstring every quote is escaped, so nothing can end the docstring early.
    return Raw(json.dumps(str(v), ensure_ascii=True)[1:-1])


# --- Markdown -------------------------------------------------------------------------------------

_MD_CHARS = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "|": "&#124;", "`": "&#96;", "*": "&#42;", "[": "&#91;",
             "]": "&#93;", "\\": "&#92;", "{": "&#123;", "}": "&#125;", "_": "&#95;",
             # doubled marks of common extensions (pymdownx mark, tilde, caret, keys): break the pair
             "==": "=&#61;", "~~": "~&#126;", "^^": "^&#94;", "++": "+&#43;"}
# Other control characters and Unicode line breaks (which some tools split lines on) become visible escapes.
_CONTROL = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x85\u2028\u2029"
_CONTROL_RE = re.compile(f"[{_CONTROL}]")
_MD_RE = re.compile(r"\r\n|[\r\n&<>|`*\[\]\\{}" + _CONTROL + r"]|==|~~|\^\^|\+\+|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def _control(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def _md_sub(mo: re.Match) -> str:
    s = mo.group(0)
    if s in ("\r\n", "\r", "\n"):
        return "<br>"
    if _CONTROL_RE.fullmatch(s):
        return "&#92;" + _control(s)[1:]
    # `_` only matches where it could open or close emphasis, so `sliding_window` stays readable
    return _MD_CHARS[s]


def md_escape(v: Any) -> Raw:
    """Escape text for a Markdown table cell (or inline text): `|`, `<`, `>`, `&`, backticks, emphasis and
    link characters, braces (template plugins), and newlines (as `<br>`)."""
    if isinstance(v, Raw):
        return v
    return Raw(_MD_RE.sub(_md_sub, "" if v is None else str(v)))


def md_join(items: Iterable[Any], sep: str = "<br>") -> Raw:
    return Raw(sep.join(md_escape(x) for x in items))


def md_code(name: str) -> Raw:
    """A code span for identifiers we control (backend names, archs); anything else is escaped instead."""
    s = str(name)
    return Raw(f"`{s}`") if re.fullmatch(r"[A-Za-z0-9_.:+×-]+", s) else md_escape(s)


def html_comment(v: Any) -> Raw:
    """Text safe inside `<!-- -->`: no `>` (so no `-->`), one line."""
    s = _CONTROL_RE.sub(lambda mo: _control(mo.group(0)), str(v))
    return Raw(html.escape(s, quote=False).replace("\r", " ").replace("\n", " ").replace("--", "-&#45;"))


def claims(cs: list[SM.Claim], page_prefix: str = "") -> Raw:
    """A support-matrix cell: items with their mark, grouped, each group with the archs where it holds."""
    if not cs:
        return Raw(T.UNSUPPORTED_MARK)
    out: list[str] = []
    group: list[str] = []
    prev: tuple | None = None
    for c in cs:
        k = (c.mark, c.archs)
        if prev is not None and k != prev:
            out.append(_claim_group(group, prev))
            group = []
        group.append(c.label)
        prev = k
    assert prev is not None
    out.append(_claim_group(group, prev))
    return Raw(" · ".join(out))


def _claim_group(labels: list[str], key: tuple) -> str:
    mark, archs = key
    text = ", ".join(md_escape(x) for x in labels if x)
    where = f" <small>({', '.join(md_escape(a) for a in archs)})</small>" if archs else ""
    return f"{text} {mark}{where}".strip() if text else f"{mark}{where}"


def items(xs: list[PG.Item], sep: str = " · ") -> Raw:
    """A capability-summary cell: entries with their mark, consecutive ones with the same mark, scope and reason
    grouped; the scope in small print, the reason as a link to the page's reason list."""
    if not xs:
        return Raw("–")
    out: list[str] = []
    group: list[str] = []
    prev: tuple | None = None
    for x in [*xs, None]:
        k = None if x is None else (x.mark, x.where, x.reason)
        if prev is not None and k != prev:
            mark, where, reason = prev
            text = ", ".join(md_escape(g) for g in group if g)
            bits = [b for b in (text, mark) if b]
            if where:
                bits.append(f"<small>({md_escape(where)})</small>")
            if reason:
                bits.append(f"[{reason}](#{reason})")
            out.append(" ".join(bits))
            group = []
        if x is not None:
            group.append(x.label)
        prev = k
    return Raw(sep.join(out))


_LATENCY_RE = re.compile(r"\blatency (\d+(?:\.\d+)?(?:e[-+]?\d+)?) ms")


def page_latencies(texts: Iterable[str]) -> list[str]:
    """The engine's explanations with each `latency X ms` to 2 significant figures, for pages: reruns vary by about
    ±10%, so further digits are noise to a reader (the selector's explain and the JSON keep the recorded value)."""
    return [_LATENCY_RE.sub(lambda mo: f"latency {PF.sig2(float(mo.group(1)))} ms", str(t)) for t in texts]


def arch_links(cs: list[SM.Claim], prefix: str) -> Raw:
    return Raw(", ".join(f"[{md_escape(capability_label(c.label))}]({prefix}{md_escape(c.label)}.md) {c.mark}"
                         for c in cs) or T.UNSUPPORTED_MARK)


def cite(sources: Iterable[str], sep: str = "; ") -> Raw:
    """Source strings as Markdown, each a link where it names an address (generator.links)."""
    out = []
    for src in sources:
        url = L.source_url(src)
        out.append(f"[{md_escape(src)}]({url})" if url else md_escape(src))
    return Raw(sep.join(out))


# --- environments ---------------------------------------------------------------------------------

def _env(finalize, *template_dirs: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in (*template_dirs, TEMPLATES)]), autoescape=False,
        trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, undefined=jinja2.StrictUndefined, finalize=finalize,
    )
    env.filters.update(comment=py_comment, hcomment=html_comment, md=md_escape, md_join=md_join, code=md_code,
                       claims=claims, items=items, latencies=page_latencies, arch_links=arch_links,
                       capability=capability_label, raw=Raw, py=py_block, tuple=tuple, cite=cite)
    env.globals.update(zip=zip)
    return env


PY_ENV = _env(pylit)
MD_ENV = _env(md_escape)


def markdown_env(*template_dirs: Path) -> jinja2.Environment:
    """The Markdown environment (escaping, filters, the shared `_header`/`_note` includes) over more template
    folders: an engine's pages (attnmatrix/engines/<engine>/templates) render with it."""
    return _env(md_escape, *template_dirs)


def python_env(*template_dirs: Path) -> jinja2.Environment:
    """The Python environment (values written with `pylit`) over more template folders: an engine's generated
    module (attnmatrix/engines/<engine>/templates) renders with it."""
    return _env(pylit, *template_dirs)


# --- header / meta --------------------------------------------------------------------------------

def header(m: ResolvedMatrix, meta: dict) -> dict:
    """The generated files' header data: matrix id, kernel versions, input files."""
    if not meta.get("matrix_id"):
        raise ValueError("meta: matrix_id is required")
    kv = meta.get("kernel_versions") or {}
    versions = [(str(b), [str(v) for v in sorted(kv[b], key=lambda v: (policy.version_key(str(v)), str(v)))])
                for b in sorted(kv)]
    return {"matrix_id": str(meta["matrix_id"]), "source_digest": meta.get("source_digest"),
            "kernel_versions": versions,
            "files": sorted(str(f) for f in meta.get("files") or [])}


SELECTOR_BLOCK_KEYS = ("backends", "default_rank", "declared_rankings", "rules", "measured", "workloads")


def render_selector(m: ResolvedMatrix, meta: dict) -> str:
    """The selector module: the engine's data for `m` (GPU archs), written out one rule or class a line."""
    data = C.engine_data(m)
    signature = ", ".join(["capability", "head_size", "head_size_v=None", "*", 'op="prefill"', 'dtype="bfloat16"',
                           *(f"{k}={v!r}" for k, v in QUERY_PARAMS.items())])
    return PY_ENV.get_template("selector.py.j2").render(
        h=header(m, meta), t=data, scalar_keys=[k for k in data if k not in SELECTOR_BLOCK_KEYS],
        select_signature=textwrap.wrap(f"- select_backends({signature})", 110, subsequent_indent="  "),
        labels={b: str(m.backends.get(b, {}).get("label", b)) for b in data["rules"]},
    )


def render_docs(m: ResolvedMatrix, meta: dict) -> dict[str, str]:
    h = header(m, meta)
    out: dict[str, str] = {}
    kv = dict(h["kernel_versions"])
    presets = Q.load_presets(meta.get("models"))
    layers = DT.decision_layers(presets)
    pages = PG.arch_pages(m, layers)
    plots = P.plot_index(m)
    out[SUPPORT_MATRIX_PATH] = MD_ENV.get_template("support-matrix.md.j2").render(
        h=h, rows=SM.backend_rows(m, kv), measured=[p.arch for p in pages if p.fastest], marks=T.TIER_MARK,
        unsupported=T.UNSUPPORTED_MARK, unknown=T.UNKNOWN_MARK, policy_doc=(policy.__doc__ or "").strip(),
        feature_columns=[c for c, _ in SM.FEATURE_COLUMNS], archs=[p.arch for p in pages],
        plots=list(plots.values()), panels=P.PANELS,
    )
    arch_tpl = MD_ENV.get_template("arch.md.j2")
    cov = {c.arch: c for c in PG.coverage(m)}
    out[COVERAGE_SNIPPET_PATH] = MD_ENV.get_template("coverage.md.j2").render(h=h, rows=list(cov.values()),
                                                                               prefix="")
    for page in pages:
        out[f"{ARCH_PAGE_DIR}/{page.arch}.md"] = arch_tpl.render(
            h=h, page=page, marks=T.TIER_MARK, unsupported=T.UNSUPPORTED_MARK, unknown=T.UNKNOWN_MARK,
            plot=plots.get(page.arch), panels=P.PANELS, cov=cov.get(page.arch), presets=bool(presets))
    out.update(CD.cells_files(m))
    queries = Q.query_files(m, DT.decision_queries(m, layers) + Q.preset_queries(m, presets), presets)
    out.update(queries)
    out[QUERY_PAGE_PATH] = MD_ENV.get_template("query.md.j2").render(
        h=h, archs=[a for a in {p.split("/")[-1].split("-")[0] for p in queries} if a != "index.json"],
        total=sum(len(json.loads(t).get("answers", {})) for t in queries.values()))
    out[DATA_PAGE_PATH] = MD_ENV.get_template("data.md.j2").render(
        h=h, columns=[(c, *CD.COLUMN_DOCS[c]) for c in CD.CELL_COLUMNS], timing_columns=CD.TIMING_COLUMNS,
        schema=CD.CELLS_SCHEMA, files=sorted(p.removeprefix("site/") for p in out if p.startswith(CD.CELLS_DIR)))
    out[MLA_PREFILL_PATH] = MD_ENV.get_template("mla-prefill.md.j2").render(h=h, archs=T.mla_tables(m, Q.mla_models(
        presets) if presets else None))
    out[FA_VERSION_PATH] = MD_ENV.get_template("fa-version.md.j2").render(
        h=h, archs=T.fa_tables(m), common=T.FA_COMMON_HEAD_SIZES)
    out[CHANGELOG_PATH] = render_changelog(m, meta)
    return out


# --- changelog ------------------------------------------------------------------------------------

CHANGE_KINDS = (  # diff_matrices' kinds, in page order, with what they mean
    ("gained", "Gained support", "supported now; unsupported or unknown before"),
    ("lost", "Lost support", "supported before; unsupported or unknown now"),
    ("status", "Other status changes", "between unsupported and unknown"),
    ("tier", "Evidence tier changed", "same status, decided by evidence of another tier"),
    ("faster", "Faster", "measured latency down by more than the threshold"),
    ("slower", "Slower", "measured latency up by more than the threshold"),
    ("added", "New cells", "evidence for a cell the previous matrix had none for"),
    ("removed", "Removed cells", "the previous matrix had evidence for the cell, this one has none"),
)
CHANGELOG_SPEED_THRESHOLD = 0.10  # as `attnmatrix diff`'s default
CHANGELOG_MAX_ROWS = 300  # per kind; the rest are counted, `attnmatrix diff` lists them all


def _previous(meta: dict) -> dict | None:
    """meta["previous"], checked: {"matrix_id": str, "matrix": ResolvedMatrix, "source": optional str}."""
    prev = meta.get("previous")
    if prev is None:
        return None
    if not isinstance(prev, dict) or not isinstance(prev.get("matrix"), ResolvedMatrix) \
            or not prev.get("matrix_id"):
        raise ValueError("meta: previous must be {'matrix_id': str, 'matrix': ResolvedMatrix, 'source': str}")
    return {"matrix_id": str(prev["matrix_id"]), "matrix": prev["matrix"], "source": str(prev.get("source") or "")}


def render_changelog(m: ResolvedMatrix, meta: dict) -> str:
    """The changelog page: diff_matrices(previous, current) when meta["previous"] is given, else a page that
    names the current matrix and says no previous version is recorded."""
    from attnmatrix.matrix.diff import diff_matrices

    h = header(m, meta)
    prev = _previous(meta)
    ctx: dict = {"h": h, "prev": prev, "kinds": CHANGE_KINDS, "threshold": CHANGELOG_SPEED_THRESHOLD,
                 "max_rows": CHANGELOG_MAX_ROWS}
    if prev is not None:
        def public(key: str) -> bool:
            b = key.split("/")[1] if key.count("/") >= 1 else ""
            return not (T.is_test_only(m, b) or T.is_test_only(prev["matrix"], b))

        changes = [c for c in diff_matrices(prev["matrix"], m, speed_threshold=CHANGELOG_SPEED_THRESHOLD)
                   if public(c.key)]
        by_kind = {k: sorted((c for c in changes if c.kind == k), key=lambda c: c.key) for k, _, _ in CHANGE_KINDS}
        per_backend: dict[tuple[str, str], dict[str, int]] = {}
        for c in changes:
            arch, backend = (c.key.split("/") + ["", ""])[:2]
            per_backend.setdefault((arch, backend), {})
            per_backend[(arch, backend)][c.kind] = per_backend[(arch, backend)].get(c.kind, 0) + 1
        present = [(k, title) for k, title, _ in CHANGE_KINDS if by_kind[k]]
        ctx.update(changes=changes, by_kind=by_kind, present=present, per_backend=[
            (a, b, [counts.get(k, 0) for k, _ in present])
            for (a, b), counts in sorted(per_backend.items(), key=lambda kv: (policy.arch_sort_key(kv[0][0]), kv[0]))])
    return MD_ENV.get_template("changelog.md.j2").render(**ctx)


def render_all(m: ResolvedMatrix, meta: dict) -> dict[str, str]:
    """Every generated file: {repo-relative path: text}. Byte-identical for the same input."""
    header_text = MD_ENV.get_template("_header.md.j2").render(h=header(m, meta))
    out = {SELECTOR_PATH: render_selector(m, meta), **render_docs(m, meta), **P.render_plots(m, header_text)}
    return dict(sorted(out.items()))
