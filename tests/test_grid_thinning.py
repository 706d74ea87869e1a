"""benchmarks/grid_thinning.py: which lines of the workload grid a sweep could go without, on the CPU."""

from __future__ import annotations

import itertools

from attnmatrix.matrix import workloads as W
from conftest import load_script, sweep_rows


def _thinning():
    return load_script("benchmarks/grid_thinning.py")


def _grid(batches, decode_lengths, prefill_lengths) -> dict[str, tuple]:
    prefill = tuple(itertools.product(batches, prefill_lengths))
    return {"decode": tuple(itertools.product(batches, decode_lengths)), "prefill": prefill, "mla_prefill": prefill}


def test_an_axis_keeps_its_ends_and_a_length_its_neighbours_of_its_own_kind():
    T = _thinning()
    L = T.Line
    grid = _grid((1, 2, 4, 8), (512, 1024, 2048), (256, 296, 512, 552, 1024, 1064))
    assert T.interior_lines(grid) == [L("decode", "batch", 2), L("decode", "batch", 4), L("decode", "length", 1024),
                                      L("prefill", "batch", 2), L("prefill", "batch", 4),
                                      L("prefill", "length", 512), L("prefill", "length", 552)]
    # 552's neighbours are the other lengths past a multiple of 64, not 512 and 1024
    assert T.neighbours(L("prefill", "length", 552), grid) == {L("prefill", "length", 296),
                                                               L("prefill", "length", 1064)}
    assert T.neighbours(L("decode", "batch", 1), grid) == {L("decode", "batch", 2)}
    less = T.without(grid, [L("prefill", "length", 552), L("decode", "batch", 2)])
    assert (1, 552) not in less["prefill"] and less["mla_prefill"] == less["prefill"]  # both prefill ops share it
    assert {b for b, _ in less["decode"]} == {1, 4, 8} and len(less["prefill"]) == 4 * 5


def test_lines_are_taken_most_saving_first_and_never_two_neighbours():
    T = _thinning()
    L = T.Line
    grid = _grid((1, 2, 4, 8, 16), (512, 1024, 2048, 4096), (256, 512))

    def figures(sweep_s, over, scans_over=0, geomean=1.001):
        return {"sweep_s": sweep_s, "grid_points": {"over_1.10": over, "geomean": geomean},
                "scans": {"over_1.10": scans_over}}

    base = figures(100, 3, 2)
    scored = {L("decode", "batch", 2): figures(90, 3, 2), L("decode", "batch", 4): figures(80, 3, 2),
              L("decode", "batch", 8): figures(85, 3, 2, 1.0),
              L("decode", "length", 1024): figures(70, 4, 2),  # makes one more miss on the grid's points
              L("decode", "length", 2048): figures(70, 3, 3)}  # and this one on the scans
    order = T.droppable(base, scored)
    assert order == [L("decode", "batch", 4), L("decode", "batch", 8), L("decode", "batch", 2)]
    # as saving: the lower geomean on the grid's points first
    tied = {L("decode", "batch", 2): figures(90, 3, 2, 1.002), L("decode", "batch", 16): figures(90, 3, 2, 1.001)}
    assert T.droppable(base, tied) == [L("decode", "batch", 16), L("decode", "batch", 2)]
    # 4 first; 8 and 2 are its neighbours
    assert T.choose(order, grid) == [L("decode", "batch", 4)]
    assert T.choose([L("decode", "batch", 2), L("decode", "batch", 8)], grid) == [L("decode", "batch", 2),
                                                                                  L("decode", "batch", 8)]


