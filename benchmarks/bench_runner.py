"""Runner throughput and isolation overhead on the CPU backend.

Prints (and writes benchmarks/results/runner.json):
- cases per second of the isolated runner (worker subprocesses) on `sdpa_cpu`, validation only;
- the same cases probed in-process (`probe_case` in a loop), and the per-case overhead of isolation.

usage: python benchmarks/bench_runner.py [--cases N] [--workers W]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
from attnmatrix.kernels.base import load_backend
from attnmatrix.kernels.env import device_provenance
from attnmatrix.kernels.probe import ProbeConfig, probe_case
from attnmatrix.kernels.runner import RunnerConfig, run_cases
from attnmatrix.matrix.cases import case_space
from attnmatrix.matrix.storage import ResultStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=120)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    cases = list(case_space(["cpu"], ["sdpa_cpu"], head_dims=[(64, 64), (128, 128), (192, 128)]))[: args.cases]
    cfg = ProbeConfig(timing=False, run_id="bench")

    # In-process: one process, no isolation; the cost of the probe itself.
    backend = load_backend("sdpa_cpu")
    base = device_provenance("cpu")
    probe_case(cases[0], cfg, base, backend)  # warm-up (first-call costs)
    t0 = time.perf_counter()
    for c in cases:
        probe_case(c, cfg, base, backend)
    inproc_s = time.perf_counter() - t0

    results = {}
    for workers in sorted({1, args.workers}):
        with tempfile.TemporaryDirectory() as d:
            store = ResultStore(Path(d) / "r.jsonl")
            t0 = time.perf_counter()
            summary = run_cases(cases, store, RunnerConfig(workers=workers, probe=cfg))
            wall = time.perf_counter() - t0
            store.close()
        results[workers] = {"wall_s": round(wall, 2), "cases_per_s": round(len(cases) / wall, 2),
                            "outcomes": dict(summary.outcomes)}
    one = results[1]["wall_s"]
    out = {
        "machine": {"cpu": base["device"], "threads": torch.get_num_threads(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "cases": len(cases),
        "in_process": {"wall_s": round(inproc_s, 2), "cases_per_s": round(len(cases) / inproc_s, 2),
                       "ms_per_case": round(inproc_s / len(cases) * 1e3, 2)},
        "isolated": results,
        # One worker runs cases serially like the in-process loop; the difference is isolation:
        # worker start-up (imports torch once), JSON round trips and fsync per record.
        "overhead_ms_per_case_1_worker": round((one - inproc_s) / len(cases) * 1e3, 2),
    }
    print(json.dumps(out, indent=2))
    Path(__file__).parent.joinpath("results", "runner.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
