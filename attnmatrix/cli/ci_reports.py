"""The CI report forms of `validate` and `check` (`--format junit|github`, attnmatrix/ci_format.py): problems as a
failed test case located on their file and line, and the report printed on stdout."""

from __future__ import annotations

import click

from attnmatrix import ci_format as ci
from attnmatrix.matrix.storage import Problem


def print_report(fmt: str, suite: str, outcomes: list[ci.Outcome]) -> None:
    if fmt == "junit":
        click.echo(ci.junit(suite, outcomes), nl=False)
    elif fmt == "github":
        click.echo(ci.github(outcomes), nl=False)


def validity(group: str, name: str, problems: list[Problem], seconds: float = 0.0) -> ci.Outcome:
    return ci.Outcome(group, name, seconds=seconds, failures=[
        ci.Failure(f"{p.field}: {p.message}" + (f" [{p.record}]" if p.record else ""),
                   file=None if p.file.startswith("(") else ci.relative(p.file), line=p.line) for p in problems])
