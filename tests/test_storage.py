"""JSON Lines storage: precise problem locations, resumable append-only stores, atomic whole-file writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from attnmatrix.matrix import storage
from attnmatrix.matrix.records import parse_record
from attnmatrix.matrix.storage import (
    InputError,
    Problem,
    ResultStore,
    atomic_write_text,
    dump_record,
    iter_result_files,
    read_records,
    write_records,
)


def test_read_records_returns_line_numbers(tmp_path: Path, make_record, write_jsonl) -> None:
    a, b = make_record(head_dim=64), make_record(head_dim=128)
    f = write_jsonl(tmp_path / "r.jsonl", [a, "", "   ", b])
    got = read_records(f)
    assert [n for n, _ in got] == [1, 4]
    assert [r.case.head_dim for _, r in got] == [64, 128]


def test_read_records_locates_every_problem(tmp_path: Path, make_record, write_jsonl) -> None:
    bad_rec = make_record(outcome="nope")
    bad_rec["case"]["dtype"] = "int8"
    f = write_jsonl(tmp_path / "r.jsonl", [make_record(), "{not json", bad_rec, make_record(head_dim=64)])
    problems: list[Problem] = []
    got = read_records(f, problems=problems)
    assert [n for n, _ in got] == [1, 4]  # the good lines are still read
    where = sorted((p.line, p.field) for p in problems)
    assert where == [(2, "(json)"), (3, "case.dtype"), (3, "outcome")]
    assert all(p.file == str(f) for p in problems)
    s = {str(p) for p in problems}
    assert any(x.startswith(f"{f}:2: (json): not valid JSON") for x in s)
    assert any(x.startswith(f"{f}:3: outcome: ") for x in s)


def test_problem_names_record_key_when_case_is_readable(tmp_path: Path, make_record, write_jsonl) -> None:
    f = write_jsonl(tmp_path / "r.jsonl", [make_record(outcome="nope")])
    problems: list[Problem] = []
    read_records(f, problems=problems)
    (p,) = problems
    assert p.record == "sm_90/fa2/prefill/bfloat16/128x128/causal"
    assert str(p).startswith(f"{f}:1 [sm_90/fa2/prefill/bfloat16/128x128/causal]: outcome: ")


def test_read_records_raises_without_problem_list(tmp_path: Path, make_record, write_jsonl) -> None:
    f = write_jsonl(tmp_path / "r.jsonl", [make_record(), "[1,", make_record(schema=2)])
    with pytest.raises(InputError) as ei:
        read_records(f)
    assert [(p.line, p.field) for p in ei.value.problems] == [(2, "(json)"), (3, "schema")]
    assert f"{f}:3" in str(ei.value)


def test_non_utf8_and_missing_files(tmp_path: Path, make_record) -> None:
    f = tmp_path / "latin1.jsonl"
    good = json.dumps(make_record()).encode()
    f.write_bytes(good + b"\n" + good + b"\n" + b'{"x": "caf\xe9"}\n')
    with pytest.raises(InputError) as ei:
        read_records(f, problems=[])  # unreadable input raises even when collecting
    (p,) = ei.value.problems
    assert (p.file, p.line, p.field) == (str(f), 3, "(file)")
    assert "UTF-8" in p.message and "0xe9" in p.message
    with pytest.raises(InputError) as ei:
        read_records(tmp_path / "nope.jsonl")
    assert ei.value.problems[0].file == str(tmp_path / "nope.jsonl")
    assert ei.value.problems[0].line is None


def test_dump_record_is_canonical(make_rec, make_record) -> None:
    d = make_record(latency_ms=1.5)
    shuffled = json.loads(json.dumps(dict(reversed(list(d.items())))))
    assert dump_record(parse_record(shuffled)) == dump_record(make_rec(latency_ms=1.5))
    line = dump_record(make_rec())
    assert "\n" not in line and ", " not in line and json.loads(line)["schema"] == 1


# --- ResultStore -------------------------------------------------------------------------------


def test_store_resume_skips_recorded_keys(tmp_path: Path, make_rec) -> None:
    path = tmp_path / "sub" / "run.jsonl"
    a, b = make_rec(head_dim=64), make_rec(head_dim=128)
    with ResultStore(path) as s:
        assert s.repaired_bytes == 0
        s.append(a)
        assert a.key in s and b.key not in s
    with ResultStore(path) as s:
        assert set(s.done) == {a.key}
        s.append(b)
    assert [r.key for _, r in read_records(path)] == [a.key, b.key]


def test_store_append_never_duplicates(tmp_path: Path, make_rec) -> None:
    path = tmp_path / "run.jsonl"
    a = make_rec(head_dim=64)
    other_outcome_same_case = make_rec(head_dim=64, outcome="crash")
    with ResultStore(path) as s:
        s.append(a)
        s.append(a)
        s.append(other_outcome_same_case)
    with ResultStore(path) as s:
        s.append(a)
    lines = path.read_text().splitlines()
    assert lines == [dump_record(a)]


def test_store_cuts_torn_last_line(tmp_path: Path, make_rec) -> None:
    path = tmp_path / "run.jsonl"
    a, b = make_rec(head_dim=64), make_rec(head_dim=128)
    torn = dump_record(b)[:37]
    path.write_text(dump_record(a) + "\n" + torn, encoding="utf-8")
    with ResultStore(path) as s:
        assert s.repaired_bytes == len(torn.encode())
        assert set(s.done) == {a.key}
        s.append(b)  # the torn case is re-run, not lost
    assert path.read_text().splitlines() == [dump_record(a), dump_record(b)]
    with ResultStore(path) as s:
        assert s.repaired_bytes == 0


def test_store_torn_only_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"schema":1,"ca')
    with ResultStore(path) as s:
        assert s.repaired_bytes == 15 and not s.done
    assert path.read_bytes() == b""


def test_store_refuses_malformed_complete_lines(tmp_path: Path, make_record, write_jsonl) -> None:
    path = write_jsonl(tmp_path / "run.jsonl", [make_record(), "garbage"])
    with pytest.raises(InputError):
        ResultStore(path)


# --- atomic writes -----------------------------------------------------------------------------


def test_atomic_write_reports_change(tmp_path: Path) -> None:
    p = tmp_path / "deep" / "out.txt"
    assert atomic_write_text(p, "one\n") is True
    assert atomic_write_text(p, "one\n") is False
    assert atomic_write_text(p, "two\n") is True
    assert p.read_text() == "two\n"
    assert list(p.parent.iterdir()) == [p]  # no temporary left behind


def test_atomic_write_failure_leaves_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "out.txt"
    p.write_text("old contents\n")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        atomic_write_text(p, "new contents\n")
    assert p.read_text() == "old contents\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["out.txt"]  # temp file cleaned up


def test_atomic_write_unchanged_does_not_touch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "out.txt"
    p.write_text("same\n")
    calls = []
    monkeypatch.setattr(storage.os, "replace", lambda *a: calls.append(a))
    assert atomic_write_text(p, "same\n") is False
    assert calls == []


def test_write_records_round_trip(tmp_path: Path, make_rec) -> None:
    recs = [make_rec(head_dim=64), make_rec(tier="declared", outcome="rejected", reason="no")]
    p = tmp_path / "m.jsonl"
    assert write_records(p, recs) is True
    assert [r for _, r in read_records(p)] == recs
    assert write_records(p, recs) is False
    assert p.read_bytes().endswith(b"\n") and os.path.getsize(p) > 0


def test_iter_result_files(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    for n in ("b.jsonl", "a.jsonl", "c.txt"):
        (d / n).write_text("")
    single = tmp_path / "x.json"
    assert list(iter_result_files([d, single])) == [d / "a.jsonl", d / "b.jsonl", single]


def test_atomic_write_gives_an_ordinary_file_mode(tmp_path) -> None:
    import os
    import stat

    from attnmatrix.matrix.storage import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "page.md", "x\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "page.md").stat().st_mode) == 0o644