def test_a_line_that_alone_shows_a_step_cannot_go_and_a_smooth_one_can(monkeypatch):
    T = _thinning()
    L = T.Line
    grid = _grid((1, 2, 4, 8, 16, 32), (512, 1024, 2048, 4096, 8192), (256, 512))
    monkeypatch.setattr(W, "BUCKETS", grid)
    # x is 2x faster everywhere but at batch 4, where y is 3x faster: a kernel's step seen on one batch alone
    times = {p: ({"x": 3.0, "y": 1.0} if p[0] == 4 else {"x": 1.0, "y": 2.0}) for p in grid["decode"]}
    rows = sweep_rows(times)
    cells = T.PR.timed_grid(rows)[2]
    whole = T.design(rows, cells, grid, [])
    assert whole["grid_points"]["points"] == 0  # the whole grid leaves nothing out
    step = T.design(rows, cells, T.without(grid, [L("decode", "batch", 4)]), [])
    assert step["grid_points"] == {"points": 5, "geomean": 3.0, "max": 3.0, "over_1.10": 5}
    # batch 16, read between 8 and 32, is as smooth as they are (batch 8, read between 4 and 16, is not)
    smooth = T.design(rows, cells, T.without(grid, [L("decode", "batch", 16)]), [])
    assert smooth["grid_points"]["points"] == 5 and smooth["grid_points"]["max"] == 1.0
    assert smooth["timings"]["decode"] < whole["timings"]["decode"] and smooth["sweep_s"] < whole["sweep_s"]


def test_a_sweep_of_a_thinner_grid_keeps_each_layers_own_points(monkeypatch):
    T = _thinning()
    grid = _grid((1, 2, 4), (512, 1024, 2048, 4096), (256,))
    monkeypatch.setattr(W, "BUCKETS", grid)
    layers = {ly.name: ly for ly in W.load_presets()}
    full, windowed = layers["llama-3.1-8b:full"], layers["phi-3-medium-4k:sliding"]  # no window; a window of 2047
    assert windowed.window == 2047 and W.past_window(2047, grid) is None  # 2048, a grid length, is past it already

    def bucket(layer, b, n):
        return {"set": "bucket", "op": "decode", "layer": layer, "batch": b, "length": n}

    rows = [bucket(ly, b, n) for ly in (full.name, windowed.name) for b, n in grid["decode"]]
    rows += [bucket(full.name, 3, 1024),  # a committed batch off the grid
             {"set": "held_out", "op": "decode", "batch": 3, "length": 700}, {"set": "check", "op": "decode"}]
    # without batch 2 and context 2048: 2048 is now the window's first length past it, timed for that layer alone
    less = T.without(grid, [T.Line("decode", "batch", 2), T.Line("decode", "length", 2048)])
    kept = T.swept(rows, less, layers)
    at = {(r["layer"], r["batch"], r["length"]) for r in kept if r["set"] == "bucket"}
    assert {(b, n) for ly, b, n in at if ly == full.name} == {(b, n) for b in (1, 4) for n in (512, 1024, 4096)}
    assert {(b, n) for ly, b, n in at if ly == windowed.name} == {(b, n) for b in (1, 4) for n in (512, 1024, 2048,
                                                                                                   4096)}
    assert sum(r["set"] != "bucket" for r in kept) == 2  # the other rows stay
    # a row of a layer no preset names is kept at the grid's own points
    assert T.swept([bucket("x:y", 1, 2048), bucket("x:y", 1, 512)], less, layers) == [bucket("x:y", 1, 512)]


def test_the_whole_grid_costs_what_the_sample_says():
    T = _thinning()
    G = load_script("benchmarks/grid_reread.py")
    counts = T.timings(W.BUCKETS)
    assert counts == {"decode": 11104, "prefill": 4263}  # the presets' layer calls at their bucket points
    assert counts == {"decode": G.grid_timings({"decode"}), "prefill": G.grid_timings({"prefill", "mla_prefill"})}
    # the sample's seconds a timing, scaled: its own timings cost what it took
    assert round(T.sweep_seconds({"decode": 676, "prefill": 261}), 1) == 126.4
    less = T.timings(T.without(W.BUCKETS, [T.Line("decode", "length", 3072)]))
    assert less["prefill"] == counts["prefill"] and less["decode"] < counts["decode"]


