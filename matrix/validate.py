"""Consistency checks on evidence beyond each record's schema. Every problem is reported."""

from __future__ import annotations

from collections import defaultdict

from .audit import audit
from .cases import Case
from .evidence import Evidence
from .merge import merge_records
from .storage import Problem


def _split(where: str) -> tuple[str, int | None]:
    f, _, n = where.rpartition(":")
    if f and n.isdigit():
        return f, int(n)
    return where.split("#", 1)[0], None


def validate_evidence(ev: Evidence) -> list[Problem]:
    problems: list[Problem] = []
    known = set(ev.backends)
    for rec, where in zip(ev.records, ev.where, strict=True):
        f, line = _split(where)
        if rec.case.backend not in known:
            problems.append(Problem(f, line, "case.backend",
                                    f"unknown backend {rec.case.backend!r} (known: {', '.join(sorted(known))})",
                                    rec.key))
        if rec.case.arch == "cpu" and rec.tier != "validated":
            problems.append(Problem(f, line, "tier", "cpu evidence can only be validated", rec.key))
        if rec.tier == "validated" and rec.outcome == "pass" and rec.error is None:
            problems.append(Problem(f, line, "error", "a validated pass must carry its measured error", rec.key))
    _, contradictions = merge_records(list(zip(ev.records, ev.where, strict=True)))
    problems += contradictions
    # Two declared facts about the same cell and version that disagree are a data bug, not evidence.
    declared: dict[tuple, list[tuple[str, str]]] = defaultdict(list)
    for rec, where in zip(ev.records, ev.where, strict=True):
        if rec.tier == "declared":
            declared[(rec.case.cell, rec.kernel_version)].append((rec.outcome, where))
    for (cell, ver), items in sorted(declared.items(), key=lambda kv: str(kv[0])):
        if len({o for o, _ in items}) > 1:
            f, _ = _split(items[0][1])
            facts = ", ".join(sorted({w.split("#", 1)[-1] + "=" + o for o, w in items}))
            key = Case(*cell).key
            problems.append(Problem(f, None, "facts", f"declared facts disagree for version {ver or 'any'}: {facts}",
                                    key))
    for r in ev.rankings:
        for b in r.order:
            if b not in known:
                problems.append(Problem(r.where or "declared", None, f"rankings[{r.id}].order",
                                        f"unknown backend {b!r}"))
    problems += audit(ev)
    return problems
