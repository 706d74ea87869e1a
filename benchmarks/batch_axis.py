"""How well a decode query between two timed batches can be placed, read off a scan of every batch.

    python benchmarks/batch_axis.py [SCAN ...] [-o SUMMARY.json]        # CPU, seconds

A batch scan (benchmarks/shape_scan.py with `--batch 1,2,3,...`, every preset layer, a few contexts) times the
backends at batches the workload grid (matrix/workloads.py DECODE_BATCHES) does not. For each batch grid below,
every scanned batch strictly between two of the grid's batches is placed from the scan's own timings at those two
(the same layer and context), as the selector places a query between timed points, and the rule's first choice is
scored against the fastest backend timed there (regret, as benchmarks/regret.py scores the held-out shapes).

Grids: the factor-1.5 batch axis the workload grid had first, the workload grid's, and denser ones; what a denser
grid buys is read off the same scan, and what it costs is its decode bucket points a layer call
(`workloads.decode_grid`: batches x DECODE_LENGTHS within the cache cap) against the factor-1.5 axis's: a sweep's
GPU time grows with them. A sliding-window layer's context past its window (`workloads.layer_buckets`) adds one point
a batch to every axis alike.

Rules:
- `interpolate`: each backend's time log-linear in the batch between the two grid batches
  (`selector_workloads.place` on a batch line).
- `waves`: each backend's time read in waves of thread blocks, where that reads its times at the grid's batches
  better: a decode kernel runs some thread blocks per sequence (one per KV head, or per query head) and the GPU
  holds some per wave (its SMs times 1 to 4 resident blocks), so its time could step where the batch fills
  another wave. Per layer and backend, the (blocks per sequence, blocks per wave) that reads every grid batch from
  its two neighbours with the least log error is kept if it beats log-linear there; a query is then placed the
  share of the waves between the two grid batches that its own batch adds.

The placements over 1.10 are listed with the measurement noise (even vs odd rounds) of the two backends there: a
regret far above that noise is a step the kernel takes at that batch, not a bad reading.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

from attnmatrix.matrix import workloads as W
from attnmatrix.matrix.storage import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"
GRIDS = {
    "a factor of 1.5 or 1.33 (matrix/workloads.py DECODE_BATCHES_BY_1_5)": tuple(W.DECODE_BATCHES_BY_1_5),
    "a factor of about 1.2 (matrix/workloads.py DECODE_BATCHES_BY_1_2)": tuple(W.DECODE_BATCHES_BY_1_2),
    "workload grid: a factor of about 1.2, the end of each of the first six waves for 8 and 4 KV heads and the "
    "first batch past it, and 9 (matrix/workloads.py DECODE_BATCHES)": tuple(W.DECODE_BATCHES),
    "every 2nd batch to 40, every 8th beyond": (1, *range(2, 41, 2), *range(48, 257, 8)),
    "every batch to 40, every 8th beyond": (*range(1, 41), *range(48, 257, 8)),
}
RULES = ("interpolate", "waves")
# SMs of the GPUs a scan names (a wave is this many thread blocks times the blocks resident per SM).
SM_COUNT = {"NVIDIA H200": 132, "NVIDIA H100 80GB HBM3": 132}
RESIDENT_BLOCKS = (1, 2, 3, 4)


def batch_lines(rows: list[dict]) -> dict[tuple, dict[int, dict[str, float]]]:
    """(layer, heads_q, heads_kv, context) -> batch -> backend -> ms, of the decode scan rows whose backend passed
    its check on the layer."""
    passed = {(r["backend"], r["layer"]) for r in rows if r["set"] == "check" and r["outcome"] == "pass"}
    lines: dict[tuple, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if (r["set"], r["outcome"], r["op"]) == ("scan", "pass", "decode") and (r["backend"], r["layer"]) in passed:
            lines[(r["layer"], r["heads_q"], r["heads_kv"], r["length"])][r["batch"]][r["backend"]] = r["ms"]
    return lines


def waves(batch: int, per_sequence: int, per_wave: int) -> int:
    return -(-batch * per_sequence // per_wave)


def share(lo: int, batch: int, hi: int, wave: tuple[int, int] | None = None) -> float:
    """How far `batch` is from `lo` towards `hi`, 0 to 1: in log space, or in waves where lo and hi differ in
    them under `wave` (blocks per sequence, blocks per wave)."""
    if wave:
        w_lo, w, w_hi = (waves(x, *wave) for x in (lo, batch, hi))
        if w_hi != w_lo:
            return (w - w_lo) / (w_hi - w_lo)
    return math.log(batch / lo) / math.log(hi / lo)


def read(times: dict[int, float], lo: int, batch: int, hi: int, wave=None) -> float:
    f = share(lo, batch, hi, wave)
    return math.exp((1 - f) * math.log(times[lo]) + f * math.log(times[hi]))


def wave_model(per_length: list[dict[int, float]], heads: tuple[int, int], sms: int) -> tuple[int, int] | None:
    """The (blocks per sequence, blocks per wave) that reads one backend's times at the grid batches (one dict per
    context) from their neighbours best, or None where log-linear reads them as well."""
    triples = [(t, bs[i - 1], bs[i], bs[i + 1])
               for t in per_length for bs in [sorted(t)] for i in range(1, len(bs) - 1)]

    def error(wave):
        return sum(abs(math.log(read(t, lo, b, hi, wave) / t[b])) for t, lo, b, hi in triples)

    best, best_error = None, error(None)
    for per_sequence in sorted(set(heads)):
        for k in RESIDENT_BLOCKS:
            e = error((per_sequence, sms * k))
            if e < best_error:
                best, best_error = (per_sequence, sms * k), e
    return best


def place(lines: dict, grid: tuple[int, ...], sms: int) -> dict[str, list[tuple]]:
    """rule -> [(regret, layer, context, batch, pick, fastest), ...] at every scanned batch between two of the
    grid's batches."""
    grid_set = set(grid)
    models: dict[tuple, tuple | None] = {}
    layers = defaultdict(list)
    for key, line in lines.items():
        layers[key[:3]].append(line)
    for (layer, hq, hkv), per_length in layers.items():
        for backend in sorted({b for line in per_length for at in line.values() for b in at}):
            timed = [{b: at[backend] for b, at in line.items() if b in grid_set and backend in at}
                     for line in per_length]
            models[(layer, backend)] = wave_model(timed, (hq, hkv), sms)
    out: dict[str, list[tuple]] = {r: [] for r in RULES}
    for (layer, _, _, length), line in sorted(lines.items()):
        on_grid = sorted(b for b in line if b in grid_set)
        for batch, truth in sorted(line.items()):
            if batch in grid_set or not on_grid or not on_grid[0] < batch < on_grid[-1]:
                continue
            lo = max(b for b in on_grid if b < batch)
            hi = min(b for b in on_grid if b > batch)
            shared = sorted(set(truth) & set(line[lo]) & set(line[hi]))
            fastest = min(truth, key=truth.get)
            for rule in RULES:
                est = {b: read({lo: line[lo][b], hi: line[hi][b]}, lo, batch, hi,
                               models[(layer, b)] if rule == "waves" else None) for b in shared}
                pick = min(est, key=lambda b: (est[b], b))
                out[rule].append((truth[pick] / truth[fastest], layer, length, batch, pick, fastest))
    return out


