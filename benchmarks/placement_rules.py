"""How well rules for placing a hinted query between timed points would do, read off the committed timings alone.

    python benchmarks/placement_rules.py [FILES ...] [-o SUMMARY.json]      # CPU, seconds

Every interior bucket point of the workload grid (one with timed neighbours on either side on both axes, among the
lengths of its kind: `selector_workloads.series`) is hidden in turn, with its layer's other points at its batch or
its length (`without`), and placed from the rest by each rule: from the grid cell around it, as a query between
timed points is placed. Its first choice is scored against the fastest backend timed there (regret, as
benchmarks/regret.py scores the held-out shapes). The cell's corners are two grid steps apart, so the figures are
those of a grid half as dense: they compare rules, they do not predict the held-out regret. A rule is chosen here,
on the grid, and judged once on the held-out shapes by `regret.py report`.

Rules:
- `interpolate`: the selector's (`selector_workloads.place`): each backend's time interpolated in log space from
  the points around, the fastest first.
- `least_worst_ratio`: of the backends within the interpolation band of the fastest (those `explain` calls a
  guess), the one whose worst ratio to the fastest at the points around is smallest.
- `any_length`: `interpolate` from every timed length around the query, whether a multiple of 64 or not.
- `no_tiles`: `interpolate` without reading a backend whose time is flat over the query's 128-token tile off that
  tile (`selector_workloads.tile_readings`).
- `no_fast_paths`: `interpolate` without leaving out the timed power-of-two decode lengths where a backend that
  declares such a fast path (backends.json `fast_path_at_powers_of_two`: cuDNN) ran it
  (`selector_workloads.fast_path_readings`).
- `no_whole_tiles`: `interpolate` without reading a backend that computes a prefill's keys in whole 128-token tiles
  (backends.json `prefill_in_whole_tiles`: cuDNN) at the end of the query's tile
  (`selector_workloads.tile_end_readings`); MLA prefill is not read so (`selector_workloads.WHOLE_TILE_OPS`), and the
  line `whole_tiles_mla` scores reading it so there too.
- `no_graphs`: `interpolate` without reading a backend whose decode split follows vLLM's captured batch (backends.json
  `splits_see_graph_batch`) in the query's CUDA graph (`selector_workloads.graph_readings`).
- `graphs_all_vllm`: `interpolate` with every vLLM FlashAttention build read in the query's CUDA graph, vLLM's FA3
  build too (whose schedule is planned from the step's own lengths: kernels/vllm_fa.py).
- `fa3_split_waves`: `interpolate`, with vllm_fa3 read slower at a decode query that FA3's own split rule
  (benchmarks/fa3_split_waves.py `waves`) puts in more waves of thread blocks than every timed point around it: by
  the time one more wave costs it, per wave more (the median ratio of its time one sequence up where the rule adds
  a wave, read from the committed summary `fa3_split_waves.SUMMARY`).
- `fa4_waves`: `interpolate`, with fa4 read in the query's wave of thread blocks at decode, as a backend is read in
  the query's CUDA graph (`selector_workloads.graph_readings`). On sm_90 FA4 runs a decode step unsplit, one
  thread block per KV head of a sequence (query heads packed with their KV head), one block per SM (flash-attn-4
  4.0.0b36 flash_attn/cute/interface.py:1631 "SplitKV not supported on SM 9.0", :1000-1001 pack_gqa, :411-413 the
  blocks; flash_fwd_sm90.py:403 min_blocks_per_mp=1 with 384 threads of 128-168 registers), so its time is about
  flat over the batches one wave of SMs holds and steps where batch x KV heads passes a multiple of the SM count
  (`workloads.wave_ends`). No parameter is fitted.

The grid alone cannot judge `no_tiles`: a hidden point's tile loses the very length the tile reading needs. The
shape scans can (`--scans`, benchmarks/results/*scan-*.jsonl): every scanned point off the grid is placed from the
committed grid, whole, and scored against the scan's own timings there, each backend's only where the scan ran the
call the grid ranks it by (a later scan of a point replaces an earlier one's reading).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from attnmatrix.matrix import workloads as W
from attnmatrix.matrix.backends import backends, power_of_two_paths, whole_tile_backends
from attnmatrix.matrix.storage import atomic_write_text
from attnmatrix.matrix.vllm_graphs import capture_sizes, declared_graph_batches

from attnmatrix.selector_workloads import LENGTH_HINT, WHOLE_TILE_OPS, place, series

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fa3_split_waves as fa3  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

RULES = ("interpolate", "least_worst_ratio", "any_length", "no_tiles", "no_fast_paths", "no_whole_tiles",
         "whole_tiles_mla", "no_graphs", "graphs_all_vllm", "fa3_split_waves", "fa4_waves")
# The backends read in the query's CUDA graph: as declared (backends.json), and by `graphs_all_vllm`.
GRAPHS = declared_graph_batches()
_DECLARED = {name: info.meta for name, info in backends().items()}
# The backends read without their power-of-two fast path, as declared (backends.json).
PATHS = power_of_two_paths(_DECLARED)
# The backends read at the end of a prefill query's tile, as declared (backends.json).
WHOLE_TILES = whole_tile_backends(_DECLARED)
ALL_VLLM_GRAPHS = {b: tuple(capture_sizes()) for b in ("vllm_fa2", "vllm_fa3", "vllm_fa4")}


def interior(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The points with a neighbour on either side on both axes, among the lengths of their kind."""
    out = []
    for b, n in points:
        kind = series(points, n)
        batches = [p[0] for p in kind if p[1] == n]
        lengths = [p[1] for p in kind if p[0] == b]
        if min(batches) < b < max(batches) and min(lengths) < n < max(lengths):
            out.append((b, n))
    return sorted(out)


