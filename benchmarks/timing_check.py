"""Does the product's GPU time agree with an independent timer? (GPU only.)

For a sample of cases (installed backends, both ops, both dtypes, the timing shapes `attnmatrix probe`
uses), in one process and one after the other on the same inputs, it times each call with

- the product: `kernels.timing.measure` (CUDA graph of N calls replayed, or back-to-back launches
  behind a spin kernel; L2 flushed between repetitions), as `kernels/probe.py` records it;
- triton's `testing.do_bench` (its own events and L2 flush per call, median);
- triton's `testing.do_bench_cudagraph` (its own graph of unrolled calls, median), where capturable;
- one event pair and a synchronize around each call, the method records used before (host included),

and prints recorded/independent ratios per shape, their median, and whether they meet the bar: median
within 0.95-1.05 and every shape within 0.85-1.15 (against do_bench; against do_bench_cudagraph too).

    python benchmarks/timing_check.py [--backends sdpa_cudnn,sdpa_flash,fa4] [--sample 12] [--out FILE]

Writes one JSON line per timed shape to --out (default: $OUT/timing_check.jsonl when $OUT is set) and
a summary line last. Exit 0 when the bar is met against do_bench, 1 when not, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

DEFAULT_BACKENDS = "sdpa_cudnn,sdpa_flash,sdpa_efficient,fa4,fa2,flashinfer,trtllm_decode"
# (op, head_dim, features): shapes a ranking is decided on, short and long kernels, host-heavy wrappers.
CASES = [
    ("prefill", 128, ("causal",)), ("prefill", 64, ()), ("prefill", 256, ("causal",)),
    ("prefill", 128, ("causal", "gqa")), ("decode", 128, ("causal",)), ("decode", 128, ("causal", "gqa")),
    ("prefill", 128, ("causal", "varlen")), ("decode", 64, ("causal", "paged_kv:16")),
]
MEDIAN_BAND = (0.95, 1.05)
SHAPE_BAND = (0.85, 1.15)


def per_call_events_ms(fn, reps: int = 30) -> float:
    """The method records used before: one event pair and a synchronize around each call."""
    import torch

    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def verdict(ratios: list[float]) -> dict:
    if not ratios:
        return {"shapes": 0, "ok": False}
    med = statistics.median(ratios)
    ok = MEDIAN_BAND[0] <= med <= MEDIAN_BAND[1] and all(SHAPE_BAND[0] <= r <= SHAPE_BAND[1] for r in ratios)
    return {"shapes": len(ratios), "median": round(med, 4), "min": round(min(ratios), 4),
            "max": round(max(ratios), 4), "ok": ok}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default=DEFAULT_BACKENDS, help="those not installed are skipped")
    ap.add_argument("--dtypes", default="bfloat16,float16")
    ap.add_argument("--sample", type=int, default=len(CASES), help="cases per backend and dtype (first N of the list)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--peak-sizes", default="4096,8192", help="matmul sizes the peak is sought at")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("timing_check: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton.testing as tt
    from attnmatrix.kernels.base import load_backend
    from attnmatrix.kernels.flops import problem_flops
    from attnmatrix.kernels.problem import TIMING_SHAPES, Unsupported, make_problem
    from attnmatrix.kernels.timing import matmul_peak, measure
    from attnmatrix.matrix.cases import Case

    out_path = args.out or (os.path.join(os.environ["OUT"], "timing_check.jsonl") if os.environ.get("OUT") else None)
    out = open(out_path, "w", encoding="utf-8") if out_path else None  # noqa: SIM115
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    peak = matmul_peak("cuda", sizes=tuple(int(n) for n in args.peak_sizes.split(",")), max_s_per_size=4.0)
    sizes = ", ".join(f"{n}:{v:.0f}" for n, v in sorted(peak.detail.items()))
    print(f"{torch.cuda.get_device_name()} ({arch}), torch {torch.__version__}; bf16 matmul peak "
          f"{peak.tflops:.0f} TFLOP/s at n={peak.n} (sizes: {sizes})")
    head = (f"{'backend':15} {'dtype':8} {'case':34} {'shape':12} {'product':>9} {'host':>8} {'method':10} "
            f"{'do_bench':>9} {'ratio':>6} {'graph':>9} {'ratio':>6} {'old/db':>6}")
    print(head)
    rows, r_db, r_graph = [], [], []
    t0 = time.monotonic()
    for name in args.backends.split(","):
        backend = load_backend(name)
        why = backend.availability()
        if why:
            print(f"{name}: not installed ({why[:100]})")
            continue
        for dtype in args.dtypes.split(","):
            for op, hd, feats in CASES[: args.sample]:
                case = Case(arch, name, op, dtype, hd, hd, feats)
                for shape in TIMING_SHAPES[op]:
                    try:
                        p = make_problem(case, shape, device="cuda", seed=1, draw_on_device=True)
                        fn = backend.prepare(p)
                        fn()
                        torch.cuda.synchronize()
                    except (Unsupported, Exception) as e:  # noqa: BLE001 - a refused case is skipped, said why
                        print(f"{name:15} {dtype:8} {case.key.split('/', 4)[-1]:34} {shape.name:12} skipped: "
                              f"{type(e).__name__}: {str(e)[:80]}")
                        torch.cuda.empty_cache()
                        break
                    m = measure(fn, device="cuda", budget_ms=40.0)
                    db = tt.do_bench(fn, warmup=25, rep=100, return_mode="median")
                    try:
                        graph = tt.do_bench_cudagraph(fn, rep=20, return_mode="median")
                    except Exception:  # noqa: BLE001 - not capturable: no graph figure
                        graph = None
                        torch.cuda.synchronize()
                    old = per_call_events_ms(fn)
                    row = {"backend": name, "case": case.key, "shape": shape.name, "product_ms": round(m.gpu_ms, 5),
                           "host_ms": round(m.host_ms, 5) if m.host_ms is not None else None, "method": m.method,
                           "do_bench_ms": round(db, 5),
                           "do_bench_cudagraph_ms": None if graph is None else round(graph, 5),
                           "per_call_events_ms": round(old, 5), "ratio_do_bench": round(m.gpu_ms / db, 4),
                           "ratio_cudagraph": None if graph is None else round(m.gpu_ms / graph, 4),
                           "tflops": round(problem_flops(p) / (m.gpu_ms * 1e-3) / 1e12, 2)}
                    if m.note:
                        row["note"] = m.note
                    rows.append(row)
                    r_db.append(row["ratio_do_bench"])
                    if graph is not None:
                        r_graph.append(row["ratio_cudagraph"])
                    print(f"{name:15} {dtype:8} {case.key.split('/', 4)[-1]:34} {shape.name:12} "
                          f"{m.gpu_ms:9.4f} {m.host_ms or 0:8.4f} {m.method:10} {db:9.4f} {row['ratio_do_bench']:6.3f} "
                          f"{graph if graph is not None else float('nan'):9.4f} "
                          f"{row['ratio_cudagraph'] if graph is not None else float('nan'):6.3f} {old / db:6.2f}",
                          flush=True)
                    if out:
                        out.write(json.dumps(row, sort_keys=True) + "\n")
                    del fn, p
                    torch.cuda.empty_cache()
    summary = {"summary": True, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "matmul_peak_tflops": round(peak.tflops, 1), "matmul_peak_n": peak.n,
               "vs_do_bench": verdict(r_db), "vs_do_bench_cudagraph": verdict(r_graph),
               "bands": {"median": MEDIAN_BAND, "every_shape": SHAPE_BAND}, "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps(summary, indent=1))
    if out:
        out.write(json.dumps(summary, sort_keys=True) + "\n")
        out.close()
    return 0 if summary["vs_do_bench"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
