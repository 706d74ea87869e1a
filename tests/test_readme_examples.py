"""The README's everyday examples run as written, in order, in a fresh copy of the checkout on a CPU, and leave
`attnmatrix check` green."""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import checkout_copy

from attnmatrix.cli import main

REPO = Path(__file__).resolve().parents[1]


def everyday_examples() -> list[list[list[str]]]:
    """Each line of the README's "Everyday use" block: its commands (split at &&), comments dropped."""
    section = (REPO / "README.md").read_text().split("## Everyday use", 1)[1]
    block = re.search(r"```bash\n(.+?)\n```", section, re.S).group(1)
    lines = []
    for line in block.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line:
            lines.append([shlex.split(part) for part in line.split("&&")])
    return lines


def test_the_examples_are_attnmatrix_commands_in_a_green_order():
    lines = everyday_examples()
    commands = [cmd[1] for line in lines for cmd in line]
    assert all(cmd[0] == "attnmatrix" for line in lines for cmd in line)
    assert commands.index("snapshot") < commands.index("merge") < commands.index("generate")
    assert commands[-1] == "check"


def fresh_checkout(tmp_path: Path) -> Path:
    return checkout_copy(tmp_path / "clone")


@pytest.mark.slow
def test_the_readme_examples_run_as_written(tmp_path, monkeypatch):
    pytest.importorskip("flash_attn.cute")  # the xcompile line needs the [fa4] extra, as the README installs it
    monkeypatch.chdir(fresh_checkout(tmp_path))
    for line in everyday_examples():
        for cmd in line:
            args = [a for arg in cmd[1:] for a in (sorted(glob.glob(arg)) if "*" in arg else [arg])]
            r = CliRunner().invoke(main, args)
            assert r.exit_code == 0, (cmd, r.output)
