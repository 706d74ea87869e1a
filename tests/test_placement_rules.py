"""benchmarks/placement_rules.py: rules for placing a query between timed points, compared on the grid alone."""

from __future__ import annotations

from conftest import load_script, sweep_rows


def _rules():
    return load_script("benchmarks/placement_rules.py")


def test_a_hidden_point_is_placed_from_the_cell_around_it_and_scored_against_the_fastest_there():
    R = _rules()
    grid = [(b, n) for b in (1, 2, 4, 8, 16) for n in (512, 1024, 2048, 4096, 8192)]
    assert R.interior(grid)[:2] == [(2, 1024), (2, 2048)] and len(R.interior(grid)) == 9
    assert R.interior(grid + [(2, 600), (4, 600)]) == R.interior(grid)  # 600: a kind of its own, no interior
    rows = [(8, 1, b, n, 1, (("x", 1.0),)) for b, n in grid]
    left = R.without(rows, 4, 2048)
    assert {(r[2], r[3]) for r in left} == {(b, n) for b, n in grid if b != 4 and n != 2048}
    # x is 2x faster everywhere but at (4, 2048), where y is: read off the cell around it, x is every rule's pick
    times = {p: {"x": 1.0, "y": 2.0} for p in grid}
    times[(4, 2048)] = {"x": 3.0, "y": 1.0}
    result = R.compare(sweep_rows(times))
    for rule in R.RULES:
        assert result["rules"][rule]["points"] == 9 and result["rules"][rule]["max"] == 3.0
    assert result["rules"]["interpolate"]["over_1.10"] == result["rules"]["any_length"]["over_1.10"] == 1
    # the anomaly widens the interpolation band (1.73 here): within it, y's worst ratio is the smaller where the
    # cell holds (4, 2048), so least_worst_ratio takes y at some of the points where x is 2x faster
    assert result["rules"]["least_worst_ratio"]["over_1.10"] > 1


def test_any_length_reads_a_length_past_a_multiple_off_the_multiples_too():
    R = _rules()
    # x is fast at multiples of 64 and slow just past them; y the other way round: at 700 tokens (past a multiple)
    # the lengths of its kind (552, 1064) say y, the nearest timed lengths (552, 1024) say x
    per = {512: {"x": 1.0, "y": 1.5}, 552: {"x": 2.0, "y": 1.6}, 1024: {"x": 2.0, "y": 3.0},
           1064: {"x": 4.0, "y": 3.1}, 2048: {"x": 4.0, "y": 6.0}}
    rows = [(8, 1, 1, n, 1, tuple(sorted(t.items(), key=lambda kv: kv[1]))) for n, t in per.items()]
    picks = R.rule_orders(rows, "prefill", 1, 700, 1.01, 1.01)
    assert picks["interpolate"][0] == "y" and picks["any_length"][0] == "x"


def test_least_worst_ratio_takes_the_guess_never_far_from_the_fastest_around():
    R = _rules()
    from attnmatrix.selector_workloads import place

    # around (2, 1024): x is fastest by 8% at three corners and 1.2x slower at the fourth; y is never more than
    # 8% off: interpolated, x is first (by 1.2%), yet both are within the interpolation band
    rows = [(8, 1, b, n, 1, tuple(sorted(per.items(), key=lambda t: t[1]))) for (b, n), per in {
        (1, 512): {"x": 1.0, "y": 1.08}, (1, 2048): {"x": 1.0, "y": 1.08}, (4, 512): {"x": 1.0, "y": 1.08},
        (4, 2048): {"x": 1.2, "y": 1.0}}.items()]
    assert place(rows, "decode", {"batch_size": 2, "context_len": 1024}, 1.01, 1.2).order[0][0] == "x"
    picks = R.rule_orders(rows, "decode", 2, 1024, 1.01, 1.2)
    assert picks["interpolate"] == ["x", "y"] and picks["least_worst_ratio"] == ["y", "x"]
    # where the band separates them, x is no guess and stays the pick
    assert R.rule_orders(rows, "decode", 2, 1024, 1.01, 1.01)["least_worst_ratio"] == ["x", "y"]


