"""`attnmatrix diff --first-choice`: a re-time that reverses one class's order is counted as one moved first choice."""

from __future__ import annotations

import copy

import pytest
from attnmatrix.generator.first_choice import first_choice_shift, shifts
from click.testing import CliRunner

import attnmatrix.selector as sel
from attnmatrix.cli import main


def test_one_reversed_class_is_one_change() -> None:
    before = sel.DATA
    assert first_choice_shift(before, before, "sm_90")["first_choice_changed"] == 0
    assert all(s["first_choice_changed"] == 0 for s in shifts(before, before))
    after = copy.deepcopy(before)
    rows = after["measured"]["sm_90"]
    cls = next(k for k, r in sorted(rows.items(), key=repr) if len(r) >= 2)
    first, second = rows[cls][0], rows[cls][1]
    # the runner-up becomes twice as fast as the old winner
    rows[cls] = ((second[0], first[1] / 2, *second[2:]), first, *rows[cls][2:])
    out = first_choice_shift(before, after, "sm_90")
    assert out["first_choice_changed"] == 1
    (moved,) = out["changed"]
    assert (moved["before"]["backend"], moved["after"]["backend"]) == (first[0], second[0])
    assert (moved["op"], moved["dtype"], moved["head_dim"], moved["head_dim_v"]) == cls[:4]


@pytest.mark.slow
def test_the_command_compares_two_matrices() -> None:
    r = CliRunner().invoke(main, ["diff", "--first-choice", "embedded", "embedded"])
    assert r.exit_code == 0, r.output
    assert "sm_90: 0 of " in r.stdout and "measured query classes changed their first choice" in r.stdout