def without(rows: list[tuple], batch: int, length: int) -> list[tuple]:
    """A layer's rows less every point at `batch` or at `length`: a point hidden with its grid lines, so it is
    placed from the cell around it, not from its own row and column."""
    return [r for r in rows if r[2] != batch and r[3] != length]


def wave_step() -> float:
    """vllm_fa3's time one sequence up where FA3's split rule adds a wave, over its time before (the committed
    summary's median)."""
    return json.loads(fa3.SUMMARY.read_text(encoding="utf-8"))["by_wave_change"]["1"]["median"]


def layer_waves(rows: list[dict]) -> dict[tuple, Callable[[int, int], int]]:
    """(cell, heads_q, heads_kv) -> (batch, context) -> the waves FA3's split rule runs a decode step of that
    layer in, for every decode layer call the sweep rows name (its preset gives the head dim and the window)."""
    presets = {ly.name: ly for ly in W.load_presets()}
    out = {}
    for r in rows:
        ly = presets.get(r.get("layer"))
        if r.get("op") == "decode" and ly is not None and "case" in r:
            out[(W.cell_of(r["case"]), r["heads_q"], r["heads_kv"])] = (
                lambda b, n, ly=ly: fa3.waves(b, ly.heads_kv, n, ly.head_dim, ly.window))
    return out


def added_waves(waves: Callable[[int, int], int], batch: int, length: int, points) -> int:
    """How many more waves FA3's split rule (`waves`) runs a decode step of (batch, length) in than the most any of
    the timed `points` around it needs: where `fa3_split_waves` reads vllm_fa3 slower."""
    return waves(batch, length) - max(waves(*q) for q in points)


