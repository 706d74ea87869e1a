"""Model-shaped timings: rankings per workload bucket, and the selector's regret on shapes the ranking did not use.

    python benchmarks/regret.py sweep --backends vllm_fa3 -o RUN.jsonl [--shard 0/4]   # GPU
    python benchmarks/regret.py report RUN.jsonl [RUN.jsonl ...] [-o SUMMARY.json]       # CPU

`sweep` takes every layer type of the model presets (matrix/data/models.json) and every op it runs, checks
each backend once on a small problem with the layer's head counts against the reference
(kernels/reference.py), then times it on the op's bucket points (matrix/workloads.py BUCKETS) and on held-out
points (HELD_OUT), GPU time per call (kernels/timing.py `measure`, CUDA graph), one timed loop at a time on
the GPU (`exclusive_gpu`). The bucket points are timed a second time after the whole first pass, with fresh
inputs: the ratio of the two is the rerun noise.

vLLM's FlashAttention builds (vllm_fa2, vllm_fa3, vllm_fa4) are timed through vLLM's call: varlen queries,
the KV cache through `block_table` + `seqused_k` with vLLM's default kernel block size 16
(vllm-project/vllm v0.33.0 vllm/v1/attention/backends/flash_attn.py `get_supported_kernel_block_sizes`:
`MultipleOf(16)`; the forward's `flash_attn_varlen_func` call passes `seqused_k` and `block_table`, prefill
and decode alike). Every other backend is called through its own API on contiguous tensors. Each line says
which call ran (`entry`, `profile`).

`report` ranks the backends per (layer, op, bucket) on the bucket points (a backend within the rerun noise
of the fastest ties with it), then for every held-out point takes the first choice of the bucket it falls in
(`workloads.bucket_of`; among tied backends, the first in the selector's order without hints), and reports
regret = its time / the fastest time among the backends that passed the check and were timed there, per
query, as geomean and max, beside the rerun noise. The first choice of the selector without hints (the
committed matrix's answer for the layer's cell) is reported beside it.

Lines (JSON): {"backend", "kernel_version", "layer", "layers", "op", "case", "batch", "length", "set" ("check" |
"bucket" | "held_out"), "rep", "outcome", "ms", "method", "reason", "entry", "profile", "heads_q", "heads_kv"}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from attnmatrix.matrix import workloads as W
from attnmatrix.matrix.workloads import Layer, bucket_label, bucket_of

ROOT = Path(__file__).resolve().parent.parent
VLLM_BACKENDS = ("vllm_fa2", "vllm_fa3", "vllm_fa4")
VLLM_BLOCK = 16  # vLLM's default KV block size for its FlashAttention backend (MultipleOf(16))
DTYPE = "bfloat16"


def presets_path(arg: str | None) -> Path:
    return Path(arg) if arg else W.DEFAULT_MODELS


def case_for(layer: Layer, op: str, backend: str, arch: str):
    from attnmatrix.matrix.cases import Case

    feats = list(layer.features(op))
    if backend in VLLM_BACKENDS:
        feats.append(f"paged_kv:{VLLM_BLOCK}")
    return Case(arch=arch, backend=backend, op=op, dtype=DTYPE, head_dim=layer.head_dim,
                head_dim_v=layer.head_dim_v, features=tuple(feats))


def profile_of(backend: str) -> str:
    if backend in VLLM_BACKENDS:
        return f"vllm: varlen q, block_table (block {VLLM_BLOCK}) + seqused_k"
    return "library API, contiguous KV"


def shape_for(layer: Layer, op: str, batch: int, length: int, name: str | None = None):
    from attnmatrix.kernels.problem import WINDOW, Shape

    sq = 1 if op == "decode" else length
    return Shape(name or bucket_label(op, batch, length), batch, sq, length, layer.heads_q, layer.heads_kv,
                 window=layer.window or WINDOW)


def _check(backend, case, layer: Layer, op: str) -> tuple[str, str | None, str | None]:
    """(outcome, reason, entry) of the backend on a small problem with the layer's head counts."""
    import torch
    from attnmatrix.kernels.probe import _message, _raised_by_library, device_fault
    from attnmatrix.kernels.problem import Unsupported, make_problem
    from attnmatrix.kernels.reference import compare, reference_attention

    if op == "decode":
        shape = shape_for(layer, op, 4, 700, "val")
    else:
        shape = shape_for(layer, op, 2, 300, "val")
    # A window that cuts most of a row, as the matrix's validation shapes have (kernels/problem.py).
    from dataclasses import replace
    shape = replace(shape, window=min(shape.window, 64 if op != "decode" else 192))
    p = make_problem(case, shape, device=backend.device, seed=0)
    entry = backend.entry(case)
    try:
        out = backend.prepare(p)()
        if backend.device == "cuda":
            torch.cuda.synchronize()
    except Unsupported as e:
        return "rejected", f"attnmatrix: the API cannot express this case: {e}", entry
    except Exception as e:  # noqa: BLE001 - every failure is an outcome
        if device_fault(e):
            raise
        return ("rejected" if _raised_by_library(e) else "crash"), _message(e, 400), entry
    err = compare(p, out, reference_attention(p))
    if not err["ok"]:
        return "wrong", f"max abs error {err['max_abs_err']} ({err['mismatched']} of {err['elements']} off)", entry
    return "pass", None, entry


