"""A second reading of workload grid points against the committed grid: do the timings, and the rankings on them, hold?

    python benchmarks/grid_reread.py --sample 16 --op decode          # the points of a 1/16 sample of the grid
    python benchmarks/grid_reread.py READ.jsonl [...] [-o SUMMARY.json]   # CPU, seconds

A sample of the grid (every K-th bucket point of an op, in (batch, length) order, from the `--offset`-th: spread over
both axes) is timed again with `benchmarks/regret.py sweep --ops OP --points POINTS -o READ.jsonl`, on another machine
of the same GPU model or after a change to the kit. This script reads those files against the committed timings
(matrix/data/workloads, the last reading of each point, as the selector ranks by them): each backend's time over its
committed time (median, p10, p90 over every backend at every point), how often the committed first choice is still the
fastest, and that first choice's regret on the second reading (its time / the fastest's there; geomean, max, over
1.10). Where the sweep's `done` rows carry each layer call's seconds, it also says what the sample took and, scaled
by the grid's (layer call, point) timings of those ops over the sample's, what the whole grid would (`cost`: the
checks, once a layer call, are scaled with the rest, so a little high).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from attnmatrix.matrix import workloads as W
from attnmatrix.matrix.storage import atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
import placement_rules as PR  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import regret  # noqa: E402


def sample(op: str, every: int, offset: int = 0) -> list[tuple[int, int]]:
    """Every `every`-th bucket point of `op` (the grid's, BUCKETS), in (batch, length) order, from the `offset`-th."""
    return sorted(W.BUCKETS[op])[offset::every]


def bucket_times(rows: list[dict]) -> dict[tuple, dict[str, float]]:
    """(layer, op, batch, length) -> backend -> ms at every bucket point that passed, in the call the grid ranks each
    backend by (`workloads.in_call`), the last reading of a point counting."""
    profiles = W.call_profiles(rows)
    out: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.get("set") == "bucket" and r.get("outcome") == "pass" and W.in_call(r, profiles):
            out.setdefault((r["layer"], r["op"], r["batch"], r["length"]), {})[r["backend"]] = r["ms"]
    return out


def compare(committed: dict[tuple, dict[str, float]], reread: dict[tuple, dict[str, float]]) -> dict:
    """Per op: the second reading's points against the committed ones (see the module's docstring)."""
    by_op: dict[str, dict] = {}
    for key, new in sorted(reread.items()):
        old = committed.get(key)
        common = sorted(set(new) & set(old or ()))
        # the committed first choice among every backend the grid timed there; a point where the second reading did
        # not time it cannot say how that choice fares
        first = min(old, key=lambda b: (old[b], b)) if old else None
        if first not in new:
            continue
        s = by_op.setdefault(key[1], {"ratios": [], "same_first": 0, "regrets": [], "changed": []})
        s["ratios"] += [new[b] / old[b] for b in common]
        fastest = min(new, key=lambda b: (new[b], b))
        s["same_first"] += first == fastest
        s["regrets"].append(new[first] / new[fastest])
        if s["regrets"][-1] > 1.05:
            s["changed"].append({"layer": key[0], "point": f"{key[2]}x{key[3]}", "committed_first": first,
                                 "fastest_now": fastest, "regret": round(s["regrets"][-1], 4),
                                 "ms": {b: [old.get(b), new.get(b)] for b in sorted(set(old) | set(new))}})
    out = {}
    for op, s in sorted(by_op.items()):
        xs = sorted(s["regrets"])
        times = {"values": len(s["ratios"]), **PR.ratio_spread(s["ratios"])}
        out[op] = {"points": len(xs), "time_over_committed": times,
                   "committed_first_still_fastest": s["same_first"],
                   "committed_first_regret": {"geomean": round(math.exp(sum(map(math.log, xs)) / len(xs)), 4),
                                              "max": round(xs[-1], 4), "over_1.05": sum(x > 1.05 for x in xs),
                                              "over_1.10": sum(x > 1.10 for x in xs)},
                   "over_1.05": s["changed"]}
    return out


def grid_timings(ops: set[str]) -> int:
    """The (layer call, point) timings of the whole grid for `ops`: each distinct layer call of the presets
    (`regret.layer_calls`) at each of its bucket points (`workloads.layer_buckets`)."""
    return sum(len(W.layer_buckets(ly, op)) for ly, op, _ in regret.layer_calls(W.load_presets(), ops))


def cost(rows: list[dict]) -> dict | None:
    """What one sample's sweep took and what the whole grid of its ops would: {ops, timings, seconds, grid_timings,
    grid_seconds}, or None where a `done` row carries no seconds (a sweep before they were recorded)."""
    done = [r for r in rows if r.get("set") == "done"]
    if not done or any("seconds" not in r for r in done):
        return None
    ops = {r["op"] for r in done}
    finished = {(r["layer"], r["op"]) for r in done}  # a layer call cut short recorded no seconds
    # every (layer call, point) its seconds were spent on, held-out points too where the sweep timed them
    timings = len({(r["layer"], r["op"], r["set"], r["batch"], r["length"]) for r in rows
                   if r.get("set") in ("bucket", "held_out") and (r["layer"], r["op"]) in finished})
    seconds = round(sum(r["seconds"] for r in done), 1)
    total = grid_timings(ops)
    return {"ops": sorted(ops), "timings": timings, "seconds": seconds, "grid_timings": total,
            "grid_seconds": round(seconds * total / timings, 1) if timings else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="sweep files of re-timed bucket points (benchmarks/regret.py sweep -o)")
    ap.add_argument("--sample", type=int, metavar="K", help="print the --points of every K-th bucket point of --op")
    ap.add_argument("--op", choices=sorted(W.BUCKETS), help="the op to sample (with --sample)")
    ap.add_argument("--offset", type=int, default=5, help="the first point of the sample (default 5)")
    ap.add_argument("-o", "--output", help="the summary as JSON")
    args = ap.parse_args(argv)
    if args.sample:
        if not args.op:
            ap.error("--sample needs --op")
        print(",".join(f"{b}x{n}" for b, n in sample(args.op, args.sample, args.offset)))
        return 0
    if not args.files:
        ap.error("name the sweep files of the second reading (or --sample K --op OP for their points)")
    committed = bucket_times(W.latest_calls(W.load_rows()))
    reads = {Path(f).name: W.load_rows([Path(f)]) for f in args.files}
    result = {"files": list(reads),
              "ops": compare(committed, bucket_times([r for rows in reads.values() for r in rows]))}
    costs = {name: c for name, rows in reads.items() if (c := cost(rows)) is not None}
    if costs:
        result["cost"] = costs
    if args.output:
        atomic_write_text(Path(args.output), json.dumps(result, indent=1, sort_keys=True) + "\n")
    for op, s in result["ops"].items():
        t, r = s["time_over_committed"], s["committed_first_regret"]
        print(f"{op}: {s['points']} (layer call, point) readings, {t['values']} backend times; time over the "
              f"committed: median {t['median']}, p10 {t['p10']}, p90 {t['p90']}; the committed first choice still the "
              f"fastest at {s['committed_first_still_fastest']}; its regret on this reading: geomean {r['geomean']}, "
              f"max {r['max']}, {r['over_1.05']} over 1.05, {r['over_1.10']} over 1.10")
        for c in s["over_1.05"]:
            print(f"  {c['layer']:26} {c['point']:10} committed first {c['committed_first']:14} fastest now "
                  f"{c['fastest_now']:14} regret {c['regret']}")
    for name, c in result.get("cost", {}).items():
        print(f"{name}: {c['timings']} (layer call, point) timings of {', '.join(c['ops'])} in {c['seconds']} s; "
              f"the grid's {c['grid_timings']}: about {c['grid_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
