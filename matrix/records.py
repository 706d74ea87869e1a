"""Result records: one outcome of one case, with the evidence behind it.

A record is one JSON object per line (JSON Lines). It is versioned (`schema`) so that readers can
refuse what they do not understand instead of guessing. Parsing collects *every* problem of a record
(field by field) rather than stopping at the first, in the spirit of xformers' `not_supported_reasons`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from attnmatrix.vocabulary import (  # noqa: F401 - re-exported: a record's fields speak the vocabulary
    OUTCOMES,
    POSITIVE_OUTCOMES,
    TIER_ORDER,
    TIERS,
    UNINFORMATIVE_OUTCOMES,
)

from .cases import Case, CaseError

SCHEMA_VERSION = 1

# Outcomes, tiers and their order are the vocabulary's (attnmatrix/vocabulary.py): `TIER_ORDER` is the one
# tier order every reader (policy, pages, the query engine) takes.
TIER_OUTCOMES = {
    "validated": {"pass", "wrong", "rejected", "crash", "timeout", "unavailable"},
    "compiled": {"compiled", "rejected", "crash", "timeout", "unavailable"},
    "shipped": {"shipped", "rejected"},
    "declared": {"pass", "rejected"},
}
PROVENANCE_REQUIRED = {
    "validated": ["device", "kernel_version", "torch", "date"],
    "compiled": ["kernel_version", "date"],
    "shipped": ["library", "kernel_version", "date"],
    "declared": ["date"],
}
PROVENANCE_STRINGS = ["device", "kernel_version", "torch", "date", "target", "declared_id"]


class RecordError(ValueError):
    """A record is malformed. `problems` lists every bad field as (field, message)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


# How a latency was measured (kernels/timing.py): GPU time from a replayed CUDA graph, or from calls
# launched back to back; wall time on a CPU. A timing without a method is from one CUDA-event pair and
# a synchronize around each call: the host's launch cost is inside it.
TIMING_METHODS = ("cuda_graph", "launches", "wall")


@dataclass(frozen=True)
class Timing:
    """One timed shape. `latency_ms` is the GPU's time per call (wall time on a CPU); `host_ms` the
    host's time for one call to return, issued back to back (its launch overhead). `tflops` counts
    only unmasked work (see kernels.flops)."""

    shape: str
    latency_ms: float
    tflops: float | None = None
    host_ms: float | None = None
    method: str | None = None

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"shape": self.shape, "latency_ms": self.latency_ms}
        if self.tflops is not None:
            d["tflops"] = self.tflops
        if self.host_ms is not None:
            d["host_ms"] = self.host_ms
        if self.method is not None:
            d["method"] = self.method
        return d


@dataclass(frozen=True)
class Record:
    case: Case
    outcome: str
    tier: str
    provenance: dict = field(default_factory=dict)
    reason: str | None = None  # the kernel's own words for a negative outcome, verbatim
    error: dict | None = None  # numerics: max_abs_err, max_rel_err, atol, rtol, nan
    timings: tuple[Timing, ...] = ()
    sources: tuple[str, ...] = ()  # citations: "repo@commit:path#Lline", "PR owner/repo#123", ...
    entry: str | None = None  # the library entry point that was called
    run_id: str | None = None
    extra: dict = field(default_factory=dict)  # backend-specific facts (compile time, cubin bytes ...)

    @property
    def key(self) -> str:
        return self.case.key

    @property
    def kernel_version(self) -> str | None:
        return self.provenance.get("kernel_version")

    @property
    def latency_ms(self) -> float | None:
        """Median over the timed shapes, so one odd shape does not decide a ranking."""
        vals = sorted(t.latency_ms for t in self.timings)
        if not vals:
            return None
        mid = len(vals) // 2
        return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2

    @property
    def tflops(self) -> float | None:
        return _median([t.tflops for t in self.timings if t.tflops is not None])

    @property
    def host_ms(self) -> float | None:
        """Median host time per call over the timed shapes that recorded it."""
        return _median([t.host_ms for t in self.timings if t.host_ms is not None])

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"schema": SCHEMA_VERSION, "case": self.case.to_dict(), "outcome": self.outcome,
                             "tier": self.tier}
        for name in ("reason", "error", "entry", "run_id"):
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        if self.timings:
            d["timings"] = [t.to_dict() for t in self.timings]
        if self.sources:
            d["sources"] = list(self.sources)
        if self.extra:
            d["extra"] = self.extra
        d["provenance"] = self.provenance
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Record:
        return parse_record(d)


def _median(vals: list[float]) -> float | None:
    vals = sorted(vals)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def _is_number(v: Any) -> bool:
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def _non_finite(d: Any) -> list[str]:
    """Paths of NaN/Infinity values: Python's json reads them, but they are not JSON and cannot be written. Every
    record is walked, so a path is named only for a container walked into or a value that is not finite."""
    if isinstance(d, float):
        return [] if math.isfinite(d) else ["(record)"]
    out, stack = [], [("", d)]
    while stack:
        path, v = stack.pop()
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, x in items:
            if isinstance(x, float):
                if not math.isfinite(x):
                    out.append(_child(path, k, v))
            elif isinstance(x, (dict, list)):
                stack.append((_child(path, k, v), x))
    return sorted(out)


