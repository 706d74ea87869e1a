"""What `check` and `validate` found, in the forms CI systems read: a JUnit XML test report and GitHub Actions
workflow commands (`::error file=...,line=...::message`, shown as annotations on the line that failed).

The commands collect `Outcome`s (one per check, per generated file, per input file, per re-probed claim); this
module only renders them, so the text output, the JUnit report and the annotations always say the same thing.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

FORMATS = ("text", "junit", "github")


@dataclass
class Failure:
    """One thing wrong, located where a reviewer fixes it: a result file's line, a generated file's line."""

    message: str
    file: str | None = None
    line: int | None = None
    detail: str = ""  # the long form (a diff, every problem), for the JUnit report


@dataclass
class Outcome:
    """One test case: `group` is its JUnit classname (`attnmatrix.check.generated`), `name` what was checked."""

    group: str
    name: str
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    skipped: str | None = None  # why it was not run

    @property
    def failed(self) -> bool:
        return bool(self.failures)


def relative(path: str | os.PathLike, root: str | os.PathLike | None = None) -> str:
    """`path` relative to `root` (default: the working folder) when it lies inside it: GitHub resolves an
    annotation's file against the repository root, where CI runs the command."""
    p = Path(path)
    try:
        return p.resolve().relative_to(Path(root or os.getcwd()).resolve()).as_posix()
    except (ValueError, OSError):
        return p.as_posix()


def junit(suite: str, outcomes: list[Outcome]) -> str:
    """A JUnit XML report: <testsuites> with one <testsuite> per group, one <testcase> per outcome, a <failure>
    (message: the first failure; text: every failure with its location and detail) for each failed one."""
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(o.group, []).append(o)
    root = ET.Element("testsuites", name=suite, tests=str(len(outcomes)),
                      failures=str(sum(o.failed for o in outcomes)), errors="0",
                      time=_seconds(sum(o.seconds for o in outcomes)))
    for group, cases in groups.items():
        ts = ET.SubElement(root, "testsuite", name=group, tests=str(len(cases)),
                           failures=str(sum(o.failed for o in cases)), errors="0",
                           skipped=str(sum(o.skipped is not None for o in cases)),
                           time=_seconds(sum(o.seconds for o in cases)))
        for o in cases:
            tc = ET.SubElement(ts, "testcase", classname=group, name=o.name, time=_seconds(o.seconds))
            if o.failed:
                first = o.failures[0]
                f = ET.SubElement(tc, "failure", message=_one_line(first.message)[:500], type="attnmatrix")
                f.text = "\n".join(_located(x) + (f"\n{x.detail}" if x.detail else "") for x in o.failures)
            elif o.skipped is not None:
                ET.SubElement(tc, "skipped", message=_one_line(o.skipped)[:500])
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def github(outcomes: list[Outcome]) -> str:
    """One `::error` workflow command per failure, on its file and line where it has one; a last `::notice`
    says how many checks passed, so a green run is visible in the log too."""
    lines = []
    for o in outcomes:
        for f in o.failures:
            props = [f"title={_prop(o.group.rsplit('.', 1)[-1] + ': ' + o.name)}"]
            if f.file:
                props.insert(0, f"file={_prop(f.file)}")
                if f.line is not None:
                    props.insert(1, f"line={f.line}")
            lines.append(f"::error {','.join(props)}::{_data(f.message)}")
    failed = sum(o.failed for o in outcomes)
    lines.append(f"::notice::{_data(f'{len(outcomes) - failed} of {len(outcomes)} checks passed')}")
    return "\n".join(lines) + "\n"


def _located(f: Failure) -> str:
    where = f.file + (f":{f.line}" if f.line is not None else "") + ": " if f.file else ""
    return where + f.message


def _seconds(s: float) -> str:
    return f"{s:.3f}"


def _one_line(s: str) -> str:
    return " ".join(s.split())


# GitHub's workflow-command escaping (toolkit's command.ts): data escapes %, CR, LF; property values also : and ,.
def _data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(s: str) -> str:
    return _data(s).replace(":", "%3A").replace(",", "%2C")
