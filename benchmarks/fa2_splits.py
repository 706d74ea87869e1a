"""Where FA2's decode reading misses, against FA2's own split heuristic.

    python benchmarks/fa2_splits.py [-o SUMMARY.json]        # CPU, seconds

FlashAttention 2 splits a decode step's KV cache among thread blocks by a heuristic of its own (upstream:
Dao-AILab/flash-attention@00979f57 csrc/flash_attn/flash_api.cpp `num_splits_heuristic`, `set_params_splitkv`,
`mha_fwd`; the timings are flash-attn 2.8.3.post2's, whose source was not read here, and the rule read from that
commit places its steps where they are timed, as at gemma-3-12b's 18 x 653 below): blocks of 64 KV tokens at head
dim 256 (128 up to 128, 256 up to 64), one thread block per (sequence, head, 64 query rows) and split, against twice
the SM count (128-thread blocks); no split when the blocks fill 80% of that; else the fewest splits whose wave of
blocks is at least 85% as full as the fullest choice, a split count that leaves the blocks per split unchanged not
counted. A decode call without a window packs a KV head's query heads as its query rows (`flash_attn_func`'s
`seqlenq_ngroups_swapped`): one block per KV head of a sequence. With a window (right edge 0) it does not: one per
query head.

The split count turns on the batch and the context together, so a query between timed points can run another
split than every point it is read from (gemma-3-12b's global layer, 18 sequences x 653 cached tokens: 11 splits of
one KV block each, where 17 and 20 sequences at 512 and 768 run 3). This script reads fa2's timings against that
rule: at every held-out decode query and every scanned decode point off the grid (benchmarks/results/*scan-*.jsonl)
where fa2 ran, fa2's measured time over the selector's reading of it, split by how the query's split count stands
to those of the timed points it is read from (`same`: every point's; `more`: above every point's; `fewer`; `mixed`).
It explains misses; it is not a placement rule: a split count above every point's makes fa2 slower than its reading
in most such queries and faster in some (the `more` line's p10 and p90), by how much the count alone does not say.
The SM count is the workload grid's GPU's (`workloads.SMS`).

Nor does a split-time model read fa2 better than plain interpolation (`split_time`): fa2's time at a point taken
as the waves its thread blocks run in times the KV blocks each walks plus a fixed cost per thread block, worth
ALPHAS KV blocks' work; fa2's reading at a query is then its interpolated time scaled by the model's value there
over the model's own interpolation from the points around (`model_reading`). The summary's `split_time_model`
scores that reading against plain interpolation by the mean |log(measured / reading)|, on every scanned point
(the design set: a model that reads worse there is not taken) and on the held-out queries, and on the points of
each that run more splits than every point around (`more`). On the committed scans it misreads fa2 more than
interpolation at every alpha, on every point and on the `more` points alike, so the selector interpolates fa2
as it does every backend.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import placement_rules as PR  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import regret as R  # noqa: E402
from attnmatrix.matrix import workloads as W  # noqa: E402
from attnmatrix.matrix.storage import atomic_write_text  # noqa: E402

from attnmatrix.selector_workloads import interpolation_weights, log_mean  # noqa: E402

BACKEND = "fa2"
FILL = 0.8  # blocks that fill this share of twice the SMs run unsplit
EFFICIENCY = 0.85  # the fewest splits at least this share as full as the fullest
MAX_SPLITS = 128
# The fixed cost of one thread block of the split-time model, in KV blocks' work: the values `split_time_model` tries.
ALPHAS = (0.5, 1, 2, 4, 8)


def kv_block(head_dim: int) -> int:
    """KV tokens per block of FA2's split-KV kernel for a head dim (run_mha_fwd_splitkv_dispatch's block_n)."""
    return 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64


def heuristic(blocks: int, slots: int, kv_blocks: int, max_splits: int = MAX_SPLITS) -> int:
    """`num_splits_heuristic`: the split count for `blocks` thread blocks over `slots` (twice the SMs) and
    `kv_blocks` blocks of the cache."""
    if blocks >= FILL * slots:
        return 1
    top = min(max_splits, slots, kv_blocks)

    def eligible(s: int) -> bool:
        return s == 1 or math.ceil(kv_blocks / s) != math.ceil(kv_blocks / (s - 1))

    fill = {s: blocks * s / slots / math.ceil(blocks * s / slots) for s in range(1, top + 1) if eligible(s)}
    best = max(fill.values())
    return next(s for s, f in fill.items() if f >= EFFICIENCY * best)


def splits(batch: int, heads_q: int, heads_kv: int, head_dim: int, context: int, windowed: bool,
           sms: int = W.SMS) -> int:
    """FA2's split count for a decode step of `batch` sequences of `context` cached tokens through
    `flash_attn_func` (query heads packed per KV head where the call has no window)."""
    blocks = thread_blocks(batch, heads_q, heads_kv, windowed)
    return heuristic(blocks, 2 * sms, math.ceil(context / kv_block(head_dim)))


def thread_blocks(batch: int, heads_q: int, heads_kv: int, windowed: bool) -> int:
    """FA2's thread blocks of an unsplit decode step: one per (sequence, head, 64 query rows), a KV head's query
    heads packed as its rows where the call has no window."""
    packed = heads_q > heads_kv and not windowed
    rows, heads = (heads_q // heads_kv, heads_kv) if packed else (1, heads_q)
    return batch * heads * math.ceil(rows / 64)


def split_time(batch: int, heads_q: int, heads_kv: int, head_dim: int, context: int, windowed: bool, alpha: float,
               sms: int = W.SMS) -> float:
    """The split-time model of a decode step, in one KV block's work: the waves its thread blocks run in (over twice
    the SMs) times the sum of the KV blocks each walks and `alpha`, a thread block's fixed cost."""
    s = splits(batch, heads_q, heads_kv, head_dim, context, windowed, sms)
    waves = math.ceil(thread_blocks(batch, heads_q, heads_kv, windowed) * s / (2 * sms))
    return waves * (alpha + math.ceil(math.ceil(context / kv_block(head_dim)) / s))


