"""Plain tables built from a ResolvedMatrix: everything the docs templates render, and nothing else.

Data flows one way: ResolvedMatrix -> these small dataclasses/dicts -> Jinja2 templates -> file
texts. Nothing here probes, imports kernels or decides support or order: every answer comes from the
query engine (`attnmatrix.selector_engine`) over the matrix's capability data (`generator.capabilities`),
the same engine and data the generated selector ships. `query`, `explain_query`, `flash_attn_version`,
`mla_prefill_priorities` and `make_query` are the seam the pages call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from attnmatrix.matrix.backends import default_rank
from attnmatrix.matrix.cases import MLA_TRIPLES, qk_rope
from attnmatrix.matrix.policy import SUPPORTED, ResolvedCell, ResolvedMatrix

from attnmatrix.selector_engine import Engine
from attnmatrix.vocabulary import TIERS, UNKNOWN, UNSUPPORTED, features_of

from .capabilities import FA_COMMON_HEAD_SIZES, engine_for, is_test_only, per_matrix, selector_archs

# Marks are plain ASCII letters, so they render in any font (emoji marks show as empty boxes in a browser
# without an emoji font); site/javascripts/marks.js turns them into coloured badges with a title.
# A tier's mark is its initial (validated -> V); the tiers are the vocabulary's.
TIER_MARK = {t: t[0].upper() for t in TIERS}
UNSUPPORTED_MARK = "X"
UNKNOWN_MARK = "?"
MARK_MEANING = {**{m: t for t, m in TIER_MARK.items()}, UNSUPPORTED_MARK: UNSUPPORTED, UNKNOWN_MARK: UNKNOWN}
if len(MARK_MEANING) != len(TIERS) + 2:
    raise AssertionError(f"tier marks must differ from each other and from X and ?: {TIER_MARK}")
# Without model presets, labels for well-known MLA (qk_nope, qk_rope, v) triples on the docs pages.
MLA_MODELS = {(128, 64, 128): "DeepSeek-V3/R1", (192, 64, 256): "GLM-5"}


# --- the shared vocabulary ----------------------------------------------------------------------

def public_cells(m: ResolvedMatrix) -> list[ResolvedCell]:
    """Every cell except those of test-only backends, in case order."""
    # A case's order is its cell key's; sorted once per matrix, every page walks them.
    return list(per_matrix(m, "public cells", lambda: tuple(sorted(
        (c for c in m.cells.values() if not is_test_only(m, c.case.backend)), key=lambda c: c.case.cell))))


def feature_string(features: Iterable[str]) -> str:
    return "+".join(features)


def backend_order_key(m: ResolvedMatrix, backend: str, arch: str | None = None) -> tuple:
    """Presentation order of backends: by default rank on `arch` (None: the "*" rank, for arch-free lists)."""
    return (default_rank(m.backends, backend, arch), backend)


# --- queries: every answer comes from the query engine (attnmatrix.selector_engine) ----------------

@dataclass(frozen=True)
class Query:
    arch: str
    op: str
    dtype: str
    head_dim: int
    head_dim_v: int
    features: tuple[str, ...]


@dataclass
class Answer:
    """The engine's answer for one backend, with its component cells as the matrix's ResolvedCells."""

    backend: str
    status: str
    tier: str | None
    reasons: list[str]
    cells: list[ResolvedCell]
    latency_ms: float | None
    basis: str  # why it sits where it does (supported answers), else ""
    marked: bool = False  # ranked on fewer timing shapes than another backend completed


def make_query(arch: str, head_size: int, head_size_v: int | None = None, *, op: str = "prefill",
               dtype: str = "bfloat16", **features: object) -> Query:
    """A query from the vocabulary's query parameters (attnmatrix.vocabulary.QUERY_PARAMS)."""
    return Query(arch, op, dtype, head_size, head_size if head_size_v is None else head_size_v,
                 features_of(**features))


def _wrap(m: ResolvedMatrix, eng: Engine, q: Query, a, ranking) -> Answer:
    cells = [m.cells[(q.arch, a.backend, q.op, q.dtype, q.head_dim, q.head_dim_v, f)] for f, _ in a.cells]
    basis = eng.basis(q.arch, a, ranking) if a.status == SUPPORTED else ""
    return Answer(a.backend, a.status, a.tier, list(a.reasons), cells, a.latency_ms, basis, a.marked)


def query(m: ResolvedMatrix, q: Query, hints: dict[str, int] | None = None) -> tuple[list[Answer], list[Answer]]:
    """(supported answers in the engine's order, every answer) for one query; `hints`: the engine's optional
    workload hints (selector_workloads.WORKLOAD_HINTS), which order by the timings at or around that shape."""
    eng = engine_for(m)
    ordered, answers, ranking = eng.query(q.arch, q.op, q.dtype, q.head_dim, q.head_dim_v, q.features, hints=hints)
    wrapped = {a.backend: _wrap(m, eng, q, a, ranking) for a in answers}
    return [wrapped[a.backend] for a in ordered], list(wrapped.values())


