"""The resolution policy: how conflicting evidence for one cell becomes one answer.

1. A newer kernel version supersedes an older one: only evidence for the newest version of the
   kernel that has informative evidence counts (evidence without a version, e.g. a declared fact
   about every version, always counts).
2. Among what counts, the strongest tier wins, in this order:
   validated  >  declared negative  >  compiled  >  declared positive.
   Compiling is not running: a cited upstream "unsupported" outranks a successful compile.
3. Within the winning rank, a negative outcome beats a positive one (a kernel that failed anywhere
   is not safe to pick), and the disagreement is kept as a conflict.
4. `unavailable` (the package did not import) says nothing about the kernel and never wins over
   informative evidence; a cell with only such evidence is `unknown`.

Every piece of evidence is kept with the resolved cell (`evidence`, `conflicts`), so `explain`
and the docs can show what was overruled and why.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from .cases import Case
from .evidence import Evidence, Ranking, default_rank
from .records import POSITIVE_OUTCOMES, UNINFORMATIVE_OUTCOMES, Record

SUPPORTED, UNSUPPORTED, UNKNOWN = "supported", "unsupported", "unknown"


def version_key(v: str | None) -> tuple:
    """Order kernel versions as PEP 440 does (4.0.0b36 < 4.0.0 < 4.0.0.post1 < 4.0.1; 1.0 == 1.0.0;
    2.11.0+cu130 == 2.11.0).

    A version PEP 440 cannot parse sorts before every parseable one, by its text, so a malformed
    version never supersedes a real one.
    """
    if not v:
        return ()
    try:
        return (1, Version(Version(v).public))  # a local tag (+cu130) is a build of the same version
    except InvalidVersion:
        return (0, v)


def is_positive(rec: Record) -> bool:
    return rec.outcome in POSITIVE_OUTCOMES


def rank(rec: Record) -> int:
    """Strength of a record's evidence; lower wins."""
    if rec.outcome in UNINFORMATIVE_OUTCOMES:
        return 9
    if rec.tier == "validated":
        return 0
    if rec.tier == "declared" and not is_positive(rec):
        return 1
    if rec.tier == "compiled":
        return 2
    return 3


def describe(rec: Record) -> str:
    """One line saying what a record claims and where it comes from."""
    p = rec.provenance
    if rec.tier == "declared":
        src = "; ".join(rec.sources)
        return f"declared {rec.outcome} ({src})"
    ver = rec.kernel_version or "?"
    lib = p.get("library", "kernel")
    where = p.get("device", "?") if rec.tier == "validated" else f"cross-compiled for {p.get('target', rec.case.arch)}"
    return f"{rec.tier} {rec.outcome} on {where} with {lib} {ver}, {p.get('date', '?')}"