def model_reading(reading: float, model, batch: int, length: int, points) -> float:
    """fa2's interpolated `reading` at (batch, length) scaled by the model's value there over its interpolation from
    the timed `points` around (as the selector weighs them: `interpolation_weights`). `model`: (batch, length) ->
    the model's value."""
    weights = {p: w for p, w in interpolation_weights(set(points), batch, length).items() if w > 0}
    return reading * model(batch, length) / log_mean(weights, {p: model(*p) for p in weights})


def kind(query: int, around: list[int]) -> str:
    if all(s == query for s in around):
        return "same"
    if query > max(around):
        return "more"
    if query < min(around):
        return "fewer"
    return "mixed"


def measured(rows: list[dict]) -> dict[tuple, float]:
    """(layer, batch, length) -> fa2's time at every held-out decode query of the committed timings."""
    profiles = W.call_profiles(rows)
    return {(r["layer"], r["batch"], r["length"]): r["ms"] for r in rows
            if r.get("set") == "held_out" and r.get("op") == "decode" and r.get("backend") == BACKEND
            and r.get("outcome") == "pass" and W.in_call(r, profiles)}


def analyse(rows: list[dict], scans: list[Path]) -> dict:
    layers = {ly.name: ly for ly in W.load_presets()}
    placed = R.selector_placements(rows)
    # (source, split kind, measured, reading, (heads_q, heads_kv, head_dim, windowed), batch, length, points)
    reads = []
    misses = []
    for (name, b, n), ms in sorted(measured(rows).items()):
        ly = layers[name]
        p = placed(name, "decode", b, n, "bfloat16")
        if p is None or p.exact or BACKEND not in dict(p.order):
            continue
        geometry = (ly.heads_q, ly.heads_kv, ly.head_dim, bool(ly.window))
        mine = splits(b, *geometry[:3], n, geometry[3])
        around = [splits(x, *geometry[:3], y, geometry[3]) for x, y in p.points]
        reads.append(("held_out", kind(mine, around), ms, dict(p.order)[BACKEND], geometry, b, n, p.points))
        if p.order[0][0] == BACKEND and ms / dict(p.order)[BACKEND] > 1.10:
            misses.append({"layer": name, "shape": f"b{b}_kv{n}", "splits": mine, "splits_around": around,
                           "measured_over_reading": round(ms / dict(p.order)[BACKEND], 4)})
    band, spread, cells = PR.timed_grid(rows)
    for (cell, hq, hkv, b, n), truth in sorted(PR.scan_truth(rows, scans).items()):
        layer = [r for r in cells.get(cell, ()) if r[:2] == (hq, hkv)]
        if cell[1] != "decode" or BACKEND not in truth or not layer or (b, n) in {(r[2], r[3]) for r in layer}:
            continue
        p = PR.place(layer, "decode", {"batch_size": b, "context_len": n}, band, spread, graphs=PR.GRAPHS,
                     paths=PR.PATHS, whole_tiles=PR.WHOLE_TILES)
        if BACKEND not in dict(p.order):
            continue
        geometry = (hq, hkv, cell[3], "sliding_window" in cell[5])
        mine = splits(b, hq, hkv, cell[3], n, geometry[3])
        around = [splits(x, hq, hkv, cell[3], y, geometry[3]) for x, y in p.points]
        reads.append(("scans", kind(mine, around), truth[BACKEND], dict(p.order)[BACKEND], geometry, b, n, p.points))
    ratios: dict[str, dict[str, list[float]]] = {"held_out": defaultdict(list), "scans": defaultdict(list)}
    for src, k, ms, reading, *_ in reads:
        ratios[src][k].append(ms / reading)
    return {"backend": BACKEND, "sms": W.SMS,
            "measured_over_reading": {src: {k: {"points": len(v), **PR.ratio_spread(v), "max": round(max(v), 3)}
                                            for k, v in sorted(by.items())} for src, by in ratios.items()},
            "picked_over_1.10": misses, "split_time_model": split_time_model(reads)}


