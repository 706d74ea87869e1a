"""The evidence a matrix is made of: result records, declared facts, declared rankings, backend metadata.

`load_evidence` reads all of it (by default the embedded `matrix/data/`), collecting every problem
with its file, line and field instead of stopping at the first.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path

from attnmatrix.vocabulary import ARCHS, DTYPES, MAX_HEAD_DIM, OPS, QUALIFIERS, feature_name

from . import backends as B
from .cases import BACKEND_FEATURE_SETS, FEATURE_SETS, HEAD_DIMS, MLA_TRIPLES, CaseError, mla_excludes, normalize_arch
from .records import Record, RecordError, parse_record
from .storage import InputError, Problem, iter_result_files, read_records

DATA_DIR = Path(__file__).parent / "data"
RESULTS_DIR = DATA_DIR / "results"
DECLARED_FILE = DATA_DIR / "declared.json"
BACKENDS_FILE = B.BACKENDS_FILE


@dataclass(frozen=True)
class Ranking:
    """A declared performance claim: on these cells, `order` is fastest first. Used only unmeasured."""

    id: str
    archs: tuple[str, ...]
    op: str
    dtype: str | None
    head_dims: tuple[tuple[int, int], ...]
    order: tuple[str, ...]
    sources: tuple[str, ...]
    statement: str
    where: str = ""  # the file it was declared in, for problems

    def applies(self, arch: str, op: str, dtype: str, head_dim: int, head_dim_v: int) -> bool:
        return (arch in self.archs and op == self.op and (self.dtype in (None, dtype))
                and (head_dim, head_dim_v) in self.head_dims)


@dataclass
class Evidence:
    records: list[Record] = field(default_factory=list)
    where: list[str] = field(default_factory=list)  # "file:line" (or "file#fact-id") per record
    rankings: list[Ranking] = field(default_factory=list)
    backends: dict[str, dict] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)

    def add(self, rec: Record, where: str) -> None:
        self.records.append(rec)
        self.where.append(where)

    def extend(self, other: Evidence) -> None:
        self.records += other.records
        self.where += other.where
        self.rankings += other.rankings
        self.files += other.files
        self.backends = self.backends or other.backends


# --- backend metadata: the one loader is matrix/backends.py ------------------------------------------------


def load_backends(path: Path | None = None) -> dict[str, dict]:
    """Backend metadata (`backends` of backends.json). Every malformed entry is reported, with file and field.

    Without `path`: the package's backends.json and the backends registered at run time (matrix/backends.py
    plugins, e.g. the test suite's fakes)."""
    if path is None:
        return {**load_backends(BACKENDS_FILE), **B.plugin_metadata()}
    try:
        entries, problems = B.read(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError([Problem(str(path), None, "backends", f"cannot load backend metadata: {e}")]) from e
    if problems:
        raise InputError([Problem(str(path), None, field, msg) for field, msg in problems])
    return entries


# --- declared facts: one fact, one scope ----------------------------------------------------------------
#
# A fact states the scope it covers on each axis: `archs`, `ops`, `dtypes`, `head_dims`, `feature_sets`,
# each either a list or "*" ("every value of that axis the matrix covers": ARCHS, OPS, DTYPES, the space's
# head dims, the standard feature sets). It is stored once; `expand_fact` turns it into one declared
# record per cell of its scope, so "FA2 has no sinks argument" holds at every head dim without a copy per
# cell. An MLA prefill cell of a "*" head-dim scope is one per MLA triple (qk_nope, qk_rope, v), with its
# `qk_rope:<n>` token; a listed [qk, v] pair stays a (qk, v) cell, which speaks for the totals only.
# `requires` (a list of feature names) narrows a "*" feature scope to the sets that have all of them, and
# `excludes` to the sets that have none of them: {"feature_sets": "*", "requires": ["sinks"]}.

ANY = "*"
SCOPE_AXES = ("archs", "ops", "dtypes", "head_dims", "feature_sets")


def _axis(fact: dict, name: str, every: list) -> list:
    v = fact[name]
    return list(every) if v == ANY else v


def _feature_scope(fact: dict) -> list[tuple[str, ...]]:
    sets = fact["feature_sets"]
    if sets == ANY:
        sets = list(FEATURE_SETS) + [f for f in BACKEND_FEATURE_SETS.get(fact["backend"], []) if f not in FEATURE_SETS]
    requires, excludes = set(fact.get("requires", ())), set(fact.get("excludes", ()))
    out = []
    for feats in sets:
        names = {feature_name(str(t)) for t in feats}  # a malformed token is the Case's to report
        if requires <= names and not (excludes & names):
            out.append(tuple(feats))
    return out


def _cells_for_op(fact: dict, op: str, feature_sets: list[tuple[str, ...]]) -> list[tuple[int, int, tuple[str, ...]]]:
    """(head_dim, head_dim_v, features) of the fact's scope for one op."""
    if fact["head_dims"] != ANY:
        return [(hd[0], hd[1], feats) for hd in fact["head_dims"] for feats in feature_sets]
    if op != "mla_prefill":
        return [(hd, hdv, feats) for hd, hdv in HEAD_DIMS for feats in feature_sets]
    out = []
    for nope, rope, v in MLA_TRIPLES:
        for feats in feature_sets:
            if mla_excludes(feats) or any(feature_name(str(t)) in QUALIFIERS for t in feats):
                continue  # MLA prefill is never paged or windowed (cases.mla_excludes); its rope split is added here
            out.append((nope + rope, v, (*feats, f"qk_rope:{rope}")))
    return out


def expand_fact(fact: dict) -> list[Record]:
    """A declared fact's records: one per cell of its scope (see above)."""
    base = {k: fact[k] for k in ("outcome", "sources") if k in fact}
    prov = {"date": fact.get("date") or "", "kernel_version": fact.get("kernel_version") or "",
            "declared_id": fact.get("id", "")}
    if not prov["kernel_version"]:
        del prov["kernel_version"]
    feature_sets = _feature_scope(fact)
    out = []
    for arch, op, dtype in itertools.product(_axis(fact, "archs", ARCHS), _axis(fact, "ops", OPS),
                                             _axis(fact, "dtypes", DTYPES)):
        for hd, hdv, feats in _cells_for_op(fact, op, feature_sets):
            d = {
                "schema": 1, "tier": "declared", "provenance": prov, **base,
                "case": {"arch": arch, "backend": fact["backend"], "op": op, "dtype": dtype, "head_dim": hd,
                         "head_dim_v": hdv, "features": list(feats)},
            }
            if fact.get("reason"):
                d["reason"] = fact["reason"]
            elif fact.get("outcome") != "pass":
                d["reason"] = fact.get("statement", "")
            if fact.get("statement"):
                d["extra"] = {"statement": fact["statement"]}
            out.append(parse_record(d))
    return out


FACT_FIELDS = ["id", "backend", "archs", "ops", "dtypes", "head_dims", "feature_sets", "outcome", "sources"]
RANKING_FIELDS = ["id", "archs", "op", "head_dims", "order", "sources"]


def _head_dim(v: object) -> int:
    """A ranking's head dim: an int in 1..MAX_HEAD_DIM (not 1.5, not true, not "64")."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_HEAD_DIM:
        raise CaseError(f"head_dims: {v!r} is not a head dim (an int in 1..{MAX_HEAD_DIM})")
    return v


def _pairs(v: object) -> list:
    if not isinstance(v, list) or not v or not all(isinstance(x, list) and len(x) == 2 for x in v):
        raise TypeError(f"head_dims: expected a non-empty list of [head_dim, head_dim_v] pairs, got {v!r}")
    return v


def _bad_axis(fact: dict) -> tuple[str, str] | None:
    """A fact's axes must be "*" or non-empty lists (an empty one would silently declare nothing); head dims
    pairs; `requires`/`excludes` lists of feature names, used with a "*" feature scope only."""
    for name in SCOPE_AXES:
        v = fact[name]
        if v != ANY and (not isinstance(v, list) or not v):
            return name, f"expected \"*\" or a non-empty list, got {v!r}"
    if fact["head_dims"] != ANY:
        try:
            _pairs(fact["head_dims"])
        except TypeError as e:
            return "head_dims", str(e).partition(": ")[2]
    for name in ("requires", "excludes"):
        if name not in fact:
            continue
        v = fact[name]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
            return name, f"expected a non-empty list of feature names, got {v!r}"
        if fact["feature_sets"] != ANY:
            return name, "narrows a \"*\" feature scope only (list the feature sets instead)"
    return None


def _string(v: object, name: str, choices: list[str] | None = None) -> str:
    if not isinstance(v, str) or (choices is not None and v not in choices):
        raise TypeError(f"{name}: {v!r} is not " + (f"one of {', '.join(choices)}" if choices else "a string"))
    return v


def _strings(v: object, name: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise TypeError(f"{name}: expected a non-empty list of non-empty strings, got {v!r}")
    return tuple(v)


def read_declared(path: Path, problems: list[Problem]) -> Evidence:
    ev = Evidence(files=[str(path)])
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise InputError([Problem(str(path), None, "(file)", f"cannot read: {e.strerror or e}")]) from e
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InputError([Problem(str(path), None, "(json)", f"not valid UTF-8 JSON: {e}")]) from e
    if not isinstance(data, dict) or type(data.get("schema")) is not int or data.get("schema") != 1:
        problems.append(Problem(str(path), None, "schema", "expected an object with \"schema\": 1"))
        return ev
    seen: set[str] = set()
    facts, rankings = data.get("facts", []), data.get("rankings", [])
    for name, value in (("facts", facts), ("rankings", rankings)):
        if not isinstance(value, list):
            problems.append(Problem(str(path), None, name, f"expected a list, got {type(value).__name__}"))
    for i, fact in enumerate(facts if isinstance(facts, list) else []):
        loc = f"facts[{i}]"
        if not isinstance(fact, dict):
            problems.append(Problem(str(path), None, loc, "not an object"))
            continue
        fid = fact.get("id", loc)
        if not isinstance(fid, str) or not fid:
            problems.append(Problem(str(path), None, f"{loc}.id", f"{fid!r} is not a non-empty string"))
            continue
        if "id" in fact:  # checked before anything else can stop us, so a broken fact's id is still known
            if fid in seen:
                problems.append(Problem(str(path), None, f"{loc}.id", f"duplicate fact id {fid!r}", fid))
            seen.add(fid)
        missing = [k for k in FACT_FIELDS if k not in fact]
        if missing:
            problems.append(Problem(str(path), None, f"{loc}.{missing[0]}", f"missing ({', '.join(missing)})", fid))
            continue
        bad_axis = _bad_axis(fact)
        if bad_axis:
            problems.append(Problem(str(path), None, f"{loc}.{bad_axis[0]}", bad_axis[1], fid))
            continue
        try:
            for rec in expand_fact(fact):
                ev.add(rec, f"{path}#{fid}")
        except RecordError as e:
            problems.extend(Problem(str(path), None, f"{loc}.{f}", m, fid) for f, m in e.problems)
        except (CaseError, TypeError, IndexError, KeyError, ValueError) as e:
            problems.append(Problem(str(path), None, loc, f"cannot expand: {e}", fid))
    for i, r in enumerate(rankings if isinstance(rankings, list) else []):
        loc = f"rankings[{i}]"
        missing = [k for k in RANKING_FIELDS if not isinstance(r, dict) or k not in r]
        if missing:
            problems.append(Problem(str(path), None, f"{loc}.{missing[0]}", f"missing ({', '.join(missing)})"))
            continue
        try:
            ev.rankings.append(Ranking(
                id=_string(r["id"], "id"), archs=tuple(normalize_arch(a) for a in _strings(r["archs"], "archs")),
                op=_string(r["op"], "op", OPS),
                dtype=None if r.get("dtype") is None else _string(r["dtype"], "dtype", DTYPES),
                head_dims=tuple((_head_dim(a), _head_dim(b)) for a, b in _pairs(r["head_dims"])),
                order=_strings(r["order"], "order"), sources=_strings(r["sources"], "sources"),
                statement=_string(r.get("statement", ""), "statement"), where=str(path),
            ))
        except (CaseError, TypeError, ValueError) as e:
            rid = r.get("id") if isinstance(r.get("id"), str) else None
            problems.append(Problem(str(path), None, loc, f"malformed ranking: {e}", rid))
    return ev


def load_evidence(
    result_paths: list[str | Path] | None = None,
    *,
    declared: Path | None = DECLARED_FILE,
    include_embedded: bool = True,
    problems: list[Problem] | None = None,
    data_dir: Path | None = None,
) -> Evidence:
    """Read result files (files or directories of `*.jsonl`) and declared facts into one Evidence.

    With `include_embedded`, the committed matrix (`matrix/data/results` of `data_dir`, by default the
    package's own data) comes first. Problems are
    appended to `problems` when given; otherwise the first batch of problems raises InputError.
    """
    found: list[Problem] = [] if problems is None else problems
    data = Path(data_dir) if data_dir is not None else None
    if data is not None and declared == DECLARED_FILE:
        declared = data / "declared.json"
    backends = load_backends(data / "backends.json" if data is not None else BACKENDS_FILE)
    # Backends registered at run time (the test suite's fakes, matrix/backends.py) are known like declared ones.
    ev = Evidence(backends={**backends, **B.plugin_metadata()})
    embedded = data / "results" if data is not None else RESULTS_DIR
    paths: list[str | Path] = ([embedded] if include_embedded else []) + list(result_paths or [])
    for f in iter_result_files(paths):
        ev.files.append(str(f))
        for line, rec in read_records(f, problems=found):
            ev.add(rec, f"{f}:{line}")
    if declared is not None and declared.exists():
        ev.extend(read_declared(declared, found))
    if found and problems is None:
        raise InputError(found)
    return ev