def provenance_source(rec: Record) -> str:
    """The evidence line shown as a cell's source for measured or compiled records."""
    p = rec.provenance
    bits = [p.get("device", "?")]
    for k, label in (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch")):
        if p.get(k):
            bits.append(f"{label} {p[k]}")
    bits.append(f"{p.get('library', 'kernel')} {rec.kernel_version or '?'}")
    bits.append(p.get("date", "?"))
    return f"{rec.tier}: " + ", ".join(bits)


@dataclass
class ResolvedCell:
    case: Case
    status: str
    outcome: str | None
    tier: str | None
    reason: str | None
    winner: Record | None
    evidence: list[Record] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def latency_ms(self) -> float | None:
        return self.winner.latency_ms if self.winner and self.status == SUPPORTED else None

    @property
    def tflops(self) -> float | None:
        return self.winner.tflops if self.winner and self.status == SUPPORTED else None

    @property
    def kernel_version(self) -> str | None:
        return self.winner.kernel_version if self.winner else None

    @property
    def sources(self) -> list[str]:
        if self.winner is None:
            return []
        if self.winner.tier == "declared":
            return list(self.winner.sources)
        return [provenance_source(self.winner), *self.winner.sources]

    def to_json(self) -> dict:
        c = self.case
        w = self.winner
        return {
            "arch": c.arch, "backend": c.backend, "op": c.op, "dtype": c.dtype, "head_dim": c.head_dim,
            "head_dim_v": c.head_dim_v, "features": list(c.features), "status": self.status,
            "outcome": self.outcome, "tier": self.tier, "reason": self.reason,
            "error": w.error if w else None, "latency_ms": self.latency_ms, "tflops": self.tflops,
            "timings": [t.to_dict() for t in w.timings] if w and self.status == SUPPORTED else [],
            "kernel_version": self.kernel_version, "sources": self.sources, "conflicts": self.conflicts,
            "evidence": [describe(r) for r in self.evidence],
        }


def _sort_key(rec: Record) -> tuple:
    # Deterministic tie-breaks: negative first, then newest date, then run id.
    return (rank(rec), is_positive(rec), _neg_date(rec.provenance.get("date", "")), rec.run_id or "", rec.key)


def _neg_date(d: str) -> tuple:
    return tuple(-ord(ch) for ch in d)


def resolve_cell(records: Sequence[Record]) -> ResolvedCell:
    """Apply the policy to every record of one cell."""
    assert records, "a cell needs at least one record"
    case = records[0].case
    informative = [r for r in records if r.outcome not in UNINFORMATIVE_OUTCOMES]
    if not informative:
        w = sorted(records, key=_sort_key)[0]
        return ResolvedCell(case, UNKNOWN, w.outcome, w.tier, w.reason, w, list(records))
    versions = {r.kernel_version for r in informative if r.kernel_version}
    newest = max(versions, key=version_key) if versions else None
    conflicts: list[str] = []
    current = [r for r in informative if not r.kernel_version or r.kernel_version == newest]
    current.sort(key=_sort_key)
    w = current[0]
    for r in informative:
        if r not in current and is_positive(r) != is_positive(w):
            conflicts.append(f"superseded by version {newest}: {describe(r)}")
    for r in current[1:]:
        if is_positive(r) != is_positive(w):
            why = "same tier, negative wins" if rank(r) == rank(w) else "weaker evidence"
            conflicts.append(f"overruled ({why}): {describe(r)}")
    status = SUPPORTED if is_positive(w) else UNSUPPORTED
    return ResolvedCell(case, status, w.outcome, w.tier, w.reason, w, list(records), sorted(set(conflicts)))


@dataclass
class ResolvedMatrix:
    cells: dict[tuple, ResolvedCell]
    rankings: list[Ranking]
    backends: dict[str, dict]

    @property
    def archs(self) -> list[str]:
        return sorted({c.case.arch for c in self.cells.values()}, key=arch_sort_key)


def arch_sort_key(arch: str) -> tuple:
    return (0, int(arch[3:])) if arch.startswith("sm_") else (1, 0)


def resolve(ev: Evidence, *, include_test_only: bool = False) -> ResolvedMatrix:
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for r in ev.records:
        if not include_test_only and ev.backends.get(r.case.backend, {}).get("test_only"):
            continue
        groups[r.case.cell].append(r)
    cells = {k: resolve_cell(v) for k, v in groups.items()}
    return ResolvedMatrix(cells, list(ev.rankings), ev.backends)


# --- Queries: answering a feature combination from single-feature cells ------------------------

MASK_FEATURES = ("causal",)


@dataclass
class Answer:
    """What the evidence says about one backend for one query (possibly composed from several cells)."""

    backend: str
    status: str
    tier: str | None
    reasons: list[str]
    cells: list[ResolvedCell]
    latency_ms: float | None


def component_cells(m: ResolvedMatrix, arch: str, backend: str, op: str, dtype: str, head_dim: int,
                    head_dim_v: int, features: Iterable[str]) -> tuple[list[ResolvedCell], list[str]]:
    """The cells whose evidence answers a query, and the features nothing answers.

    The exact feature set wins when probed. Otherwise the query is split into its mask (causal or
    not) and one cell per extra feature, each looked up on top of the same mask, then on top of
    `causal` (where sweeps probe most features), then alone.
    """
    feats = tuple(sorted(set(features)))
    key = (arch, backend, op, dtype, head_dim, head_dim_v)
    exact = m.cells.get((*key, feats))
    if exact is not None:
        return [exact], []
    mask = tuple(f for f in feats if f in MASK_FEATURES)
    cells, missing = [], []
    base = m.cells.get((*key, mask))
    if base is not None:
        cells.append(base)
    else:  # evidence for the other mask mode must not answer this one
        missing.append("+".join(mask) or "no mask")
    for f in (f for f in feats if f not in MASK_FEATURES):
        for cand in (tuple(sorted({*mask, f})), tuple(sorted({"causal", f})), (f,)):
            cell = m.cells.get((*key, cand))
            if cell is not None:
                cells.append(cell)
                break
        else:
            missing.append(f)
    return cells, missing


TIER_ORDER = {"validated": 0, "compiled": 1, "declared": 2}


def answer(m: ResolvedMatrix, arch: str, backend: str, op: str, dtype: str, head_dim: int, head_dim_v: int,
           features: Iterable[str]) -> Answer:
    cells, missing = component_cells(m, arch, backend, op, dtype, head_dim, head_dim_v, features)
    reasons: list[str] = []
    bad = [c for c in cells if c.status == UNSUPPORTED]
    for c in bad:
        feats = "+".join(c.case.features) or "no features"
        reasons.append(f"{feats}: {c.outcome} ({c.tier}): {c.reason}")
    if bad:
        status = UNSUPPORTED
    elif missing or any(c.status == UNKNOWN for c in cells) or not cells:
        status = UNKNOWN
        reasons += [f"{f}: no evidence" for f in missing]
        reasons += [f"{'+'.join(c.case.features) or 'no features'}: unknown: {c.reason}" for c in cells
                    if c.status == UNKNOWN]
    else:
        status = SUPPORTED
    tiers = [c.tier for c in (bad or cells) if c.tier]
    tier = max(tiers, key=lambda t: TIER_ORDER[t]) if tiers and status == SUPPORTED else (
        min(tiers, key=lambda t: TIER_ORDER[t]) if tiers else None)
    lats = [c.latency_ms for c in cells]
    latency = max(lats) if status == SUPPORTED and lats and all(x is not None for x in lats) else None
    return Answer(backend, status, tier, reasons, cells, latency)


def order_backends(m: ResolvedMatrix, answers: list[Answer], arch: str, op: str, dtype: str, head_dim: int,
                   head_dim_v: int) -> list[Answer]:
    """Supported answers, fastest measured first; then declared rankings; then the documented default for `arch`
    (`default_rank` in backends.json, which may differ per capability major: evidence.default_rank)."""
    ranking = next((r for r in m.rankings if r.applies(arch, op, dtype, head_dim, head_dim_v)), None)

    def key(a: Answer) -> tuple:
        default = default_rank(m.backends, a.backend, arch)
        if a.latency_ms is not None:
            return (0, a.latency_ms, default, a.backend)
        if ranking is not None and a.backend in ranking.order:
            return (1, ranking.order.index(a.backend), default, a.backend)
        return (2, 0, default, a.backend)

    return sorted((a for a in answers if a.status == SUPPORTED), key=key)


def features_of(*, causal: bool, sliding_window: bool = False, softcap: bool = False, alibi: bool = False,
                sinks: bool = False, gqa: bool = False, varlen: bool = False, page_size: int | None = None,
                fp8: bool = False) -> tuple[str, ...]:
    """Query flags -> feature tokens, the same mapping the generated selector uses."""
    flags = {"causal": causal, "sliding_window": sliding_window, "softcap": softcap, "alibi": alibi,
             "sinks": sinks, "gqa": gqa, "varlen": varlen, "fp8": fp8}
    toks = [name for name, on in flags.items() if on]
    if page_size:
        toks.append(f"paged_kv:{page_size}")
    return tuple(sorted(toks))
