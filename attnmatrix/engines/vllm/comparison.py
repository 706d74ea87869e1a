"""vLLM's choice next to attnmatrix's, for every cell the matrix has evidence for, and the selection regret.

Plain tables for `site/vllm-comparison.md` (rendered by `render_page` with this folder's template), built from a
ResolvedMatrix (through the generator's query seam `generator.tables`, i.e. the query engine) and from a pinned
vLLM release's own answers (the committed answers file that `attnmatrix vllm-answers` writes by running the
release's selection code, read through `names.vllm_choice`).
Nothing is hard-coded about the evidence or about vLLM: regenerate after new results or new answers and the
page follows.

- A *compared cell* is one (arch, op, dtype, head dims, feature set) key that has a resolved cell on a GPU
  arch. For prefill and decode the decision compared is the FlashAttention version (vLLM's
  `get_flash_attn_version` against attnmatrix's first FlashAttention backend for that exact query); for
  mla_prefill it is the MLA prefill backend (vLLM's `get_mla_prefill_backend` against attnmatrix's first
  backend with a vLLM MLA prefill name). A cell is *covered* when the evidence says something about the
  decision: attnmatrix has a supported candidate, or vLLM's pick has evidence (supported or not) there.
- *Regret* of a choice on a *measured cell* (at least two validated, timed backends for that exact query):
  latency(choice) / latency(fastest validated backend, any backend). attnmatrix's choice is
  `select_backends(...)[0]`, which orders by measured latency, so its regret is 1.00 by construction (the
  tests check it); vLLM's is computed where its pick is measured and counted otherwise.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from attnmatrix.generator import page_format as PF
from attnmatrix.generator import render as R
from attnmatrix.generator import tables as T
from attnmatrix.matrix.cases import OPS, feature_name
from attnmatrix.matrix.policy import SUPPORTED, UNKNOWN, UNSUPPORTED, ResolvedMatrix, arch_sort_key

from . import answers as O
from . import names as V

FA_DECISION, MLA_DECISION = "FlashAttention version", "MLA prefill backend"
# Why attnmatrix and vLLM disagree, in page order: (kind, column header, what it means).
# Rerun noise: a latency measured twice differs by up to this ratio in 95% of cells (p95 of the ratios of 200 sm_90
# cells timed in two runs, benchmarks/results/rerun_variance.json `latency_ratio.p95`; a test keeps the two equal).
# A measured pick slower than attnmatrix's by no more than this is a tie, not a disagreement.
RERUN_NOISE = 1.162
KINDS = (
    ("slower", "vLLM's pick slower",
     f"both measured, vLLM's pick slower by more than the rerun noise (×{RERUN_NOISE})"),
    ("unmeasured", "vLLM's pick unmeasured", "vLLM's pick supported but unmeasured, attnmatrix's measured"),
    ("unsupported", "vLLM's pick unsupported", "vLLM's pick is unsupported by the evidence"),
    ("no_evidence", "no evidence for vLLM's pick", "no evidence for vLLM's pick here"),
    ("vllm_none", "vLLM has no choice", "vLLM has no (probed) choice"),
    ("by_rank", "neither measured",
     "neither measured: attnmatrix orders by declared ranking or the arch's default rank"),
)
# Differences that are not disagreements about this decision: (kind, column header, what it means).
NOT_DISAGREEMENTS = (
    ("routed", "vLLM routes elsewhere",
     "vLLM's attention backend choice is not FLASH_ATTN here (its priority list and validate_configuration pick "
     "FLASHINFER, TRITON_ATTN, ...): the FlashAttention version is not what vLLM runs"),
    ("tie", "within noise", f"both measured, the two picks within the rerun noise (×{RERUN_NOISE}) of each other"),
)
REAL = tuple(k for k, _, _ in KINDS)


@dataclass(frozen=True)
class Pick:
    """One backend's standing on one query."""

    backend: str | None
    status: str  # supported / unsupported / unknown; "none" when there is no backend
    tier: str | None
    latency_ms: float | None
    tflops: float | None  # only where the exact cell answers (a composed answer has no one FLOP count)
    reason: str  # why not supported, or how it was ordered when supported

    @property
    def measured(self) -> bool:
        return self.status == SUPPORTED and self.latency_ms is not None


NO_PICK = Pick(None, "none", None, None, None, "")