def sweep(args: argparse.Namespace) -> int:
    import torch
    from attnmatrix.kernels.base import load_backend
    from attnmatrix.kernels.probe import _message, device_fault
    from attnmatrix.kernels.problem import make_problem
    from attnmatrix.kernels.timing import exclusive_gpu, measure

    names = args.backends.split(",")
    devices = {load_backend(b).device for b in names}
    if len(devices) != 1:
        raise SystemExit(f"--backends {args.backends}: one device at a time (got {sorted(devices)})")
    device = devices.pop()
    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        arch, device_name = f"sm_{major}{minor}", torch.cuda.get_device_name()
    else:
        arch, device_name = "cpu", "cpu"
    layers = W.load_presets(presets_path(args.presets))
    # Layers the kernel cannot tell apart (same heads, head dims, features, window) are timed once; the row
    # names every layer it stands for (`layers`).
    same: dict[tuple, list[str]] = {}
    work = []
    for ly in layers:
        for op in ly.ops():
            sig = (op, ly.heads_q, ly.heads_kv, ly.head_dim, ly.head_dim_v, ly.features(op), ly.window)
            if sig not in same:
                same[sig] = []
                work.append((ly, op, same[sig]))
            same[sig].append(ly.name)
    i, n = (int(x) for x in args.shard.split("/"))
    work = work[i::n]
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with out.open("a", encoding="utf-8") as f:
        def emit(row: dict) -> None:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()

        for name in names:
            backend = load_backend(name)
            why = backend.availability()
            version = backend.version()
            passed = []
            for layer, op, names in work:
                case = case_for(layer, op, name, arch)
                base = {"backend": name, "kernel_version": version, "layer": layer.name, "layers": names, "op": op,
                        "case": case.key,
                        "heads_q": layer.heads_q, "heads_kv": layer.heads_kv, "profile": profile_of(name),
                        "device": device_name, "arch": arch}
                if why:
                    emit({**base, "set": "check", "outcome": "unavailable", "reason": why})
                    continue
                outcome, reason, entry = _check(backend, case, layer, op)
                emit({**base, "set": "check", "outcome": outcome, "reason": reason, "entry": entry})
                print(f"{name:14} {layer.name:24} {op:11} check {outcome}", file=sys.stderr, flush=True)
                if outcome == "pass":
                    passed.append((layer, op, case, base, entry))
            # The held-out points between the two passes over the bucket points: the rerun sees other work first.
            for kind, rep in (("bucket", 0), ("held_out", 0), ("bucket", 1)):
                for (layer, op, case, base, entry), (batch, length) in (
                        (w, pt) for w in passed for pt in (W.BUCKETS if kind == "bucket" else W.HELD_OUT)[w[1]]):
                    row = {**base, "entry": entry, "set": kind, "rep": rep, "batch": batch, "length": length}
                    tp = None
                    try:
                        tp = make_problem(case, shape_for(layer, op, batch, length), device=device, seed=1 + rep,
                                          draw_on_device=True)
                        fn = backend.prepare(tp)
                        fn()
                        with exclusive_gpu():
                            m = measure(fn, device=device, budget_ms=args.budget_ms)
                        emit({**row, "outcome": "pass", "ms": round(m.gpu_ms, 5), "method": m.method,
                              "host_ms": None if m.host_ms is None else round(m.host_ms, 5)})
                    except Exception as e:  # noqa: BLE001 - a point not timed is noted
                        emit({**row, "outcome": "untimed", "reason": _message(e, 300)})
                        if device_fault(e):
                            print(f"{name}: device fault, stopping this process", file=sys.stderr)
                            return 3
                    finally:
                        del tp
                        if device == "cuda":
                            torch.cuda.empty_cache()
    print(json.dumps({"output": str(out), "seconds": round(time.monotonic() - t0, 1), "workloads": len(work)}))
    return 0