def rule_orders(rows: list[tuple], op: str, batch: int, length: int, band: float, spread: float,
                graphs: dict[str, tuple[int, ...]] = GRAPHS, waves: Callable[[int, int], int] | None = None,
                step: float = 1.0) -> dict[str, list[str]]:
    """Each rule's order at (batch, length), placed from `rows`: its first choice first. `graphs`: the backends
    read in the query's CUDA graph (as declared by default; {}: none); `waves`: (batch, length) -> the waves FA3's
    split rule runs the layer's decode step in, and `step` what one more wave costs vllm_fa3 (`fa3_split_waves`;
    without `waves` that rule is `interpolate`)."""
    hints = {"batch_size": batch, LENGTH_HINT[op]: length}

    def order_of(**kw) -> list[str]:
        return [b for b, _ in place(rows, op, hints, band, spread,
                                    **{"graphs": graphs, "paths": PATHS, "whole_tiles": WHOLE_TILES, **kw}).order]

    p = place(rows, op, hints, band, spread, graphs=graphs, paths=PATHS, whole_tiles=WHOLE_TILES)
    timed = {(r[2], r[3]): dict(r[5]) for r in rows}
    around = [q for q in p.points if q in timed]
    est = dict(p.order)

    def worst(backend: str) -> float:
        return max(timed[q][backend] / min(timed[q].values()) for q in around if backend in timed[q])

    order = [b for b, _ in p.order]
    guess = sorted(order[:p.uncertain], key=lambda b: (worst(b), est[b]))
    more = added_waves(waves, batch, length, p.points) if waves and op == "decode" else 0
    stepped = {**est, fa3.BACKEND: est[fa3.BACKEND] * step ** more} if more > 0 and fa3.BACKEND in est else est
    # fa4 read as a backend is read in its CUDA graph, the ends of its waves standing for the captured sizes
    waves_fa4 = {**graphs, "fa4": W.wave_ends(rows[0][1], max(W.DECODE_BATCHES))} if op == "decode" else graphs
    return {"interpolate": order,
            "least_worst_ratio": guess + order[p.uncertain:],
            "any_length": order_of(by_kind=False),
            "no_tiles": order_of(tiles=False),
            "no_fast_paths": order_of(paths=()),
            "no_whole_tiles": order_of(whole_tiles=()),
            "whole_tiles_mla": order_of(tile_ops=(*WHOLE_TILE_OPS, "mla_prefill")),
            "no_graphs": order_of(graphs={}),
            "graphs_all_vllm": order_of(graphs=ALL_VLLM_GRAPHS),
            "fa3_split_waves": sorted(stepped, key=lambda b: (stepped[b], b)),
            "fa4_waves": order_of(graphs=waves_fa4)}


def summary(regrets: dict[str, list[float]], moves: dict[str, dict[str, int]] | None = None) -> dict:
    out = {}
    for rule, xs in regrets.items():
        xs.sort()
        changed = {} if rule == "interpolate" else {"against_interpolate": (moves or {}).get(
            rule, {"changed": 0, "fixed": 0, "new": 0})}
        out[rule] = {**changed, "points": len(xs),
                     "geomean": round(math.exp(sum(map(math.log, xs)) / len(xs)), 4) if xs else None,
                     "p99": round(xs[int(0.99 * len(xs))], 4) if xs else None,
                     "max": round(xs[-1], 4) if xs else None,
                     "over_1.10": sum(1 for x in xs if x > 1.10)}
    return out


def score(regrets: dict[str, list[float]], orders: dict, truth: dict[str, float],
          moves: dict[str, dict[str, int]] | None = None) -> None:
    """Add each rule's regret at one point: its first choice timed there (a backend not timed: the next) against
    the fastest. `moves`: rule -> counts of the points where its first choice is not `interpolate`'s (`changed`),
    and of those, where it ends a regret over 1.10 (`fixed`) or makes one (`new`)."""
    picks = {rule: next((x for x in order if x in truth), None) for rule, order in orders.items()}
    regret = {rule: truth[x] / min(truth.values()) for rule, x in picks.items() if x is not None}
    for rule, r in regret.items():
        regrets[rule].append(r)
        base = regret.get("interpolate")
        if moves is not None and base is not None and picks[rule] != picks["interpolate"]:
            m = moves.setdefault(rule, {"changed": 0, "fixed": 0, "new": 0})
            m["changed"] += 1
            m["fixed"] += base > 1.10 >= r
            m["new"] += r > 1.10 >= base


