"""benchmarks/placement_rules.py: rules for placing a query between timed points, compared on the grid alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _rules():
    spec = importlib.util.spec_from_file_location("placement_rules_bench", ROOT / "benchmarks" / "placement_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rows(times: dict[tuple[int, int], dict[str, float]]) -> list[dict]:
    call = {"layer": "m:l", "op": "decode", "outcome": "pass", "arch": "sm_90", "heads_q": 8, "heads_kv": 1,
            "case": "sm_90/x/decode/bfloat16/128x128/gqa"}
    rows = [{**call, "backend": b, "set": "check"} for b in ("x", "y")]
    for (batch, length), per in times.items():
        rows += [{**call, "backend": b, "set": "bucket", "batch": batch, "length": length, "ms": ms,
                  "rounds": [ms, ms]} for b, ms in per.items()]
    return rows


def test_only_interior_points_are_hidden_and_each_rule_is_scored_against_the_fastest_there():
    R = _rules()
    grid = [(b, n) for b in (1, 2, 4) for n in (512, 1024, 2048)]
    assert R.interior(grid) == [(2, 1024)]
    assert R.interior(grid + [(1, 600), (2, 600), (4, 600)]) == [(2, 1024)]  # 600: a kind of its own, no interior
    # x is 2x faster everywhere but at the middle point, where y is: every rule reads x off the neighbours there
    times = {p: {"x": 1.0, "y": 2.0} for p in grid}
    times[(2, 1024)] = {"x": 3.0, "y": 1.0}
    result = R.compare(_rows(times))
    for rule in R.RULES:
        assert result["rules"][rule] == {"points": 1, "geomean": 3.0, "p99": 3.0, "max": 3.0, "over_1.10": 1}


def test_least_worst_ratio_takes_the_guess_never_far_from_the_fastest_around():
    R = _rules()
    from attnmatrix.selector_workloads import place

    # around (2, 1024): x is fastest by 8% at three corners and 1.2x slower at the fourth; y is never more than
    # 8% off: interpolated, x is first (by 1.2%), yet both are within the interpolation band
    rows = [(8, 1, b, n, 1, tuple(sorted(per.items(), key=lambda t: t[1]))) for (b, n), per in {
        (1, 512): {"x": 1.0, "y": 1.08}, (1, 2048): {"x": 1.0, "y": 1.08}, (4, 512): {"x": 1.0, "y": 1.08},
        (4, 2048): {"x": 1.2, "y": 1.0}}.items()]
    assert place(rows, "decode", {"batch_size": 2, "context_len": 1024}, 1.01, 1.2).order[0][0] == "x"
    picks = R.first_choices(rows, "decode", 2, 1024, 1.01, 1.2)
    assert picks["interpolate"] == "x" and picks["least_worst_ratio"] == "y"
    # where the band separates them, x is no guess and stays the pick
    assert R.first_choices(rows, "decode", 2, 1024, 1.01, 1.01)["least_worst_ratio"] == "x"
