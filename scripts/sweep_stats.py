"""Where a sweep's time went, from its records: per backend, the seconds spent in first calls
(JIT compile or cache load), checks and timed shapes (`extra.seconds`, written by kernels/probe.py).

usage: python scripts/sweep_stats.py RESULTS.jsonl [...] [--json]

Worker time, summed over workers: with W workers in parallel, a sweep's wall time is at least the
largest of these sums divided by W. A first call over 1 s is counted as slow: for FA4, FlashInfer
and XQA that is a JIT compile (a kernel loaded from their caches returns in milliseconds); for FA2
and SDPA, which compile nothing at run time, it is CUDA's lazy module loading on a busy machine.
The timing phase includes drawing the timed shapes' inputs and waiting for the GPU's timing lock,
which concurrent workers share (`gpu_lock_wait_s`); its median and max per timed case, by op, are listed too,
and so are the slow first calls' min, median and max, by op.
Refusals, and records written before seconds were recorded, count under `without_seconds`.
Also: the best TFLOP/s per backend, with the matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

COMPILE_S = 1.0


def stats(paths: list[Path]) -> dict[str, dict]:
    acc: dict[str, dict] = defaultdict(lambda: {"records": 0, "without_seconds": 0, "first_call_s": 0.0,
                                                "check_s": 0.0, "timing_s": 0.0, "gpu_lock_wait_s": 0.0,
                                                "slow": [], "best": None, "timing_by_op": defaultdict(list),
                                                "slow_by_op": defaultdict(list)})
    for path in paths:
        for line in path.open():
            if not line.strip():
                continue
            rec = json.loads(line)
            a = acc[rec["case"]["backend"]]
            a["records"] += 1
            _best(a, rec)
            secs = (rec.get("extra") or {}).get("seconds")
            if not secs:
                a["without_seconds"] += 1
                continue
            for phase in ("first_call", "check", "timing", "gpu_lock_wait"):  # the lock wait is part of timing
                a[f"{phase}_s"] += secs.get(phase, 0.0)
            if secs.get("first_call", 0.0) > COMPILE_S:
                a["slow"].append(secs["first_call"])
                a["slow_by_op"][rec["case"]["op"]].append(secs["first_call"])
            if "timing" in secs:
                a["timing_by_op"][rec["case"]["op"]].append(secs["timing"])
    out = {}
    for backend, a in sorted(acc.items()):
        slow = a.pop("slow")
        best = a.pop("best")
        by_op = a.pop("timing_by_op")
        slow_by_op = a.pop("slow_by_op")
        out[backend] = {**{k: round(v, 1) if isinstance(v, float) else v for k, v in a.items()},
                        "slow_first_calls": len(slow), "slow_first_call_s": round(sum(slow), 1),
                        "median_slow_first_call_s": round(statistics.median(slow), 1) if slow else None,
                        "timing_s_per_case": {op: {"cases": len(v), "median": round(statistics.median(v), 1),
                                                   "max": round(max(v), 1)} for op, v in sorted(by_op.items())},
                        "slow_first_call_s_per_case": {op: {"cases": len(v), "min": round(min(v), 1),
                                                            "median": round(statistics.median(v), 1),
                                                            "max": round(max(v), 1)}
                                                       for op, v in sorted(slow_by_op.items())},
                        "best_tflops": best}
    return out


def _best(a: dict, rec: dict) -> None:
    """Keep the record's best timed shape if it beats the backend's best so far."""
    peak = (rec.get("provenance") or {}).get("matmul_peak_tflops")
    for t in rec.get("timings") or ():
        if t.get("tflops") is not None and (a["best"] is None or t["tflops"] > a["best"]["tflops"]):
            c = rec["case"]
            a["best"] = {"tflops": t["tflops"], "shape": t["shape"], "peak_tflops": float(peak) if peak else None,
                         "fraction": round(t["tflops"] / float(peak), 2) if peak else None,
                         "cell": f"{c['op']} {c['dtype']} {c['head_dim']}x{c['head_dim_v']} "
                                 f"{'+'.join(c['features']) or 'none'}"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    table = stats(args.files)
    if args.json:
        print(json.dumps(table, indent=1, sort_keys=True))
        return
    cols = ["records", "without_seconds", "slow_first_calls", "slow_first_call_s", "median_slow_first_call_s",
            "first_call_s", "check_s", "timing_s", "gpu_lock_wait_s"]
    print("backend".ljust(16) + " ".join(c.rjust(len(c)) for c in cols))
    for backend, row in table.items():
        print(backend.ljust(16) + " ".join(str(row[c]).rjust(len(c)) for c in cols))
    print("\ntiming phase per timed case (seconds): cases, median, max, by op")
    for backend, row in table.items():
        ops = "  ".join(f"{op} {t['cases']} {t['median']} {t['max']}" for op, t in row["timing_s_per_case"].items())
        if ops:
            print(f"{backend.ljust(16)}{ops}")
    print("\nslow first calls (over 1 s: compiles) per case (seconds): cases, min, median, max, by op")
    for backend, row in table.items():
        ops = "  ".join(f"{op} {t['cases']} {t['min']} {t['median']} {t['max']}"
                        for op, t in row["slow_first_call_s_per_case"].items())
        if ops:
            print(f"{backend.ljust(16)}{ops}")
    print("\nbest TFLOP/s per backend (fraction of the matmul peak recorded in the same run)")
    for backend, row in table.items():
        b = row["best_tflops"]
        if b:
            print(f"{backend.ljust(16)}{b['tflops']:9.1f}  {b['fraction']}  of {b['peak_tflops']}  "
                  f"{b['cell']} {b['shape']}")


if __name__ == "__main__":
    main()
