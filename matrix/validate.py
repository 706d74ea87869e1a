"""Consistency checks on evidence beyond each record's schema. Every problem is reported."""

from __future__ import annotations

from collections import defaultdict

from .audit import audit
from .cases import Case
from .evidence import Evidence
from .merge import merge_records
from .storage import Problem, split_where


def validate_evidence(ev: Evidence) -> list[Problem]:
    problems: list[Problem] = []
    known = set(ev.backends)
    for rec, where in zip(ev.records, ev.where, strict=True):
        f, line = split_where(where)
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
            f, _ = split_where(items[0][1])
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


# Both dtypes of one kernel run the same template on the same shapes: their GPU times at one timing shape
# should be close. A pair further apart than this was not measured like for like (concurrent sweeps on one
# GPU, a throttled clock), unless both were re-timed together as a pair, one after the other, one sweep on
# the GPU (scripts/reprobe.py retime --dtype-pairs, whose run ids start with DTYPE_PAIR_RUN): then the
# difference is a measurement.
DTYPE_TIMING_FACTOR = 1.5
DTYPE_PAIR_RUN = "dtype-pairs"


def dtype_timing_disagreements(records, factor: float = DTYPE_TIMING_FACTOR) -> list[dict]:
    """The bfloat16/float16 pairs of one cell's newest validated timed passes whose latency at some shared timing
    shape differs by more than `factor`, unless the pair was re-timed together. One entry per pair:
    {"cell", "bfloat16", "float16" (record keys), "shape", "ratio", "runs"}."""
    newest: dict[str, object] = {}
    for rec in records:
        if rec.tier != "validated" or rec.outcome != "pass" or not rec.timings or rec.case.arch == "cpu":
            continue  # CPU wall times: float16 is emulated there, slower by design
        old = newest.get(rec.key)
        if old is None or rec.provenance.get("date", "") >= old.provenance.get("date", ""):
            newest[rec.key] = rec
    pairs: dict[tuple, dict[str, object]] = defaultdict(dict)
    for rec in newest.values():
        c = rec.case
        pairs[(c.arch, c.backend, c.op, c.head_dim, c.head_dim_v, c.features)][c.dtype] = rec
    out = []
    for cell, by in sorted(pairs.items(), key=lambda kv: str(kv[0])):
        bf, fp = by.get("bfloat16"), by.get("float16")
        if bf is None or fp is None or (bf.run_id == fp.run_id and (bf.run_id or "").startswith(DTYPE_PAIR_RUN)):
            continue
        a = {t.shape: t.latency_ms for t in bf.timings}
        b = {t.shape: t.latency_ms for t in fp.timings}
        worst = max(((max(a[s], b[s]) / min(a[s], b[s]), s) for s in a.keys() & b.keys() if min(a[s], b[s]) > 0),
                    default=None)
        if worst and worst[0] > factor:
            out.append({"cell": "/".join(map(str, cell[:5])) + "/" + ("+".join(cell[5]) or "none"),
                        "bfloat16": bf.key, "float16": fp.key, "shape": worst[1], "ratio": round(worst[0], 3),
                        "runs": [bf.run_id, fp.run_id]})
    return out
