"""Whether a full sweep can go without some lines of the workload grid, read off the committed timings alone.

    python benchmarks/grid_thinning.py [-o SUMMARY.json] [--workers N]     # CPU, 13 to 20 minutes on 2 cores

A full sm_90 sweep of the grid (matrix/workloads.py BUCKETS) costs more than 30 minutes of one H200: each (layer
call, point) timing costs what the grid's 1/16 sample cost a timing (`SAMPLE`), and the grid has about 11,100 decode
and 4,300 prefill timings. The committed timings hold every point of it, so a thinner grid can be read off them: its
sweep's timings are the committed ones at its own points (`swept`), and every committed point it leaves out is a shape
whose truth is known.

Each interior line of the grid (a decode batch or context, a prefill batch or length, among the lengths of its kind:
`selector_workloads.series`; an axis's first and last values stay, past them a query would be read off one side) is
left out in turn, and the grid less it is scored on two design sets, each point placed as
benchmarks/placement_rules.py places it (`interpolate`) from the thinner grid's timings alone:
- the committed bucket points that grid does not time (the line's own points, and the committed points off the grid:
  the factor-1.2 batches the grid times at a wave's end instead);
- the shape scans' points off it (benchmarks/results/*scan-*.jsonl).
A line can go when leaving it out alone makes no more regrets over 1.10 on either set than the whole grid does.
Those lines are taken most-saving first (ties: the lower geomean on the grid's points), each unless a line next to it
on its axis is taken already (two neighbours gone would leave a gap three steps wide), and the grid less all of them is
scored again.

The judge comes last and chose nothing: the held-out queries (benchmarks/regret.py report's, scored as it scores them)
placed by a selector made from a grid's timings alone (`engine_of`): the whole grid's, and the grid less the first 1,
2, ... of the chosen lines, most saving first, with what a full sweep of each would cost; beside them the generated
selector, which ranks by every committed timing (the off-grid batches too). The grid drops a line only where the
judge holds.

The other way round: the committed decode batches off the grid (`off_grid_batches`: the factor-1.2 batches the grid
times at a wave's end instead) are each added to the whole grid in turn (`with_batches`) and scored on the scans,
without the scanned points at any of those batches (`design`'s `skip`: every grid is scored on the same points). A
batch that alone ends regrets over 1.10 there is one to add (`addable`); the judge scores the grid with the first 1,
2, ... of them, most ended first, and with all of them, each with its sweep's cost. The interpolation band is
derived from how well every point of a grid is read from its neighbours, and it also decides which of cuDNN's
power-of-two timings are read as its fast path, so added points change answers far from them through it (and the noise
band through their rounds). Two controls (`engine_of`'s `bands`) tell the two apart: each grid's points read with the
whole grid's bands, and the whole grid's points read with each grid's bands.

Every selector here reads its noise band (within which two timings tie) from the spread of the rounds of the rows it
is made from (its grid's and the held-out rows), as the generated selector reads every committed row's: a band, not a
ranking.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from attnmatrix.matrix import workloads as W
from attnmatrix.matrix.storage import atomic_write_text

from attnmatrix.selector_workloads import LENGTH_ALIGNMENT, LENGTH_HINT, place

sys.path.insert(0, str(Path(__file__).resolve().parent))
import placement_rules as PR  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)
import regret  # noqa: E402

# kind -> (seconds, timings) of the grid's 1/16 sample swept with every backend and its checks
# (benchmarks/results/README.md, the grid-reread rows): what one (layer call, point) timing costs, on average
SAMPLE = {"decode": (86.6, 676), "prefill": (39.8, 261)}
# a sweep's FA4 warm-up: 55-113 s in the committed sweeps (benchmarks/results/README.md), counted above the longest
FA4_WARM_UP_S = 120
BUDGET_S = 30 * 60  # of one H200, for a full sweep of the grid (matrix/workloads.py)
KINDS = ("decode", "prefill")  # the grids: decode's own, prefill's for prefill and MLA prefill
SCANS = sorted((Path(__file__).resolve().parent / "results").glob("*scan-*.jsonl"), key=lambda f: f.name)


@dataclass(frozen=True, order=True)
class Line:
    kind: str  # "decode", or "prefill" for both prefill ops (`kind_of`)
    axis: str  # "batch" or "length"
    value: int

    def __str__(self) -> str:
        return f"{self.kind} {self.axis} {self.value}"


def kind_of(op: str) -> str:
    return "decode" if op == "decode" else "prefill"


def without(grid: dict[str, tuple], lines) -> dict[str, tuple]:
    """`grid` less every point on one of `lines` (of its op's kind)."""
    gone = {(ln.kind, ln.axis, ln.value) for ln in lines}
    return {op: tuple(p for p in points if (kind_of(op), "batch", p[0]) not in gone
                      and (kind_of(op), "length", p[1]) not in gone) for op, points in grid.items()}


def axis_values(grid: dict[str, tuple], kind: str, axis: str, value: int) -> list[int]:
    """The values of `axis` in `grid`'s points of `kind` that `value` lies among: every batch; the lengths of its kind
    (a multiple of LENGTH_ALIGNMENT or not)."""
    points = grid[kind]
    if axis == "batch":
        return sorted({b for b, _ in points})
    return sorted({n for _, n in points if (n % LENGTH_ALIGNMENT == 0) == (value % LENGTH_ALIGNMENT == 0)})


def interior_lines(grid: dict[str, tuple]) -> list[Line]:
    """Every line of `grid` but an axis's first and last values (of each kind of length)."""
    out = []
    for kind in KINDS:
        for axis, i in (("batch", 0), ("length", 1)):
            for v in sorted({p[i] for p in grid[kind]}):
                values = axis_values(grid, kind, axis, v)
                if values[0] < v < values[-1]:
                    out.append(Line(kind, axis, v))
    return out


def neighbours(line: Line, grid: dict[str, tuple]) -> set[Line]:
    """The lines on either side of `line` on its axis in `grid`."""
    values = axis_values(grid, line.kind, line.axis, line.value)
    i = values.index(line.value)
    return {Line(line.kind, line.axis, values[j]) for j in (i - 1, i + 1) if 0 <= j < len(values)}


def swept(rows: list[dict], grid: dict[str, tuple], layers: dict | None = None) -> list[dict]:
    """The rows a sweep of `grid` would leave: the committed rows, bucket rows only at the points a sweep of `grid`
    times for their layer (`workloads.layer_buckets`: a sliding-window layer's length past its window too, which
    can be a length the grid left out). `layers`: preset layer name -> Layer (default: the presets); a row of a
    layer not among them is kept at `grid`'s own points."""
    layers = {ly.name: ly for ly in W.load_presets()} if layers is None else layers
    points: dict[tuple[str, str], set] = {}

    def kept(r: dict) -> bool:
        key = (r.get("layer"), r["op"])
        if key not in points:
            ly = layers.get(key[0])
            points[key] = set(W.layer_buckets(ly, key[1], grid) if ly is not None else grid[key[1]])
        return (r["batch"], r["length"]) in points[key]

    return [r for r in rows if r.get("set") != "bucket" or kept(r)]


def timings(grid: dict[str, tuple]) -> dict[str, int]:
    """kind -> the (layer call, point) timings of a full sweep of `grid` (`regret.layer_calls` x `layer_buckets`)."""
    out = dict.fromkeys(KINDS, 0)
    for ly, op, _ in regret.layer_calls(W.load_presets()):
        out[kind_of(op)] += len(W.layer_buckets(ly, op, grid))
    return out


def sweep_seconds(counts: dict[str, int]) -> float:
    """What a full sweep of that many timings costs, at the sample's seconds a timing (`SAMPLE`)."""
    return sum(counts[k] * SAMPLE[k][0] / SAMPLE[k][1] for k in KINDS)


def figures(regrets: list[float]) -> dict:
    xs = sorted(regrets)
    return {"points": len(xs), "geomean": round(math.exp(sum(map(math.log, xs)) / len(xs)), 4) if xs else None,
            "max": round(xs[-1], 4) if xs else None, "over_1.10": sum(x > 1.10 for x in xs)}


def pick_regret(order: list[str], truth: dict[str, float]) -> float | None:
    pick = next((b for b in order if b in truth), None)
    return truth[pick] / min(truth.values()) if pick else None


def design(rows: list[dict], dense_cells: dict, grid: dict[str, tuple], scans: list[Path],
           skip: frozenset[int] = frozenset()) -> dict:
    """`grid` scored on the design sets (the module's docstring): {grid_points, scans, timings, sweep_s}. `skip`:
    decode batches whose points neither set scores (grids that differ in them are scored on the same points)."""
    thin = swept(rows, grid)
    band, spread, cells = PR.timed_grid(thin)
    kw = {"graphs": PR.GRAPHS, "paths": PR.PATHS, "whole_tiles": PR.WHOLE_TILES}
    left_out = []
    for key, cell in sorted(dense_cells.items()):
        op = key[1]
        for heads in sorted({r[:2] for r in cell}):
            layer = [r for r in cells.get(key, ()) if r[:2] == heads]
            kept = {(r[2], r[3]) for r in layer}
            for r in cell:
                if r[:2] == heads and (r[2], r[3]) not in kept and not (op == "decode" and r[2] in skip):
                    p = place(layer, op, {"batch_size": r[2], LENGTH_HINT[op]: r[3]}, band, spread, **kw)
                    left_out.append(pick_regret([b for b, _ in p.order], dict(r[5])))
    scanned = []
    for op, b, n, truth, layer, bd, sp, _ in PR.off_grid(thin, scans, (band, spread, cells)):
        if op == "decode" and b in skip:
            continue
        p = place(layer, op, {"batch_size": b, LENGTH_HINT[op]: n}, bd, sp, **kw)
        scanned.append(pick_regret([x for x, _ in p.order], truth))
    counts = timings(grid)
    return {"grid_points": figures([x for x in left_out if x]), "scans": figures([x for x in scanned if x]),
            "timings": counts, "sweep_s": round(sweep_seconds(counts), 1)}


_STATE: dict = {}  # the rows and the dense grid's cells, shared with the worker processes (fork)


def _score_line(line: Line) -> dict:
    return design(_STATE["rows"], _STATE["cells"], without(W.BUCKETS, [line]), _STATE["scans"])


def _judge_less(lines: tuple[Line, ...]) -> dict:
    grid = without(W.BUCKETS, lines)
    return {**judge(_STATE["rows"], engine_of(swept(_STATE["rows"], grid))),
            "sweep_s": round(sweep_seconds(timings(grid)), 1)}


def _score_added(batch: int) -> dict:
    return design(_STATE["rows"], _STATE["cells"], with_batches(W.BUCKETS, [batch]), _STATE["scans"],
                  _STATE["skip"])


def _judge_with(batches: tuple[int, ...], bands: tuple[float, float] | None = None) -> dict:
    grid = with_batches(W.BUCKETS, batches)
    return {**judge(_STATE["rows"], engine_of(swept(_STATE["rows"], grid), bands)),
            "sweep_s": round(sweep_seconds(timings(grid)), 1)}


def droppable(base: dict, scored: dict[Line, dict]) -> list[Line]:
    """The lines whose leaving out alone makes no more regrets over 1.10 on either design set than the whole grid
    does, most saving first (ties: the lower geomean on the grid's points, then the line)."""
    ok = [ln for ln, s in scored.items()
          if all(s[k]["over_1.10"] <= base[k]["over_1.10"] for k in ("grid_points", "scans"))]
    return sorted(ok, key=lambda ln: (scored[ln]["sweep_s"], scored[ln]["grid_points"]["geomean"] or 0, ln))


def choose(candidates: list[Line], grid: dict[str, tuple]) -> list[Line]:
    """Of `candidates` (in order), each unless a neighbour on its axis is taken already."""
    taken: list[Line] = []
    for ln in candidates:
        if not neighbours(ln, grid) & set(taken):
            taken.append(ln)
    return sorted(taken)


def off_grid_batches(rows: list[dict], grid: dict[str, tuple]) -> list[int]:
    """The decode batches the committed bucket timings hold and `grid` does not: the factor-1.2 batches the grid times
    at a wave's end instead."""
    on = {b for b, _ in grid["decode"]}
    return sorted({r["batch"] for r in rows if r.get("set") == "bucket" and r["op"] == "decode"} - on)


def with_batches(grid: dict[str, tuple], batches) -> dict[str, tuple]:
    """`grid` with decode `batches` added at each of its decode lengths, within the grid's cache cap
    (`workloads.decode_grid`)."""
    lengths = sorted({n for _, n in grid["decode"]})
    return {**grid, "decode": tuple(sorted(set(grid["decode"]) | set(W.decode_grid(list(batches), lengths))))}


def addable(base: dict, scored: dict[int, dict]) -> list[int]:
    """The batches whose adding alone makes fewer regrets over 1.10 on the scans (scored without any candidate's
    points) than the grid does, the most ended first (ties: the lower geomean, then the batch)."""
    ok = [b for b, s in scored.items() if s["scans"]["over_1.10"] < base["scans"]["over_1.10"]]
    return sorted(ok, key=lambda b: (scored[b]["scans"]["over_1.10"], scored[b]["scans"]["geomean"] or 0, b))


def engine_of(rows: list[dict], bands: tuple[float, float] | None = None):
    """A selector engine like the generated one (attnmatrix/selector.py), its workload timings read from `rows` alone
    (as generator/capabilities.py `workloads` reads the committed files). `bands`: (the noise band within which two
    timings tie, the interpolation band within which two backends placed between timed points cannot be told apart;
    default: those `rows` give, as the generator derives them). The interpolation band also decides which of cuDNN's
    power-of-two timings are read as its fast path."""
    from attnmatrix import selector
    from attnmatrix.selector_vllm import VllmEngine

    noise, orders = W.bucket_orders(rows)
    timed: dict = {}
    for (arch, *cell), cell_rows in W.selector_rows(orders).items():
        timed.setdefault(arch, {})[tuple(cell)] = tuple(cell_rows)
    band, spread = bands or (noise["p90"] or 1.0, W.interpolation_error(orders)["p90"] or 1.0)
    return VllmEngine({**selector.DATA, "workloads": timed, "workload_band": band,
                       "workload_interpolation_band": spread})


def judge(rows: list[dict], engine=None) -> dict:
    """The held-out queries' regret (benchmarks/regret.py `analyse`) under `engine` (default: the generated
    selector)."""
    from attnmatrix import selector

    engine = engine or selector._ENGINE
    queries = regret.expand(W.latest_calls(rows))
    result = regret.analyse(queries, regret.selector_orders(queries, engine),
                            regret.selector_placements(queries, engine))
    g = result["regret"]
    over = [{k: q[k] for k in ("layer", "op", "shape", "pick", "fastest", "regret")} for q in result["queries"]
            if (q.get("regret") or 0) > 1.10]
    return {**{k: g[k] for k in ("queries", "geomean", "max", "over_1.10", "fresh_draws")}, "over": over,
            "bands": [engine.data.get("workload_band"), engine.data.get("workload_interpolation_band")]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", help="the summary as JSON")
    ap.add_argument("--workers", type=int, default=2, help="processes scoring the lines (default 2)")
    args = ap.parse_args(argv)
    rows = W.load_rows(None)
    extra = off_grid_batches(rows, W.BUCKETS)
    _STATE.update(rows=rows, cells=PR.timed_grid(rows)[2], scans=SCANS, skip=frozenset(extra))
    base = design(rows, _STATE["cells"], W.BUCKETS, SCANS)
    lines = interior_lines(W.BUCKETS)
    print(f"the whole grid: {fmt(base)}", flush=True)
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        scored = {}
        for ln, s in zip(lines, pool.imap(_score_line, lines), strict=True):
            scored[ln] = s
            print(f"  less {ln!s:22} {fmt(s)}", flush=True)
        order = droppable(base, scored)
        taken = choose(order, W.BUCKETS)
        taken.sort(key=order.index)  # most saving first
        union = design(rows, _STATE["cells"], without(W.BUCKETS, taken), SCANS)
        print(f"lines that can go, most saving first: {', '.join(map(str, taken))}\nthe grid less them: {fmt(union)}")
        print("the judge, held-out queries (benchmarks/regret.py report's), each selector's timings alone "
              f"(a full sweep's minutes with FA4's warm-up, {FA4_WARM_UP_S} s, of {BUDGET_S // 60}):", flush=True)
        prefixes = [tuple(taken[:i]) for i in range(len(taken) + 1)]
        curve = pool.map(_judge_less, prefixes)
        base_add = design(rows, _STATE["cells"], W.BUCKETS, SCANS, _STATE["skip"])
        added = dict(zip(extra, pool.map(_score_added, extra), strict=True))
        gain = addable(base_add, added)
        sets = [tuple(gain[:i]) for i in range(1, len(gain) + 1)]
        sets += [tuple(extra)] if tuple(extra) not in sets else []
        with_curve = pool.map(_judge_with, sets)
        # each grid's points read with the whole grid's bands, and the whole grid's with each grid's bands: what the
        # added points end and what the bands their rows narrow end
        whole_bands = tuple(curve[0]["bands"])
        points_alone = pool.starmap(_judge_with, [(bs, whole_bands) for bs in sets])
        bands_alone = pool.starmap(_judge_with, [((), tuple(h["bands"])) for h in with_curve])
    held = {"generated": judge(rows),
            "grid_less": [{"lines": [str(x) for x in p], **h} for p, h in zip(prefixes, curve, strict=True)]}
    g = held["generated"]
    print(f"  the generated selector (every committed timing): {g['queries']} queries, geomean {g['geomean']}, max "
          f"{g['max']}, {g['over_1.10']} over 1.10")
    for p, h in zip(prefixes, curve, strict=True):
        name = f"the grid less {', '.join(map(str, p))}" if p else "the whole grid"
        print(f"  ~{(h['sweep_s'] + FA4_WARM_UP_S) / 60:4.1f} min  geomean {h['geomean']}, max {h['max']}, "
              f"{h['over_1.10']:2} over 1.10: {name}")
    c = base_add["scans"]
    print(f"decode batches the committed timings hold off the grid: {', '.join(map(str, extra))}; on the scans "
          f"without their points ({c['points']}) the whole grid has geomean {c['geomean']}, max {c['max']}, "
          f"{c['over_1.10']} over 1.10 (a sweep's minutes without FA4's warm-up, as above)")
    for b, a in added.items():
        c = a["scans"]
        print(f"  with decode batch {b:<4} {a['timings']['decode']} decode timings, ~{a['sweep_s'] / 60:.1f} min; "
              f"scans: {c['geomean']}, {c['max']}, {c['over_1.10']} over")
    print(f"batches that end regrets over 1.10 on the scans, the most first: {', '.join(map(str, gain)) or 'none'}")
    print(f"the judge, as above (minutes with the warm-up), each grid beside its points read with the whole grid's "
          f"noise and interpolation bands ({whole_bands[0]}, {whole_bands[1]}) and the whole grid's read with its "
          f"bands:")
    for bs, h, pa, ba in zip(sets, with_curve, points_alone, bands_alone, strict=True):
        print(f"  ~{(h['sweep_s'] + FA4_WARM_UP_S) / 60:4.1f} min  geomean {h['geomean']}, max {h['max']}, "
              f"{h['over_1.10']:2} over 1.10: the grid with decode batches {', '.join(map(str, bs))} (bands "
              f"{h['bands'][0]}, {h['bands'][1]}); its points at the whole grid's bands: {pa['over_1.10']} over; the "
              f"whole grid at its bands: {ba['over_1.10']} over")
    held["grid_with"] = [{"batches": list(bs), **h, "its_points_at_the_whole_grids_bands": pa,
                          "the_whole_grid_at_its_bands": ba}
                         for bs, h, pa, ba in zip(sets, with_curve, points_alone, bands_alone, strict=True)]
    result = {"sample_cost": {k: {"seconds": s, "timings": n} for k, (s, n) in SAMPLE.items()},
              "fa4_warm_up_s": FA4_WARM_UP_S, "whole_grid": base, "lines": {str(ln): s for ln, s in scored.items()},
              "can_go": [asdict(ln) for ln in taken], "grid_less_them": union, "held_out": held,
              "added_batches": {"candidates": extra, "whole_grid": base_add,
                                "with": {str(b): a for b, a in added.items()}, "can_add": gain}}
    if args.output:
        atomic_write_text(Path(args.output), json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


def fmt(s: dict) -> str:
    g, c = s["grid_points"], s["scans"]
    return (f"{s['timings']['decode']} decode + {s['timings']['prefill']} prefill timings, ~{s['sweep_s'] / 60:.1f} "
            f"min; grid points left out {g['points']}: geomean {g['geomean']}, max {g['max']}, {g['over_1.10']} over "
            f"1.10; scans {c['points']}: {c['geomean']}, {c['max']}, {c['over_1.10']} over")


if __name__ == "__main__":
    sys.exit(main())