def test_the_scans_score_each_rule_at_lengths_the_grid_does_not_hold(tmp_path):
    import json

    R = _rules()
    # the grid: x flat over each 128-token tile, y growing; the scan between 296 and 424 has x fastest past 330
    per = {256: {"x": 0.5, "y": 0.6}, 296: {"x": 1.0, "y": 0.95}, 384: {"x": 1.02, "y": 1.2},
           424: {"x": 2.0, "y": 1.3}, 512: {"x": 2.03, "y": 1.6}}
    call = {"layer": "m:l", "op": "prefill", "outcome": "pass", "arch": "sm_90", "heads_q": 8, "heads_kv": 8,
            "case": "sm_90/x/prefill/bfloat16/128x128/causal"}
    rows = [{**call, "backend": b, "set": "check"} for b in ("x", "y")]
    rows += [{**call, "backend": b, "set": "bucket", "batch": 1, "length": n, "ms": ms, "rounds": [ms, ms * 1.2]}
             for n, t in per.items() for b, ms in t.items()]
    scan = tmp_path / "scan.jsonl"
    checks = [{**call, "backend": b, "set": "check", "outcome": "fail" if b == "z" else "pass"} for b in "xyz"]
    timed = [{**call, "backend": b, "set": "scan", "batch": 1, "length": n, "ms": ms}
             for n, t in {360: {"x": 1.0, "y": 1.1, "z": 0.1}, 296: {"x": 1.0, "y": 0.95}}.items()
             for b, ms in t.items()]
    scan.write_text("".join(json.dumps(r) + "\n" for r in checks + timed))  # a scan file: each backend's check first
    result = R.on_scans(rows, [scan])  # 296 is a grid point: only 360 is scored; z failed its check there
    assert result["interpolate"]["points"] == 1 and result["interpolate"]["max"] == 1.0
    assert result["no_tiles"]["max"] == 1.1  # between 296 and 424, x's step is smeared and y looks faster


def test_a_scan_counts_each_backend_only_in_the_call_the_grid_ranks_it_by(tmp_path):
    import json

    R = _rules()
    call = {"layer": "m:l", "op": "decode", "outcome": "pass", "arch": "sm_90", "heads_q": 8, "heads_kv": 1,
            "case": "sm_90/x/decode/bfloat16/128x128/gqa"}
    grid = [{**call, "backend": "x", "set": "check", "profile": "new"}, {**call, "backend": "y", "set": "check"}]

    def scan_file(name: str, x_profile: str, times: dict[str, float]):
        checks = [{**call, "backend": "x", "set": "check", "profile": x_profile}, {**call, "backend": "y",
                                                                                    "set": "check"}]
        timed = [{**call, "backend": b, "set": "scan", "batch": 5, "length": 2048, "ms": ms} for b, ms in times.items()]
        f = tmp_path / name
        f.write_text("".join(json.dumps(r) + "\n" for r in checks + timed))
        return f

    old = scan_file("scan-a.jsonl", "old", {"x": 1.0, "y": 2.0})
    new = scan_file("vllm-step-scan-b.jsonl", "new", {"x": 3.0, "y": 2.5})
    # x's earlier call is left out of the old scan; the later scan's readings replace the earlier ones
    truth = R.scan_truth(grid, [old])
    assert [dict(t) for t in truth.values()] == [{"y": 2.0}]
    assert list(R.scan_truth(grid, [old, new]).values()) == [{"x": 3.0, "y": 2.5}]
    assert next(iter(truth))[3:] == (5, 2048)


def test_no_graphs_interpolates_a_backend_the_selector_reads_in_its_cuda_graph():
    R = _rules()
    from attnmatrix.matrix.vllm_graphs import capture_sizes

    # `step` is flat over the graph of 8 (5..8) and steps up from 4; `grow` grows with the batch: at batch 5 the
    # graph reading sees step's step, interpolation between 4 and 6 does not
    rows = [(8, 1, b, n, 1, tuple(sorted((("step", s), ("grow", g)), key=lambda t: t[1])))
            for b, s, g in ((4, 1.0, 1.2), (6, 2.0, 1.8), (8, 2.0, 2.4)) for n in (1024, 2048)]
    picks = R.rule_orders(rows, "decode", 5, 1500, 1.01, 1.01, graphs={"step": tuple(capture_sizes())})
    assert picks["interpolate"][0] == "grow" and picks["no_graphs"][0] == "step"
    assert R.rule_orders(rows, "decode", 5, 1500, 1.01, 1.01, graphs={})["interpolate"][0] == "step"
    assert set(R.RULES) == set(picks)