def scan_truth(rows: list[dict], scans: list[Path]) -> dict[tuple, dict[str, float]]:
    """(cell, heads_q, heads_kv, batch, length) -> backend -> ms at every scanned point, from the scans in order (a
    later scan's reading of a point replaces an earlier one's), each backend only in the call the grid ranks it by
    (`workloads.in_call`): a scan of a backend's earlier call says nothing of the call the selector answers for."""
    profiles = W.call_profiles(rows)
    timed: dict[tuple, dict[str, float]] = {}
    for f in scans:
        scan = W.load_rows([Path(f)])  # a timed row's shared fields filled back in from its check row
        passed = {(r["backend"], r["layer"]) for r in scan if r["set"] == "check" and r["outcome"] == "pass"}
        for r in scan:
            if (r["set"] == "scan" and r["outcome"] == "pass" and (r["backend"], r["layer"]) in passed
                    and W.in_call(r, profiles)):
                point = (W.cell_of(r["case"]), r["heads_q"], r["heads_kv"], r["batch"], r["length"])
                timed.setdefault(point, {})[r["backend"]] = r["ms"]
    return timed


def timed_grid(rows: list[dict]) -> tuple[float, float, dict[tuple, list[tuple]]]:
    """(the noise band, the interpolation band, the selector's rows per cell) of the committed timings: derived once
    and handed to each comparison (`compare`, `on_scans`, `wave_misreads`)."""
    noise, orders = W.bucket_orders(rows)
    return noise["p90"] or 1.0, W.interpolation_error(orders)["p90"] or 1.0, W.selector_rows(orders)


def off_grid(rows: list[dict], scans: list[Path], grid: tuple | None = None):
    """Every scanned point off the grid whose layer the grid timed, as the rules place it: (op, batch, length, the
    scan's times there, the layer's timed rows, the noise and interpolation bands, the layer's FA3 waves or None).
    `grid`: `timed_grid(rows)`, when already derived."""
    band, spread, cells = grid or timed_grid(rows)
    waves = layer_waves(rows)
    for (cell, hq, hkv, b, n), truth in sorted(scan_truth(rows, scans).items()):
        layer = [r for r in cells.get(cell, ()) if r[:2] == (hq, hkv)]
        if layer and (b, n) not in {(r[2], r[3]) for r in layer}:
            yield cell[1], b, n, truth, layer, band, spread, waves.get((cell, hq, hkv))


def on_scans(rows: list[dict], scans: list[Path], grid: tuple | None = None) -> dict:
    """Per rule: the regret of its first choice at every scanned point off the grid, placed from the whole grid."""
    step = wave_step()
    regrets: dict[str, list[float]] = {r: [] for r in RULES}
    moves: dict[str, dict[str, int]] = {}
    for op, b, n, truth, layer, band, spread, waves in off_grid(rows, scans, grid):
        score(regrets, rule_orders(layer, op, b, n, band, spread, waves=waves, step=step), truth, moves)
    return summary(regrets, moves)


def wave_misreads(rows: list[dict], scans: list[Path], grid: tuple | None = None) -> dict:
    """At the scanned decode points off the grid where FA3's split rule adds a wave over the most any timed point
    around needs (where `fa3_split_waves` reads vllm_fa3 slower): each backend's scanned time over the selector's
    reading of it, vllm_fa3's and the median of the others' at each point, and vllm_fa3's over the others': how
    much of its step the other backends share (median, p10, p90 over the points)."""
    ratios: dict[str, list[float]] = {"vllm_fa3": [], "others": [], "vllm_fa3_over_others": []}
    for op, b, n, truth, layer, band, spread, waves in off_grid(rows, scans, grid):
        if op != "decode" or waves is None:
            continue
        p = place(layer, op, {"batch_size": b, "context_len": n}, band, spread, graphs=GRAPHS, paths=PATHS,
                  whole_tiles=WHOLE_TILES)
        est = dict(p.order)
        others = [truth[x] / est[x] for x in truth if x != fa3.BACKEND and x in est]
        if added_waves(waves, b, n, p.points) > 0 and fa3.BACKEND in truth and fa3.BACKEND in est and others:
            ratios["vllm_fa3"].append(truth[fa3.BACKEND] / est[fa3.BACKEND])
            ratios["others"].append(statistics.median(others))
            ratios["vllm_fa3_over_others"].append(ratios["vllm_fa3"][-1] / ratios["others"][-1])

    return {"points": len(ratios["vllm_fa3"]), **{k: ratio_spread(v) for k, v in ratios.items()}}


