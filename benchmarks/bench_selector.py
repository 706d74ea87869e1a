"""Speed of the generated selector: import time and per-call time, against a plain function.

- import: a fresh interpreter imports `attnmatrix.selector` (median of several runs), once with bytecode
  caching disabled (compiles the module) and once from its .pyc;
- calls: median time per `select_backends(...)` and `get_flash_attn_version(...)` call, against a plain
  Python function taking the same arguments, in the same run.
Prints a table and writes benchmarks/results/selector.json.

usage: python benchmarks/bench_selector.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path

IMPORT = "import time; t = time.perf_counter(); import attnmatrix.selector; print(time.perf_counter() - t)"


def import_ms(no_pyc: bool, runs: int = 7) -> float:
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
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, *flags, "-c", IMPORT], capture_output=True, text=True, env=env,
                             check=True)
        times.append(float(out.stdout) * 1e3)
    return statistics.median(times)


def per_call_us(stmt: str, setup: str, number: int = 20000, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(stmt, setup, number=number, repeat=repeat)) / number * 1e6


def plain(capability, head_size, head_size_v=None, *, op="prefill", dtype="bfloat16", causal=True,
          sliding_window=False, softcap=False, alibi=False, sinks=False):
    return [capability, head_size]


def main() -> None:
    setup = "import attnmatrix.selector as s; from __main__ import plain"
    calls = {
        "select_backends": "s.select_backends((9, 0), 128, causal=True)",
        "select_backends_composed": "s.select_backends((9, 0), 128, causal=True, softcap=True, gqa=True)",
        "get_flash_attn_version": "s.get_flash_attn_version((10, 0), head_size=256)",
        "plain_function_same_args": "plain((9, 0), 128, causal=True)",
    }
    out = {
        "python": sys.version.split()[0],
        "import_ms_from_pyc": round(import_ms(no_pyc=False), 2),
        "import_ms_without_pyc": round(import_ms(no_pyc=True), 2),
        "per_call_us": {k: round(per_call_us(v, setup), 3) for k, v in calls.items()},
    }
    print(json.dumps(out, indent=2))
    Path(__file__).parent.joinpath("results", "selector.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
