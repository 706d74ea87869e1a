"""benchmarks/ranking_shift.py: a re-time that reverses one cell's order is counted as one moved first choice."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

_ROOT = Path(__file__).parent.parent
_SPEC = importlib.util.spec_from_file_location("ranking_shift", _ROOT / "benchmarks" / "ranking_shift.py")
ranking_shift = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ranking_shift)


def test_one_reversed_cell_is_one_change():
    before = ranking_shift.load_data(str(_ROOT / "attnmatrix" / "selector.py"))
    assert ranking_shift.shift(before, before, "sm_90")["first_choice_changed"] == 0
    after = copy.deepcopy(before)
    rows = after["measured"]["sm_90"]
    key, fset = next((k, f) for k, by in sorted(rows.items()) for f, r in sorted(by.items()) if len(r) >= 2)
    first, second = rows[key][fset][0], rows[key][fset][1]
    # the runner-up becomes twice as fast as the old winner
    rows[key][fset] = ((second[0], first[1] / 2, *second[2:]), (first[0], *first[1:]), *rows[key][fset][2:])
    out = ranking_shift.shift(before, after, "sm_90")
    assert out["first_choice_changed"] == 1
    (moved,) = out["changed"]
    assert (moved["before"]["backend"], moved["after"]["backend"]) == (first[0], second[0])
    assert moved["features"] == fset and (moved["op"], moved["dtype"]) == key[:2]