def _child(path: str, key: Any, parent: dict | list) -> str:
    """The path of `parent[key]`: `a.b` under an object, `a[0]` in a list."""
    if isinstance(parent, list):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def parse_record(d: Any) -> Record:
    """Build a Record from decoded JSON, or raise RecordError listing every bad field."""
    if not isinstance(d, dict):
        raise RecordError([("(record)", f"expected a JSON object, got {type(d).__name__}")])
    problems: list[tuple[str, str]] = []
    schema = d.get("schema")
    if type(schema) is not int or schema != SCHEMA_VERSION:  # not true, not 1.0
        problems.append(("schema", f"{schema!r} is not a supported schema version (expected {SCHEMA_VERSION})"))
    case = None
    try:
        case = Case.from_dict(d.get("case"))
    except CaseError as e:
        f, _, m = str(e).partition(": ")
        problems.append((f"case.{f}" if not f.startswith("case") else f, m))
    outcome, tier = d.get("outcome"), d.get("tier")
    if outcome not in OUTCOMES:
        problems.append(("outcome", f"{outcome!r} is not one of {', '.join(OUTCOMES)}"))
    if tier not in TIERS:
        problems.append(("tier", f"{tier!r} is not one of {', '.join(TIERS)}"))
    if outcome in OUTCOMES and tier in TIERS and outcome not in TIER_OUTCOMES[tier]:
        problems.append(("outcome", f"{outcome!r} cannot come from tier {tier!r}"))
    prov = d.get("provenance")
    if not isinstance(prov, dict):
        problems.append(("provenance", "missing or not an object"))
        prov = {}
    else:
        required = PROVENANCE_REQUIRED[tier] if tier in TIERS else []
        for k in required:
            if not isinstance(prov.get(k), str) or not prov.get(k):
                problems.append((f"provenance.{k}", f"required for tier {tier!r}"))
        # The fields that identify a probe (merge keys, version comparisons) must be strings when present.
        for k in PROVENANCE_STRINGS:
            if k in prov and k not in required and not isinstance(prov[k], str):
                problems.append((f"provenance.{k}", f"{prov[k]!r} is not a string"))
    reason = d.get("reason")
    if reason is not None and not isinstance(reason, str):
        problems.append(("reason", "must be a string"))
    if outcome in OUTCOMES and outcome not in POSITIVE_OUTCOMES and not reason:
        problems.append(("reason", f"a {outcome!r} outcome must say why (the kernel's own words)"))
    error = d.get("error")
    if error is not None and not isinstance(error, dict):
        problems.append(("error", "must be an object"))
    timings: list[Timing] = []
    raw_t = d.get("timings", [])
    if not isinstance(raw_t, list):
        problems.append(("timings", "must be a list"))
        raw_t = []
    for i, t in enumerate(raw_t):
        if not isinstance(t, dict) or not isinstance(t.get("shape"), str):
            problems.append((f"timings[{i}].shape", "missing or not a string"))
            continue
        lat, tf = t.get("latency_ms"), t.get("tflops")
        if not _is_number(lat) or lat <= 0:
            problems.append((f"timings[{i}].latency_ms", f"{lat!r} is not a positive number"))
            continue
        if tf is not None and (not _is_number(tf) or tf < 0):
            problems.append((f"timings[{i}].tflops", f"{tf!r} is not a non-negative number"))
            continue
        host, method = t.get("host_ms"), t.get("method")
        if host is not None and (not _is_number(host) or host < 0):
            problems.append((f"timings[{i}].host_ms", f"{host!r} is not a non-negative number"))
            continue
        if method is not None and method not in TIMING_METHODS:
            problems.append((f"timings[{i}].method", f"{method!r} is not one of {', '.join(TIMING_METHODS)}"))
            continue
        timings.append(Timing(t["shape"], float(lat), None if tf is None else float(tf),
                              None if host is None else float(host), method))
    if timings and outcome != "pass":
        problems.append(("timings", f"only a 'pass' can be timed, this record is {outcome!r}"))
    sources = d.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) and s for s in sources):
        problems.append(("sources", "must be a list of non-empty strings"))
        sources = []
    if tier in ("declared", "shipped") and not sources:
        problems.append(("sources", f"a {tier} record must cite at least one source"))
    for name in ("entry", "run_id"):
        if d.get(name) is not None and not isinstance(d.get(name), str):
            problems.append((name, "must be a string"))
    extra = d.get("extra", {})
    if not isinstance(extra, dict):
        problems.append(("extra", "must be an object"))
    known = {"schema", "case", "outcome", "tier", "provenance", "reason", "error", "timings", "sources",
             "entry", "run_id", "extra"}
    for k in sorted(set(d) - known):
        # Quoted when it could not be read as a field name ("", spaces, newlines): a problem names a field.
        problems.append((k if re.fullmatch(r"[\w.-]+", k) else json.dumps(k), "unknown field"))
    named = {f for f, _ in problems}
    problems += [(path, "NaN or Infinity is not a JSON number") for path in _non_finite(d) if path not in named]
    if problems:
        raise RecordError(problems)
    assert case is not None
    return Record(case=case, outcome=outcome, tier=tier, provenance=prov, reason=reason, error=error,
                  timings=tuple(timings), sources=tuple(sources), entry=d.get("entry"), run_id=d.get("run_id"),
                  extra=extra)
