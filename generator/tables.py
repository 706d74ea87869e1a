"""Plain tables built from a ResolvedMatrix: everything the templates render, and nothing else.

Data flows one way: ResolvedMatrix -> these small dataclasses/dicts -> Jinja2 templates -> file
texts. Nothing here probes, imports kernels or decides support: every answer comes from
`attnmatrix.matrix.policy` (`answer`, `order_backends`, `component_cells`, `features_of`). The
query helpers below (`query`, `explain_query`, `flash_attn_version`, `mla_prefill_priorities`) are
the reference the generated selector must agree with: the docs pages are computed from them, and the
tests compare the selector against them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attnmatrix.matrix.cases import DTYPES, FEATURES, MLA_HEAD_DIMS, OPS, feature_name
from attnmatrix.matrix.cases import page_size as case_page_size
from attnmatrix.matrix.evidence import default_rank
from attnmatrix.matrix.policy import (
    SUPPORTED,
    UNKNOWN,
    UNSUPPORTED,
    Answer,
    ResolvedCell,
    ResolvedMatrix,
    answer,
    arch_sort_key,
    features_of,
    order_backends,
)

TIERS = ("validated", "compiled", "declared")
TIER_MARK = {"validated": "✅", "compiled": "🔧", "declared": "📄"}
UNSUPPORTED_MARK = "❌"
UNKNOWN_MARK = "❔"
# Head sizes get_flash_attn_version decides over when the caller gives none (documented in the
# generated docstring): the common ones, the last one orders the candidates.
FA_COMMON_HEAD_SIZES: tuple[tuple[int, int], ...] = ((64, 64), (128, 128))
FA_BACKEND_FIELD = "fa_version"
MLA_NAME_FIELD = "mla_prefill"
# Labels for well-known MLA dims on the docs pages; presentation only.
MLA_MODELS = {(192, 128): "DeepSeek-V3/R1: qk_nope 128 + qk_rope 64, v 128",
              (256, 256): "GLM-5: qk_nope 192 + qk_rope 64, v 256"}


# --- the shared vocabulary ----------------------------------------------------------------------

def is_test_only(m: ResolvedMatrix, backend: str) -> bool:
    return bool(m.backends.get(backend, {}).get("test_only"))


@dataclass
class _View:
    cells: list[ResolvedCell]
    backends: dict[str, list[str]]


_LAST_VIEW: list = []  # [(matrix, cells dict, cell count), view]: the queries below reuse one matrix many times


def _view(m: ResolvedMatrix) -> _View:
    ident = (m, m.cells, len(m.cells))
    if _LAST_VIEW and all(x is y for x, y in zip(_LAST_VIEW[0][:2], ident[:2], strict=True)) \
            and _LAST_VIEW[0][2] == ident[2]:
        return _LAST_VIEW[1]
    cells = sorted((c for c in m.cells.values() if not is_test_only(m, c.case.backend)), key=lambda c: c.case)
    per: dict[str, set[str]] = defaultdict(set)
    for c in cells:
        per[c.case.arch].add(c.case.backend)
    view = _View(cells, {a: sorted(bs) for a, bs in per.items()})
    _LAST_VIEW[:] = [ident, view]
    return view


def public_cells(m: ResolvedMatrix) -> list[ResolvedCell]:
    """Every cell except those of test-only backends, in case order."""
    return list(_view(m).cells)


def selector_archs(m: ResolvedMatrix) -> list[str]:
    """Archs the selector knows: every GPU arch with evidence (never `cpu`)."""
    return sorted((a for a in _view(m).backends if a != "cpu"), key=arch_sort_key)


def backends_for_arch(m: ResolvedMatrix, arch: str) -> list[str]:
    """The backends a query on `arch` considers: every non-test backend with any cell there."""
    if arch == "cpu":
        return []
    return list(_view(m).backends.get(arch, []))


def feature_string(features: Iterable[str]) -> str:
    return "+".join(features)


def backend_order_key(m: ResolvedMatrix, backend: str, arch: str | None = None) -> tuple:
    """Presentation order of backends: by default rank on `arch` (None: the "*" rank, for arch-free lists)."""
    return (default_rank(m.backends, backend, arch), backend)


def tier_mark(tier: str | None) -> str:
    return TIER_MARK.get(tier or "", UNKNOWN_MARK)


def strongest(tiers: Iterable[str | None]) -> str | None:
    ts = [t for t in tiers if t in TIERS]
    return min(ts, key=TIERS.index) if ts else None


# --- queries (the reference the selector is generated to match) -------------------------------

@dataclass(frozen=True)
class Query:
    arch: str
    op: str
    dtype: str
    head_dim: int
    head_dim_v: int
    features: tuple[str, ...]


def make_query(arch: str, head_size: int, head_size_v: int | None = None, *, op: str = "prefill",
               dtype: str = "bfloat16", causal: bool = True, sliding_window: bool = False, softcap: bool = False,
               alibi: bool = False, sinks: bool = False, gqa: bool = False, varlen: bool = False,
               page_size: int | None = None, fp8: bool = False) -> Query:
    feats = features_of(causal=causal, sliding_window=sliding_window, softcap=softcap, alibi=alibi, sinks=sinks,
                        gqa=gqa, varlen=varlen, page_size=page_size, fp8=fp8)
    return Query(arch, op, dtype, head_size, head_size if head_size_v is None else head_size_v, feats)


def query(m: ResolvedMatrix, q: Query) -> tuple[list[Answer], list[Answer]]:
    """(supported answers in policy order, every answer) for one query, via policy.answer/order_backends."""
    answers = [answer(m, q.arch, b, q.op, q.dtype, q.head_dim, q.head_dim_v, q.features)
               for b in backends_for_arch(m, q.arch)]
    ordered = order_backends(m, answers, q.arch, q.op, q.dtype, q.head_dim, q.head_dim_v)
    return ordered, answers


def applicable_ranking(m: ResolvedMatrix, q: Query):
    """The declared ranking order_backends consults for this query (the first that applies), if any."""
    return next((r for r in m.rankings if r.applies(q.arch, q.op, q.dtype, q.head_dim, q.head_dim_v)), None)


def fmt_ms(x: float) -> str:
    return f"{x:.6g} ms"


def order_basis(m: ResolvedMatrix, q: Query, a: Answer) -> str:
    """Why a supported answer sits where it does: mirrors the key of policy.order_backends."""
    if a.latency_ms is not None:
        return f"latency {fmt_ms(a.latency_ms)}, by measured latency"
    r = applicable_ranking(m, q)
    if r is not None and a.backend in r.order:
        return f"unmeasured, by declared ranking {r.id} ({'; '.join(r.sources)})"
    return f"unmeasured, by default rank {default_rank(m.backends, a.backend, q.arch)}"


def _evidence(cells: Sequence[ResolvedCell]) -> str:
    return " | ".join(f"{feature_string(c.case.features) or 'no features'}: {'; '.join(c.sources) or 'no sources'}"
                      for c in cells)


def explain_answer(m: ResolvedMatrix, q: Query, a: Answer, position: int | None, n_supported: int) -> str:
    """The text `explain` gives for one backend (the selector produces exactly the same string)."""
    if a.status == SUPPORTED:
        return (f"supported (#{position} of {n_supported}, {a.tier}, {order_basis(m, q, a)}); "
                f"evidence: {_evidence(a.cells)}")
    if a.status == UNSUPPORTED:
        bad = [c for c in a.cells if c.status == UNSUPPORTED]  # answer() lists a reason per bad cell, in order
        items = [f"{r} [evidence: {'; '.join(c.sources) or 'no sources'}]" for r, c in zip(a.reasons, bad, strict=True)]
        return "unsupported: " + "; ".join(items)
    return "unknown: " + "; ".join(a.reasons)


def explain_query(m: ResolvedMatrix, q: Query) -> dict[str, str]:
    """backend -> why it is in or out; supported backends first in selection order, then the rest by name."""
    ordered, answers = query(m, q)
    out = {a.backend: explain_answer(m, q, a, i + 1, len(ordered)) for i, a in enumerate(ordered)}
    for a in sorted(answers, key=lambda a: a.backend):
        if a.backend not in out:
            out[a.backend] = explain_answer(m, q, a, None, len(ordered))
    return out


def fa_versions(m: ResolvedMatrix) -> dict[str, int]:
    return {b: int(d[FA_BACKEND_FIELD]) for b, d in sorted(m.backends.items())
            if d.get(FA_BACKEND_FIELD) is not None and not d.get("test_only")}


def mla_names(m: ResolvedMatrix) -> dict[str, str]:
    return {b: str(d[MLA_NAME_FIELD]) for b, d in sorted(m.backends.items())
            if d.get(MLA_NAME_FIELD) and not d.get("test_only")}


def flash_attn_version(m: ResolvedMatrix, arch: str, requires_alibi: bool = False, head_size: int | None = None,
                       head_size_v: int | None = None, has_sinks: bool = False,
                       requires_local_attention: bool = False) -> int | None:
    """vLLM's get_flash_attn_version, answered from evidence (see the selector's docstring)."""
    fa = fa_versions(m)
    sizes = [(head_size, head_size if head_size_v is None else head_size_v)] if head_size is not None \
        else list(FA_COMMON_HEAD_SIZES)
    per_size = []
    for hd, hdv in sizes:
        q = make_query(arch, hd, hdv, alibi=requires_alibi, sinks=has_sinks, sliding_window=requires_local_attention)
        per_size.append([fa[a.backend] for a in query(m, q)[0] if a.backend in fa])
    for v in per_size[-1]:
        if all(v in p for p in per_size):
            return v
    return None


def mla_prefill_priorities(m: ResolvedMatrix, arch: str, qk_nope_head_dim: int, qk_rope_head_dim: int,
                           v_head_dim: int) -> list[str]:
    names = mla_names(m)
    q = make_query(arch, qk_nope_head_dim + qk_rope_head_dim, v_head_dim, op="mla_prefill")
    out: list[str] = []
    for a in query(m, q)[0]:
        n = names.get(a.backend)
        if n and n not in out:
            out.append(n)
    return out


# --- the selector's tables ----------------------------------------------------------------------

ROW_TOKEN_RE = re.compile(r"[A-Za-z0-9_.:+-]+(?: [A-Za-z0-9_.:+-]+)*")


@dataclass(frozen=True)
class SelectorRow:
    """One resolved cell as the selector stores it. `reason`/`sources` index the string tables."""

    head_dim: int
    head_dim_v: int
    features: str  # "+"-joined tokens, "" for none
    status: str
    outcome: str | None
    tier: str | None
    reason: int | None
    latency_ms: float | None
    sources: int

    def as_line(self) -> str:
        """`hd hdv features status outcome tier reason latency sources`, `-` for none/empty. Only generated
        tokens (ints, enum words, feature tokens, float reprs) appear, never free text: checked here."""
        def tok(v: object) -> str:
            return "-" if v is None or v == "" else repr(v) if isinstance(v, float) else str(v)

        line = " ".join(tok(v) for v in (self.head_dim, self.head_dim_v, self.features, self.status, self.outcome,
                                         self.tier, self.reason, self.latency_ms, self.sources))
        if not ROW_TOKEN_RE.fullmatch(line) or len(line.split(" ")) != 9:
            raise ValueError(f"selector row {line!r} has a token the selector cannot parse")
        return line


@dataclass
class SelectorTables:
    archs: list[str]
    strings: list[str]  # every reason and source, sorted, deduplicated
    source_sets: list[tuple[int, ...]]  # tuples of string indices, sorted
    backends: dict[str, list[str]]  # arch -> backends considered
    rows: dict[str, dict[tuple[str, str, str], list[str]]]  # arch -> (backend, op, dtype) -> row lines
    rankings: list[tuple]
    default_rank: dict[str, dict[str, int]]  # arch -> backend -> its default rank there
    fa_version: dict[str, int]
    mla_name: dict[str, str]
    ops: list[str]
    dtypes: list[str]
    features: list[str]
    fa_common_head_sizes: list[tuple[int, int]]
    n_cells: int


def _finite(x: float | None, what: str) -> float | None:
    if x is None:
        return None
    if not math.isfinite(x):
        raise ValueError(f"{what}: {x!r} is not a finite number")
    return float(x)


def selector_tables(m: ResolvedMatrix) -> SelectorTables:
    archs = selector_archs(m)
    cells = [c for c in public_cells(m) if c.case.arch in archs]
    strings = sorted({c.reason for c in cells if c.reason is not None} | {s for c in cells for s in c.sources})
    sidx = {s: i for i, s in enumerate(strings)}
    source_sets = sorted({tuple(sidx[s] for s in c.sources) for c in cells})
    setidx = {s: i for i, s in enumerate(source_sets)}
    rows: dict[str, dict[tuple[str, str, str], list[str]]] = {a: defaultdict(list) for a in archs}
    for c in cells:  # sorted by case: arch, backend, op, dtype, dims, features
        k = c.case
        row = SelectorRow(k.head_dim, k.head_dim_v, feature_string(k.features), c.status, c.outcome, c.tier,
                          None if c.reason is None else sidx[c.reason], _finite(c.latency_ms, k.key),
                          setidx[tuple(sidx[s] for s in c.sources)])
        rows[k.arch][(k.backend, k.op, k.dtype)].append(row.as_line())
    # What the selector needs of each matrix.evidence.Ranking, in evidence order (the first that applies wins).
    rankings = [(r.id, tuple(r.archs), r.op, r.dtype, tuple(r.head_dims), tuple(r.order), tuple(r.sources))
                for r in m.rankings]
    public = sorted(b for b in m.backends if not is_test_only(m, b))
    return SelectorTables(
        archs=archs, strings=strings, source_sets=source_sets,
        backends={a: backends_for_arch(m, a) for a in archs},
        rows={a: dict(sorted(v.items())) for a, v in rows.items()},
        rankings=rankings,
        default_rank={a: {b: default_rank(m.backends, b, a) for b in public} for a in archs},
        fa_version=fa_versions(m), mla_name=mla_names(m),
        ops=list(OPS), dtypes=list(DTYPES), features=list(FEATURES),
        fa_common_head_sizes=list(FA_COMMON_HEAD_SIZES), n_cells=len(cells),
    )


# --- docs tables ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """One item of a support-matrix column (a dtype, a head size, a block size, or a whole feature)."""

    label: str
    mark: str
    archs: tuple[str, ...]  # where it holds; empty when it holds on all of the backend's archs


@dataclass
class BackendRow:
    backend: str
    label: str
    library: str
    versions: list[str]
    ops: list[str]
    dtypes: list[Claim]
    head_sizes: list[Claim]
    features: dict[str, list[Claim]]  # column -> claims grouped by mark
    block_sizes: list[Claim]
    archs: list[Claim]  # label = arch, mark = strongest tier of its supported cells


def _dims_label(hd: int, hdv: int) -> str:
    return str(hd) if hd == hdv else f"{hd}×{hdv}"


def _item_claims(cells: list[ResolvedCell], item_of, sort_key, all_archs: list[str]) -> list[Claim]:
    """Supported items (with the strongest tier of their supported cells), each with the archs where they hold
    (omitted when that is every arch the backend supports anything on)."""
    per: dict = defaultdict(lambda: defaultdict(list))
    for c in cells:
        if c.status == SUPPORTED:
            for item in item_of(c):
                per[item][c.case.arch].append(c.tier)
    out = []
    for item in sorted(per, key=sort_key):
        archs = sorted(per[item], key=arch_sort_key)
        mark = tier_mark(strongest(t for a in archs for t in per[item][a]))
        out.append(Claim(item if isinstance(item, str) else _dims_label(*item), mark,
                         () if archs == all_archs else tuple(archs)))
    return out


def _feature_claims(cells: list[ResolvedCell], feature: str, archs: list[str]) -> list[Claim]:
    """A feature column: per arch, the strongest tier of a supported cell with the feature, else ❌ if one was
    unsupported, else ❔ if only unknown; archs without any such cell are left out. Grouped by mark."""
    by_arch: dict[str, list[ResolvedCell]] = defaultdict(list)
    for c in cells:
        if any(feature_name(t) == feature for t in c.case.features):
            by_arch[c.case.arch].append(c)
    marks: dict[str, str] = {}
    for a, cs in by_arch.items():
        sup = [c.tier for c in cs if c.status == SUPPORTED]
        if sup:
            marks[a] = tier_mark(strongest(sup))
        elif any(c.status == UNSUPPORTED for c in cs):
            marks[a] = UNSUPPORTED_MARK
        else:
            marks[a] = UNKNOWN_MARK
    if not marks:
        return [Claim("", UNKNOWN_MARK, ())]
    order = [TIER_MARK[t] for t in TIERS] + [UNSUPPORTED_MARK, UNKNOWN_MARK]
    groups = []
    for mk in order:
        got = sorted((a for a, x in marks.items() if x == mk), key=arch_sort_key)
        if got:
            groups.append(Claim("", mk, tuple(got)))
    if len(groups) == 1 and set(groups[0].archs) == set(archs):
        groups = [Claim("", groups[0].mark, ())]  # the same on every arch the backend has evidence for
    return groups


FEATURE_COLUMNS = [("Sinks", "sinks"), ("Sliding window", "sliding_window"), ("Softcap", "softcap"),
                   ("ALiBi", "alibi")]


def backend_rows(m: ResolvedMatrix, kernel_versions: dict[str, list[str]]) -> list[BackendRow]:
    cells = public_cells(m)
    by_backend: dict[str, list[ResolvedCell]] = defaultdict(list)
    for c in cells:
        by_backend[c.case.backend].append(c)
    out = []
    for b in sorted(by_backend, key=lambda b: backend_order_key(m, b)):
        cs = by_backend[b]
        meta = m.backends.get(b, {})
        sup_archs = sorted({c.case.arch for c in cs if c.status == SUPPORTED}, key=arch_sort_key)
        all_archs = sorted({c.case.arch for c in cs}, key=arch_sort_key)
        versions = list(kernel_versions.get(b) or sorted({c.kernel_version for c in cs if c.kernel_version}))
        arch_claims = [Claim(a, tier_mark(strongest(c.tier for c in cs if c.case.arch == a and c.status == SUPPORTED)),
                             ()) for a in sup_archs]
        blocks = _item_claims(cs, lambda c: [str(p)] if (p := case_page_size(c.case.features)) else [], int, sup_archs)
        if not blocks:
            paged = any(case_page_size(c.case.features) for c in cs)
            blocks = [Claim("", UNSUPPORTED_MARK if paged else UNKNOWN_MARK, ())]
        out.append(BackendRow(
            backend=b, label=str(meta.get("label", b)), library=str(meta.get("library", "")), versions=versions,
            ops=[o for o in OPS if any(c.case.op == o for c in cs)],
            dtypes=_item_claims(cs, lambda c: [c.case.dtype], DTYPES.index, sup_archs),
            head_sizes=_item_claims(cs, lambda c: [(c.case.head_dim, c.case.head_dim_v)],
                                    lambda d: (d[0] != d[1], d), sup_archs),
            features={col: _feature_claims(cs, f, all_archs) for col, f in FEATURE_COLUMNS},
            block_sizes=blocks,
            archs=arch_claims,
        ))
    return out


@dataclass
class FastestGrid:
    arch: str
    columns: list[str]  # feature strings
    rows: list[tuple[str, list[str]]]  # (op dtype dims label, [cell text per column])


def fastest_grids(m: ResolvedMatrix) -> list[FastestGrid]:
    """Per arch, the fastest validated backend per (op, dtype, dims) x probed feature set, where measured."""
    out = []
    cells = public_cells(m)
    for arch in sorted({c.case.arch for c in cells}, key=arch_sort_key):
        measured = [c for c in cells if c.case.arch == arch and c.latency_ms is not None]
        if not measured:
            continue
        cols = sorted({c.case.features for c in measured}, key=lambda f: (len(f), f))
        keys = sorted({(OPS.index(c.case.op), c.case.op, c.case.dtype, c.case.head_dim, c.case.head_dim_v)
                       for c in measured}, key=lambda k: (k[0], k[2], k[3] != k[4], k[3], k[4]))
        rows = []
        for _, op, dtype, hd, hdv in keys:
            texts = []
            for f in cols:
                ordered, _ = query(m, Query(arch, op, dtype, hd, hdv, f))
                best = next((a for a in ordered if a.latency_ms is not None), None)
                texts.append(f"{best.backend} ({fmt_ms(best.latency_ms)})" if best else "–")
            rows.append((f"{op} {dtype} {_dims_label(hd, hdv)}", texts))
        out.append(FastestGrid(arch, [feature_string(f) or "none" for f in cols], rows))
    return out


@dataclass
class CellLine:
    backend: str
    op: str
    dtype: str
    dims: str
    features: str
    status: str
    tier: str
    reason: str
    max_error: str
    latency: str
    tflops: str
    sources: list[str]
    conflicts: list[str]


def _fmt_err(err: dict | None) -> str:
    if not err:
        return ""
    bits = []
    for k, label in (("max_abs_err", "abs"), ("max_rel_err", "rel")):
        v = err.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            bits.append(f"{label} {v:.3g}")
    if err.get("nan"):
        bits.append("NaN")
    return ", ".join(bits)


@dataclass
class ArchPage:
    arch: str
    title: str
    counts: list[tuple[str, int, int, int]]  # backend, supported, unsupported, unknown
    sections: list[tuple[str, str, list[CellLine]]]  # backend, label, lines


def arch_title(arch: str) -> str:
    if arch.startswith("sm_"):
        n = arch[3:]
        return f"{arch} (compute capability {n[:-1]}.{n[-1]})"
    return arch


def arch_pages(m: ResolvedMatrix) -> list[ArchPage]:
    cells = public_cells(m)
    pages = []
    for arch in sorted({c.case.arch for c in cells}, key=arch_sort_key):
        mine = [c for c in cells if c.case.arch == arch]
        backends = sorted({c.case.backend for c in mine}, key=lambda b: backend_order_key(m, b, arch))
        counts, sections = [], []
        for b in backends:
            cs = sorted((c for c in mine if c.case.backend == b),
                        key=lambda c: (OPS.index(c.case.op), c.case.dtype, c.case.head_dim != c.case.head_dim_v,
                                       c.case.head_dim, c.case.head_dim_v, len(c.case.features), c.case.features))
            counts.append((b, *(sum(c.status == s for c in cs) for s in (SUPPORTED, UNSUPPORTED, UNKNOWN))))
            lines = [CellLine(
                backend=b, op=c.case.op, dtype=c.case.dtype, dims=_dims_label(c.case.head_dim, c.case.head_dim_v),
                features=feature_string(c.case.features) or "none", status=c.status,
                tier=c.tier or "", reason=c.reason or "",
                max_error=_fmt_err(c.winner.error if c.winner else None),
                latency="" if c.latency_ms is None else f"{c.latency_ms:.4g}",
                tflops="" if c.tflops is None else f"{c.tflops:.1f}",
                sources=list(c.sources), conflicts=list(c.conflicts)) for c in cs]
            sections.append((b, str(m.backends.get(b, {}).get("label", b)), lines))
        pages.append(ArchPage(arch, arch_title(arch), counts, sections))
    return pages


@dataclass
class MlaEntry:
    dims: str
    model: str
    priorities: list[str]
    order: list[str]  # "backend (vLLM NAME): tier, basis"
    excluded: list[str]  # "backend: why"


def mla_tables(m: ResolvedMatrix) -> list[tuple[str, list[MlaEntry]]]:
    dims = sorted(set(MLA_HEAD_DIMS) | {(c.case.head_dim, c.case.head_dim_v) for c in public_cells(m)
                                         if c.case.op == "mla_prefill"})
    names = mla_names(m)
    out = []
    for arch in selector_archs(m):
        entries = []
        for hd, hdv in dims:
            q = make_query(arch, hd, hdv, op="mla_prefill")
            ordered, answers = query(m, q)
            expl = explain_query(m, q)
            pr = mla_prefill_priorities(m, arch, hd - 64, 64, hdv) if hd > 64 else []
            entries.append(MlaEntry(
                dims=f"qk {hd}, v {hdv}", model=MLA_MODELS.get((hd, hdv), ""), priorities=pr,
                order=[f"{a.backend} ({names.get(a.backend, 'no vLLM MLA prefill name')}): {a.tier}, "
                       f"{order_basis(m, q, a)}" for a in ordered],
                excluded=[f"{a.backend}: {expl[a.backend]}" for a in sorted(answers, key=lambda a: a.backend)
                          if a.status != SUPPORTED]))
        out.append((arch, entries))
    return out


@dataclass
class FaRow:
    head_size: str
    default: str
    alibi: str
    sinks: str
    local: str
    order: list[str]


def _fa_text(v: int | None) -> str:
    return "none" if v is None else f"FA{v}"


def fa_tables(m: ResolvedMatrix) -> list[tuple[str, list[FaRow]]]:
    fa = fa_versions(m)
    dims = sorted({(c.case.head_dim, c.case.head_dim_v) for c in public_cells(m)
                   if c.case.backend in fa and c.case.op == "prefill"}, key=lambda d: (d[0] != d[1], d))
    out = []
    for arch in selector_archs(m):
        rows = []
        for d in [None, *dims]:
            hd, hdv = (None, None) if d is None else d

            def v(**kw):
                return _fa_text(flash_attn_version(m, arch, head_size=hd, head_size_v=hdv, **kw))  # noqa: B023

            sizes = list(FA_COMMON_HEAD_SIZES) if d is None else [d]
            q = make_query(arch, sizes[-1][0], sizes[-1][1])
            order = [f"{a.backend}: {a.tier}, {order_basis(m, q, a)}" for a in query(m, q)[0] if a.backend in fa]
            rows.append(FaRow(
                head_size="unspecified (64 and 128)" if d is None else _dims_label(*d),
                default=v(), alibi=v(requires_alibi=True), sinks=v(has_sinks=True),
                local=v(requires_local_attention=True), order=order))
        out.append((arch, rows))
    return out
