"""Is the matmul peak a peak? (GPU only.)

The records' "% of peak" divides each attention rate by the bf16 matmul rate the sweep measured
(`kernels.timing.matmul_peak`). A peak that an attention kernel outruns is no ceiling. In one process
this script measures

1. the matmul rate per operand kind (normal, uniform, ones, zeros) and size, timed in a CUDA graph
   and by back-to-back launches after warm-up, with the SM clock and board power nvidia-smi reads
   while each runs (random operands drive the GPU to its power limit and its clocks down);
2. the attention rate of the installed backends at their fastest timing shape (b1_s8192, causal and
   not, head dims 128, 192, 256), with the product's own problem builder and timer;
3. the peak exactly as a sweep records it (`matmul_peak()`, its provenance);

and prints whether every attention rate stays under that peak. Exit 0 if it does, 1 if not, 2 without
a GPU.

    python benchmarks/matmul_peak.py [--backends sdpa_cudnn,fa4] [--sizes 4096,8192] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

KINDS = ("normal", "uniform", "ones", "zeros")
ATTENTION = [("prefill", 128, ()), ("prefill", 128, ("causal",)), ("prefill", 192, ()),
             ("prefill", 256, ()), ("prefill", 256, ("causal",))]


class Sampler:
    """nvidia-smi's SM clock (MHz) and board power (W), sampled every 100 ms while in use."""

    QUERY = "clocks.sm,power.draw,power.limit,temperature.gpu"

    def __init__(self, gpu: str) -> None:
        self.gpu, self.rows, self.proc = gpu, [], None

    def __enter__(self) -> Sampler:
        self.rows = []
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "-i", self.gpu, f"--query-gpu={self.QUERY}",
                                          "--format=csv,noheader,nounits", "-lms", "100"],
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        except OSError:
            self.proc = None
            return self
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                self.rows.append([float(x) for x in line.split(",")])
            except ValueError:
                continue

    def __exit__(self, *exc) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait()

    def summary(self) -> dict:
        if not self.rows:
            return {}
        cols = list(zip(*self.rows, strict=False))
        return {"sm_mhz": statistics.median(cols[0]), "power_w": statistics.median(cols[1]),
                "power_limit_w": cols[2][-1], "temp_c": max(cols[3])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="sdpa_cudnn,sdpa_flash,fa4,fa2,flashinfer",
                    help="attention backends to compare (those not installed are skipped)")
    ap.add_argument("--sizes", default="4096,8192,16384", help="square matmul sizes per operand kind")
    ap.add_argument("--json", default=None, help="also write the figures as JSON here")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("matmul_peak: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton.testing as tt
    from attnmatrix.kernels.base import load_backend
    from attnmatrix.kernels.flops import problem_flops
    from attnmatrix.kernels.problem import TIMING_SHAPES, make_problem
    from attnmatrix.kernels.timing import PEAK_OPERANDS, matmul_peak, measure
    from attnmatrix.matrix.cases import Case

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    gpu = visible if visible.isdigit() else "0"
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    sizes = tuple(int(n) for n in args.sizes.split(","))
    out: dict = {"device": torch.cuda.get_device_name(), "arch": arch, "torch": torch.__version__,
                 "date": time.strftime("%Y-%m-%d"), "matmul": [], "attention": []}
    print(f"{out['device']} ({arch}), torch {torch.__version__}, {out['date']}")

    print(f"\n1. bf16 matmul by operand kind: the product's peak search (best of CUDA graph and back-to-back\n"
          f"   launches, after warm-up) and triton's do_bench on the same operands\n"
          f"{'data':8} {'n':>6} {'TFLOP/s':>8} {'timer':10} {'do_bench':>8} {'SM MHz':>7} {'W':>6} {'limit W':>7} "
          f"{'max C':>5}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for kind in KINDS:
        for n in sizes:
            with Sampler(gpu) as s:
                p = matmul_peak("cuda", sizes=(n,), data=(kind,), max_s_per_size=4.0)
            a, b = (PEAK_OPERANDS[kind](n, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            db_ms = tt.do_bench(lambda a=a, b=b: a @ b, warmup=100, rep=500, return_mode="median")
            db = 2 * n**3 / (db_ms * 1e-3) / 1e12
            del a, b
            row = {"data": kind, "n": n, "tflops": round(p.tflops, 1), "timer": p.timer,
                   "do_bench_tflops": round(db, 1), **s.summary()}
            out["matmul"].append(row)
            print(f"{kind:8} {n:6} {p.tflops:8.1f} {p.timer:10} {db:8.1f} {row.get('sm_mhz', 0):7.0f} "
                  f"{row.get('power_w', 0):6.0f} {row.get('power_limit_w', 0):7.0f} {row.get('temp_c', 0):5.0f}",
                  flush=True)

    print(f"\n2. attention at b1_s8192 (random Q/K/V, the product's timer)\n"
          f"{'backend':12} {'case':32} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6}")
    shape = next(s for s in TIMING_SHAPES["prefill"] if s.name == "b1_s8192")
    for name in args.backends.split(","):
        try:
            backend = load_backend(name)
        except KeyError:
            continue
        if backend.availability():
            print(f"{name:12} not installed")
            continue
        for op, hd, feats in ATTENTION:
            case = Case(arch, name, op, "bfloat16", hd, hd, feats)
            try:
                prob = make_problem(case, shape, device="cuda", seed=1, draw_on_device=True)
                fn = backend.prepare(prob)
                with Sampler(gpu) as s:
                    best = max(problem_flops(prob) / (measure(fn, device="cuda", budget_ms=200.0).gpu_ms * 1e-3) / 1e12
                               for _ in range(4))
            except Exception as e:  # noqa: BLE001 - a refused case is skipped, said why
                print(f"{name:12} {case.key.split('/', 4)[-1]:32} skipped: {type(e).__name__}: {str(e)[:60]}")
                torch.cuda.synchronize()
                continue
            row = {"backend": name, "case": case.key, "shape": shape.name, "tflops": round(best, 1), **s.summary()}
            out["attention"].append(row)
            print(f"{name:12} {case.key.split('/', 4)[-1]:32} {best:8.1f} {row.get('sm_mhz', 0):7.0f} "
                  f"{row.get('power_w', 0):6.0f}", flush=True)
            del fn, prob
            torch.cuda.empty_cache()

    t0 = time.monotonic()
    peak = matmul_peak("cuda")
    out["peak"] = {**peak.provenance(), "seconds": round(time.monotonic() - t0, 1)}
    fastest = max(out["attention"], key=lambda r: r["tflops"], default=None)
    out["ok"] = fastest is None or fastest["tflops"] < peak.tflops
    print(f"\n3. the peak a sweep records: {peak.tflops:.1f} TFLOP/s ({out['peak']['matmul_peak_method']}), "
          f"measured in {out['peak']['seconds']} s")
    if fastest:
        print(f"fastest attention: {fastest['tflops']} TFLOP/s ({fastest['backend']} {fastest['case']}) = "
              f"{100 * fastest['tflops'] / peak.tflops:.1f}% of the peak: {'under' if out['ok'] else 'OVER'} it")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