def misread(ratios: list[float]) -> dict:
    """How far readings are from the measured times: the mean |log(measured / reading)|, the ratio's p10 and p90,
    and the counts over 1.10 and under 1 / 1.10."""
    return {"points": len(ratios), "mean_abs_log": round(statistics.fmean(abs(math.log(r)) for r in ratios), 4),
            **{k: v for k, v in PR.ratio_spread(ratios).items() if k != "median"},
            "over_1.10": sum(r > 1.10 for r in ratios), "under_1/1.10": sum(r < 1 / 1.10 for r in ratios)}


def split_time_model(reads: list[tuple]) -> dict:
    """Per source (scans, held-out) and subset (every point, `more`): plain interpolation's misreading of fa2 beside
    that of the split-time model at each of ALPHAS (`misread`)."""
    out: dict = {}
    for src in ("scans", "held_out"):
        for subset in ("all", "more"):
            here = [r for r in reads if r[0] == src and (subset == "all" or r[1] == "more")]
            if not here:
                continue
            line = {"interpolate": misread([ms / reading for _, _, ms, reading, *_ in here])}
            for alpha in ALPHAS:
                line[f"alpha_{alpha}"] = misread([ms / model_reading(
                    reading, lambda x, y, g=g, a=alpha: split_time(x, *g[:3], y, g[3], a), b, n, points)
                    for _, _, ms, reading, g, b, n, points in here])
            out[f"{src}_{subset}"] = line
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", help="the summary as JSON")
    args = ap.parse_args(argv)
    rows = W.load_rows()
    scans = sorted((Path(__file__).parent / "results").glob("*scan-*.jsonl"), key=lambda f: f.name)
    result = analyse(rows, scans)
    if args.output:
        atomic_write_text(Path(args.output), json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{BACKEND}'s measured time over the selector's reading, by its split count (FA2's heuristic, "
          f"{W.SMS} SMs) at the query against the timed points it is read from:")
    for src, by in result["measured_over_reading"].items():
        for k, s in by.items():
            print(f"  {src:9} {k:6} points {s['points']:5}  median {s['median']}  p10 {s['p10']}  p90 {s['p90']}  "
                  f"max {s['max']}")
    print(f"{BACKEND}'s misreading (mean |log(measured / reading)|, p10, p90, over 1.10, under 1/1.10), plain "
          f"interpolation against the split-time model, by a thread block's fixed cost (alpha, in KV blocks):")
    for subset, by in result["split_time_model"].items():
        for reader, m in by.items():
            print(f"  {subset:13} {reader:12} points {m['points']:5}  mean |log| {m['mean_abs_log']:.4f}  "
                  f"p10 {m['p10']}  p90 {m['p90']}  over {m['over_1.10']:4}  under {m['under_1/1.10']:4}")
    print(f"held-out queries where {BACKEND} was picked and took over 1.10x its reading:")
    for m in result["picked_over_1.10"]:
        print(f"  {m['layer']:24} {m['shape']:12} splits {m['splits']} (around: {m['splits_around']})  "
              f"measured / reading {m['measured_over_reading']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
