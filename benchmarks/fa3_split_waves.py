"""Where vLLM's FA3 build steps along decode's batch axis, against FA3's own split heuristic.

    python benchmarks/fa3_split_waves.py [SCAN ...] [-o SUMMARY.json]        # CPU, a second

FA3 splits a decode step's KV cache among the SMs: it takes the fewest splits whose waves of thread blocks are at
least 85% as full as the fullest choice, and no split once the blocks nearly fill the SMs (upstream:
Dao-AILab/flash-attention@6d21ae21 hopper/heuristics.h:25-62, `num_splits_heuristic`). A decode step with its
query heads packed per KV head runs one block per KV head of a sequence and split, so one sequence more can take a
step from one wave of blocks to two. This script reads that rule (`splits`, `waves`) against vllm_fa3's timings in
batch scans (benchmarks/shape_scan.py; by default the committed ones of every batch): for each pair of scanned
batches one sequence apart, the time ratio by how many waves the rule adds, and for each layer and context the
batches where vllm_fa3 is over 1.10x the fastest backend, beside the batches where the rule needs more than one wave.

The rule is a model: the KV block per head dim (`KV_BLOCK`) and the window's share of the cache are read coarsely,
and vLLM's split bound is left out (it binds only above 32 splits).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from attnmatrix.matrix import workloads as W
from attnmatrix.matrix.storage import atomic_write_text

RESULTS = Path(__file__).resolve().parent / "results"
SCANS = ("scan-sm_90-h200-20261203-3-decode-batch-vllm-graph.jsonl",
         "scan-sm_90-h200-20261203-4-decode-gemma-2-2b-global-b1-16.jsonl")
# The committed summary of those scans (`-o`): what one more wave costs vllm_fa3, as benchmarks/placement_rules.py
# reads it.
SUMMARY = RESULTS / "fa3-split-waves-sm_90-h200-20261203.json"
SMS = W.SMS  # of the GPU the scans ran on, as the workload grid's
FILL = 0.8  # blocks that fill this share of the SMs run unsplit
EFFICIENCY = 0.85  # the fewest splits at least this share as full as the fullest
BACKEND = "vllm_fa3"


def kv_block(head_dim: int) -> int:
    """KV tokens per block, coarsely: FA3's sm90 decode tiles take fewer KV tokens per block for head dim 256."""
    return 80 if head_dim > 128 else 128


def splits(blocks: int, kv_blocks: int, sms: int = SMS, max_splits: int = 128) -> int:
    """FA3's split count for `blocks` thread blocks (sequences x KV heads) over `kv_blocks` blocks of the cache."""
    if blocks >= FILL * sms or kv_blocks <= 4:
        return 1
    top = min(max_splits, sms, kv_blocks)
    fill = [blocks * s / sms / math.ceil(blocks * s / sms) for s in range(1, top + 1)]
    return next(s for s, f in enumerate(fill, 1) if f >= EFFICIENCY * max(fill))


def waves(batch: int, heads_kv: int, context: int, head_dim: int, window: int | None) -> int:
    """Waves of thread blocks over the SMs for a decode step of `batch` sequences under FA3's split."""
    loaded = min(context, window + 1) if window else context
    blocks = batch * heads_kv
    return math.ceil(blocks * splits(blocks, math.ceil(loaded / kv_block(head_dim))) / SMS)


def analyse(rows: list[dict]) -> dict:
    layers = {ly.name: ly for ly in W.load_presets()}
    times: dict[tuple, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        if r.get("set") == "scan" and r.get("outcome") == "pass" and r.get("op") == "decode":
            times[(r["layer"], r["length"])][r["batch"]][r["backend"]] = r["ms"]
    by_change: dict[int, list[float]] = defaultdict(list)
    lines = []
    for (name, length), at in sorted(times.items()):
        ly = layers[name]
        w = {b: waves(b, ly.heads_kv, length, ly.head_dim, ly.window) for b in at}
        for b in sorted(at):
            if b + 1 in at and BACKEND in at[b] and BACKEND in at[b + 1]:
                by_change[w[b + 1] - w[b]].append(at[b + 1][BACKEND] / at[b][BACKEND])
        slow = sorted(b for b, t in at.items() if BACKEND in t and t[BACKEND] > 1.10 * min(t.values()))
        lines.append({"layer": name, "context": length, "batches": len(at), "slow_batches": slow,
                      "over_one_wave": sorted(b for b in at if w[b] > 1)})
    return {
        "what": f"{BACKEND}'s time at batch b+1 / at b, by how many waves FA3's split rule adds between them",
        "by_wave_change": {str(k): {"pairs": len(v), "median": round(statistics.median(v), 3)}
                           for k, v in sorted(by_change.items())},
        "lines": lines,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scans", nargs="*", type=Path, help="batch scan files (default: the committed ones)")
    ap.add_argument("-o", "--output", type=Path, help="write the summary as JSON")
    args = ap.parse_args(argv)
    # a point scanned twice counts its later reading (files in name order)
    out = analyse(W.latest_calls(W.load_rows(args.scans or [RESULTS / s for s in SCANS])))
    for k, v in out["by_wave_change"].items():
        print(f"waves {int(k):+d}: {v['pairs']} pairs, {BACKEND} b+1 / b median {v['median']}")
    for line in out["lines"]:
        print(f"{line['layer']} kv{line['context']}: over 1.10x the fastest at {line['slow_batches']}; "
              f"more than one wave at {line['over_one_wave']}")
    if args.output:
        atomic_write_text(args.output, json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
