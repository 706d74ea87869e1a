"""`attnmatrix check` wall time on the committed checkout: what the pre-commit hook (.pre-commit-hooks.yaml) costs.

Runs `attnmatrix check` in a fresh process `--runs` times (each validates the matrix and renders every generated
file in memory, as the hook does) and prints the times and their median; `-o` writes them as JSON.

usage: python benchmarks/bench_check.py [--runs 3] [-o benchmarks/results/check.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attnmatrix.matrix.storage import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-o", "--output", help="the times as JSON")
    args = ap.parse_args(argv)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "attnmatrix.cli", "check"], cwd=ROOT, capture_output=True,
                              text=True)
        times.append(round(time.perf_counter() - t0, 2))
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return done.returncode
    result = {"runs_s": times, "median_s": statistics.median(times), "cpus": os.cpu_count(),
              "python": platform.python_version(), "what": "wall time of `attnmatrix check` on the committed checkout, "
              "one fresh process a run"}
    print(f"attnmatrix check: {', '.join(f'{t} s' for t in times)} (median {result['median_s']} s, "
          f"{result['cpus']} CPUs)")
    if args.output:
        atomic_write_text(args.output, json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
