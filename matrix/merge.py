"""Merging result files from many machines into one evidence file.

Merging keeps every piece of evidence (resolution happens later, by policy); it only removes exact
duplicates and refuses true contradictions: two different records for the same case from the
same run cannot both be true, and picking one would silently lose data.
"""

from __future__ import annotations

from .records import Record
from .storage import Problem, dump_record


def record_identity(rec: Record) -> tuple:
    """Records with the same identity describe the same probe: the same case, run, machine and kernel version
    (and, for compiles, target; for declared facts, the fact). Their substance must agree."""
    p = rec.provenance
    return (rec.key, rec.tier, rec.run_id or "", p.get("device", ""), p.get("kernel_version", ""),
            p.get("declared_id", ""), p.get("target", ""))


# What varies between two attempts at the same compile-only or declared record without saying anything different
# about the kernel: the date it was made, and how long the compiler took. Two records of one identity that differ
# only here are the same evidence, not a contradiction. (Latencies are the measurement itself: two different
# timings of one probe in one run are a contradiction.)
MEASUREMENT_FIELDS = {"provenance.date", "extra.compile_s"}


def _is_measurement(path: str) -> bool:
    return path in MEASUREMENT_FIELDS


def _flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(_flatten(v, path + "."))
        else:
            out[path] = v
    return out


def substance(rec: Record) -> dict[str, object]:
    """The record's fields (flattened: `provenance.torch`, `extra.cubin_bytes`) less its measurement fields."""
    return {k: v for k, v in _flatten(rec.to_dict()).items() if not _is_measurement(k)}


def differing_fields(a: Record, b: Record) -> list[str]:
    """The fields, measurement fields aside, in which two records differ: outcome and reason first, then by name."""
    sa, sb = substance(a), substance(b)
    return sorted((k for k in sa.keys() | sb.keys() if sa.get(k, _MISSING) != sb.get(k, _MISSING)),
                  key=lambda k: (_FIRST.get(k, len(_FIRST)), k))


_FIRST = {"outcome": 0, "reason": 1}  # named first: what a reader needs to judge the contradiction


_MISSING = object()


def _show(v: object) -> str:
    text = "(absent)" if v is _MISSING else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def merge_records(located: list[tuple[Record, str]]) -> tuple[list[Record], list[Problem]]:
    """(records, problems): deduplicated records in canonical order, and every contradiction found.

    Two records with one identity (`record_identity`) that differ only in measurement fields are one piece of
    evidence (the first is kept); a difference in any other field is a contradiction, and the problem names
    the field(s).
    """
    by_id: dict[tuple, tuple[Record, str, str]] = {}
    problems: list[Problem] = []
    for rec, where in located:
        ident = record_identity(rec)
        line = dump_record(rec)
        if ident in by_id:
            prev, prev_line, prev_where = by_id[ident]
            if prev_line != line:
                fields = differing_fields(prev, rec)
                if fields:
                    sa, sb = substance(prev), substance(rec)
                    first = fields[0]
                    what = ", ".join(fields[:5]) + (f" and {len(fields) - 5} more" if len(fields) > 5 else "")
                    f, _, n = where.rpartition(":")
                    problems.append(Problem(
                        f or where, int(n) if n.isdigit() else None, first,
                        f"contradicts {prev_where}: same case, run and machine but a different {what} "
                        f"({first}: {_show(sa.get(first, _MISSING))} vs {_show(sb.get(first, _MISSING))})", rec.key))
            continue
        by_id[ident] = (rec, line, where)
    merged = [v[0] for k, v in sorted(by_id.items(), key=lambda kv: (kv[0], kv[1][1]))]
    return merged, problems