def ratio_spread(xs: list[float]) -> dict:
    """{median, p10, p90} of ratios, rounded to 3 places; {} for none."""
    xs = sorted(xs)
    return {"median": round(statistics.median(xs), 3), "p10": round(xs[len(xs) // 10], 3),
            "p90": round(xs[len(xs) * 9 // 10], 3)} if xs else {}


def compare(rows: list[dict], grid: tuple | None = None) -> dict:
    """Per rule: the regret of its first choice at every interior grid point, hidden (geomean, max, p99, over 1.10)."""
    band, spread, cells = grid or timed_grid(rows)
    regrets: dict[str, list[float]] = {r: [] for r in RULES}
    moves: dict[str, dict[str, int]] = {}
    waves, step = layer_waves(rows), wave_step()
    for key, cell in sorted(cells.items()):
        for heads in sorted({r[:2] for r in cell}):  # each timed layer of the cell on its own
            layer = [r for r in cell if r[:2] == heads]
            by_point = {(r[2], r[3]): r for r in layer}
            for b, n in interior(sorted(by_point)):
                here = rule_orders(without(layer, b, n), key[1], b, n, band, spread, waves=waves.get((key, *heads)),
                                   step=step)
                score(regrets, here, dict(by_point[(b, n)][5]), moves)
    return {"bands": {"noise": band, "interpolation": spread}, "rules": summary(regrets, moves)}


def line(rule: str, r: dict) -> str:
    """One rule's figures as `main` prints them."""
    moved = r.get("against_interpolate")
    moved = (f"; against interpolate: {moved['changed']} first choices changed, {moved['fixed']} over 1.10 ended, "
             f"{moved['new']} made") if moved else ""
    return (f"  {rule:18} points {r['points']:5}  regret geomean {r['geomean']}  p99 {r['p99']}  max {r['max']}  "
            f"over 1.10: {r['over_1.10']}{moved}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", help="sweep files (default: the committed ones, matrix/data/workloads)")
    ap.add_argument("-o", "--output", help="the summary as JSON")
    ap.add_argument("--scans", action="store_true", help="also score the rules on the committed shape scans "
                    "(benchmarks/results/*scan-*.jsonl, in name order: a later scan's reading of a point replaces "
                    "an earlier one's)")
    ap.add_argument("--scan", action="append", default=[], metavar="FILE",
                    help="also score the rules on this shape scan (benchmarks/shape_scan.py -o); repeatable")
    args = ap.parse_args(argv)
    rows = W.load_rows([Path(f) for f in args.files] if args.files else None)
    grid = timed_grid(rows)
    result = compare(rows, grid)
    scans = [Path(f) for f in args.scan]
    if args.scans:
        scans += sorted((Path(__file__).parent / "results").glob("*scan-*.jsonl"), key=lambda f: f.name)
    if scans:
        result["scans"] = {"files": [f.name for f in scans], "rules": on_scans(rows, scans, grid),
                           "fa3_added_wave": wave_misreads(rows, scans, grid)}
    if args.output:
        atomic_write_text(Path(args.output), json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"interior grid points hidden in turn with their grid lines, each placed from the cell around it (noise band "
          f"{result['bands']['noise']}, "
          f"interpolation band {result['bands']['interpolation']}):")
    for rule, r in result["rules"].items():
        print(line(rule, r))
    if "scans" in result:
        print(f"the shape scans' points off the grid, each placed from the whole grid "
              f"({', '.join(result['scans']['files'])}):")
        for rule, r in result["scans"]["rules"].items():
            print(line(rule, r))
        w = result["scans"]["fa3_added_wave"]
        if w["points"]:
            print(f"where FA3's split rule adds a wave over every timed point around ({w['points']} scanned decode "
                  f"points), scanned time / the selector's reading: vllm_fa3 median {w['vllm_fa3']['median']}, the "
                  f"others' median {w['others']['median']}; vllm_fa3's over the others' median "
                  f"{w['vllm_fa3_over_others']['median']} (p10 {w['vllm_fa3_over_others']['p10']}, "
                  f"p90 {w['vllm_fa3_over_others']['p90']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
