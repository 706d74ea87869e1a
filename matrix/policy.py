"""The resolution policy: how conflicting evidence for one cell becomes one answer.

1. A newer kernel version supersedes an older one: only evidence for the newest version of the
   kernel that has informative evidence counts (evidence without a version, e.g. a declared fact
   about every version, always counts).
2. Among what counts, the strongest tier wins, in this order:
   validated  >  declared negative  >  compiled = shipped  >  declared positive.
   Compiling is not running: a cited upstream "unsupported" outranks a successful compile. A
   shipped binary (a prebuilt kernel for that exact arch and configuration, listed in the library's
   own kernel table) is as strong as a compile and no stronger: it was built, never run here.
3. Within the winning rank, a negative outcome beats a positive one (a kernel that failed anywhere
   is not safe to pick), and the disagreement is kept as a conflict.
4. `unavailable` (the package did not import) says nothing about the kernel and never wins over
   informative evidence; a cell with only such evidence is `unknown`.
5. Call profiles: where a cell has evidence from the call an engine makes (records with `extra.profile`,
   e.g. `vllm` for vLLM's own FlashAttention builds probed through vLLM's call, kernels/base.py), evidence
   from another call of the same kernel does not decide the cell: it is kept and shown as a conflict
   ("another call"), so a cell never mixes profiles silently. A declared fact is no call: it cites the
   library's own word on the kernel and keeps its place in rule 2 beside the engine's call.
6. A supported cell's latency is its winner's timings, or where the winner timed no shape, those of
   the newest timed record with the same outcome, tier and kernel version (`timed_by`).

Every piece of evidence is kept with the resolved cell (`evidence`, `conflicts`), so `explain`
and the docs can show what was overruled and why. Querying a resolved matrix (composing a feature
combination from cells, ordering backends, explaining) is not here: it is the query engine,
`attnmatrix.selector_engine`, over the data `attnmatrix.generator.capabilities` builds from this result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from attnmatrix.vocabulary import (  # noqa: F401 - statuses and arch order re-exported for the policy's readers
    POSITIVE_OUTCOMES,
    SUPPORTED,
    UNINFORMATIVE_OUTCOMES,
    UNKNOWN,
    UNSUPPORTED,
    arch_sort_key,
)

from .cases import Case
from .evidence import Evidence, Ranking
from .records import Record


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
    if rec.tier in ("compiled", "shipped"):
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
    if rec.tier == "shipped":
        what = rec.reason if is_positive(rec) else "no matching kernel"
        return f"shipped {rec.outcome} for {p.get('target', rec.case.arch)} in {lib} {ver}: {what}"
    if rec.tier == "compiled":  # "compiled compiled on cross-compiled ..." said the tier and outcome twice
        what = "compiled" if rec.outcome == "compiled" else f"{rec.outcome} when compiled"
        return f"{what} for {p.get('target', rec.case.arch)} (not run) with {lib} {ver}, {p.get('date', '?')}"
    return f"{rec.tier} {rec.outcome} on {p.get('device', '?')} with {lib} {ver}, {p.get('date', '?')}"


def provenance_source(rec: Record) -> str:
    """The evidence line shown as a cell's source for measured or compiled records."""
    p = rec.provenance
    if rec.tier == "shipped":
        what = rec.reason if is_positive(rec) else "no matching kernel"
        return (f"shipped: {what} ({p.get('library', 'kernel')} {rec.kernel_version or '?'} kernel table, "
                f"for {p.get('target', rec.case.arch)})")
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
    # Agreeing evidence of a stronger tier for an older kernel version (superseded by version, not
    # contradicted): shown beside the winner's sources, e.g. a shipped binary under a newer declared fact.
    corroborated_by: list[Record] = field(default_factory=list)
    # The record whose timings speak for a supported cell: the winner, or where the winner could time no
    # shape (a re-check that ran out of memory beside other jobs, or timed nothing), the newest timed
    # record of the same outcome, tier and kernel version. An untimed re-check erases no measurement.
    timed_by: Record | None = None

    @property
    def latency_ms(self) -> float | None:
        return self.timed_by.latency_ms if self.timed_by and self.status == SUPPORTED else None

    @property
    def tflops(self) -> float | None:
        return self.timed_by.tflops if self.timed_by and self.status == SUPPORTED else None

    @property
    def host_ms(self) -> float | None:
        """The host's time per call beside `latency_ms` (GPU time): None for records timed before it was kept."""
        return self.timed_by.host_ms if self.timed_by and self.status == SUPPORTED else None

    @property
    def timings(self) -> tuple:
        """The timed shapes behind `latency_ms` (empty for an unsupported or unmeasured cell)."""
        return self.timed_by.timings if self.timed_by and self.status == SUPPORTED else ()

    @property
    def kernel_version(self) -> str | None:
        return self.winner.kernel_version if self.winner else None

    @property
    def sources(self) -> list[str]:
        if self.winner is None:
            return []
        also = [f"also, for an older version: {provenance_source(r)}; {'; '.join(r.sources)}"
                for r in self.corroborated_by]
        if self.winner.tier == "declared":
            return [*self.winner.sources, *also]
        return [provenance_source(self.winner), *self.winner.sources, *also]

    def to_json(self) -> dict:
        c = self.case
        w = self.winner
        return {
            "arch": c.arch, "backend": c.backend, "op": c.op, "dtype": c.dtype, "head_dim": c.head_dim,
            "head_dim_v": c.head_dim_v, "features": list(c.features), "status": self.status,
            "outcome": self.outcome, "tier": self.tier, "reason": self.reason,
            "error": w.error if w else None, "latency_ms": self.latency_ms, "host_ms": self.host_ms,
            "tflops": self.tflops,
            "timings": [t.to_dict() for t in self.timings],
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
        return ResolvedCell(case, UNKNOWN, w.outcome, w.tier, w.reason, w, sorted(records, key=_sort_key))
    conflicts: list[str] = []
    profiles = sorted({str(r.extra.get("profile")) for r in informative if r.extra and r.extra.get("profile")})
    if profiles:
        profiled = [r for r in informative if r.extra and r.extra.get("profile")]
        for r in informative:
            if r not in profiled and r.tier != "declared":
                conflicts.append(f"another call (not {'/'.join(profiles)}'s), kept, not deciding: {describe(r)}")
        informative = [r for r in informative if r in profiled or r.tier == "declared"]
    versions = {r.kernel_version for r in informative if r.kernel_version}
    newest = max(versions, key=version_key) if versions else None
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
    stronger = sorted((r for r in informative if r not in current and is_positive(r) == is_positive(w)
                       and rank(r) < rank(w)), key=_sort_key)
    # evidence in policy order, not in the order files were read: a file's name must not change an answer
    timed = next((r for r in current if r.timings and (r.outcome, r.tier) == (w.outcome, w.tier)), None)
    return ResolvedCell(case, status, w.outcome, w.tier, w.reason, w, sorted(records, key=_sort_key),
                        sorted(set(conflicts)), stronger[:1], timed if status == SUPPORTED else None)


@dataclass
class ResolvedMatrix:
    cells: dict[tuple, ResolvedCell]
    rankings: list[Ranking]
    backends: dict[str, dict]

    @property
    def archs(self) -> list[str]:
        return sorted({c.case.arch for c in self.cells.values()}, key=arch_sort_key)


def resolve(ev: Evidence, *, include_test_only: bool = False) -> ResolvedMatrix:
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for r in ev.records:
        if not include_test_only and ev.backends.get(r.case.backend, {}).get("test_only"):
            continue
        groups[r.case.cell].append(r)
    cells = {k: resolve_cell(v) for k, v in groups.items()}
    return ResolvedMatrix(cells, list(ev.rankings), ev.backends)
