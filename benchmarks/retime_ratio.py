"""How far per-call timings were from GPU time, per backend, from the committed records alone.

    python benchmarks/retime_ratio.py [--arch sm_90] [--results matrix/data/results] [--json]

A case re-timed as GPU time keeps its older record too (one event pair and a synchronize per call, no
timing method recorded). For every validated pass timed the old way, the newest validated pass of the same
case timed with a recorded method is its pair; per timed shape both have, old latency / new latency. Prints
the median, 10th and 90th percentile and maximum per backend.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from attnmatrix.matrix.evidence import RESULTS_DIR
from attnmatrix.matrix.records import Record
from attnmatrix.matrix.storage import iter_result_files, read_records


def ratios(arch: str, results: Path = RESULTS_DIR) -> dict[str, list[float]]:
    old: dict[str, Record] = {}
    new: dict[str, Record] = {}
    for path in iter_result_files([results]):
        for _, rec in read_records(path):
            if rec.case.arch != arch or rec.tier != "validated" or rec.outcome != "pass" or not rec.timings:
                continue
            side = new if all(t.method for t in rec.timings) else old
            kept = side.get(rec.key)
            if kept is None or rec.provenance.get("date", "") >= kept.provenance.get("date", ""):
                side[rec.key] = rec
    out: dict[str, list[float]] = defaultdict(list)
    for key, before in sorted(old.items()):
        after = new.get(key)
        if after is None:
            continue
        now = {t.shape: t.latency_ms for t in after.timings}
        out[before.case.backend] += [t.latency_ms / now[t.shape] for t in before.timings
                                     if now.get(t.shape) and t.latency_ms]
    return dict(sorted(out.items()))


def summary(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {"shapes": len(v), "median": round(statistics.median(v), 2), "p10": round(v[len(v) // 10], 2),
            "p90": round(v[9 * len(v) // 10], 2), "max": round(v[-1], 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    table = {b: summary(v) for b, v in ratios(args.arch, args.results).items() if v}
    if args.json:
        print(json.dumps(table, indent=1, sort_keys=True))
        return 0
    for b, s in table.items():
        print(f"{b:16} {s['shapes']:5} shapes  old/new median {s['median']:.2f}  p10 {s['p10']:.2f}  "
              f"p90 {s['p90']:.2f}  max {s['max']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