@dataclass(frozen=True)
class Comparison:
    query: T.Query  # the cell compared: arch, op, dtype, head dims, features
    decision: str
    vllm: V.VllmChoice
    vllm_pick: Pick
    amx_pick: Pick  # attnmatrix's first candidate of the same family (FlashAttention / vLLM MLA-named)
    first: Pick  # attnmatrix's first choice overall (select_backends(...)[0])
    fastest: Pick | None  # the fastest validated, timed backend, if any
    n_timed: int  # validated, timed backends for this exact query
    covered: bool

    @property
    def agree(self) -> bool:
        return self.vllm.backend is not None and self.vllm.backend == self.amx_pick.backend

    @property
    def measured(self) -> bool:
        return self.n_timed >= 2

    @property
    def kind(self) -> str | None:
        """Why they disagree (a KINDS key), None when they agree."""
        if self.agree:
            return None
        vp, ap = self.vllm_pick, self.amx_pick
        if self.vllm.routed:
            return "routed"
        if self.vllm.backend is None:
            return "vllm_none"
        if vp.status == UNSUPPORTED:
            return "unsupported"
        if vp.status != SUPPORTED:
            return "no_evidence"
        if vp.measured and ap.measured:
            return "slower" if vp.latency_ms > ap.latency_ms * RERUN_NOISE else "tie"
        if ap.measured:
            return "unmeasured"
        return "by_rank"

    @property
    def label(self) -> str:
        q = self.query
        dims = T._dims_label(q.head_dim, q.head_dim_v)
        return f"{q.op} {q.dtype} {dims} {T.feature_string(q.features) or 'no features'}"

    def regret(self, p: Pick) -> float | None:
        if self.fastest is None or not self.measured or not p.measured or p.tier != "validated":
            return None
        return p.latency_ms / self.fastest.latency_ms


def _pick(m: ResolvedMatrix, q: T.Query, a: T.Answer | None, backend: str | None) -> Pick:
    if backend is None:
        return NO_PICK
    if a is None:  # the backend has no evidence at all on this arch
        return Pick(backend, UNKNOWN, None, None, None, f"no evidence for {backend} on {q.arch}")
    tflops = None
    if a.status == SUPPORTED and len(a.cells) == 1 and a.cells[0].case.features == q.features:
        tflops = a.cells[0].tflops
    if a.status == SUPPORTED:
        reason = T.order_basis(m, q, a)
    else:
        reason = "; ".join(a.reasons) or a.status
    return Pick(backend, a.status, a.tier, a.latency_ms if a.status == SUPPORTED else None, tflops, reason)


def _query_keys(m: ResolvedMatrix) -> list[T.Query]:
    archs = set(T.selector_archs(m))
    # vLLM asks MLA prefill per (qk_nope, qk_rope, v) triple: a `qk_rope:<n>` cell is its own question. MLA
    # cells without a rope split (kernels probed by (qk, v) totals) answer no vLLM question and are left out.
    keys = {(c.case.arch, c.case.op, c.case.dtype, c.case.head_dim, c.case.head_dim_v, c.case.features)
            for c in T.public_cells(m) if c.case.arch in archs
            and (c.case.op != "mla_prefill" or c.case.has("qk_rope"))}
    return [T.Query(*k) for k in sorted(keys, key=lambda k: (arch_sort_key(k[0]), OPS.index(k[1]), k[2],
                                                               k[3] != k[4], k[3], k[4], len(k[5]), k[5]))]


def compare_cell(m: ResolvedMatrix, q: T.Query, vllm_answers: O.Answers) -> Comparison:
    ordered, answers = T.query(m, q)
    by_backend = {a.backend: a for a in answers}
    if q.op == "mla_prefill":
        decision, family = MLA_DECISION, set(T.mla_names(m))
    else:
        decision, family = FA_DECISION, set(T.fa_versions(m))
    vc = V.vllm_choice(vllm_answers, q.arch, q.op, q.dtype, q.head_dim, q.head_dim_v, q.features,
                       V.VllmNames.from_backends(m.backends))
    vq = q
    if vc.pads_v:
        # vLLM pads V up to the QK head size for FA2: the call is then FA2's ordinary varlen prefill at
        # (head_dim, head_dim), so that cell's evidence answers it.
        vq = T.Query(q.arch, "prefill", q.dtype, q.head_dim, q.head_dim,
                     tuple(t for t in q.features if feature_name(t) != "qk_rope"))
    if vc.backend is None:
        vp = NO_PICK
    elif vq is q:
        vp = _pick(m, q, by_backend.get(vc.backend), vc.backend)
    else:
        a = T.answer(m, vq, vc.backend)
        vp = _pick(m, vq, a, vc.backend)
    amx = next((a for a in ordered if a.backend in family), None)
    amx_pick = _pick(m, q, amx, amx.backend) if amx else NO_PICK
    first = _pick(m, q, ordered[0], ordered[0].backend) if ordered else NO_PICK
    timed = [a for a in ordered if a.latency_ms is not None and a.tier == "validated"]
    fastest_a = min(timed, key=lambda a: (a.latency_ms, a.backend)) if timed else None
    fastest = _pick(m, q, fastest_a, fastest_a.backend) if fastest_a else None
    # vLLM's own answer routing the cell away from FlashAttention says something about the decision too
    covered = amx_pick.backend is not None or vp.status in (SUPPORTED, UNSUPPORTED) or vc.routed
    return Comparison(q, decision, vc, vp, amx_pick, first, fastest, len(timed), covered)


