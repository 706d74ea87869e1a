"""The Ray executor against the local one: the same sweep, the same two worker processes.

Prints (and writes benchmarks/results/ray.json):
- the wall time and cases per second of the local executor (`run_cases`, 2 workers) on `sdpa_cpu`,
  validation only;
- the same cases through `run_cases_ray` on a local Ray instance of 2 CPUs (so 2 tasks at a time, each
  running one runner worker), with the default chunking and with one chunk per slot, and the overhead:
  Ray's start-up (once per sweep) is reported apart from the sweep itself.

Where the overhead comes from: each Ray task (chunk) starts its own runner worker, which imports torch;
the records travel through Ray's object store; the driver waits on the stream.

usage: python benchmarks/bench_ray.py [--cases N]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
from attnmatrix.kernels import ray_cluster as rc
from attnmatrix.kernels import ray_executor as rx
from attnmatrix.kernels.env import device_provenance
from attnmatrix.kernels.probe import ProbeConfig
from attnmatrix.kernels.runner import RunnerConfig, run_cases
from attnmatrix.matrix.cases import case_space
from attnmatrix.matrix.storage import ResultStore

SLOTS = 2


def _sweep(run) -> tuple[float, object]:
    with tempfile.TemporaryDirectory() as d, ResultStore(Path(d) / "r.jsonl") as store:
        t0 = time.perf_counter()
        summary = run(store)
        return time.perf_counter() - t0, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=120)
    args = ap.parse_args()
    cases = list(case_space(["cpu"], ["sdpa_cpu"], head_dims=[(64, 64), (128, 128), (192, 128)]))[: args.cases]
    cfg = RunnerConfig(workers=SLOTS, device="cpu", probe=ProbeConfig(timing=False, run_id="bench"))
    n = len(cases)

    local_s, local = _sweep(lambda store: run_cases(cases, store, cfg))
    results = {"local": {"workers": SLOTS, "wall_s": round(local_s, 2), "cases_per_s": round(n / local_s, 2),
                         "outcomes": dict(local.outcomes)}}

    ray = rc.import_ray()
    t0 = time.perf_counter()
    with rc.ray_session(None, num_cpus=SLOTS):
        start_s = time.perf_counter() - t0
        runs = {"ray_auto_chunks": rx.FleetConfig(cpus_per_task=1),
                "ray_one_chunk_per_slot": rx.FleetConfig(chunk_size=-(-n // SLOTS), cpus_per_task=1)}
        for name, fleet in runs.items():
            wall, s = _sweep(lambda store, fleet=fleet: rx.run_cases_ray(cases, store, cfg, fleet, ray=ray))
            assert s.ran == n and not s.unprobed and dict(s.outcomes) == dict(local.outcomes), s
            results[name] = {"tasks": s.tasks, "chunk_size": fleet.chunk_size or rx.auto_chunk_size(n, SLOTS),
                             "wall_s": round(wall, 2), "cases_per_s": round(n / wall, 2),
                             "overhead_vs_local_s": round(wall - local_s, 2),
                             "overhead_ms_per_case": round((wall - local_s) / n * 1e3, 1),
                             "slowdown_vs_local": round(wall / local_s, 2)}
    out = {
        "machine": {"cpu": device_provenance("cpu")["device"], "threads": torch.get_num_threads(),
                    "python": platform.python_version(), "torch": torch.__version__, "ray": ray.__version__},
        "cases": n,
        "ray_start_s": round(start_s, 2),  # ray.init of a local instance, paid once per sweep
        **results,
    }
    print(json.dumps(out, indent=2))
    Path(__file__).parent.joinpath("results", "ray.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
