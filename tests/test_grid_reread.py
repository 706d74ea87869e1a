"""benchmarks/grid_reread.py: a second reading of grid points against the committed grid, on the CPU."""

from __future__ import annotations

import json

from conftest import load_script


def _reread():
    return load_script("benchmarks/grid_reread.py")


def test_a_sample_is_every_kth_grid_point_from_the_offset():
    G = _reread()
    from attnmatrix.matrix import workloads as W

    grid = sorted(W.BUCKETS["decode"])
    assert G.sample("decode", 16, 5) == grid[5::16] and len(G.sample("decode", 16, 5)) == 26
    assert G.sample("prefill", 1) == sorted(W.BUCKETS["prefill"])


def test_the_second_reading_is_scored_against_the_committed_first_choice():
    G = _reread()
    committed = {("l", "decode", 4, 512): {"a": 1.0, "b": 1.02}, ("l", "decode", 8, 512): {"a": 2.0, "b": 2.5},
                 ("l", "prefill", 4, 512): {"a": 1.0}}
    # at 4 x 512 b is now 1.10x faster than a, the committed first; at 8 x 512 a still is; a point the committed
    # files do not hold, or with no backend in common, is left out
    reread = {("l", "decode", 4, 512): {"a": 1.21, "b": 1.1}, ("l", "decode", 8, 512): {"a": 2.0, "b": 2.6},
              ("l", "decode", 16, 512): {"a": 1.0}, ("l", "prefill", 4, 512): {"c": 1.0}}
    # a point where the second reading did not time the committed first choice is left out too
    committed[("l", "decode", 32, 512)] = {"a": 1.0, "b": 1.5}
    reread[("l", "decode", 32, 512)] = {"b": 1.4}
    out = G.compare(committed, reread)
    assert list(out) == ["decode"]
    d = out["decode"]
    assert d["points"] == 2 and d["committed_first_still_fastest"] == 1
    assert d["committed_first_regret"] == {"geomean": round((1.1 * 1.0) ** 0.5, 4), "max": 1.1, "over_1.05": 1,
                                           "over_1.10": 0}
    assert d["time_over_committed"]["values"] == 4 and d["time_over_committed"]["median"] == 1.059  # 1.04, 1.078
    assert [c["point"] for c in d["over_1.05"]] == ["4x512"] and d["over_1.05"][0]["fastest_now"] == "b"
    json.dumps(out)  # the summary is JSON


def test_the_cli_prints_a_sample_and_refuses_no_files(capsys):
    G = _reread()
    assert G.main(["--sample", "200", "--op", "decode", "--offset", "0"]) == 0
    assert capsys.readouterr().out.strip().split(",")[0] == "1x512"
    import pytest

    with pytest.raises(SystemExit):
        G.main([])
    assert "name the sweep files" in capsys.readouterr().err


def test_a_sample_whose_sweep_recorded_its_seconds_says_what_the_whole_grid_costs(monkeypatch):
    G = _reread()
    rows = [{"set": "bucket", "layer": "l", "op": "decode", "batch": b, "length": 512, "backend": x}
            for b in (1, 2) for x in ("a", "b")]
    done = {"set": "done", "layer": "l", "op": "decode", "seconds": 3.0}
    monkeypatch.setattr(G, "grid_timings", lambda ops: {"decode": 100}[next(iter(ops))])
    assert G.cost(rows + [done]) == {"ops": ["decode"], "timings": 2, "seconds": 3.0, "grid_timings": 100,
                                     "grid_seconds": 150.0}
    assert G.cost(rows + [{k: v for k, v in done.items() if k != "seconds"}]) is None  # a sweep before seconds
    assert G.cost(rows) is None
    # held-out points the sweep timed count with the buckets; a layer call cut short (no done row) is left out
    more = [{"set": "held_out", "layer": "l", "op": "decode", "batch": 3, "length": 600, "backend": "a"},
            {"set": "bucket", "layer": "cut", "op": "decode", "batch": 1, "length": 512, "backend": "a"}]
    assert G.cost(rows + more + [done])["timings"] == 3


def test_the_grid_timings_are_every_layer_calls_bucket_points():
    G = _reread()
    from attnmatrix.matrix import workloads as W

    # decode: 26 distinct layer calls of the presets x their points (417, and one more a batch past a window)
    assert G.grid_timings({"decode"}) == 11104
    calls = G.regret.layer_calls(W.load_presets(), {"prefill"})
    assert G.grid_timings({"prefill"}) == len(calls) * len(W.BUCKETS["prefill"])