def summary(regrets: list[float]) -> dict:
    xs = sorted(regrets)
    return {"points": len(xs), "geomean": round(math.exp(sum(map(math.log, xs)) / len(xs)), 4) if xs else None,
            "p99": round(xs[int(0.99 * len(xs))], 4) if xs else None, "max": round(xs[-1], 4) if xs else None,
            "over_1.10": sum(1 for x in xs if x > 1.10)}


def noise_of(rows: list[dict]) -> dict[tuple, float]:
    """(layer, context, batch, backend) -> slower/faster of the medians of its even and odd rounds."""
    return {(r["layer"], r["length"], r["batch"], r["backend"]): x for r in rows if r["set"] == "scan"
            and r["outcome"] == "pass" for x in [W.point_noise(r)] if x is not None}


def call_ratios(rows: list[dict], base: list[dict]) -> dict[str, dict[str, dict]]:
    """backend -> {"captured", "padded"} -> the ratio of its time in the scan `rows` to its time in the scan `base`
    at the same (layer, context, batch), split by whether vLLM runs that batch as it is (one of its captured batch
    sizes) or padded to the next (kernels/vllm_fa.py `graph_batch`): what padding the step costs each backend."""
    from attnmatrix.matrix.vllm_graphs import capture_sizes

    captured = set(capture_sizes())

    def times(scan: list[dict]) -> dict[tuple, float]:
        return {(r["layer"], r["length"], r["batch"], r["backend"]): r["ms"] for r in scan
                if r["set"] == "scan" and r["outcome"] == "pass"}

    new, old = times(rows), times(base)
    out: dict[str, dict[str, list[float]]] = {}
    for key in sorted(new.keys() & old.keys()):
        kind = "captured" if key[2] in captured else "padded"
        out.setdefault(key[3], {}).setdefault(kind, []).append(new[key] / old[key])
    def spread(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {**summary(xs), "p10": round(xs[len(xs) // 10], 4), "p90": round(xs[int(0.9 * len(xs))], 4),
                "min": round(xs[0], 4)}

    return {b: {kind: spread(xs) for kind, xs in sorted(per.items())} for b, per in sorted(out.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scans", nargs="*", help="batch scans (default: benchmarks/results/scan-*-decode-batch.jsonl)")
    ap.add_argument("--sms", type=int, help="the GPU's SM count (default: from the scan's device: "
                    + ", ".join(f"{k} {v}" for k, v in SM_COUNT.items()) + ")")
    ap.add_argument("--against", metavar="BASE", help="instead: each backend's time in the scans over its time in "
                    "the scan BASE at the same points, at vLLM's captured batches and at those it pads")
    ap.add_argument("-o", "--output", help="the summary as JSON")
    args = ap.parse_args(argv)
    files = [Path(f) for f in args.scans] or sorted(RESULTS.glob("scan-*-decode-batch.jsonl"))
    if not files:
        ap.error("no batch scan given and none in benchmarks/results")
    rows = W.load_rows(files)
    if args.against:
        ratios = call_ratios(rows, W.load_rows([Path(args.against)]))
        if args.output:
            atomic_write_text(Path(args.output), json.dumps({"files": [f.name for f in files], "against": Path(
                args.against).name, "ratios": ratios}, indent=1, sort_keys=True) + "\n")
        print(f"{', '.join(f.name for f in files)} over {Path(args.against).name}, point by point:")
        for backend, kinds in ratios.items():
            for kind, x in kinds.items():
                print(f"  {backend:15} {kind:9} points {x['points']:5}  geomean {x['geomean']}  p10 {x['p10']}  "
                      f"p90 {x['p90']}  min {x['min']}  max {x['max']}")
        return 0
    devices = sorted({r.get("device") for r in rows if r["set"] == "check"})
    sms = args.sms or (SM_COUNT.get(devices[0]) if len(devices) == 1 else None)
    if not sms:
        ap.error(f"--sms: the scans' devices {devices} have no known SM count; give it")
    lines = batch_lines(rows)
    noise = noise_of(rows)
    result = {"files": [f.name for f in files], "sms": sms, "lines": len(lines), "grids": {}}
    for name, grid in GRIDS.items():
        placed = place(lines, grid, sms)
        result["grids"][name] = {"batches": list(grid), "rules": {r: summary([x[0] for x in xs])
                                                                  for r, xs in placed.items()},
                                 "decode_points": len(W.decode_grid(grid))}
        worst = sorted((x for x in placed["interpolate"] if x[0] > 1.10), reverse=True)
        result["grids"][name]["interpolate_over_1.10"] = [
            {"regret": round(g, 4), "layer": ly, "context": n, "batch": b, "pick": p, "fastest": f,
             "noise": [round(noise.get((ly, n, b, p), 0), 4), round(noise.get((ly, n, b, f), 0), 4)]}
            for g, ly, n, b, p, f in worst]
    if args.output:
        atomic_write_text(Path(args.output), json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"batch scans {', '.join(result['files'])}: {result['lines']} (layer, context) lines, {sms} SMs")
    for name, g in result["grids"].items():
        print(f"{name}: {len(g['batches'])} batches, {g['decode_points']} decode bucket points a layer call "
              f"({g['decode_points'] / len(W.GRID_BY_1_5['decode']):.2f}x the factor-1.5 axis's)")
        for rule, s in g["rules"].items():
            print(f"  {rule:12} points {s['points']:5}  regret geomean {s['geomean']}  p99 {s['p99']}  max {s['max']}  "
                  f"over 1.10: {s['over_1.10']}")
        for w in g["interpolate_over_1.10"][:5]:
            print(f"    {w['layer']:24} kv{w['context']:<6} b{w['batch']:<4} pick {w['pick']:12} {w['regret']:.3f}x "
                  f"the fastest {w['fastest']:12} (noise {w['noise'][0]:.3f}, {w['noise'][1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
