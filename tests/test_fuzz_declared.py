"""Fuzzed declared facts and rankings (tests/fuzz_inputs.py): `evidence.read_declared`, and JSON's NaN and Infinity
anywhere in a record."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from attnmatrix.matrix import evidence
from attnmatrix.matrix.cases import OPS
from attnmatrix.matrix.evidence import read_declared
from attnmatrix.matrix.merge import merge_records
from attnmatrix.matrix.storage import InputError, Problem, read_records
from attnmatrix.matrix.validate import validate_evidence
from fuzz_inputs import (
    BAD_ARCHS,
    FUZZ,
    GOOD_HEAD_DIMS,
    IMPOSSIBLE_HEAD_DIMS,
    among,
    examples,
    is_dict,
    is_list,
    is_str,
    json_values,
    located,
    negated,
    valid_fact,
    valid_ranking,
    workdir,
)
from hypothesis import given, settings
from hypothesis import strategies as st

# --- declared facts: evidence.read_declared -------------------------------------------------------------------


FACT_INVALID: dict[str, st.SearchStrategy] = {
    "id": st.one_of(json_values.filter(negated(is_str)), st.just("")),
    "backend": st.one_of(json_values.filter(negated(is_str)), st.sampled_from(["", "FA2", "a b"])),
    "archs": st.one_of(json_values.filter(negated(is_list)), st.lists(st.sampled_from([*BAD_ARCHS, 9.0, None]),
                                                                   min_size=1, max_size=3)),
    "ops": st.lists(st.one_of(json_values, st.just("prefil")).filter(negated(among(OPS))), min_size=1, max_size=2),
    "dtypes": st.lists(st.sampled_from(["int8", None, 16, "bf16"]), min_size=1, max_size=2),
    "head_dims": st.one_of(
        json_values.filter(negated(is_list)),
        st.lists(st.one_of(st.tuples(st.sampled_from(IMPOSSIBLE_HEAD_DIMS), st.sampled_from(GOOD_HEAD_DIMS)),
                           st.tuples(st.sampled_from(GOOD_HEAD_DIMS), st.sampled_from(IMPOSSIBLE_HEAD_DIMS)),
                           st.sampled_from([[], [128], [1, 2, 3], 128, "128x128"])).map(
            lambda x: list(x) if isinstance(x, tuple) else x), min_size=1, max_size=2)),
    "feature_sets": st.lists(st.one_of(st.sampled_from([["dropout"], ["paged_kv"], "causal", [1], None])),
                             min_size=1, max_size=2),
    "outcome": st.one_of(json_values, st.sampled_from(["wrong", "crash", "compiled"])).filter(
        lambda v: v not in ("pass", "rejected")),
    "sources": st.one_of(json_values.filter(negated(is_list)), st.just([]), st.just([""]), st.just([1])),
    "reason": json_values.filter(lambda v: v not in (None, "", 0, False, [], {}) and not isinstance(v, str)),
}
RANKING_INVALID: dict[str, st.SearchStrategy] = {
    "id": json_values.filter(negated(is_str)),
    "archs": st.one_of(json_values.filter(negated(is_list)), st.lists(st.sampled_from([*BAD_ARCHS, 9.0, None]),
                                                                   min_size=1, max_size=2)),
    "op": json_values.filter(negated(is_str)),
    "head_dims": st.one_of(json_values.filter(negated(is_list)), st.lists(st.one_of(
        st.tuples(st.sampled_from(IMPOSSIBLE_HEAD_DIMS), st.sampled_from(GOOD_HEAD_DIMS)).map(list),
        st.sampled_from([[128], [], 128, "128"])), min_size=1, max_size=2)),
    "order": st.one_of(json_values.filter(negated(is_list)), st.lists(json_values.filter(negated(is_str)),
                                                                    min_size=1, max_size=2)),
    "sources": st.one_of(json_values.filter(negated(is_list)), st.lists(json_values.filter(negated(is_str)),
                                                                      min_size=1, max_size=2)),
}


@st.composite
def hostile_declared(draw) -> tuple[object, set[str]]:
    """(document, locations that must be reported, as 'facts[i]'/'rankings[i]' or a top-level name)."""
    if draw(st.integers(0, 9)) == 0:
        doc = draw(json_values)
        return doc, set() if isinstance(doc, dict) and doc.get("schema") == 1 else {"schema"}
    facts: list[object] = []
    rankings: list[object] = []
    must: set[str] = set()
    for i in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["ok", "ok", "bad", "missing", "not_object", "dup"]))
        f = valid_fact(i)
        if kind == "bad":
            key = draw(st.sampled_from(sorted(FACT_INVALID)))
            v = draw(FACT_INVALID[key])
            if key == "reason" and not v:
                v = 1
            f[key] = v
            must.add(f"facts[{len(facts)}]")
        elif kind == "missing":
            del f[draw(st.sampled_from(evidence.FACT_FIELDS))]
            must.add(f"facts[{len(facts)}]")
        elif kind == "not_object":
            f = draw(json_values.filter(negated(is_dict)))
            must.add(f"facts[{len(facts)}]")
        elif kind == "dup" and facts and isinstance(facts[0], dict) and isinstance(facts[0].get("id"), str):
            f["id"] = facts[0]["id"]
            must.add(f"facts[{len(facts)}]")
        facts.append(f)
    for i in range(draw(st.integers(0, 3))):
        r = valid_ranking(i)
        if draw(st.booleans()):
            key = draw(st.sampled_from(sorted(RANKING_INVALID)))
            r[key] = draw(RANKING_INVALID[key])
            must.add(f"rankings[{len(rankings)}]")
        rankings.append(r)
    doc: dict = {"schema": 1, "facts": facts, "rankings": rankings}
    if draw(st.integers(0, 5)) == 0:
        key = draw(st.sampled_from(["facts", "rankings"]))
        doc[key] = draw(json_values.filter(negated(is_list)))
        must = {m for m in must if not m.startswith(key)} | {key}
    return doc, must


@settings(FUZZ, max_examples=examples(150))
@given(case=hostile_declared(), encoding=st.sampled_from(["utf-8", "utf-8", "utf-8", "latin-1-garbage", "truncated"]))
def test_read_declared_hostile(case: tuple[object, set[str]], encoding: str) -> None:
    doc, must = case
    text = json.dumps(doc, ensure_ascii=False)
    with workdir() as d:
        path = d / "declared.json"
        if encoding == "latin-1-garbage":
            path.write_bytes(text.encode("utf-8") + b"\xff\xfe")
        elif encoding == "truncated":
            path.write_bytes(text.encode("utf-8")[: max(0, len(text) // 2)])
        else:
            path.write_text(text, encoding="utf-8")
        problems: list[Problem] = []
        try:
            json.loads(path.read_bytes().decode("utf-8"))
            readable = True
        except ValueError:  # UnicodeDecodeError is one
            readable = False
        if not readable:
            with pytest.raises(InputError) as ei:
                read_declared(path, problems)
            for p in ei.value.problems:
                located(p, path, line_based=False)
            return
        ev = read_declared(path, problems)
        ev.backends = evidence.load_backends()
        problems += validate_evidence(ev)  # what `attnmatrix validate` adds on top: must not crash either
        for p in problems:
            located(p, path, line_based=False)
        reported = {p.field.split(".")[0] for p in problems}
        assert must <= reported, (must, [str(p) for p in problems])
        if not must:
            assert not [p for p in problems if p.field != "facts"], [str(p) for p in problems]
        # Whatever was accepted is well formed: valid records, rankings of real head dims.
        for r in ev.rankings:
            assert all(isinstance(x, int) and not isinstance(x, bool) and 0 < x <= 1024
                       for hd in r.head_dims for x in hd)
            assert all(isinstance(b, str) for b in r.order)
        merge_records(list(zip(ev.records, ev.where, strict=True)))


def test_read_declared_unreadable(tmp_path: Path) -> None:
    for path in (tmp_path / "missing.json", tmp_path):
        with pytest.raises(InputError) as ei:
            read_declared(path, [])
        assert all(p.file == str(path) for p in ei.value.problems)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(InputError):
        read_declared(deep, [])
    huge = tmp_path / "huge.json"
    huge.write_text('{"schema": ' + "1" * 5000 + "}", encoding="utf-8")
    with pytest.raises(InputError):
        read_declared(huge, [])


def test_nan_and_infinity_are_never_numbers(tmp_path: Path) -> None:
    """JSON's NaN/Infinity extensions parse in Python; anywhere in a record they are problems of that field
    (a merge could not write them back: JSON has no such numbers)."""
    assert math.isnan(json.loads("NaN"))
    rec = {"schema": 1, "tier": "validated", "outcome": "pass", "error": {"max_abs_err": float("nan")},
           "case": {"arch": "sm_90", "backend": "fa2", "op": "prefill", "dtype": "bfloat16", "head_dim": 64,
                    "head_dim_v": 64, "features": []},
           "provenance": {"device": "d", "torch": "t", "kernel_version": "k", "date": "2026-11-30"},
           "timings": [{"shape": "s", "latency_ms": float("inf")}]}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec) + "\n", encoding="utf-8")
    problems: list[Problem] = []
    read_records(path, problems=problems)
    assert {(p.line, p.field) for p in problems} == {(1, "error.max_abs_err"), (1, "timings[0].latency_ms")}
