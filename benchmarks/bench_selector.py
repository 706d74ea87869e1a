"""Speed of the generated selector: import time and per-call time, against a plain function.

- import: a fresh interpreter imports `attnmatrix.selector` (median of several runs), once with bytecode
  caching disabled (compiles the module) and once from its .pyc;
- cached calls: median CPU time per repeated `select_backends(...)` / `get_flash_attn_version(...)` /
  `get_mla_prefill_backend_priorities(...)` call (answered from the per-argument cache), against a plain Python
  function taking the same arguments, in the same run;
- first calls, in CPU time (a shared machine's wall clock counts other processes' time): a query the process
  has not asked before: (a) in a warm process, the mean over every probed sm_90 query class asked once each, as
  probed and composed (with gqa and sliding_window added); (b) in a fresh interpreter, the very first
  `select_backends` call after the import (it reads the rules of the backends it consults).
Prints the figures and writes benchmarks/results/selector.json.

usage: python benchmarks/bench_selector.py
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

from attnmatrix.vocabulary import query_params_of

# Wall time and CPU time of the import: on a shared machine the CPU time is what the module itself costs.
IMPORT = ("import time; t, c = time.perf_counter(), time.process_time(); import attnmatrix.selector; "
          "print(time.perf_counter() - t, time.process_time() - c)")


def import_ms(no_pyc: bool, runs: int = 7) -> tuple[float, float]:
    env = dict(os.environ)
    if no_pyc:
        # -B stops writing bytecode; an empty cache prefix stops reading it, so the module is compiled.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="nopyc-")
        flags = ["-B"]
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("PYTHONPYCACHEPREFIX", None)
        flags = []
        subprocess.run([sys.executable, "-c", "import compileall, attnmatrix.selector as s; "
                        "compileall.compile_file(s.__file__, quiet=1)"], check=True, env=env)
    wall, cpu = [], []
    for _ in range(runs):
        out = subprocess.run([sys.executable, *flags, "-c", IMPORT], capture_output=True, text=True, env=env,
                             check=True)
        w, c = (float(x) * 1e3 for x in out.stdout.split())
        wall.append(w)
        cpu.append(c)
    return statistics.median(wall), statistics.median(cpu)


COLD_FIRST = ("import time, attnmatrix.selector as s; c = time.process_time(); s.select_backends((9, 0), 128); "
              "print(time.process_time() - c)")


def cold_first_call_us(runs: int = 7) -> float:
    """CPU time of the first select_backends call in a fresh interpreter (median)."""
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", COLD_FIRST], capture_output=True, text=True, check=True)
        times.append(float(out.stdout) * 1e6)
    return statistics.median(times)


def warm_first_call_us(composed: bool, repeat: int = 7) -> tuple[float, int]:
    """Mean CPU time of an uncached select_backends call (best of `repeat` passes, the cache cleared before each):
    every probed sm_90 query class once, as probed or (composed) with gqa and sliding_window added, which most
    backends answer from three cells."""
    import attnmatrix.selector as s

    queries = []
    for op, dtype, hd, hdv, feats in s.DATA["measured"]["sm_90"]:
        if composed:
            feats = sorted({*feats, "gqa", "sliding_window"})
        queries.append((hd, hdv, op, dtype, query_params_of(feats)))
    s.select_backends((9, 0), 128)  # the rules of every sm_90 backend are parsed once, before timing
    best = float("inf")
    for _ in range(repeat):
        s._ENGINE._select_cache.clear()
        t = time.process_time()
        for hd, hdv, op, dtype, kw in queries:
            s.select_backends((9, 0), hd, hdv, op=op, dtype=dtype, **kw)
        best = min(best, (time.process_time() - t) / len(queries) * 1e6)
    return best, len(queries)


def per_call_us(stmt: str, setup: str, number: int = 20000, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(stmt, setup, timer=time.process_time, number=number, repeat=repeat)) \
        / number * 1e6


def plain(capability, head_size, head_size_v=None, *, op="prefill", dtype="bfloat16", causal=True,
          sliding_window=False, softcap=False, alibi=False, sinks=False):
    return [capability, head_size]


def main() -> None:
    setup = "import attnmatrix.selector as s; from __main__ import plain"
    calls = {
        "select_backends": "s.select_backends((9, 0), 128, causal=True)",
        "select_backends_composed": "s.select_backends((9, 0), 128, causal=True, softcap=True, gqa=True)",
        "get_flash_attn_version": "s.get_flash_attn_version((10, 0), head_size=256)",
        "get_mla_prefill_backend_priorities": "s.get_mla_prefill_backend_priorities((10, 0), 128, 64, 128)",
        "plain_function_same_args": "plain((9, 0), 128, causal=True)",
    }
    pyc, no_pyc = import_ms(no_pyc=False), import_ms(no_pyc=True)
    out = {
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start "
                   "(the CPU-time figures do not count other processes; the wall-clock imports do)",
        "import_ms_from_pyc": round(pyc[0], 2),
        "import_ms_from_pyc_cpu": round(pyc[1], 2),
        "import_ms_without_pyc": round(no_pyc[0], 2),
        "import_ms_without_pyc_cpu": round(no_pyc[1], 2),
        "per_call_cpu_us": {k: round(per_call_us(v, setup), 3) for k, v in calls.items()},
    }
    exact, n = warm_first_call_us(composed=False)
    composed, _ = warm_first_call_us(composed=True)
    out["first_call_cpu_us"] = {"uncached_probed_query": round(exact, 1), "uncached_composed_query": round(composed, 1),
                                "queries_timed": n, "first_query_after_import": round(cold_first_call_us(), 1)}
    print(json.dumps(out, indent=2))
    Path(__file__).parent.joinpath("results", "selector.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
