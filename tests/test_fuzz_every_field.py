"""Every field of a record and of a declared fact, every wrong JSON type: the exhaustive table beside the random
search of tests/test_fuzz_result_files.py and tests/test_fuzz_declared.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

from attnmatrix.matrix.cases import DTYPES, OPS
from attnmatrix.matrix.evidence import read_declared
from attnmatrix.matrix.storage import Problem, read_records
from click.testing import CliRunner
from fuzz_inputs import (
    DELETE,
    base_record,
    finite_tree,
    invoke,
    located,
    set_field,
    valid_ranking,
)

# --- every field, every wrong type: the exhaustive table beside the random search -----------------------------

# One value of each JSON type and the awkward ones; for each field, those it must refuse are tried one a line.
EVERY_TYPE: list[object] = [None, True, False, 0, -1, 1, 1.5, 10**9, 10**400, float("nan"), float("inf"), "", "x",
                            "sm_90", [], [1], ["causal"], [[128, 128]], {}, {"a": 1}, {"a": [float("nan")]}, DELETE]


def _valid_arch(v: object) -> bool:
    from attnmatrix.matrix.cases import normalize_arch

    try:
        return isinstance(v, str) and bool(normalize_arch(v))
    except ValueError:
        return False


def _valid_dim(v: object) -> bool:
    return type(v) is int and 0 < v <= 1024


def _valid_features(v: object) -> bool:
    from attnmatrix.matrix.cases import canonical_features

    try:
        return isinstance(v, list) and all(isinstance(t, str) for t in v) and canonical_features(v) is not None
    except ValueError:
        return False


def _nonempty_str(v: object) -> bool:
    return isinstance(v, str) and bool(v)


def _finite(v: object) -> bool:
    try:
        return type(v) in (int, float) and math.isfinite(v)
    except OverflowError:
        return False


# field -> is this value acceptable there (in a validated 'pass' record with one timing)?
RECORD_FIELDS = {
    "schema": lambda v: type(v) is int and v == 1,
    "case": lambda v: False,  # none of EVERY_TYPE is a case
    "case.arch": _valid_arch,
    "case.backend": lambda v: isinstance(v, str) and v.isascii() and v.replace("_", "a").isalnum() and v == v.lower(),
    "case.op": lambda v: v in OPS if isinstance(v, str) else False,
    "case.dtype": lambda v: v in DTYPES if isinstance(v, str) else False,
    "case.head_dim": _valid_dim,
    "case.head_dim_v": _valid_dim,
    "case.features": _valid_features,
    "outcome": lambda v: v == "pass" if isinstance(v, str) else False,  # the others need a reason / no timings
    "tier": lambda v: v == "validated" if isinstance(v, str) else False,
    "provenance": lambda v: False,  # a validated record needs device, torch, kernel_version, date
    "provenance.device": _nonempty_str,
    "provenance.date": _nonempty_str,
    "provenance.torch": _nonempty_str,
    "provenance.kernel_version": _nonempty_str,
    "provenance.target": lambda v: isinstance(v, str),
    "provenance.declared_id": lambda v: isinstance(v, str),
    "reason": lambda v: v is None or isinstance(v, str),
    "error": lambda v: v is None or isinstance(v, dict) and finite_tree(v),
    "timings": lambda v: isinstance(v, list) and not v,
    "timings.0.shape": lambda v: isinstance(v, str),
    "timings.0.latency_ms": lambda v: _finite(v) and v > 0,
    "timings.0.tflops": lambda v: v is None or (_finite(v) and v >= 0),
    "sources": lambda v: isinstance(v, list) and all(isinstance(s, str) and s for s in v),
    "entry": lambda v: v is None or isinstance(v, str),
    "run_id": lambda v: v is None or isinstance(v, str),
    "extra": lambda v: isinstance(v, dict) and finite_tree(v),
    "unexpected_field": lambda v: False,
}
# Fields a record may leave out.
OPTIONAL = {"case.features", "provenance.target", "provenance.declared_id", "reason", "error", "timings",
            "timings.0.tflops", "sources", "entry", "run_id", "extra", "unexpected_field"}


def test_every_record_field_every_wrong_type(tmp_path: Path, cli_runner: CliRunner, fast_cli: None) -> None:
    rows: list[str] = []
    expect: dict[int, tuple[str, bool]] = {}  # line -> (field, must be refused)
    for fld, ok in RECORD_FIELDS.items():
        for v in EVERY_TYPE:
            rec = base_record(len(rows))
            if fld == "run_id" and isinstance(v, str):
                v = f"{v}-{len(rows)}"  # keep identities distinct: no accidental contradiction
            if fld == "unexpected_field":
                if v is not DELETE:
                    rec[fld] = v
            elif fld == "case.features" and v == [[128, 128]]:
                continue  # a list of lists: covered by [1]
            else:
                set_field(rec, fld, v)
            rows.append(json.dumps(rec))
            accepted = fld in OPTIONAL if v is DELETE else ok(v)
            expect[len(rows)] = (fld.replace(".0.", "[0]."), not accepted)
            if v is DELETE and fld.startswith("case."):
                expect[len(rows)] = ("case", not accepted)  # "case: missing field(s) arch"
    path = tmp_path / "every.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    problems: list[Problem] = []
    read_records(path, problems=problems)
    by_line: dict[int, list[str]] = {}
    for p in problems:
        located(p, path)
        by_line.setdefault(p.line, []).append(p.field)
    wrong = []
    for ln, (fld, refuse) in expect.items():
        fields = by_line.get(ln, [])
        named = any(f == fld or f.startswith(fld + ".") or f.startswith(fld + "[") for f in fields)
        if refuse != bool(fields) or (refuse and not named):
            wrong.append((ln, fld, json.loads(rows[ln - 1]), fields))
    assert not wrong, "\n".join(map(str, wrong[:10]))
    assert sum(refuse for _, refuse in expect.values()) > 400
    # The CLI says the same, line by line, and a merge writes nothing.
    res = invoke(cli_runner, ["validate", str(path), "--no-embedded", "--json"])
    assert res.exit_code == 1
    cli_lines = {json.loads(x)["line"] for x in res.stdout.splitlines()}
    assert cli_lines >= set(by_line)
    # Beyond the schema, validate only adds "a validated pass must carry its measured error" and unknown backends.
    extra = sorted({(expect[ln][0], rows[ln - 1]) for ln in cli_lines - set(by_line)})
    assert all(f in ("error", "case.backend") for f, _ in extra), extra
    out = tmp_path / "out.jsonl"
    assert invoke(cli_runner, ["merge", str(path), "-o", str(out)]).exit_code == 1 and not out.exists()


def _base_fact() -> dict:
    return {"id": "f", "backend": "fa2", "archs": ["sm_90"], "ops": ["prefill"], "dtypes": ["bfloat16"],
            "head_dims": [[128, 128]], "feature_sets": [["causal"]], "outcome": "rejected",
            "sources": ["Dao-AILab/flash-attention@abc:csrc/x.cpp#L1"], "reason": "head dim not supported",
            "statement": "fa2 does not support it", "date": "2026-11-30"}


def _list_of(pred):
    return lambda v: isinstance(v, list) and bool(v) and all(pred(x) for x in v)


def _pair(v: object) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_valid_dim(x) for x in v)


FACT_FIELDS_OK = {
    "id": _nonempty_str,
    "backend": RECORD_FIELDS["case.backend"],
    "archs": _list_of(_valid_arch),
    "ops": _list_of(lambda x: isinstance(x, str) and x in OPS),
    "dtypes": _list_of(lambda x: isinstance(x, str) and x in DTYPES),
    "head_dims": _list_of(_pair),
    "feature_sets": _list_of(_valid_features),
    "outcome": lambda v: isinstance(v, str) and v in ("pass", "rejected"),
    "sources": _list_of(_nonempty_str),
    "reason": lambda v: not v or isinstance(v, str),  # empty: the statement stands in
    "date": _nonempty_str,
    "kernel_version": lambda v: not v or isinstance(v, str),
}
RANKING_FIELDS_OK = {
    "id": lambda v: isinstance(v, str),
    "archs": _list_of(_valid_arch),
    "op": lambda v: isinstance(v, str) and v in OPS,
    "dtype": lambda v: v is None or v is DELETE or (isinstance(v, str) and v in DTYPES),
    "head_dims": _list_of(_pair),
    "order": _list_of(_nonempty_str),
    "sources": _list_of(_nonempty_str),
    "statement": lambda v: v is DELETE or isinstance(v, str),
}


def test_every_declared_field_every_wrong_type(tmp_path: Path) -> None:
    wrong = []
    values = [*EVERY_TYPE, ["sm_90"], ["prefill"], ["bfloat16"], [["causal"]], [[128]], [[128, 128, 1]],
              [[0, 128]], [[True, 128]], [[1.5, 128]], [[10**9, 128]], [[-1, 128]], [["128", 128]], ["fa2"]]
    for kind, fields in (("facts", FACT_FIELDS_OK), ("rankings", RANKING_FIELDS_OK)):
        for fld, ok in fields.items():
            for v in values:
                item = _base_fact() if kind == "facts" else valid_ranking(0)
                if v is DELETE:
                    item.pop(fld, None)
                else:
                    item[fld] = v
                path = tmp_path / "declared.json"
                path.write_text(json.dumps({"schema": 1, kind: [item]}), encoding="utf-8")
                problems: list[Problem] = []
                read_declared(path, problems)
                for p in problems:
                    located(p, path, line_based=False)
                must = not ok(v) and not (v is DELETE and fld in ("kernel_version", "reason", "dtype", "statement"))
                if must != bool(problems) or (must and not all(p.field.startswith(f"{kind}[0]") for p in problems)):
                    wrong.append((kind, fld, v, [str(p) for p in problems]))
    assert not wrong, "\n".join(map(str, wrong[:10]))
