"""Merging result files from many machines into one evidence file.

Merging keeps every piece of evidence (resolution happens later, by policy); it only removes exact
duplicates and refuses true contradictions: two different records for the same case from the
same run cannot both be true, and picking one would silently lose data.
"""

from __future__ import annotations

from .records import Record
from .storage import Problem, dump_record


def record_identity(rec: Record) -> tuple:
    """Records with the same identity describe the same probe and must be identical."""
    p = rec.provenance
    return (rec.key, rec.tier, rec.run_id or "", p.get("device", ""), p.get("kernel_version", ""),
            p.get("declared_id", ""), p.get("target", ""))


def merge_records(located: list[tuple[Record, str]]) -> tuple[list[Record], list[Problem]]:
    """(records, problems): deduplicated records in canonical order, and every contradiction found."""
    by_id: dict[tuple, tuple[Record, str, str]] = {}
    problems: list[Problem] = []
    for rec, where in located:
        ident = record_identity(rec)
        line = dump_record(rec)
        if ident in by_id:
            prev, prev_line, prev_where = by_id[ident]
            if prev_line != line:
                f, _, n = where.rpartition(":")
                problems.append(Problem(
                    f or where, int(n) if n.isdigit() else None, "(record)",
                    f"contradicts {prev_where}: same case, run and machine but different content "
                    f"({prev.outcome} vs {rec.outcome})", rec.key))
            continue
        by_id[ident] = (rec, line, where)
    merged = [v[0] for k, v in sorted(by_id.items(), key=lambda kv: (kv[0], kv[1][1]))]
    return merged, problems
