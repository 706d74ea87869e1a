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
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import placement_rules as PR  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import regret as R  # noqa: E402
from attnmatrix.matrix import workloads as W  # noqa: E402
from attnmatrix.matrix.storage import atomic_write_text  # noqa: E402

BACKEND = "fa2"
FILL = 0.8  # blocks that fill this share of twice the SMs run unsplit
EFFICIENCY = 0.85  # the fewest splits at least this share as full as the fullest
MAX_SPLITS = 128


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
    packed = heads_q > heads_kv and not windowed
    rows, heads = (heads_q // heads_kv, heads_kv) if packed else (1, heads_q)
    blocks = batch * heads * math.ceil(rows / 64)
    return heuristic(blocks, 2 * sms, math.ceil(context / kv_block(head_dim)))


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
    ratios: dict[str, dict[str, list[float]]] = {"held_out": defaultdict(list), "scans": defaultdict(list)}
    misses = []
    for (name, b, n), ms in sorted(measured(rows).items()):
        ly = layers[name]
        p = placed(name, "decode", b, n, "bfloat16")
        if p is None or p.exact or BACKEND not in dict(p.order):
            continue
        mine = splits(b, ly.heads_q, ly.heads_kv, ly.head_dim, n, bool(ly.window))
        around = [splits(x, ly.heads_q, ly.heads_kv, ly.head_dim, y, bool(ly.window)) for x, y in p.points]
        ratio = ms / dict(p.order)[BACKEND]
        ratios["held_out"][kind(mine, around)].append(ratio)
        if p.order[0][0] == BACKEND and ratio > 1.10:
            misses.append({"layer": name, "shape": f"b{b}_kv{n}", "splits": mine, "splits_around": around,
                           "measured_over_reading": round(ratio, 4)})
    band, spread, cells = PR.timed_grid(rows)
    for (cell, hq, hkv, b, n), truth in sorted(PR.scan_truth(rows, scans).items()):
        layer = [r for r in cells.get(cell, ()) if r[:2] == (hq, hkv)]
        if cell[1] != "decode" or BACKEND not in truth or not layer or (b, n) in {(r[2], r[3]) for r in layer}:
            continue
        p = PR.place(layer, "decode", {"batch_size": b, "context_len": n}, band, spread, graphs=PR.GRAPHS,
                     paths=PR.PATHS, whole_tiles=PR.WHOLE_TILES)
        if BACKEND not in dict(p.order):
            continue
        windowed = "sliding_window" in cell[5]
        mine = splits(b, hq, hkv, cell[3], n, windowed)
        around = [splits(x, hq, hkv, cell[3], y, windowed) for x, y in p.points]
        ratios["scans"][kind(mine, around)].append(truth[BACKEND] / dict(p.order)[BACKEND])
    return {"backend": BACKEND, "sms": W.SMS,
            "measured_over_reading": {src: {k: {"points": len(v), **PR.ratio_spread(v), "max": round(max(v), 3)}
                                            for k, v in sorted(by.items())} for src, by in ratios.items()},
            "picked_over_1.10": misses}


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
    print(f"held-out queries where {BACKEND} was picked and took over 1.10x its reading:")
    for m in result["picked_over_1.10"]:
        print(f"  {m['layer']:24} {m['shape']:12} splits {m['splits']} (around: {m['splits_around']})  "
              f"measured / reading {m['measured_over_reading']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
