"""Model-shaped timings: rankings per workload bucket, and the selector's regret on shapes the ranking did not use.

    python benchmarks/regret.py sweep --backends vllm_fa3 -o RUN.jsonl [--shard 0/4]   # GPU
    python benchmarks/regret.py report RUN.jsonl [RUN.jsonl ...] [-o SUMMARY.json]       # CPU

`sweep` takes every layer type of the model presets (matrix/data/models.json) and every op it runs, checks each
backend once against the reference (kernels/reference.py) on a small problem with the layer's head counts, then
times those that passed at the layer's bucket points (matrix/workloads.py `layer_buckets`: the grid's, BUCKETS,
and a sliding-window layer's decode context just past its window) and held-out points (HELD_OUT), in
`--dtype` (bfloat16 by default; one dtype per output file). At each point the backends run on the same inputs and
take turns (kernels/interleaved_timing.py `measure_interleaved`: GPU time per call from a CUDA graph, the L2 flushed
before each replay, `--rounds` rounds each starting from the next backend), so a drift of the GPU's clocks falls on
all of them alike: give `--backends` every backend to compare, in one process. The medians of the even and of the
odd rounds are two readings of one figure; their ratio is the measurement noise (`workloads.noise`), and backends
within its p90 of the fastest tie. A killed sweep resumes after its last finished workload (`done` lines); a
workload it was in the middle of is timed again (with `--new-points-only` into a file among the committed ones, but
the points it had timed), and the last reading of a point counts.

`--ops decode` times the decode calls alone (after a change to how an engine makes them: kernels/vllm_fa.py
`graph_batch`); a backend re-timed in another call ranks by the latest (`workloads.latest_calls`).

FA4 compiles a kernel on its first call at each new configuration: `--warm-only` (with
`FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1`, no `-o`) makes every call once and times nothing; run it in parallel
shards first, and the timing process loads the compiled kernels from the cache.

vLLM's FlashAttention builds (vllm_fa2/3/4) are timed through vLLM's call, the others through their own API
(benchmarks/workload_timing.py); each line says which call ran (`entry`, `profile`). After the grid grows or new
held-out shapes are drawn, `--new-points-only` times only the points the committed files do not hold, into a file
of their own; `--points` names the points to time where the committed files are not at hand.

`report` ranks the backends per (layer, op, dtype, bucket), then asks the generated selector (whose data are the
committed sweep files) at every held-out point with the layer's heads and the point as workload hints, and reports
regret = its first choice's time / the fastest that passed the check, and the time lost per call, per query and as
geomean and max, beside the noise, the first choice without hints and the best of the backends fastest at a bucket
point around the query (`workloads.around`); `bucket` is the nearest bucket point (`workloads.bucket_of`).

Lines (JSON): {"backend", "kernel_version", "layer", "layers", "op", "case", "batch", "length", "set" ("check" |
"bucket" | "held_out"), "outcome", "ms" (median of "rounds": per-call ms, one per round), "calls" (per replay),
"copies" (of the inputs), "method", "note", "reason", "entry", "profile", "heads_q", "heads_kv", "device", "arch"};
after each finished workload {"set": "done", "layer", "op", "backends", "seconds" (its wall time)} (and "sets":
["held_out"] from `--held-out-only`, which times the held-out points alone: `report` on its file alone scores the
committed rankings on a second reading of them; "new_points_only": true from `--new-points-only`). Timed rows leave
out what their check row says (`workloads.compact`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from attnmatrix.matrix import workloads as W
from attnmatrix.matrix.storage import atomic_write_text
from attnmatrix.matrix.workloads import bucket_label, bucket_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workload_timing import DTYPE, time_workload  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

ROOT = Path(__file__).resolve().parent.parent
SETS = ["bucket", "held_out"]  # what a sweep times; `--held-out-only` the second alone


def presets_path(arg: str | None) -> Path:
    return Path(arg) if arg else W.DEFAULT_MODELS


def dtype_of(row: dict) -> str:
    """The dtype a sweep row was timed in: its case's (a timed row has its check row's case once read)."""
    return row["case"].split("/")[3] if row.get("case") else DTYPE


def sweep(args: argparse.Namespace) -> int:
    names = args.backends.split(",")
    from attnmatrix.kernels.base import load_device_backends

    ops = set(args.ops.split(",")) if args.ops else None
    if ops and ops - set(W.BUCKETS):
        raise SystemExit(f"--ops {args.ops}: unknown op(s) {', '.join(sorted(ops - set(W.BUCKETS)))} "
                         f"(known: {', '.join(W.BUCKETS)})")
    sets = ["held_out"] if args.held_out_only else SETS
    layers = W.load_presets(presets_path(args.presets))
    only = parse_points(args.points, ops or set(W.BUCKETS), sets, layers) if args.points is not None else None
    points_key = ",".join(f"{b}x{n}" for b, n in sorted(only)) if only else None  # the `done` rows' form
    backends, device, arch, device_name = load_device_backends(args.backends)
    work = layer_calls(layers, ops)
    i, n = (int(x) for x in args.shard.split("/"))
    work = work[i::n]
    out = Path(args.output) if args.output else None
    done = set()
    if out is not None and out.exists():  # a killed sweep resumes: finished workloads are not timed again
        before = W.load_rows([out])
        other = sorted({dtype_of(r) for r in before if r["set"] == "check"} - {args.dtype})
        if other:  # a timed row is read with its check row, by backend, layer and op: one dtype per file
            raise SystemExit(f"-o {out}: holds {', '.join(other)} timings; a {args.dtype} sweep needs its own file")
        done = {(r["layer"], r["op"]) for r in before if r["set"] == "done" and set(r["backends"]) == set(names)
                and r.get("sets", SETS) == sets and r.get("new_points_only", False) == args.new_points_only
                and r.get("points") == points_key}
    known = committed_points(args.dtype) if args.new_points_only else set()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with (out.open("a", encoding="utf-8") if out is not None else open(os.devnull, "w")) as f:
        checks: dict[tuple, dict] = {}

        def emit(row: dict) -> None:
            key = (row.get("backend"), row.get("layer"), row.get("op"))
            if row["set"] == "check":
                checks[key] = row
            f.write(json.dumps(W.compact(row, checks.get(key)), sort_keys=True) + "\n")
            f.flush()

        for k, (layer, op, same_layers) in enumerate(work, 1):
            if (layer.name, op) in done:
                continue
            points = tuple((kind, tuple(p for p in (W.layer_buckets(layer, op) if kind == "bucket" else W.HELD_OUT[op])
                                        if (layer.name, op, kind, *p) not in known and (only is None or p in only)))
                           for kind in sets)
            if not any(at for _, at in points):
                continue
            started = time.monotonic()
            status = time_workload(backends, layer, op, same_layers, arch, device, device_name, emit, args, points)
            print(f"[{k}/{len(work)}] {layer.name} {op}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
            if status:
                return status
            emit({"set": "done", "layer": layer.name, "op": op, "backends": names,
                  "seconds": round(time.monotonic() - started, 1),
                  **({"sets": sets} if sets != SETS else {}),
                  **({"new_points_only": True} if args.new_points_only else {}),
                  **({"points": points_key} if points_key else {})})
    print(json.dumps({"output": str(out), "seconds": round(time.monotonic() - t0, 1), "workloads": len(work)}))
    return 0


def layer_calls(layers: list, ops: set[str] | None = None) -> list[tuple]:
    """(layer, op, the names of every layer it stands for) per distinct call of the presets' layers, in preset order:
    layers the kernel cannot tell apart (same heads, head dims, features, window, and called alike: vLLM plans FA3's
    schedule only for a model of one window size) are timed once, and the row names every layer it stands for
    (`layers`). `ops`: those ops alone (None: every op)."""
    same: dict[tuple, list[str]] = {}
    work = []
    for ly in layers:
        for op in ly.ops():
            if ops and op not in ops:
                continue
            sig = (op, ly.heads_q, ly.heads_kv, ly.head_dim, ly.head_dim_v, ly.features(op), ly.window,
                   ly.one_window_size)
            if sig not in same:
                same[sig] = []
                work.append((ly, op, same[sig]))
            same[sig].append(ly.name)
    return work


def parse_points(text: str, ops: set[str], sets: list[str], layers: list) -> set[tuple[int, int]]:
    """`--points` ("BATCHxLENGTH,...") as a set of (batch, length), each one a point of `sets` (bucket, held_out)
    of one of `ops` for one of `layers` (`workloads.layer_buckets`): a point the sweep would not time is refused, not
    skipped."""
    out = set()
    for item in text.split(","):
        b, sep, n = item.strip().partition("x")
        if not (sep and b.isdigit() and n.isdigit() and int(b) > 0 and int(n) > 0):
            raise SystemExit(f"--points {text}: {item!r} is not BATCHxLENGTH (e.g. 20x22349)")
        out.add((int(b), int(n)))
    timed = {p for op in ops for kind in sets for ly in layers
             for p in (W.layer_buckets(ly, op) if kind == "bucket" else W.HELD_OUT[op])}
    if out - timed:
        raise SystemExit(f"--points {text}: {', '.join(f'{b}x{n}' for b, n in sorted(out - timed))} is no "
                         f"{' or '.join(sets)} point of {', '.join(sorted(ops))} (matrix/workloads.py "
                         f"layer_buckets, HELD_OUT)")
    return out


def committed_points(dtype: str) -> set[tuple]:
    """(layer, op, set, batch, length) of every point the committed workload files hold a row for in `dtype`:
    what `--new-points-only` leaves out, once the grid or the held-out shapes grow."""
    return {(name, r["op"], r["set"], r["batch"], r["length"]) for r in W.load_rows()
            if r["set"] in SETS and dtype_of(r) == dtype for name in r.get("layers") or [r["layer"]]}


# --- report (CPU) -------------------------------------------------------------------------------------------

def geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def expand(rows: list[dict]) -> list[dict]:
    """One row per layer a timed row stands for (`layers`: layers the kernel cannot tell apart)."""
    return [{**r, "layer": name} for r in rows for name in (r.get("layers") or [r["layer"]])]


def analyse(rows: list[dict], order=None, placement=None) -> dict:
    """Rankings per bucket, the noise band, and the regret of the selector's first choice on held-out points.

    A workload is a layer's op in one dtype. `order(layer, op, batch=None, length=None, dtype=DTYPE)`: the
    selector's order for the layer's cell, with workload hints when a point is given (`selector_orders`); without
    one, the regret is that of the bucket's own first choice. `placement(layer, op, batch, length, dtype)`: the
    selector's Placement there (`selector_placements`), whose backends within the interpolation band of the first
    it says it cannot tell apart."""
    checks = {(r["backend"], r["layer"], r["op"], dtype_of(r)): r for r in rows if r["set"] == "check"}
    ok = {k for k, r in checks.items() if r["outcome"] == "pass"}
    # (layer, op, dtype, set, batch, length) -> backend -> ms
    times: dict[tuple, dict[str, float]] = {}
    for r in rows:
        key = (r.get("backend"), r.get("layer"), r.get("op"), dtype_of(r))
        if r["set"] in ("bucket", "held_out") and r["outcome"] == "pass" and key in ok:
            times.setdefault((*key[1:], r["set"], r["batch"], r["length"]), {})[key[0]] = r["ms"]
    # each timed row once (not once per layer it stands for), of the backends that passed their check
    spread = W.noise([r for r in rows if (r.get("backend"), r.get("layer"), r.get("op"), dtype_of(r)) in ok
                      and r["layer"] == (r.get("layers") or [r["layer"]])[0]])
    band = spread["p90"] or 1.0

    workloads = sorted({(r["layer"], r["op"], dtype_of(r)) for r in rows if r["set"] == "check"})
    bucket_points: dict[tuple, list[tuple[int, int]]] = {}  # the grid's and the layer's own (`layer_buckets`)
    for k in sorted(times):
        if k[3] == "bucket":
            bucket_points.setdefault(k[:3], []).append(k[4:])
    rankings, queries = {}, []
    for layer, op, dtype in workloads:
        name = f"{layer} {op}" + ("" if dtype == DTYPE else f" {dtype}")  # the default dtype's names: no suffix
        for batch, length in bucket_points.get((layer, op, dtype), ()):  # the grid's, and the layer's own
            cands = sorted((t, b) for b, t in times[(layer, op, dtype, "bucket", batch, length)].items())
            best = cands[0][0]
            rankings[f"{name} {bucket_label(op, batch, length)}"] = {
                "order": [[b, round(t, 5)] for t, b in cands],
                "tie_within_noise": [b for t, b in cands if t / best <= band],
            }
        for batch, length in W.HELD_OUT[op]:
            here = times.get((layer, op, dtype, "held_out", batch, length), {})
            if not here:
                continue
            bb, bl = bucket_of(op, batch, length)
            rk = rankings.get(f"{name} {bucket_label(op, bb, bl)}")
            fastest = min(here.values())
            q = {"layer": layer, "op": op, "dtype": dtype, "shape": bucket_label(op, batch, length),
                 "bucket": bucket_label(op, bb, bl), "fastest": min(here, key=here.get), "timed": len(here),
                 "draw": next((d for d, shapes in W.FRESH_DRAWS.items() if (batch, length) in shapes.get(op, ())),
                              None)}
            q["fresh"] = q["draw"] is not None
            if order is not None:
                pick = next((b for b in order(layer, op, batch, length, dtype=dtype) if b in here), None)
                plain = next((b for b in order(layer, op, dtype=dtype) if b in here), None)
                q.update(pick_without_hints=plain,
                         regret_without_hints=round(here[plain] / fastest, 4) if plain else None)
            else:
                pick = next((b for b, _ in rk["order"] if b in here), None) if rk else None
            q.update(pick=pick, regret=round(here[pick] / fastest, 4) if pick else None,
                     lost_us=round((here[pick] - fastest) * 1e3, 2) if pick else None, fastest_ms=fastest)
            # The corner winners' best: of the backends fastest at a bucket point around the query (among those
            # timed here too), the one fastest here. Above 1 where the order at the query is one no point around shows.
            near = [{b: t for b, t in times.get((layer, op, dtype, "bucket", *p), {}).items() if b in here}
                    for p in W.around(op, batch, length)]
            winners = {min(at, key=at.get) for at in near if at}
            q["nearby_winners_best"] = round(min(here[b] for b in winners) / fastest, 4) if winners else None
            if placement is not None:
                placed = placement(layer, op, batch, length, dtype)
                q["uncertain"] = [b for b, _ in placed.order[:placed.uncertain]] if placed else []
            queries.append(q)
    regrets = [q["regret"] for q in queries if q.get("regret")]
    over = [q for q in queries if (q.get("regret") or 0) > 1.10]
    plain = [q["regret_without_hints"] for q in queries if q.get("regret_without_hints")]
    bound = [q["nearby_winners_best"] for q in queries if q.get("nearby_winners_best")]
    # a choice the selector marked as a guess: the fastest was among the backends it could not tell apart
    flagged = [q for q in over if q.get("pick") in q.get("uncertain", ()) and q["fastest"] in q.get("uncertain", ())]
    # the selector's answers split by whether it could tell the backends apart at the shape (one backend within the
    # interpolation band of the first) or marked the order as a guess
    sure = [q["regret"] for q in queries if q.get("regret") and len(q.get("uncertain") or ()) == 1]
    guess = [q["regret"] for q in queries if q.get("regret") and len(q.get("uncertain") or ()) > 1]
    # the shapes drawn at random and fixed before they were timed (workloads.FRESH_DRAWS), each draw apart: a rule
    # chosen after a draw was timed may have been chosen on it, so the latest draw is the one outside every rule
    fresh = [q["regret"] for q in queries if q.get("regret") and q["fresh"]]
    draws = {d: [q["regret"] for q in queries if q.get("regret") and q.get("draw") == d] for d in W.FRESH_DRAWS}
    return {
        "noise": {**spread,
                  "what": "slower/faster of the medians of the even and of the odd rounds of one backend at one "
                          "point (the backends take turns, on the same inputs); backends within p90 of the "
                          "fastest tie"},
        "regret": {"queries": len(regrets), "geomean": _r(geomean(regrets)), "max": max(regrets, default=None),
                   "first_choice_fastest": sum(1 for x in regrets if x == 1.0),
                   "within_noise": sum(1 for x in regrets if x <= band),
                   "unanswered": sum(1 for q in queries if q.get("pick") is None),
                   "over_1.10": len(over),
                   "max_lost_us": max((q["lost_us"] for q in queries if q.get("lost_us") is not None), default=None),
                   "max_lost_us_over_1.10": max((q["lost_us"] for q in over), default=None),
                   "slowest_fastest_ms_over_1.10": max((q["fastest_ms"] for q in over), default=None),
                   "over_1.10_marked_uncertain": len(flagged),
                   "sure": {"queries": len(sure), "geomean": _r(geomean(sure)), "max": max(sure, default=None)},
                   "guess": {"queries": len(guess), "geomean": _r(geomean(guess)), "max": max(guess, default=None)},
                   "fresh": {"queries": len(fresh), "geomean": _r(geomean(fresh)), "max": max(fresh, default=None),
                             "over_1.10": sum(1 for x in fresh if x > 1.10)},
                   "fresh_draws": {d: {"queries": len(xs), "geomean": _r(geomean(xs)), "max": max(xs, default=None),
                                       "over_1.10": sum(1 for x in xs if x > 1.10)} for d, xs in draws.items() if xs},
                   # draws committed after the newest one these files time, untimed here: the judges still to come
                   "pending_draws": pending_draws(draws)},
        "regret_without_hints": {"queries": len(plain), "geomean": _r(geomean(plain)), "max": max(plain, default=None)},
        "nearby_winners_best": {"queries": len(bound), "geomean": _r(geomean(bound)), "max": max(bound, default=None),
                       "over_1.10": sum(1 for x in bound if x > 1.10),
                       "what": "per held-out query, the regret of the best of the backends that are fastest at one of "
                               "the bucket points around it (workloads.around): an oracle that knew which of the "
                               "nearby winners wins at the query; a rule may still pick a backend that wins nowhere "
                               "near and do better"},
        "checks": {f"{b} {ly} {op}" + ("" if dt == DTYPE else f" {dt}"): r["outcome"]
                   + (f": {r['reason']}" if r.get("reason") else "") for (b, ly, op, dt), r in sorted(checks.items())},
        "rankings": rankings,
        "queries": queries,
    }


def pending_draws(draws: dict[str, list[float]]) -> list[str]:
    """The draws (oldest first, as workloads.FRESH_DRAWS) after the newest one with timings, none timed yet. A draw
    counts as timed once any of its queries has a regret: one timed for some of its ops only is not pending."""
    names = list(draws)
    timed = [i for i, d in enumerate(names) if draws[d]]
    return names[timed[-1] + 1:] if timed else names


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def selector_orders(rows: list[dict], engine=None):
    """A function (layer, op, batch, length or None, dtype=) -> the generated selector's order for that layer's
    cell, with the layer's head counts and the point as workload hints (length None: no hints, the order without
    them). `engine`: a selector engine made from other data (default: the generated selector's)."""
    from attnmatrix.matrix.cases import Case

    from attnmatrix import selector
    from attnmatrix.selector_workloads import LENGTH_HINT
    from attnmatrix.vocabulary import query_params_of

    select = (engine or selector._ENGINE).select_backends

    layers = {}
    for r in rows:
        if r["set"] == "check":
            layers.setdefault((r["layer"], r["op"], dtype_of(r)), (Case.from_key(r["case"]), r["heads_q"],
                                                                   r["heads_kv"]))

    def order(layer: str, op: str, batch: int | None = None, length: int | None = None, *,
              dtype: str = DTYPE) -> list[str]:
        c, hq, hkv = layers[(layer, op, dtype)]
        params = query_params_of(c.features)
        params.pop("page_size", None)  # the vLLM profile's cache, not a feature of the layer
        if length is not None:
            params.update(num_heads=hq, num_kv_heads=hkv, batch_size=batch, **{LENGTH_HINT[op]: length})
        major, minor = int(c.arch[3:-1]), int(c.arch[-1])
        return select((major, minor), c.head_dim, c.head_dim_v, op=op, dtype=c.dtype, **params)

    return order


def selector_placements(rows: list[dict], engine=None):
    """A function (layer, op, batch, length, dtype) -> the generated selector's Placement of the layer's backends at
    that point (selector_workloads.place, through the engine the selector's data make), or None. `engine`: as
    `selector_orders`."""
    from attnmatrix.matrix.cases import Case

    from attnmatrix import selector
    from attnmatrix.selector_workloads import LENGTH_HINT

    engine = engine or selector._ENGINE

    layers = {}
    for r in rows:
        if r["set"] == "check":
            layers.setdefault((r["layer"], r["op"], dtype_of(r)), (Case.from_key(r["case"]), r["heads_q"],
                                                                   r["heads_kv"]))

    def placement(layer: str, op: str, batch: int, length: int, dtype: str = DTYPE):
        c, hq, hkv = layers[(layer, op, dtype)]
        feats = tuple(t for t in c.features if not t.startswith("paged_kv:"))
        hints = {"num_heads": hq, "num_kv_heads": hkv, "batch_size": batch, LENGTH_HINT[op]: length}
        return engine.workload_order(c.arch, op, c.dtype, c.head_dim, c.head_dim_v, feats, hints)

    return placement


def report(args: argparse.Namespace) -> int:
    files = [Path(f) for f in args.files] if args.files else sorted(W.WORKLOADS_DIR.glob("*.jsonl"))
    rows = expand(W.latest_calls(W.load_rows(files)))
    placement = selector_placements(rows)
    result = analyse(rows, selector_orders(rows), placement)
    result["files"] = [str(f.resolve().relative_to(ROOT)) if f.resolve().is_relative_to(ROOT) else str(f)
                       for f in files]
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    if args.output:
        atomic_write_text(Path(args.output), text)
    s = result
    n = s["noise"]
    print(f"measurement noise (even vs odd rounds): median {n['median']:.3f}, p90 {n['p90']:.3f}, max {n['max']:.3f} "
          f"({s['noise']['points']} points)")
    g = s["regret"]
    print(f"regret, selector with workload hints: geomean {g['geomean']}, max {g['max']} over {g['queries']} "
          f"held-out queries ({g['unanswered']} unanswered; {g['first_choice_fastest']} fastest, {g['within_noise']} "
          f"within noise; {g['over_1.10']} over 1.10"
          + (f", where the fastest took at most {g['slowest_fastest_ms_over_1.10']} ms and at most "
             f"{g['max_lost_us_over_1.10']} us was lost per call" if g["over_1.10"] else "")
          + f"; at most {g['max_lost_us']} us lost per call over all"
          + (f"; {g['over_1.10_marked_uncertain']} of the {g['over_1.10']} marked as a guess: the fastest within the "
             f"selector's interpolation band of its pick" if g["over_1.10"] else "") + ")")
    if placement is not None:
        sure, guess = g["sure"], g["guess"]
        print(f"  where it could tell the backends apart ({sure['queries']} queries): geomean {sure['geomean']}, max "
              f"{sure['max']}; where it marked its order a guess ({guess['queries']}): geomean {guess['geomean']}, "
              f"max {guess['max']}")
    if g["fresh"]["queries"]:
        f = g["fresh"]
        print(f"  on the shapes drawn at random before they were timed ({f['queries']} queries, "
              f"workloads.FRESH_DRAWS): geomean {f['geomean']}, max "
              f"{f['max']}, {f['over_1.10']} over 1.10")
        for d, x in g["fresh_draws"].items():
            print(f"    drawn {d} ({x['queries']} queries): geomean {x['geomean']}, max {x['max']}, "
                  f"{x['over_1.10']} over 1.10")
        for d in g.get("pending_draws", ()):
            print(f"    drawn {d}: no timings in these files (its shapes judge the rules chosen before it was drawn)")
    print(f"regret, selector without hints:  geomean {s['regret_without_hints']['geomean']}, "
          f"max {s['regret_without_hints']['max']}")
    b = s["nearby_winners_best"]
    if b["queries"]:  # a file of held-out points alone (`--held-out-only`) has no bucket points around them
        print(f"the nearby winners' best (of the backends fastest at a bucket point around each query, the fastest "
              f"at it): geomean {b['geomean']}, max {b['max']} over {b['queries']} queries ({b['over_1.10']} over "
              f"1.10)")
    for q in result["queries"]:
        print(f"  {q['layer']:24} {q['op']:11} {q['shape']:12} bucket {q['bucket']:12} pick {q.get('pick')!s:14} "
              f"regret {q.get('regret')!s:7} ({q.get('lost_us')!s:>6} us) fastest {q['fastest']:14} "
              f"no-hints {q.get('pick_without_hints')!s:14} "
              f"{q.get('regret_without_hints')!s:7} nearby-winners {q.get('nearby_winners_best')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sweep", help="GPU: check and time the backends on the presets' workloads")
    s.add_argument("--backends", required=True, help="comma-separated, timed one after another")
    s.add_argument("-o", "--output", help="JSON Lines, appended to; a workload already finished there (its `done` "
                   "line, same backends) is not timed again, so a killed sweep resumes")
    s.add_argument("--presets", help=f"models file (default matrix/data/{W.DEFAULT_MODELS.name})")
    s.add_argument("--ops", help="comma-separated: time only the layers' calls of these ops (e.g. decode, after "
                   "a change to one op's call); default every op a layer runs")
    s.add_argument("--shard", default="0/1", help="i/n: this process takes every n-th workload from i")
    s.add_argument("--dtype", choices=("bfloat16", "float16"), default=DTYPE, help="one dtype per output file")
    s.add_argument("--rounds", type=int, default=6,
                   help="rounds of turns per point, at least 2 (each backend once per round)")
    s.add_argument("--held-out-only", action="store_true",
                   help="time the held-out points only: a second reading of the regret on another run or GPU, "
                        "reported (`report FILE`) against the rankings of the committed sweep files")
    s.add_argument("--new-points-only", action="store_true",
                   help="time only the points no committed workload file (matrix/data/workloads) holds in this "
                        "dtype: the points a denser grid or new held-out shapes add, into a file of their own")
    s.add_argument("--points", metavar="BxL,...", help="time only these (batch, length) points of the grid and the "
                   "held-out shapes (e.g. a new draw of fresh shapes: 20x22349,22x5304), on a machine without the "
                   "committed workload files that --new-points-only reads")
    s.add_argument("--warm-only", action="store_true",
                   help="check and call every backend at every point without timing: fills FA4's kernel cache "
                        "(FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1) from parallel shards before one process times")
    r = sub.add_parser("report", help="rankings per bucket and regret on held-out points, from sweep files")
    r.add_argument("files", nargs="*", help="sweep files (default: the committed ones, matrix/data/workloads)")
    r.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    if args.cmd == "sweep" and bool(args.output) == bool(args.warm_only):
        ap.error("sweep: -o/--output is required, except with --warm-only, which times and writes nothing")
    if args.cmd == "sweep" and args.rounds < 2:
        ap.error("sweep: --rounds must be at least 2 (the even and the odd rounds are the noise's two readings)")
    return sweep(args) if args.cmd == "sweep" else report(args)


if __name__ == "__main__":
    sys.exit(main())