# --- report (CPU) -------------------------------------------------------------------------------------------

def read_rows(paths: list[str]) -> list[dict]:
    rows = []
    for p in paths:
        for n, line in enumerate(Path(p).read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise SystemExit(f"{p}:{n}: not JSON ({e})") from None
    return rows


def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def quantile(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def expand(rows: list[dict]) -> list[dict]:
    """One row per layer a timed row stands for (`layers`: layers the kernel cannot tell apart)."""
    return [{**r, "layer": name} for r in rows for name in (r.get("layers") or [r["layer"]])]


def analyse(rows: list[dict], order=None) -> dict:
    """Rankings per bucket, the noise band, and the regret of the selector's first choice on held-out points.

    `order(layer, op, batch=None, length=None)`: the selector's order for the layer's cell, with workload hints
    when a point is given (`selector_orders`); without one, the regret is that of the bucket's own first choice."""
    checks = {(r["backend"], r["layer"], r["op"]): r for r in rows if r["set"] == "check"}
    ok = {k for k, r in checks.items() if r["outcome"] == "pass"}
    times: dict[tuple, dict[int, float]] = defaultdict(dict)  # (backend, layer, op, set, batch, length) -> rep -> ms
    for r in rows:
        if r["set"] != "check" and r["outcome"] == "pass" and (r["backend"], r["layer"], r["op"]) in ok:
            times[(r["backend"], r["layer"], r["op"], r["set"], r["batch"], r["length"])][r["rep"]] = r["ms"]
    ratios = sorted(max(v.values()) / min(v.values()) for v in times.values() if len(v) >= 2)
    noise = quantile(ratios, 0.9) or 1.0

    def ms(key) -> float:
        return statistics.median(times[key].values())

    workloads = sorted({(r["layer"], r["op"]) for r in rows if r["set"] == "check"})
    rankings, queries = {}, []
    for layer, op in workloads:
        for batch, length in W.BUCKETS[op]:
            cands = sorted((ms(k), k[0]) for k in times if k[1:] == (layer, op, "bucket", batch, length))
            if not cands:
                continue
            best = cands[0][0]
            rankings[f"{layer} {op} {bucket_label(op, batch, length)}"] = {
                "order": [[b, round(t, 5)] for t, b in cands],
                "tie_within_noise": [b for t, b in cands if t / best <= noise],
            }
        for batch, length in W.HELD_OUT[op]:
            here = {k[0]: ms(k) for k in times if k[1:] == (layer, op, "held_out", batch, length)}
            if not here:
                continue
            bb, bl = bucket_of(op, batch, length)
            rk = rankings.get(f"{layer} {op} {bucket_label(op, bb, bl)}")
            fastest = min(here.values())
            q = {"layer": layer, "op": op, "shape": bucket_label(op, batch, length),
                 "bucket": bucket_label(op, bb, bl), "fastest": min(here, key=here.get), "timed": len(here)}
            if order is not None:
                pick = next((b for b in order(layer, op, batch, length) if b in here), None)
                plain = next((b for b in order(layer, op) if b in here), None)
                q.update(pick_without_hints=plain,
                         regret_without_hints=round(here[plain] / fastest, 4) if plain else None)
            else:
                pick = next((b for b, _ in rk["order"] if b in here), None) if rk else None
            q.update(pick=pick, regret=round(here[pick] / fastest, 4) if pick else None)
            queries.append(q)
    regrets = [q["regret"] for q in queries if q.get("regret")]
    plain = [q["regret_without_hints"] for q in queries if q.get("regret_without_hints")]
    return {
        "noise": {"pairs": len(ratios), "median": quantile(ratios, 0.5), "p90": noise,
                  "max": ratios[-1] if ratios else None,
                  "what": "ratio slower/faster of the two timings of one backend at one bucket point (fresh inputs, "
                          "the whole first pass in between); a bucket's backends within p90 of the fastest tie"},
        "regret": {"queries": len(regrets), "geomean": _r(geomean(regrets)), "max": max(regrets, default=None),
                   "first_choice_fastest": sum(1 for x in regrets if x == 1.0),
                   "within_noise": sum(1 for x in regrets if x <= noise)},
        "regret_without_hints": {"queries": len(plain), "geomean": _r(geomean(plain)), "max": max(plain, default=None)},
        "checks": {f"{b} {ly} {op}": r["outcome"] + (f": {r['reason']}" if r.get("reason") else "")
                   for (b, ly, op), r in sorted(checks.items())},
        "rankings": rankings,
        "queries": queries,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def selector_orders(rows: list[dict]):
    """A function (layer, op, batch, length or None) -> the generated selector's order for that layer's cell, with
    the layer's head counts and the point as workload hints (length None: no hints, the order without them)."""
    from attnmatrix.matrix.cases import Case

    from attnmatrix import selector

    layers = {}
    for r in rows:
        if r["set"] == "check":
            layers.setdefault((r["layer"], r["op"]), (Case.from_key(r["case"]), r["heads_q"], r["heads_kv"]))

    def order(layer: str, op: str, batch: int | None = None, length: int | None = None) -> list[str]:
        c, hq, hkv = layers[(layer, op)]
        flags: dict = {"causal": False}
        for tok in c.features:
            name, _, arg = tok.partition(":")
            if name == "qk_rope":
                flags[name] = int(arg)
            elif name != "paged_kv":  # the vLLM profile's cache, not a feature of the layer
                flags[name] = True
        if length is not None:
            flags.update(num_heads=hq, num_kv_heads=hkv, batch_size=batch,
                         **{W.LENGTH_NAME[op]: length})
        major, minor = int(c.arch[3:-1]), int(c.arch[-1])
        return selector.select_backends((major, minor), c.head_dim, c.head_dim_v, op=op, dtype=c.dtype, **flags)

    return order


def report(args: argparse.Namespace) -> int:
    rows = expand(read_rows(args.files or [str(p) for p in sorted(W.WORKLOADS_DIR.glob("*.jsonl"))]))
    result = analyse(rows, selector_orders(rows))
    result["files"] = [str(Path(p)) for p in args.files]
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    if args.output:
        tmp = Path(args.output).with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, args.output)
    s = result
    print(f"rerun noise: median {s['noise']['median']:.3f}, p90 {s['noise']['p90']:.3f}, max {s['noise']['max']:.3f} "
          f"({s['noise']['pairs']} pairs)")
    print(f"regret, selector with workload hints: geomean {s['regret']['geomean']}, max {s['regret']['max']} over "
          f"{s['regret']['queries']} held-out queries ({s['regret']['first_choice_fastest']} fastest, "
          f"{s['regret']['within_noise']} within noise)")
    print(f"regret, selector without hints:  geomean {s['regret_without_hints']['geomean']}, "
          f"max {s['regret_without_hints']['max']}")
    for q in result["queries"]:
        print(f"  {q['layer']:24} {q['op']:11} {q['shape']:12} bucket {q['bucket']:12} pick {q.get('pick')!s:14} "
              f"regret {q.get('regret')!s:7} fastest {q['fastest']:14} no-hints {q.get('pick_without_hints')!s:14} "
              f"{q.get('regret_without_hints')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="GPU: check and time the backends on the presets' workloads")
    s.add_argument("--backends", required=True, help="comma-separated, timed one after another")
    s.add_argument("-o", "--output", required=True, help="JSON Lines, appended to")
    s.add_argument("--presets", help=f"models file (default matrix/data/{W.DEFAULT_MODELS.name})")
    s.add_argument("--shard", default="0/1", help="i/n: this process takes every n-th workload from i")
    s.add_argument("--budget-ms", type=float, default=20.0, help="timed repetitions per point, after warm-up")
    r = sub.add_parser("report", help="rankings per bucket and regret on held-out points, from sweep files")
    r.add_argument("files", nargs="*", help="sweep files (default: the committed ones, matrix/data/workloads)")
    r.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    return sweep(args) if args.cmd == "sweep" else report(args)


if __name__ == "__main__":
    sys.exit(main())