def comparisons(m: ResolvedMatrix, answers: O.Answers | None = None) -> list[Comparison]:
    """One Comparison per (GPU arch, op, dtype, dims, features) key with a resolved cell, in page order.
    `answers`: vLLM's recorded answers (default: the pinned release's committed file)."""
    answers = answers or V.default_answers()
    return [compare_cell(m, q, answers) for q in _query_keys(m)]


# --- presentation helpers ---------------------------------------------------------------------------

def fmt_ms(ms: float | None) -> str:
    """A latency as every page writes one: ms, 2 significant figures (reruns vary by about ±10%)."""
    return "–" if ms is None else f"{PF.sig2(ms)} ms"


def fmt_tflops(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} TFLOP/s"


def fmt_ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _standing(p: Pick) -> str:
    if p.backend is None:
        return "none"
    if p.status == UNSUPPORTED:
        return f"unsupported ({p.tier})" if p.tier else "unsupported"
    if p.status != SUPPORTED:
        return "no evidence"
    return f"{p.tier}, measured" if p.latency_ms is not None else f"{p.tier}, unmeasured"


def why(c: Comparison) -> str:
    """One sentence (or three) saying why attnmatrix and vLLM differ on a cell."""
    vp, ap, parts = c.vllm_pick, c.amx_pick, []
    if c.vllm.backend is None:
        if c.vllm.label == "none":
            parts.append(f"vLLM's rules give no choice here ({c.vllm.why})")
        else:
            parts.append(f"vLLM picks {c.vllm.label}, which attnmatrix does not probe ({c.vllm.why})")
    else:
        padded = f" at {c.query.head_dim}×{c.query.head_dim} (V padded)" if c.vllm.pads_v else ""
        head = f"vLLM picks {vp.backend}{padded} ({c.vllm.why})"
        if vp.status == UNSUPPORTED:
            parts.append(f"{head}, but the evidence says unsupported: {vp.reason}")
        elif vp.status != SUPPORTED:
            parts.append(f"{head}, but there is no evidence for it here: {vp.reason}")
        elif vp.latency_ms is None:
            parts.append(f"{head}; it is {vp.tier} here, unmeasured")
        else:
            parts.append(f"{head}; measured {fmt_ms(vp.latency_ms)}")
    if ap.backend is None:
        parts.append(f"attnmatrix has no supported {c.decision} candidate here")
    elif ap.measured:
        parts.append(f"attnmatrix picks {ap.backend}, measured {fmt_ms(ap.latency_ms)}")
    else:
        parts.append(f"attnmatrix picks {ap.backend} ({ap.tier}, {ap.reason})")
    f = c.fastest
    if f is not None and f.backend not in (ap.backend, vp.backend):
        parts.append(f"fastest validated here: {f.backend} at {fmt_ms(f.latency_ms)}")
    return "; ".join(parts)


@dataclass
class DisagreementRow:
    cell: str
    vllm: str
    amx: str
    vllm_numbers: str
    amx_numbers: str
    ratio: str
    tiers: str
    why: str


def _numbers(p: Pick) -> str:
    if not p.measured:
        return "–"
    return f"{fmt_ms(p.latency_ms)} · {fmt_tflops(p.tflops)}"


# Rows the page lists per (arch, kind) group: the counts cover every cell, `attnmatrix explain` any other cell.
DISAGREEMENT_ROWS = 8


def disagreement_row(c: Comparison) -> DisagreementRow:
    vp, ap = c.vllm_pick, c.amx_pick
    ratio = vp.latency_ms / ap.latency_ms if vp.measured and ap.measured else None
    return DisagreementRow(
        cell=c.label, vllm=c.vllm.label if vp.backend is None else f"{vp.backend} ({c.vllm.label})",
        amx=ap.backend or "none", vllm_numbers=_numbers(vp), amx_numbers=_numbers(ap), ratio=fmt_ratio(ratio),
        tiers=f"{_standing(vp)} / {_standing(ap)}", why=why(c))