def answer(m: ResolvedMatrix, q: Query, backend: str) -> Answer:
    """One backend's answer for a query, whether or not the backend has evidence on that arch."""
    eng = engine_for(m)
    a = eng.answer(q.arch, backend, q.op, q.dtype, q.head_dim, q.head_dim_v, q.features)
    return _wrap(m, eng, q, a, eng.declared_ranking(q.arch, q.op, q.dtype, q.head_dim, q.head_dim_v))


def applicable_ranking(m: ResolvedMatrix, q: Query):
    """The declared ranking the engine consults for this query (the first that applies), if any."""
    return next((r for r in m.rankings if r.applies(q.arch, q.op, q.dtype, q.head_dim, q.head_dim_v)), None)


def fmt_ms(x: float) -> str:
    return f"{x:.6g} ms"


def order_basis(m: ResolvedMatrix, q: Query, a: Answer) -> str:
    """Why a supported answer sits where it does (the engine's words)."""
    return a.basis


def explain_query(m: ResolvedMatrix, q: Query, hints: dict[str, int] | None = None) -> dict[str, str]:
    """backend -> why it is in or out; supported backends first in selection order, then the rest by name."""
    return engine_for(m).explain_query(q.arch, q.op, q.dtype, q.head_dim, q.head_dim_v, q.features, hints=hints)


def fa_versions(m: ResolvedMatrix) -> dict[str, int]:
    return dict(engine_for(m).data["fa_version"])


def mla_names(m: ResolvedMatrix) -> dict[str, str]:
    """backend -> vLLM's MLA prefill name (backends without one left out)."""
    return dict(engine_for(m).data["engine_names"]["vllm"]["mla_prefill"])


def flash_attn_version(m: ResolvedMatrix, arch: str, requires_alibi: bool = False, head_size: int | None = None,
                       head_size_v: int | None = None, has_sinks: bool = False,
                       requires_local_attention: bool = False, requires_softcap: bool = False,
                       kv_cache_block_size: int | None = None) -> int | None:
    """vLLM's get_flash_attn_version, answered from evidence (the engine's flash_attn_version_for)."""
    return engine_for(m).flash_attn_version_for(arch, requires_alibi, head_size, head_size_v, has_sinks,
                                                requires_local_attention, requires_softcap, kv_cache_block_size)


def mla_prefill_priorities(m: ResolvedMatrix, arch: str, qk_nope_head_dim: int, qk_rope_head_dim: int,
                           v_head_dim: int) -> list[str]:
    return engine_for(m).mla_prefill_priorities_for(arch, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)


# --- docs tables ----------------------------------------------------------------------------------
# The arch pages, the support matrix's backend rows and the fastest-backend grids are built in
# generator.pages; the MLA and FA-version pages below are answers of the queries above.

def _dims_label(hd: int, hdv: int) -> str:
    return str(hd) if hd == hdv else f"{hd}×{hdv}"


@dataclass
class MlaEntry:
    dims: str
    model: str
    priorities: list[str]
    order: list[str]  # "backend (vLLM NAME): tier, basis"
    excluded: list[str]  # "backend: why"


def mla_triples(m: ResolvedMatrix) -> list[tuple[int, int, int]]:
    """(qk_nope, qk_rope, v) triples the MLA page answers: the case space's, and every rope split probed."""
    got = set(MLA_TRIPLES)
    for c in public_cells(m):
        rope = qk_rope(c.case.features) if c.case.op == "mla_prefill" else None
        if rope is not None:
            got.add((c.case.head_dim - rope, rope, c.case.head_dim_v))
    return sorted(got, key=lambda t: (t[0] + t[1], t[2], t[1]))


def mla_tables(m: ResolvedMatrix, models: dict[tuple[int, int, int], list[str]] | None = None
               ) -> list[tuple[str, list[MlaEntry]]]:
    """Per arch, one row per (qk_nope, qk_rope, v) triple: the one query `get_mla_prefill_backend_priorities`
    asks (causal bfloat16 mla_prefill at qk_nope + qk_rope, v, with the rope split), its vLLM names, the order
    and every excluded backend's reason, all from that same query."""
    names = mla_names(m)
    models = models if models is not None else {t: [n] for t, n in MLA_MODELS.items()}
    out = []
    for arch in selector_archs(m):
        entries = []
        for nope, rope, v in mla_triples(m):
            q = Query(arch, "mla_prefill", "bfloat16", nope + rope, v, features_of(causal=True, qk_rope=rope))
            ordered, answers = query(m, q)
            expl = explain_query(m, q)
            entries.append(MlaEntry(
                dims=f"{nope}, {rope}, {v}", model=", ".join(models.get((nope, rope, v), [])),
                priorities=mla_prefill_priorities(m, arch, nope, rope, v),
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
