"""Run-to-run variation of measured latencies: the same cells measured in two runs on the same GPU.

For every cell present in both files, compares outcomes (they must agree) and, per timed shape, the
ratio of the second run's median latency to the first's. Prints the distribution and writes
benchmarks/results/rerun_variance.json.

usage: python benchmarks/rerun_variance.py FIRST.jsonl [FIRST.jsonl ...] SECOND.jsonl
(the first run's records may span several files, e.g. the committed sweep files of one arch)
default: FA2 2.8.3.post2's committed H200 records (matrix/data/results/sm_90-fa2-2.8.3.post2-h200-20261130.jsonl)
against 200 of its bf16 cells probed again later the same day on the same kind of machine
(benchmarks/results/sm_90-fa2-2.8.3.post2-h200-20261130-rerun.jsonl); writes benchmarks/results/rerun_variance.json.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from attnmatrix.matrix.records import Record
from attnmatrix.matrix.storage import read_records

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = (ROOT / "matrix/data/results/sm_90-fa2-2.8.3.post2-h200-20261130.jsonl",
           ROOT / "benchmarks/results/sm_90-fa2-2.8.3.post2-h200-20261130-rerun.jsonl")


def _records(*paths: Path) -> dict[str, Record]:
    return {rec.key: rec for path in paths for _, rec in read_records(path)}


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def compare(firsts: list[Path], second: Path) -> dict:
    """The first run's records (from one or more files) against the second run's."""
    a, b = _records(*firsts), _records(second)
    common = sorted(a.keys() & b.keys())
    changed = [key for key in common if a[key].outcome != b[key].outcome]
    ratios = []
    for key in common:
        before = {t.shape: t.latency_ms for t in a[key].timings}
        ratios += [t.latency_ms / before[t.shape] for t in b[key].timings if t.shape in before]
    ratios.sort()
    n = len(ratios)

    def q(p: float) -> float | None:
        return round(ratios[min(n - 1, int(p * n))], 3) if n else None

    return {"first": ", ".join(_shown(p) for p in firsts), "second": _shown(second),
            "cells_in_both": len(common), "outcome_changes": changed, "timed_shapes": n,
            "latency_ratio": {"median": round(statistics.median(ratios), 3) if n else None, "p05": q(0.05),
                              "p95": q(0.95), "min": q(0.0), "max": q(1.0)}}


def main() -> None:
    paths = [Path(p).resolve() for p in sys.argv[1:]] or list(DEFAULT)
    if len(paths) < 2:
        sys.exit("usage: python benchmarks/rerun_variance.py FIRST.jsonl [FIRST.jsonl ...] SECOND.jsonl")
    result = compare(paths[:-1], paths[-1])
    r = result["latency_ratio"]
    print(f"{result['cells_in_both']} cells in both runs, {len(result['outcome_changes'])} outcome changes")
    print(f"{result['timed_shapes']} timed shapes, latency second/first: median {r['median']}, "
          f"5-95% {r['p05']}-{r['p95']}, min {r['min']}, max {r['max']}")
    if len(sys.argv) == 1:
        out = ROOT / "benchmarks/results/rerun_variance.json"
        out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