@dataclass
class SummaryRow:
    arch: str
    decision: str
    compared: int
    agree: int
    routed: int  # vLLM routes the cell to another backend (not a disagreement about this decision)
    tie: int  # both measured, within the rerun noise
    disagree: int  # real disagreements: the sum of `kinds`
    kinds: list[int]  # per KINDS
    not_covered: int


@dataclass
class RegretRow:
    arch: str
    op: str
    cells: int  # measured cells
    amx_median: str
    amx_max: str
    vllm_measured: int
    vllm_median: str
    vllm_max: str
    vllm_unmeasured: int  # vLLM's pick supported but not timed (or not validated)
    vllm_unsupported: int
    vllm_no_evidence: int  # unknown, or vLLM has no (probed) choice
    vllm_routed: int  # vLLM's attention backend is not FLASH_ATTN


@dataclass
class ArchDisagreements:
    arch: str
    sections: list[tuple[str, list[DisagreementRow]]]  # (what the disagreement kind means, rows)


@dataclass
class ComparisonPage:
    summary: list[SummaryRow]
    regret: list[RegretRow]
    disagreements: list[ArchDisagreements]
    total_compared: int
    total_agree: int
    total_routed: int
    total_tie: int
    total_disagree: int  # real disagreements
    total_not_covered: int


def regret_rows(cs: list[Comparison]) -> list[RegretRow]:
    per: dict[tuple[str, str], list[Comparison]] = defaultdict(list)
    for c in cs:
        if c.measured:
            per[(c.query.arch, c.query.op)].append(c)
    out = []
    for (arch, op), group in sorted(per.items(), key=lambda kv: (arch_sort_key(kv[0][0]), OPS.index(kv[0][1]))):
        amx = [c.regret(c.first) for c in group]
        amx_vals = [x for x in amx if x is not None]
        vl = [c.regret(c.vllm_pick) for c in group]
        vl_vals = [x for x in vl if x is not None]
        unmeasured = sum(1 for c, r in zip(group, vl, strict=True)
                         if r is None and c.vllm_pick.status == SUPPORTED)
        unsupported = sum(1 for c in group if c.vllm_pick.status == UNSUPPORTED)
        routed = sum(1 for c in group if c.vllm.routed)
        no_ev = sum(1 for c in group if c.vllm_pick.status not in (SUPPORTED, UNSUPPORTED) and not c.vllm.routed)
        out.append(RegretRow(
            arch, op, len(group),
            fmt_ratio(statistics.median(amx_vals)) if amx_vals else "–", fmt_ratio(max(amx_vals, default=None)),
            len(vl_vals), fmt_ratio(statistics.median(vl_vals)) if vl_vals else "–",
            fmt_ratio(max(vl_vals, default=None)), unmeasured, unsupported, no_ev, routed))
    return out


def comparison_page(m: ResolvedMatrix, answers: O.Answers | None = None) -> ComparisonPage:
    cs = comparisons(m, answers)
    summary, arch_rows = [], []
    for arch in T.selector_archs(m):
        mine = [c for c in cs if c.query.arch == arch]
        for decision in (FA_DECISION, MLA_DECISION):
            d = [c for c in mine if c.decision == decision]
            if not d:
                continue
            cov = [c for c in d if c.covered]
            kinds = Counter(c.kind for c in cov if not c.agree)
            summary.append(SummaryRow(arch, decision, len(cov), sum(c.agree for c in cov), kinds["routed"],
                                      kinds["tie"], sum(kinds[k] for k in REAL), [kinds.get(k, 0) for k in REAL],
                                      len(d) - len(cov)))
        sections = []
        for kind, _, meaning in (*KINDS, *NOT_DISAGREEMENTS):
            rows = [disagreement_row(c) for c in mine if c.covered and c.kind == kind]
            if rows:
                sections.append((meaning, rows))
        if sections:
            arch_rows.append(ArchDisagreements(arch, sections))
    covered = [c for c in cs if c.covered]
    kinds = Counter(c.kind for c in covered if not c.agree)
    return ComparisonPage(summary, regret_rows(cs), arch_rows, len(covered), sum(c.agree for c in covered),
                          kinds["routed"], kinds["tie"], sum(kinds[k] for k in REAL), len(cs) - len(covered))


