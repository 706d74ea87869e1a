"""Snapshots of a published matrix, so the next one can say what changed (the docs' changelog).

A snapshot keeps, per resolved cell, what `diff.diff_matrices` compares: status, outcome, tier and
latency. It is one JSON Lines file: a header with the matrix id, then one line per cell, sorted,
so the same matrix always gives the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

from .cases import Case
from .evidence import DATA_DIR
from .policy import ResolvedCell, ResolvedMatrix
from .records import Record, Timing
from .storage import InputError, Problem

SNAPSHOT_FILE = DATA_DIR / "history" / "previous.jsonl"


def dump_snapshot(m: ResolvedMatrix, matrix_id: str) -> str:
    lines = [json.dumps({"schema": 1, "matrix_id": matrix_id, "cells": len(m.cells)}, sort_keys=True)]
    for c in sorted(m.cells.values(), key=lambda c: c.case):
        lines.append(json.dumps({"case": c.case.to_dict(), "status": c.status, "outcome": c.outcome, "tier": c.tier,
                                 "latency_ms": c.latency_ms}, sort_keys=True))
    return "\n".join(lines) + "\n"


def load_snapshot(path: Path, backends: dict[str, dict]) -> tuple[str, ResolvedMatrix]:
    """(matrix id, the snapshot as a ResolvedMatrix with just enough of each cell for a diff)."""
    line_no: int | None = 1
    try:
        head, *rows = path.read_text(encoding="utf-8").splitlines()
        matrix_id = json.loads(head)["matrix_id"]
        cells = {}
        for line_no, line in enumerate(rows, start=2):  # noqa: B007 - read by the error below
            d = json.loads(line)
            case = Case.from_dict(d["case"])
            timing = (Timing("snapshot", d["latency_ms"]),) if d.get("latency_ms") else ()
            winner = None if d["tier"] is None else Record(case, d["outcome"], d["tier"], timings=timing)
            cells[case.cell] = ResolvedCell(case, d["status"], d["outcome"], d["tier"], None, winner,
                                            timed_by=winner if timing else None)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError([Problem(str(path), line_no, "(snapshot)", f"not a matrix snapshot: {e}")]) from e
    return matrix_id, ResolvedMatrix(cells, [], backends)