def test_no_fast_paths_interpolates_through_a_power_of_two_fast_path(monkeypatch):
    R = _rules()
    # `fast` takes a fast path at 1024 tokens; `even` grows evenly: at 880 the selector reads fast from 768 and 1536
    times = {768: (12.0, 11.0), 1024: (9.0, 11.3), 1536: (13.0, 12.0)}
    rows = [(4, 1, b, n, 1, tuple(sorted((("fast", f), ("even", e)), key=lambda t: t[1])))
            for b in (1, 2) for n, (f, e) in times.items()]
    monkeypatch.setattr(R, "PATHS", ("fast",))
    picks = R.rule_orders(rows, "decode", 1, 880, 1.01, 1.1, graphs={})
    assert picks["interpolate"][0] == "even" and picks["no_fast_paths"][0] == "fast"
    assert R.PATHS == ("fast",) and set(R.RULES) == set(picks)


def test_no_whole_tiles_interpolates_a_whole_tile_backend_and_whole_tiles_mla_reads_mla_prefill_so(monkeypatch):
    R = _rules()

    # `tiles` takes 1.0 per 128-token tile; `smooth` grows with the length: at 619 (five tiles, read between 552
    # and 808, five and seven) the selector reads tiles at its tile's end, 640
    def tiles(n):
        return float(-(-n // 128))

    rows = [(8, 8, b, n, 1, tuple(sorted((("tiles", b * tiles(n)), ("smooth", b * n / 118)), key=lambda t: t[1])))
            for b in (32, 48) for n in (512, 552, 768, 808)]
    monkeypatch.setattr(R, "WHOLE_TILES", ("tiles",))
    picks = R.rule_orders(rows, "prefill", 40, 619, 1.01, 1.1, graphs={})
    assert picks["interpolate"][0] == "tiles" and picks["no_whole_tiles"][0] == "smooth"
    mla = R.rule_orders(rows, "mla_prefill", 40, 619, 1.01, 1.1, graphs={})
    assert mla["interpolate"][0] == "smooth" and mla["whole_tiles_mla"][0] == "tiles"
    assert set(R.RULES) == set(picks)


def test_fa4_waves_reads_fa4_at_the_timed_batch_of_its_wave():
    R = _rules()
    from attnmatrix.selector_workloads import place

    # 8 KV heads a sequence: a wave of 132 SMs holds 16 sequences, the next up to 33. fa4 steps from one wave at 16
    # to two at 17 and is flat after; `grow` grows with the batch: interpolated between 16 and 20, fa4 looks faster
    # at 17 than it is; read at 20, the first timed batch of its wave, it is not
    rows = [(32, 8, b, n, 1, tuple(sorted((("fa4", f), ("grow", g)), key=lambda t: t[1])))
            for b, f, g in ((16, 1.0, 1.2), (20, 1.8, 1.5), (24, 2.1, 1.8)) for n in (4096, 6144)]
    picks = R.rule_orders(rows, "decode", 17, 5218, 1.01, 1.01, graphs={})
    assert picks["interpolate"][0] == "fa4" and picks["fa4_waves"][0] == "grow"
    waves = {"fa4": R.W.wave_ends(8, 256)}
    hints = {"batch_size": 17, "context_len": 5218}
    assert place(rows, "decode", hints, graphs=waves).graphed == (("fa4", 20),)
    # between two timed batches of one wave (20 and 24) it is interpolated like the others
    assert place(rows, "decode", {**hints, "batch_size": 22}, graphs=waves).graphed == ()


def test_fa3_split_waves_reads_vllm_fa3_slower_where_its_split_rule_adds_a_wave():
    R = _rules()
    fa3 = R.fa3

    # gemma-2-2b's global layer (4 KV heads, head dim 256) at 13017 tokens: FA3's rule runs 7 sequences in two waves,
    # 6 and 8 in one; vllm_fa3 is 2% faster than fa2 at both timed batches
    def waves(b, n):
        return fa3.waves(b, 4, n, 256, None)

    rows = [(8, 4, b, n, 1, (("vllm_fa3", 1.00 * b), ("fa2", 1.02 * b))) for b in (6, 8) for n in (12288, 16384)]
    picks = R.rule_orders(rows, "decode", 7, 13017, 1.01, 1.01, waves=waves, step=1.3)
    assert picks["interpolate"][0] == "vllm_fa3" and picks["fa3_split_waves"] == ["fa2", "vllm_fa3"]
    # where the rule adds no wave (batch 6 against 4 and 8), or without the rule, the order is interpolation's
    rows = [(8, 4, b, n, 1, (("vllm_fa3", 1.00 * b), ("fa2", 1.02 * b))) for b in (4, 8) for n in (12288, 16384)]
    at_6 = R.rule_orders(rows, "decode", 6, 13017, 1.01, 1.01, waves=waves, step=1.3)
    assert at_6["fa3_split_waves"][0] == "vllm_fa3"
    assert R.rule_orders(rows, "decode", 7, 13017, 1.01, 1.01, step=1.3)["fa3_split_waves"][0] == "vllm_fa3"
    assert R.wave_step() > 1.0  # read from the committed summary of the batch scans


def test_the_scans_say_how_far_vllm_fa3_is_misread_where_its_split_rule_adds_a_wave(tmp_path, monkeypatch):
    import json

    R = _rules()

    class Layer:  # gemma-2-2b's global layer: FA3's rule runs 7 sequences at 13017 tokens in two waves, 6 and 8 in one
        name, heads_kv, head_dim, window = "m:l", 4, 256, None

    monkeypatch.setattr(R.W, "load_presets", lambda: [Layer])
    call = {"layer": "m:l", "op": "decode", "outcome": "pass", "arch": "sm_90", "heads_q": 8, "heads_kv": 4,
            "case": "sm_90/x/decode/bfloat16/256x256/gqa"}
    rows = [{**call, "backend": b, "set": "check"} for b in ("vllm_fa3", "fa2")]
    rows += [{**call, "backend": b, "set": "bucket", "batch": batch, "length": n, "ms": ms * batch,
              "rounds": [ms * batch] * 2}
             for batch in (6, 8) for n in (12288, 16384) for b, ms in (("vllm_fa3", 1.0), ("fa2", 1.02))]
    # scanned at 7 sequences: vllm_fa3 1.5x its reading, fa2 as read; at 6 (a grid batch, 13017 tokens) no wave added
    checks = [{**call, "backend": b, "set": "check"} for b in ("vllm_fa3", "fa2")]
    timed = [{**call, "backend": b, "set": "scan", "batch": 7, "length": 13017, "ms": ms}
             for b, ms in (("vllm_fa3", 1.5 * 7), ("fa2", 1.02 * 7))]
    timed += [{**call, "backend": b, "set": "scan", "batch": 6, "length": 13017, "ms": ms * 6}
              for b, ms in (("vllm_fa3", 1.0), ("fa2", 1.02))]
    scan = tmp_path / "scan.jsonl"
    scan.write_text("".join(json.dumps(r) + "\n" for r in checks + timed))
    out = R.wave_misreads(rows, [scan])
    assert out["points"] == 1
    assert out["vllm_fa3"]["median"] == 1.5 and out["others"]["median"] == 1.0
    assert out["vllm_fa3_over_others"]["median"] == 1.5
    # and the rule's pick there is fa2, interpolation's vllm_fa3
    regrets = R.on_scans(rows, [scan])
    assert regrets["interpolate"]["max"] > 1.4 and regrets["fa3_split_waves"]["max"] == 1.0
    assert regrets["fa3_split_waves"]["against_interpolate"] == {"changed": 1, "fixed": 1, "new": 0}
    assert regrets["no_tiles"]["against_interpolate"] == {"changed": 0, "fixed": 0, "new": 0}