# --- where vLLM's answers came from, for the page ----------------------------------------------------

@dataclass
class ReleaseInfo:
    version: str
    wheel: str | None
    wheel_sha256: str | None
    files: list[tuple[str, str]]  # (path in the wheel, sha256) of every file executed
    stand_ins: list[tuple[str, str]]  # (module, what it replaces)
    answers_path: str
    n_fa: int
    n_mla: int
    n_backend: int


def release_info(answers: O.Answers, answers_path: str) -> ReleaseInfo:
    d = answers.doc
    return ReleaseInfo(d["vllm"]["version"], d["vllm"].get("wheel"), d["vllm"].get("wheel_sha256"),
                       [(f["path"], f["sha256"]) for f in d["executed_files"]],
                       [(s["module"], s["replaces"]) for s in d.get("stand_ins", [])], answers_path,
                       len(d["flash_attn_version"]), len(d["mla_prefill"]), len(d.get("attention_backend", [])))


def build_versions(m: ResolvedMatrix) -> list[tuple[str, list[str]]]:
    """vLLM's own kernel builds (backends whose library is vllm) and the vLLM releases their evidence comes from,
    as the resolved cells' winners state them: a build's evidence may be of another release than the pinned one,
    and the page must say so, not let the pinned version stand for it."""
    out = []
    for name in sorted(b for b, meta in m.backends.items() if meta.get("library") == "vllm"):
        versions = {c.kernel_version for c in m.cells.values() if c.case.backend == name and c.kernel_version}
        if versions:
            out.append((name, sorted(versions)))
    return out


def mapping_rows(m: ResolvedMatrix) -> list[tuple[str, str]]:
    """vLLM's names and the backends they run, as the matrix's backends declare them."""
    return V.VllmNames.from_backends(m.backends).rows()


def print_regret(m: ResolvedMatrix, answers: O.Answers | None = None) -> str:
    """The regret table and the agreement summary as plain text (what `benchmarks/vllm_regret.py` prints)."""
    page = comparison_page(m, answers)
    lines = [f"compared cells: {page.total_compared}, agree {page.total_agree}, vLLM routes elsewhere "
             f"{page.total_routed}, within noise {page.total_tie}, disagree {page.total_disagree}, "
             f"not covered {page.total_not_covered}",
             "arch     op           cells  amx-median amx-max  vllm-measured vllm-median vllm-max  "
             "vllm-unmeasured vllm-unsupported vllm-no-evidence vllm-routed"]
    for r in page.regret:
        lines.append(f"{r.arch:<8} {r.op:<12} {r.cells:>5}  {r.amx_median:>10} {r.amx_max:>7}  {r.vllm_measured:>13} "
                     f"{r.vllm_median:>11} {r.vllm_max:>8}  {r.vllm_unmeasured:>15} {r.vllm_unsupported:>16} "
                     f"{r.vllm_no_evidence:>16} {r.vllm_routed:>11}")
    for s in page.summary:
        kinds = ", ".join(f"{k} {n}" for (k, _, _), n in zip(KINDS, s.kinds, strict=True) if n)
        lines.append(f"{s.arch} {s.decision}: {s.compared} compared, {s.agree} agree, {s.routed} routed elsewhere, "
                     f"{s.tie} within noise, {s.disagree} disagree"
                     + (f" ({kinds})" if kinds else "") + f", {s.not_covered} not covered")
    return "\n".join(lines)



# --- the page ----------------------------------------------------------------------------------------------

PAGE_PATH = "site/vllm-comparison.md"
TEMPLATES = Path(__file__).parent / "templates"


def render_pages(m: ResolvedMatrix, meta: dict) -> dict[str, str]:
    """{PAGE_PATH: text}: vLLM's choices next to attnmatrix's, the disagreements and the selection regret.
    vLLM's recorded answers: meta["vllm_answers"] (a path; the checkout's own) or the package's."""
    answers = O.load_answers(meta["vllm_answers"]) if meta.get("vllm_answers") else V.default_answers()
    text = R.markdown_env(TEMPLATES).get_template("vllm-comparison.md.j2").render(
        h=R.header(m, meta), page=comparison_page(m, answers), kinds=KINDS, others=NOT_DISAGREEMENTS, noise=RERUN_NOISE,
        release=release_info(answers, f"matrix/data/vllm/{Path(answers.path).name}"), mapping=mapping_rows(m),
        builds=build_versions(m),
        sources=list(V.VLLM_SOURCES), max_rows=DISAGREEMENT_ROWS)
    return {PAGE_PATH: text}
