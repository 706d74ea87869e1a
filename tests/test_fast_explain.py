"""`attnmatrix explain` answers from the generated selector's data while it is current, and from the matrix
(`--full`, or a stale selector) otherwise; both answer the same order."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from attnmatrix import project
from attnmatrix.cli.group import COMMANDS, MODULES, main

REPO = Path(project.__file__).resolve().parent.parent


def run(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.slow
@pytest.mark.parametrize("query", [
    ["--arch", "sm_90", "--head-size", "128"],
    ["--arch", "sm_100", "--head-size", "256", "--sliding-window"],
    ["--arch", "sm_90", "--head-size", "192", "--head-size-v", "128", "--op", "decode", "--page-size", "64"],
])
def test_the_selector_and_the_matrix_answer_the_same(query: list[str]) -> None:
    fast = run("explain", *query, "--json")
    full = run("explain", *query, "--json", "--full")
    assert fast.exit_code == 0 and full.exit_code == 0, fast.output + full.output
    f, m = json.loads(fast.stdout), json.loads(full.stdout)
    assert "from" in f and "from" not in m  # the fast answer says where it came from
    assert f["order"] == m["order"] and f["query"] == m["query"]
    for b, a in m["backends"].items():
        assert (f["backends"][b]["status"], f["backends"][b]["tier"]) == (a["status"], a["tier"]), b


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(REPO / "matrix" / "data", root / "matrix" / "data")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    (root / "attnmatrix").mkdir()
    shutil.copy(REPO / "attnmatrix" / "selector.py", root / "attnmatrix" / "selector.py")
    return root


@pytest.mark.slow
def test_a_stale_selector_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path)
    monkeypatch.chdir(root)
    r = run("explain", "--arch", "sm_90", "--head-size", "128")
    assert r.exit_code == 0 and "from the generated selector's data" in r.stderr, r.output
    # one more fact in the checkout's matrix: its selector no longer speaks for it
    declared = root / "matrix" / "data" / "declared.json"
    declared.write_text(declared.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    r = run("explain", "--arch", "sm_90", "--head-size", "128")
    assert r.exit_code == 0, r.output
    assert "not current for the matrix files" in r.stderr and "from the generated selector's data" not in r.stderr
    assert "source:" in r.stdout  # the matrix's answer, with every cell's sources


def test_every_command_is_in_the_lazy_table() -> None:
    import importlib

    for mod in MODULES:
        importlib.import_module(f"attnmatrix.cli.{mod}")
    assert set(main.commands) == set(COMMANDS)
    for name, mod in COMMANDS.items():
        assert main.commands[name].callback.__module__ == f"attnmatrix.cli.{mod}", name
