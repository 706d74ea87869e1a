"""Fuzzed result files (tests/fuzz_inputs.py): `storage.read_records`, the CLI's `validate` and `merge` of them, and
the merged matrices read back, validated and diffed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from attnmatrix.matrix.cases import FEATURE_SETS
from attnmatrix.matrix.records import parse_record
from attnmatrix.matrix.storage import InputError, Problem, dump_record, read_records
from click.testing import CliRunner
from fuzz_inputs import (
    FUZZ,
    GOOD_HEAD_DIMS,
    PAGED_BACKENDS,
    Plan,
    base_record,
    check_broken_lines_reported,
    examples,
    expected_exit,
    hostile_files,
    invoke,
    line_of,
    located,
    sha,
    workdir,
)
from hypothesis import given, settings
from hypothesis import strategies as st

# --- result files: storage.read_records ----------------------------------------------------------------------


@settings(FUZZ, max_examples=examples(80))
@given(plan=hostile_files())
def test_read_records_reports_every_broken_line(plan: Plan) -> None:
    with workdir() as d:
        path = d / "results.jsonl"
        path.write_bytes(plan.data)
        problems: list[Problem] = []
        if plan.bad_byte_line is not None:
            with pytest.raises(InputError) as ei:
                read_records(path, problems=problems)
            (p,) = ei.value.problems
            located(p, path)
            assert p.line == plan.bad_byte_line and p.field == "(file)"
            return
        got = read_records(path, problems=problems)
        for p in problems:
            located(p, path)
        assert {n for n, _ in got} == plan.valid
        assert {p.line for p in problems} == set(plan.broken)
        check_broken_lines_reported(problems, plan)
        # Without a problem list, the same file raises exactly when something is wrong.
        if problems:
            with pytest.raises(InputError) as ei:
                read_records(path)
            assert [str(p) for p in ei.value.problems] == [str(p) for p in problems]
        else:
            assert len(read_records(path)) == len(got)


@settings(FUZZ, max_examples=examples(60))
@given(data=st.binary(max_size=400), cut=st.integers(0, 400))
def test_read_records_random_bytes(data: bytes, cut: int) -> None:
    """Any bytes at all: a list of problems or InputError (not UTF-8), never anything else."""
    with workdir() as d:
        path = d / "r.jsonl"
        path.write_bytes(data[:cut] + b"\n" + data[cut:])
        problems: list[Problem] = []
        try:
            read_records(path, problems=problems)
        except InputError as e:
            problems = e.problems
            assert len(problems) == 1 and problems[0].field == "(file)"
        for p in problems:
            located(p, path)


def test_read_records_pathological_json(tmp_path: Path) -> None:
    """Inputs the JSON parser itself chokes on are problems of their line, not crashes."""
    lines = ["[" * 100_000 + "]" * 100_000, '{"schema": ' + "1" * 5000 + "}", '{"a": ' * 5000 + "1" + "}" * 5000,
             "\ufeff{}", "\x00", "NaN", '{"schema": 1, "schema": 2}', "\u2028{}"]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    problems: list[Problem] = []
    assert read_records(path, problems=problems) == []
    for p in problems:
        located(p, path)
    assert {p.line for p in problems} == set(range(1, len(lines) + 1))


def test_unknown_fields_with_odd_names_are_named(tmp_path: Path) -> None:
    """An unknown field called "", " " or "a\\nb" is still named, quoted, so the problem points somewhere."""
    rec = base_record(0)
    for k in ("", " ", "a\nb", "colour"):
        rec[k] = 1
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    problems: list[Problem] = []
    read_records(path, problems=problems)
    assert sorted(p.field for p in problems) == sorted(['""', '" "', '"a\\nb"', "colour"])
    for p in problems:
        located(p, path)


def test_read_records_unreadable(tmp_path: Path) -> None:
    for path in (tmp_path / "missing.jsonl", tmp_path):
        with pytest.raises(InputError) as ei:
            read_records(path)
        (p,) = ei.value.problems
        assert p.file == str(path) and p.field == "(file)"


# --- result files through the CLI: validate and merge --------------------------------------------------------


@settings(FUZZ, max_examples=examples(60))
@given(plan=hostile_files())
def test_cli_validate_hostile_file(plan: Plan, cli_runner: CliRunner, fast_cli: None) -> None:
    with workdir() as d:
        path = d / "results.jsonl"
        path.write_bytes(plan.data)
        res = invoke(cli_runner, ["validate", str(path), "--no-embedded", "--json"])
        assert res.exit_code == expected_exit(plan, command="validate"), (res.stdout, res.stderr)
        if plan.bad_byte_line is not None:
            errors = [x for x in res.stderr.splitlines() if x.startswith("error: ")]
            assert errors and all(x.startswith(f"error: {path}:{plan.bad_byte_line}: (file): ") for x in errors)
            return
        problems = [Problem(**json.loads(x)) for x in res.stdout.splitlines()]
        for p in problems:
            located(p, path)
        check_broken_lines_reported(problems, plan)
        assert {p.line for p in problems} <= set(plan.broken) | plan.contradicted | plan.unknown_backend
        for ln in plan.contradicted:
            assert any(p.line == ln and p.field.startswith("extra.") and "contradicts" in p.message
                       for p in problems), (ln, problems)
        for ln in plan.unknown_backend:
            assert any(p.line == ln and p.field == "case.backend" for p in problems), (ln, problems)
        # The human format names the same places: FILE:LINE, then the field.
        text = invoke(cli_runner, ["validate", str(path), "--no-embedded"])
        assert text.exit_code == res.exit_code
        shown = [x for x in text.stderr.splitlines() if x.startswith("problem: ")]
        assert len(shown) == len(problems)
        assert all(x.startswith(f"problem: {path}:") for x in shown)


@settings(FUZZ, max_examples=examples(60))
@given(plan=hostile_files(), out_exists=st.booleans())
def test_cli_merge_hostile_file(plan: Plan, out_exists: bool, cli_runner: CliRunner) -> None:
    with workdir() as d:
        path = d / "results.jsonl"
        path.write_bytes(plan.data)
        out = d / "out" / "merged.jsonl"
        if out_exists:
            out.parent.mkdir()
            # an earlier merge (a result file of ours: anything else is refused before the merge starts)
            out.write_text(json.dumps(base_record(10**6)) + "\n", encoding="utf-8")
        before, listing = sha(out), sorted(os.listdir(d))
        # An existing OUT is extended only with --append (without it, merge refuses to replace it).
        res = invoke(cli_runner, ["merge", str(path), "-o", str(out)] + (["--append"] if out_exists else []))
        assert res.exit_code == expected_exit(plan, command="merge"), (res.stdout, res.stderr)
        if res.exit_code != 0:
            assert sha(out) == before, "a failed merge changed its output"
            assert sorted(os.listdir(d)) == listing
            if out.parent.exists():
                assert [f.name for f in out.parent.iterdir()] == ([out.name] if out_exists else [])
            lines = [x for x in res.stderr.splitlines() if x.startswith(("problem: ", "error: "))]
            assert lines and all(x.split(": ", 1)[1].startswith(f"{path}:") for x in lines)
            return
        # Success: the merged matrix holds every distinct record once, and reads back clean.
        assert [f.name for f in out.parent.iterdir()] == [out.name]
        merged = read_records(out)
        want = {line_of_record(r) for _, r in read_records(path)}
        if out_exists:
            want.add(line_of_record(parse_record(base_record(10**6))))
        assert sorted(line_of_record(r) for _, r in merged) == sorted(want)


def line_of_record(rec) -> str:
    return dump_record(rec)


def test_cli_unreadable_inputs(tmp_path: Path, cli_runner: CliRunner) -> None:
    """Missing files, folders and non-UTF-8 bytes: exit 2, the file named, OUT untouched (real CLI, no seams)."""
    out = tmp_path / "out.jsonl"
    out.write_text("keep\n", encoding="utf-8")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"schema": 1}\n{"a": "\xff"}\n')
    for target in (tmp_path / "missing.jsonl", bad):
        for args in (["validate", str(target), "--no-embedded"], ["merge", str(target), "-o", str(out)]):
            res = invoke(cli_runner, args)
            assert res.exit_code == 2, (args, res.output)
            assert f"error: {target}" in res.stderr
            assert out.read_text(encoding="utf-8") == "keep\n"
    assert "bad.jsonl:2: (file)" in invoke(cli_runner, ["validate", str(bad), "--no-embedded"]).stderr


def test_cli_large_file(tmp_path: Path, cli_runner: CliRunner) -> None:
    """A few MB: thousands of records, a 1 MB line, one broken line in the middle. Found, named, nothing written.

    This one runs the real CLI (with the embedded declared facts)."""
    import random

    rnd = random.Random(7)
    rows = []
    for i in range(3000):
        hd = rnd.choice(GOOD_HEAD_DIMS)
        rows.append(line_of({
            "schema": 1, "tier": "validated", "outcome": "pass", "run_id": f"big-{i}",
            "case": {"arch": "sm_90", "backend": rnd.choice(PAGED_BACKENDS), "op": "prefill", "dtype": "bfloat16",
                     "head_dim": hd, "head_dim_v": hd, "features": list(rnd.choice(FEATURE_SETS))},
            "provenance": {"device": "NVIDIA H200", "torch": "2.11.0", "kernel_version": "2.8.3",
                           "date": "2026-11-30", "note": "y" * 700},
            "error": {"max_abs_err": 0.001, "nan": 0},
        }))
    long_rec = json.loads(rows[10])
    long_rec["extra"] = {"blob": "z" * 1_000_000}
    rows[10] = line_of(long_rec)
    rows[1501] = rows[1501][: len(rows[1501]) // 2]  # torn in the middle of the file
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    assert path.stat().st_size > 3_000_000
    out = tmp_path / "out.jsonl"
    keep = rows[0] + "\n"  # an earlier merge: a result file of ours, which a failed merge must leave as it is
    out.write_text(keep, encoding="utf-8")
    res = invoke(cli_runner, ["validate", str(path), "--no-embedded"])
    assert res.exit_code == 2  # a line that is not JSON: unreadable input
    problems = [x for x in res.stderr.splitlines() if x.startswith("problem: ")]
    assert problems == [x for x in problems if x.startswith(f"problem: {path}:1502: (json): ")] and problems
    res = invoke(cli_runner, ["merge", str(path), "-o", str(out)])
    assert res.exit_code == 2 and out.read_text(encoding="utf-8") == keep
    rows[1501] = rows[1500].replace('"big-1500"', '"big-1501"')
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    res = invoke(cli_runner, ["merge", str(path), "-o", str(out), "--append"])
    assert res.exit_code == 0, res.stderr
    assert len(read_records(out)) == 3000


def test_cli_merge_lone_surrogate(tmp_path: Path, cli_runner: CliRunner) -> None:
    """A lone surrogate (`"\\ud800"`) is valid JSON but no UTF-8 can hold it: merge keeps it escaped."""
    rec = {"schema": 1, "tier": "validated", "outcome": "rejected", "reason": "kernel said \ud800 then \udfff",
           "case": {"arch": "sm_90", "backend": "fa2", "op": "prefill", "dtype": "bfloat16", "head_dim": 64,
                    "head_dim_v": 64, "features": []},
           "provenance": {"device": "d", "torch": "t", "kernel_version": "k", "date": "2026-11-30"}}
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps(rec) + "\n", encoding="utf-8")  # ensure_ascii: the surrogates stay escaped
    out = tmp_path / "out.jsonl"
    res = invoke(cli_runner, ["merge", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.stderr
    ((_, got),) = read_records(out)
    assert got.reason == rec["reason"]
    assert invoke(cli_runner, ["validate", str(out), "--no-embedded"]).exit_code == 0


def test_cli_merge_output_not_writable(tmp_path: Path, cli_runner: CliRunner) -> None:
    """An OUT that cannot be written (its folder is a file) is reported, exit 2, not a traceback."""
    src = tmp_path / "r.jsonl"
    src.write_text(line_of({
        "schema": 1, "tier": "validated", "outcome": "pass", "error": {"max_abs_err": 0.0},
        "case": {"arch": "sm_90", "backend": "fa2", "op": "prefill", "dtype": "bfloat16", "head_dim": 64,
                 "head_dim_v": 64, "features": []},
        "provenance": {"device": "d", "torch": "t", "kernel_version": "k", "date": "2026-11-30"}}) + "\n",
        encoding="utf-8")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder\n", encoding="utf-8")
    res = invoke(cli_runner, ["merge", str(src), "-o", str(blocker / "out.jsonl")])
    assert res.exit_code == 2 and str(blocker / "out.jsonl") in res.stderr
    assert blocker.read_text(encoding="utf-8") == "not a folder\n"


# --- merged matrices: what merge wrote, read back, validated and diffed ----------------------------------------


@pytest.mark.slow
@settings(FUZZ, max_examples=examples(20))
@given(a=hostile_files(allow_non_utf8=False, max_lines=6), b=hostile_files(allow_non_utf8=False, max_lines=6))
def test_merged_matrices_round_trip_and_diff(a: Plan, b: Plan, cli_runner: CliRunner, fast_cli: None) -> None:
    with workdir() as d:
        outs = []
        for name, plan in (("a", a), ("b", b)):
            src = d / f"{name}.jsonl"
            src.write_bytes(plan.data)
            out = d / f"{name}.merged.jsonl"
            res = invoke(cli_runner, ["merge", str(src), "-o", str(out)])
            if res.exit_code != 0:
                assert not out.exists()
                # A broken input is not a matrix: diff refuses it too, naming the file, without a traceback.
                res = invoke(cli_runner, ["diff", str(src), str(src)])
                if plan.broken:
                    assert res.exit_code in (1, 2) and f"{src}:" in res.stderr
                out.write_bytes(b"")  # an empty matrix stands in
            else:
                again = d / f"{name}.again.jsonl"
                res = invoke(cli_runner, ["merge", str(out), "-o", str(again)])
                assert res.exit_code == 0
                assert again.read_bytes() == out.read_bytes(), "merging a merge must be a no-op"
                res = invoke(cli_runner, ["validate", str(out), "--no-embedded", "--json"])
                assert res.exit_code == (1 if plan.unknown_backend else 0), res.stdout
            outs.append(out)
        res = invoke(cli_runner, ["diff", str(outs[0]), str(outs[1]), "--json"])
        assert res.exit_code == 0, res.stderr
        for x in res.stdout.splitlines():
            assert set(json.loads(x)) == {"kind", "cell", "before", "after"}
        # The merged files merge together: problems, if any, are contradictions between them, named.
        out = d / "both.jsonl"
        res = invoke(cli_runner, ["merge", str(outs[0]), str(outs[1]), "-o", str(out)])
        if res.exit_code == 1:
            assert not out.exists()
            assert all(x.split(": ", 1)[1].startswith(str(d)) for x in res.stderr.splitlines()
                       if x.startswith("problem: "))
