"""A GPU process's first FA4 call, with the kernel cross-compiled into its cache and without (GPU only).

Cross-compiles one case (bf16 prefill, head dim 128, causal) for the local GPU with the GPU hidden, then
runs the same first call in fresh GPU processes, alternately on that cache and on an empty one, and
prints each first call's seconds. This is the measurement behind
tests/test_xcompile.py::test_kernel_compiled_without_a_gpu_is_reused_by_a_gpu_process, which compares
the two (a first call also pays for CUDA's context, the DSL's setup and tracing, so it cannot be
compared with the cross-compile's own `compile_s`). It reuses that test's GPU program and target.

usage: python benchmarks/fa4_first_call.py      (on a GPU machine with flash-attn-4 installed)
Output on an H200 (flash-attn-4 4.0.0b36, torch 2.11.0+cu130): benchmarks/results/sm_90-fa4-first-call-h200-20261130.txt
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import test_xcompile as t  # noqa: E402 - after the path: the GPU program lives with its test
from attnmatrix.kernels import xcompile  # noqa: E402
from attnmatrix.matrix.cases import Case  # noqa: E402
from attnmatrix.matrix.storage import read_records  # noqa: E402


def main() -> None:
    target = t._local_target()
    if target is None:
        sys.exit("needs a CUDA GPU")
    tmp = Path(tempfile.mkdtemp())
    case = Case(target, "fa4", "prefill", "bfloat16", 128, 128, ("causal",))
    cache = tmp / "c"
    xcompile.xcompile_cases([case], tmp / "xc.jsonl", [target], cache_dir=str(cache))
    [(_, rec)] = read_records(tmp / "xc.jsonl")
    print("xcompile", rec.outcome, rec.extra)
    env = {k: v for k, v in os.environ.items()
           if k not in ("FLASH_ATTENTION_ARCH", "CUTE_DSL_ARCH", "FLASH_ATTENTION_NUM_SMS", "CUDA_VISIBLE_DEVICES")}
    runs = [("populated", cache), ("empty", tmp / "e"), ("populated-again", cache), ("empty-second", tmp / "e2")]
    for label, d in runs:
        e = dict(env, FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED="1", FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=str(d))
        r = subprocess.run([sys.executable, "-c", t._GPU_RUN, json.dumps(case.to_dict())], env=e,
                           capture_output=True, text=True)
        print(label, r.returncode, r.stdout.strip().splitlines()[-1:], r.stderr[-300:] if r.returncode else "")


if __name__ == "__main__":
    main()
