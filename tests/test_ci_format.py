"""`check` and `validate` speak CI: a JUnit XML report that satisfies the JUnit schema, and GitHub Actions
annotations on the record or generated line that failed."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import build_record, checkout_copy, dump_jsonl

from attnmatrix import ci_format as ci
from attnmatrix.cli import main

REPO = Path(__file__).resolve().parents[1]

# The JUnit XML schema as CI systems read it (the Ant/Jenkins "junit-10" XSD that Jenkins' xunit plugin and
# GitLab validate against), written out as data: per element, its required and optional attributes with their
# types, and the child elements it may hold (None: text only).
INT, DECIMAL, STRING = "int", "decimal", "string"
JUNIT_SCHEMA = {
    "testsuites": ({}, {"name": STRING, "time": DECIMAL, "tests": INT, "failures": INT, "errors": INT,
                        "disabled": INT}, {"testsuite"}),
    "testsuite": ({"name": STRING, "tests": INT},
                  {"failures": INT, "errors": INT, "skipped": INT, "disabled": INT, "time": DECIMAL,
                   "timestamp": STRING, "hostname": STRING, "id": STRING, "package": STRING, "file": STRING},
                  {"properties", "testcase", "system-out", "system-err"}),
    "testcase": ({"name": STRING}, {"classname": STRING, "time": DECIMAL, "assertions": STRING, "status": STRING,
                                    "file": STRING, "line": INT},
                 {"skipped", "error", "failure", "system-out", "system-err"}),
    "failure": ({}, {"message": STRING, "type": STRING}, None),
    "error": ({}, {"message": STRING, "type": STRING}, None),
    "skipped": ({}, {"message": STRING}, None),
}
TYPE_RE = {INT: re.compile(r"\d+"), DECIMAL: re.compile(r"-?\d+(\.\d+)?"), STRING: re.compile(r".*", re.S)}


def schema_errors(el: ET.Element, expected: str = "testsuites") -> list[str]:
    """Every way `el` breaks the schema above (empty: valid)."""
    if el.tag != expected:
        return [f"<{el.tag}> where <{expected}> belongs"]
    required, optional, children = JUNIT_SCHEMA[el.tag]
    errors = [f"<{el.tag}> lacks {a}" for a in required if a not in el.attrib]
    for a, v in el.attrib.items():
        kind = required.get(a) or optional.get(a)
        if kind is None:
            errors.append(f"<{el.tag}> has an unknown attribute {a}")
        elif not TYPE_RE[kind].fullmatch(v):
            errors.append(f"<{el.tag} {a}={v!r}> is not {kind}")
    for child in el:
        if children is None or child.tag not in children:
            errors.append(f"<{child.tag}> inside <{el.tag}>")
        else:
            errors += schema_errors(child, child.tag)
    if el.tag == "testcase" and len(el.findall("skipped")) > 1:
        errors.append("<testcase> with more than one <skipped>")
    if el.tag == "testsuite" and not errors:
        cases = el.findall("testcase")
        if int(el.get("tests", -1)) != len(cases):
            errors.append(f"<testsuite {el.get('name')}> says tests={el.get('tests')}, holds {len(cases)}")
        if int(el.get("failures", 0)) != sum(bool(c.findall("failure")) for c in cases):
            errors.append(f"<testsuite {el.get('name')}> miscounts its failures")
    return errors


def test_the_schema_check_can_say_no():
    assert schema_errors(ET.fromstring('<testsuites><testsuite name="a" tests="1"><testcase name="x"/></testsuite>'
                                       '</testsuites>')) == []
    for bad in ('<testsuite name="a" tests="0"/>', '<testsuites><testsuite tests="0"/></testsuites>',
                '<testsuites><testsuite name="a" tests="x"/></testsuites>',
                '<testsuites><testsuite name="a" tests="1"><testcase/></testsuite></testsuites>',
                '<testsuites><testsuite name="a" tests="2"><testcase name="x"/></testsuite></testsuites>',
                '<testsuites><testsuite name="a" tests="1"><testcase name="x"><oops/></testcase></testsuite>'
                '</testsuites>'):
        assert schema_errors(ET.fromstring(bad)), bad


def sample_outcomes() -> list[ci.Outcome]:
    return [ci.Outcome("attnmatrix.check.matrix", "matrix is valid"),
            ci.Outcome("attnmatrix.check.generated", "site/a.md",
                       failures=[ci.Failure("site/a.md is stale from line 3: <&> \"q\" 100%, a:b\nsecond line",
                                            file="site/a.md", line=3, detail="--- a\n+++ b")]),
            ci.Outcome("attnmatrix.check.generated", "site/b.md"),
            ci.Outcome("attnmatrix.check.reprobe", "sm_90/fa2/prefill/bfloat16/128x128/causal",
                       skipped="not installed")]


def test_junit_report_satisfies_the_schema_and_counts():
    root = ET.fromstring(ci.junit("attnmatrix check", sample_outcomes()))
    assert schema_errors(root) == []
    assert root.get("tests") == "4" and root.get("failures") == "1"
    (failure,) = root.iter("failure")
    assert "stale from line 3" in failure.get("message") and "\n" not in failure.get("message")
    assert "site/a.md:3: " in failure.text and "+++ b" in failure.text


def test_github_annotations_escape_and_locate():
    out = ci.github(sample_outcomes()).splitlines()
    assert out[0].startswith("::error file=site/a.md,line=3,title=generated%3A site/a.md::")
    assert "100%25, a:b%0Asecond line" in out[0]  # data escaping keeps the message on one line
    assert out[-1] == "::notice::3 of 4 checks passed" and len(out) == 2


# --- the commands ------------------------------------------------------------------------------------------------


def test_validate_formats_name_the_record_that_failed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = dump_jsonl(tmp_path / "good.jsonl", [build_record(head_dim=64)])
    bad = dump_jsonl(tmp_path / "bad.jsonl", [build_record(head_dim=64), build_record(backend="nope")])
    r = CliRunner().invoke(main, ["validate", "--no-embedded", str(good), str(bad), "--format", "junit"])
    assert r.exit_code == 1
    root = ET.fromstring(r.stdout)
    assert schema_errors(root) == []
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) >= {"good.jsonl", "bad.jsonl"}
    assert not cases["good.jsonl"].findall("failure") and cases["bad.jsonl"].findall("failure")
    r = CliRunner().invoke(main, ["validate", "--no-embedded", str(good), str(bad), "--format", "github"])
    assert r.exit_code == 1
    errors = [x for x in r.stdout.splitlines() if x.startswith("::error")]
    assert errors and all(x.startswith("::error file=bad.jsonl,line=2,") for x in errors), r.stdout
    r = CliRunner().invoke(main, ["validate", "--no-embedded", str(good), "--format", "github"])
    assert r.exit_code == 0 and "::error" not in r.stdout
    assert re.fullmatch(r"::notice::(\d+) of \1 checks passed\n", r.stdout), r.stdout


def test_validate_json_and_format_conflict():
    r = CliRunner().invoke(main, ["validate", "--json", "--format", "junit"])
    assert r.exit_code == 2


def tree_of(tmp_path: Path) -> Path:
    return checkout_copy(tmp_path / "tree")


@pytest.mark.slow
def test_check_reports_a_stale_generated_file_in_both_formats(tmp_path, monkeypatch):
    root = tree_of(tmp_path)
    page = root / "site" / "fa-version.md"
    lines = page.read_text().splitlines(keepends=True)
    lines[11] = lines[11].rstrip("\n") + " (edited by hand)\n"
    page.write_text("".join(lines))
    monkeypatch.chdir(root)
    r = CliRunner().invoke(main, ["check", "--format", "junit"])
    assert r.exit_code == 1
    report = ET.fromstring(r.stdout)
    assert schema_errors(report) == []
    failed = [c.get("name") for c in report.iter("testcase") if c.findall("failure")]
    # (the test suite's fake backends, registered for the runner's tests, may show in the query index too)
    assert "site/fa-version.md" in failed and set(failed) <= {"site/fa-version.md", "site/data/query/index.json"}
    names = [c.get("name") for c in report.iter("testcase")]
    assert "matrix is valid" in names and "attnmatrix/selector.py" in names
    r = CliRunner().invoke(main, ["check", "--format", "github"])
    assert r.exit_code == 1
    errors = [x for x in r.stdout.splitlines() if x.startswith("::error")]
    assert any(x.startswith("::error file=site/fa-version.md,line=12,") for x in errors), r.stdout
    # a record that breaks the matrix: the annotation sits on its line of its result file
    results = root / "matrix" / "data" / "results"
    dump_jsonl(results / "zz-broken.jsonl", [build_record(head_dim=64), build_record(backend="nope")])
    r = CliRunner().invoke(main, ["check", "--format", "github"])
    assert r.exit_code == 1
    errors = [x for x in r.stdout.splitlines() if x.startswith("::error")]
    assert errors and all(x.startswith("::error file=matrix/data/results/zz-broken.jsonl,line=2,")
                          for x in errors), r.stdout


def test_the_pre_commit_hook_and_the_actions_example_use_the_ci_formats():
    hook = (REPO / ".pre-commit-hooks.yaml").read_text()
    assert re.search(r"^\s*entry: attnmatrix check --format github$", hook, re.M)
    workflow = (REPO / "docs-examples" / "github-actions.yml").read_text()
    assert "run: attnmatrix check --format github" in workflow
    assert "--reprobe --sample 200 --format junit > attnmatrix-reprobe.xml" in workflow