def test_a_committed_batch_off_the_grid_is_added_where_it_ends_misses_on_the_same_scanned_points(tmp_path,
                                                                                                   monkeypatch):
    import json

    T = _thinning()
    grid = _grid((1, 2, 8, 16), (512, 1024, 2048), (256,))
    monkeypatch.setattr(W, "BUCKETS", grid)
    # y is 3x faster than x at 4 and 5 sequences (a step the grid's batches 2 and 8 do not show); 4 is committed
    # off the grid, as the factor-1.2 batches are
    def at(b):
        return {"x": 3.0, "y": 1.0} if b in (4, 5) else {"x": 1.0, "y": 2.0}

    rows = sweep_rows({(b, n): at(b) for b in (1, 2, 4, 8, 16) for n in (512, 1024, 2048)})
    assert T.off_grid_batches(rows, grid) == [4]
    plus = T.with_batches(grid, [4])
    assert {p for p in plus["decode"] if p[0] == 4} == {(4, 512), (4, 1024), (4, 2048)}
    assert plus["prefill"] == grid["prefill"] and set(grid["decode"]) < set(plus["decode"])
    scan = tmp_path / "scan.jsonl"
    call = {k: rows[0][k] for k in ("layer", "op", "outcome", "arch", "heads_q", "heads_kv", "case")}
    lines = [{**call, "backend": b, "set": "check"} for b in ("x", "y")]
    lines += [{**call, "backend": b, "set": "scan", "batch": sb, "length": 1024, "ms": ms}
              for sb in (4, 5) for b, ms in at(sb).items()]
    scan.write_text("".join(json.dumps(r) + "\n" for r in lines))
    cells = T.PR.timed_grid(rows)[2]
    skip = frozenset([4])
    whole = T.design(rows, cells, grid, [scan], skip)
    # the committed batch's points and its scanned point are left out; 5 sequences, read between 2 and 8, picks x
    assert whole["grid_points"]["points"] == 0
    assert whole["scans"] == {"points": 1, "geomean": 3.0, "max": 3.0, "over_1.10": 1}
    added = T.design(rows, cells, plus, [scan], skip)
    assert added["scans"]["points"] == 1 and added["scans"]["over_1.10"] == 0  # read between 4 and 8: y
    assert added["sweep_s"] > whole["sweep_s"]
    # without `skip`, the grid would also be scored at batch 4's scanned point, which the grid with 4 no longer is
    assert T.design(rows, cells, grid, [scan])["scans"]["points"] == 2
    assert T.addable(whole, {4: added}) == [4] and T.addable(whole, {4: whole}) == []


def test_batches_are_added_the_most_ended_first():
    T = _thinning()

    def scans(over, geomean=1.001):
        return {"scans": {"over_1.10": over, "geomean": geomean}}

    base = scans(5)
    scored = {32: scans(3), 48: scans(5), 64: scans(3, 1.0), 80: scans(4), 96: scans(6)}
    assert T.addable(base, scored) == [64, 32, 80]  # 48 ends none, 96 adds one


def test_a_selector_made_from_a_grids_timings_takes_their_interpolation_band_unless_given_one():
    T = _thinning()
    times = {(b, n): {"x": 1.0 + b / 10 + n / 4096, "y": 2.0 * (1 + (b % 3)) * n / 1024}
             for b in (1, 2, 4, 8) for n in (512, 1024, 2048)}
    rows = sweep_rows(times)
    noise, orders = W.bucket_orders(rows)
    derived = (noise["p90"] or 1.0, W.interpolation_error(orders)["p90"] or 1.0)
    data = T.engine_of(rows).data
    assert (data["workload_band"], data["workload_interpolation_band"]) == derived and 1.25 not in derived
    data = T.engine_of(rows, (1.02, 1.25)).data
    assert (data["workload_band"], data["workload_interpolation_band"]) == (1.02, 1.25)


def test_batches_are_added_within_the_grids_cache_cap():
    T = _thinning()
    plus = T.with_batches(W.BUCKETS, [192])
    added = set(plus["decode"]) - set(W.BUCKETS["decode"])
    assert added and {b for b, _ in added} == {192}
    assert all(b * n <= W.DECODE_CACHE_CAP for b, n in plus["decode"])
    assert max(n for _, n in added) == 4096  # 192 x 6144 is past the cap of 1M cached tokens
