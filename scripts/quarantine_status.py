"""What became of the quarantined cells: for each distinct cell in matrix/data/quarantine/*.jsonl, the
outcome of its probed record (tier `validated`, not a cross-compile) in matrix/data/results/, or
`no record` if none.

usage: python scripts/quarantine_status.py
Prints the counts by outcome now, then the cells whose later record is not a pass, grouped by
backend, op, head dim and features (both dtypes together).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from attnmatrix.matrix.storage import read_records

DATA = Path(__file__).resolve().parent.parent / "matrix" / "data"


def main() -> None:
    now = {rec.key: rec.outcome for path in sorted((DATA / "results").glob("*.jsonl"))
           for _, rec in read_records(path) if rec.tier == "validated"}
    quarantined = {rec.key: rec.case for path in sorted((DATA / "quarantine").glob("*.jsonl"))
                   for _, rec in read_records(path)}
    outcomes = Counter(now.get(key, "no record") for key in quarantined)
    print(f"{len(quarantined)} distinct quarantined cells; their records now: "
          + ", ".join(f"{outcome} {n}" for outcome, n in outcomes.most_common()))
    groups = Counter((now.get(key, "no record"), c.backend, c.op, f"{c.head_dim}x{c.head_dim_v}",
                      "+".join(c.features) or "none")
                     for key, c in quarantined.items() if now.get(key) != "pass")
    for (outcome, *cell), n in sorted(groups.items()):
        print(f"  {outcome:10} {' '.join(cell)}: {n}")


if __name__ == "__main__":
    main()
