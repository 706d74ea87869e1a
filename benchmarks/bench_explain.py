"""Speed of `attnmatrix explain`: answered from the generated selector's data, against `--full` (read and resolve
the whole matrix), one fresh process per call, as a user runs it.

For each: the median over several calls of the wall time (what the user waits; on a shared machine other
processes' work is inside it, so the load average is recorded beside it) and of the CPU time of the process
(user + system: what the command itself costs). Also checks that both answer the same order.
Prints the figures and writes benchmarks/results/explain.json.

usage: python benchmarks/bench_explain.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUERY = ["explain", "--arch", "sm_90", "--head-size", "128"]


def one_call(args: list[str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one `attnmatrix` process."""
    exe = shutil.which("attnmatrix") or "attnmatrix"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run([exe, *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out


def measure(args: list[str], runs: int) -> dict:
    one_call(args)  # warm: bytecode caches written, files in the page cache
    walls, cpus, outs = [], [], []
    for _ in range(runs):
        w, c, o = one_call(args)
        walls.append(w)
        cpus.append(c)
        outs.append(o)
    return {"args": args, "runs": runs, "wall_s_median": round(statistics.median(walls), 3),
            "wall_s_min": round(min(walls), 3), "cpu_s_median": round(statistics.median(cpus), 3),
            "order": next(line for line in outs[0].splitlines() if line.startswith("order:"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    load_before = os.getloadavg()
    fast = measure(QUERY, a.runs)
    full = measure([*QUERY, "--full"], max(3, a.runs // 2))
    out = {
        "query": " ".join(QUERY), "fast": fast, "full": full, "same_order": fast["order"] == full["order"],
        "cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(f"explain from the selector's data: wall {fast['wall_s_median']} s (min {fast['wall_s_min']} s), "
          f"CPU {fast['cpu_s_median']} s")
    print(f"explain --full:                   wall {full['wall_s_median']} s (min {full['wall_s_min']} s), "
          f"CPU {full['cpu_s_median']} s")
    print(f"same order: {out['same_order']}; {out['cpus']} CPUs, load average {out['load_average_before']} before, "
          f"{out['load_average_after']} after")
    path = ROOT / "benchmarks" / "results" / "explain.json"
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
