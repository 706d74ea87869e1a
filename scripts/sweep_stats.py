"""Where a sweep's time went, from its records: per backend, the seconds spent in first calls
(JIT compile or cache load), checks and timed shapes (`extra.seconds`, written by kernels/probe.py).

usage: python scripts/sweep_stats.py RESULTS.jsonl [...] [--json]

Worker time, summed over workers: with W workers in parallel, a sweep's wall time is at least the
largest of these sums divided by W. A first call over 1 s is counted as slow: for FA4, FlashInfer
and XQA that is a JIT compile (a kernel loaded from their caches returns in milliseconds); for FA2
and SDPA, which compile nothing at run time, it is CUDA's lazy module loading on a busy machine.
The timing phase includes waiting for the GPU's timing lock, which concurrent workers share.
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
                                                "slow": [], "best": None})
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
    out = {}
    for backend, a in sorted(acc.items()):
        slow = a.pop("slow")
        best = a.pop("best")
        out[backend] = {**{k: round(v, 1) if isinstance(v, float) else v for k, v in a.items()},
                        "slow_first_calls": len(slow), "slow_first_call_s": round(sum(slow), 1),
                        "median_slow_first_call_s": round(statistics.median(slow), 1) if slow else None,
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
    print("\nbest TFLOP/s per backend (fraction of the matmul peak recorded in the same run)")
    for backend, row in table.items():
        b = row["best_tflops"]
        if b:
            print(f"{backend.ljust(16)}{b['tflops']:9.1f}  {b['fraction']}  of {b['peak_tflops']}  "
                  f"{b['cell']} {b['shape']}")


if __name__ == "__main__":
    main()
