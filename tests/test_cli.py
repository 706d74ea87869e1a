"""The command line contract: exit codes 0 ok / 1 check failed / 2 bad usage or unreadable input, and errors
that name the file, the line and the field.

`generate`/`check` run against a temporary copy of the checkout (`--root`); the real files are never written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from attnmatrix import project
from attnmatrix.cli import main

REPO = Path(project.__file__).resolve().parent.parent


def run(*args: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# --- validate ----------------------------------------------------------------------------------


def test_validate_embedded_matrix_ok() -> None:
    r = run("validate")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("ok: ") and "no problems" in r.stdout


def test_validate_lists_every_malformed_line(tmp_path: Path, make_record, write_jsonl) -> None:
    bad_outcome = make_record(head_dim=96, outcome="nope")
    bad_dtype = make_record(head_dim=80)
    bad_dtype["case"]["dtype"] = "int4"
    f = write_jsonl(tmp_path / "bad.jsonl", [make_record(head_dim=64), bad_outcome, "{oops", make_record(),
                                             bad_dtype])
    r = run("validate", f)
    assert r.exit_code == 2, r.output  # line 3 is not JSON: unreadable input, and every problem still listed
    assert f"{f}:2 [sm_90/fa2/prefill/bfloat16/96x96/causal]: outcome: 'nope'" in r.stderr
    assert f"{f}:3: (json): not valid JSON" in r.stderr
    assert f"{f}:5: case.dtype: 'int4'" in r.stderr
    assert "3 problem(s) found" in r.stderr

    j = run("validate", "--no-embedded", "--json", f)
    assert j.exit_code == 2
    rows = [json.loads(line) for line in j.stdout.splitlines()]
    assert [(x["file"], x["line"], x["field"]) for x in rows] == [
        (str(f), 2, "outcome"), (str(f), 3, "(json)"), (str(f), 5, "case.dtype")]


def test_validate_consistency_problems_exit_1(tmp_path: Path, make_record, write_jsonl) -> None:
    f = write_jsonl(tmp_path / "r.jsonl", [make_record(backend="fa9")])
    r = run("validate", "--no-embedded", f)
    assert r.exit_code == 1 and f"{f}:1 [sm_90/fa9/" in r.stderr and "case.backend" in r.stderr


def test_validate_unreadable_input_exits_2(tmp_path: Path, make_record) -> None:
    missing = tmp_path / "missing.jsonl"
    r = run("validate", missing)
    assert r.exit_code == 2 and f"{missing}: (file): cannot read" in r.stderr
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(make_record()).encode() + b"\n" + b'{"a": "caf\xe9"}\n')
    r = run("validate", latin)
    assert r.exit_code == 2 and f"{latin}:2: (file): not UTF-8" in r.stderr


# --- merge -------------------------------------------------------------------------------------


def test_merge_refuses_contradictions(tmp_path: Path, make_record, write_jsonl) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [make_record(run_id="r1", head_dim=64), make_record(run_id="r1")])
    b = write_jsonl(tmp_path / "b.jsonl", [make_record(run_id="r1", outcome="crash", reason="SIGSEGV")])
    out = tmp_path / "merged.jsonl"
    r = run("merge", a, b, "-o", out)
    assert r.exit_code == 1, r.output
    assert f"{b}:1 [sm_90/fa2/prefill/bfloat16/128x128/causal]: outcome: contradicts {a}:2" in r.stderr
    assert not out.exists() and f"not written: {out}" in r.stderr

    write_jsonl(out, [make_record(run_id="r0", head_dim=32)])  # an earlier merge: ours, but kept on failure
    before = sha(out)
    assert run("merge", a, b, "-o", out, "--append").exit_code == 1
    assert sha(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl", "merged.jsonl"]


def test_merge_writes_deduplicated_output(tmp_path: Path, make_record, write_jsonl) -> None:
    one, two = make_record(head_dim=64), make_record(head_dim=128, device="NVIDIA H100")
    a = write_jsonl(tmp_path / "a.jsonl", [one, two])
    d = tmp_path / "more"
    write_jsonl(d / "b.jsonl", [two, make_record(head_dim=96)])
    out = tmp_path / "merged.jsonl"
    r = run("merge", a, d, "-o", out)
    assert r.exit_code == 0, r.output
    assert "merged 4 records from 2 file(s) into 3" in r.stdout
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and len(set(lines)) == 3
    assert run("validate", "--no-embedded", out).exit_code == 0
    first = out.read_bytes()
    assert run("merge", d, a, "-o", out, "--append").exit_code == 0
    assert out.read_bytes() == first  # canonical, whatever the input order


def test_merge_unreadable_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    r = run("merge", tmp_path / "nope.jsonl", "-o", out)
    assert r.exit_code == 2 and not out.exists()


# --- show / explain / diff ---------------------------------------------------------------------

SHOW_KEYS = {"arch", "backend", "op", "dtype", "head_dim", "head_dim_v", "features", "status", "tier", "reason",
             "latency_ms", "tflops", "sources"}


def test_show_json_lines(tmp_path: Path, make_record, write_jsonl) -> None:
    # An arch the embedded matrix has no evidence for, so the two records are the only cells shown.
    t4 = dict(arch="sm_75", backend="sdpa_flash", device="Tesla T4", kernel_version="2.13.0")
    f = write_jsonl(tmp_path / "t4.jsonl", [
        make_record(**t4, head_dim=64, latency_ms=[1.0, 2.0, 3.0]),
        make_record(**t4, head_dim=128, outcome="rejected", reason="torch: no"),
    ])
    r = run("show", "--format", "json", "--results", f, "--arch", "sm_75")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert SHOW_KEYS <= set(row), SHOW_KEYS - set(row)
    by = {row["head_dim"]: row for row in rows}
    assert by[64]["status"] == "supported" and by[64]["latency_ms"] == 2.0 and by[64]["tflops"] == 100.0
    assert by[64]["sources"][0].startswith("validated: Tesla T4")
    assert by[128]["status"] == "unsupported" and by[128]["reason"] == "torch: no" and by[128]["latency_ms"] is None


def test_show_embedded_json_and_filters() -> None:
    r = run("show", "--format", "json", "--arch", "sm_90a", "--backend", "fa2", "--head-dim", "128", "--limit", "5")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert 0 < len(rows) <= 5
    assert all(x["arch"] == "sm_90" and x["backend"] == "fa2" and x["head_dim"] == 128 for x in rows)
    assert all(SHOW_KEYS <= set(x) for x in rows)


def test_show_backend_family_prefix() -> None:
    """`--backend trtllm` means every trtllm_* backend (issue #5's query), on sm_90 and on sm_100."""
    r = run("show", "--format", "json", "--backend", "trtllm")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert {x["backend"] for x in rows} >= {"trtllm_ragged", "trtllm_context", "trtllm_decode"}
    assert {"sm_90", "sm_100"} <= {x["arch"] for x in rows}
    assert run("show", "--backend", "trtll").exit_code == 2  # a prefix must end at a word boundary


def test_show_bad_usage_exits_2() -> None:
    r = run("show", "--backend", "nosuch")
    assert r.exit_code == 2 and "nosuch" in r.output
    assert run("show", "--arch", "volta").exit_code == 2


def test_explain_mentions_fa4() -> None:
    r = run("explain", "--arch", "sm_100", "--head-size", "256", "--sliding-window")
    assert r.exit_code == 0, r.output
    assert "query: sm_100 prefill bfloat16, head size 256x256, features causal+sliding_window" in r.stdout
    assert "fa4" in r.stdout
    j = run("explain", "--capability", "10.0", "--head-size", "256", "--sliding-window", "--json")
    assert j.exit_code == 0
    data = json.loads(j.stdout)
    assert data["query"]["arch"] == "sm_100" and "fa4" in data["backends"]
    assert set(data["order"]) <= set(data["backends"])


def test_explain_usage_errors() -> None:
    assert run("explain", "--head-size", "128").exit_code == 2
    assert run("explain", "--arch", "hopper", "--head-size", "128").exit_code == 2


def test_diff_between_two_files(tmp_path: Path, make_record, write_jsonl) -> None:
    # cpu cells: no declared fact mentions them, so both sides are exactly these files
    cpu = dict(arch="cpu", backend="sdpa_cpu")
    a = write_jsonl(tmp_path / "a.jsonl", [
        make_record(**cpu, head_dim=64, latency_ms=1.0), make_record(**cpu, head_dim=96, outcome="rejected",
                                                                     reason="no"),
        make_record(**cpu, head_dim=128), make_record(**cpu, head_dim=32, latency_ms=1.0)])
    b = write_jsonl(tmp_path / "b.jsonl", [
        make_record(**cpu, head_dim=64, latency_ms=2.0), make_record(**cpu, head_dim=96),
        make_record(**cpu, head_dim=256), make_record(**cpu, head_dim=32, latency_ms=0.5)])
    r = run("diff", a, b, "--json")
    assert r.exit_code == 0, r.output
    got = {(c["kind"], c["cell"]) for c in map(json.loads, r.stdout.splitlines())}
    assert got == {("slower", "cpu/sdpa_cpu/prefill/bfloat16/64x64/causal"),
                   ("faster", "cpu/sdpa_cpu/prefill/bfloat16/32x32/causal"),
                   ("gained", "cpu/sdpa_cpu/prefill/bfloat16/96x96/causal"),
                   ("removed", "cpu/sdpa_cpu/prefill/bfloat16/128x128/causal"),
                   ("added", "cpu/sdpa_cpu/prefill/bfloat16/256x256/causal")}
    back = run("diff", b, a, "--json")
    assert ("lost", "cpu/sdpa_cpu/prefill/bfloat16/96x96/causal") in {
        (c["kind"], c["cell"]) for c in map(json.loads, back.stdout.splitlines())}
    t = run("diff", a, b)
    assert t.exit_code == 0 and "added: 1, faster: 1, gained: 1, removed: 1, slower: 1" in t.stdout
    same = run("diff", a, a)
    assert same.exit_code == 0 and "no changes" in same.stdout
    assert run("diff", a, tmp_path / "nope.jsonl").exit_code == 2


# --- probe -------------------------------------------------------------------------------------


def test_probe_bad_usage_exits_2(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    r = run("probe", "--device", "cpu", "--backends", "nosuch", "-o", out)
    assert r.exit_code == 2 and "nosuch" in r.output
    r = run("probe", "--device", "cpu", "--backends", "sdpa_cpu", "--head-dims", "0", "-o", out)
    assert r.exit_code == 2 and "--head-dims" in r.output
    r = run("probe", "--device", "cpu", "--head-dims", "0", "-o", out)  # default backends
    assert r.exit_code == 2 and "--head-dims" in r.output
    r = run("probe", "--device", "cpu", "--backends", "sdpa_cpu", "--features", "causal+flash", "-o", out)
    assert r.exit_code == 2 and "--features" in r.output
    r = run("probe", "--device", "cpu", "--backends", "sdpa_cpu", "--dtypes", "float32", "-o", out)
    assert r.exit_code == 2
    assert not out.exists()


def test_probe_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "cpu.jsonl"
    args = ["probe", "--device", "cpu", "--backends", "sdpa_cpu", "--head-dims", "64", "--features", "none,causal",
            "--dtypes", "bfloat16", "--no-timing", "--timeout", "120", "-o", out]
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert "4 cases, 0 already recorded" in r.stderr and "pass" in r.stdout
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((x["case"]["op"], tuple(x["case"]["features"])) for x in recs) == [
        ("decode", ()), ("decode", ("causal",)), ("prefill", ()), ("prefill", ("causal",))]
    assert all(x["outcome"] == "pass" and x["case"]["arch"] == "cpu" and "timings" not in x for x in recs)
    assert run("validate", "--no-embedded", out).exit_code == 0

    j = run(*args, "--json")  # resumes: nothing left to probe
    assert j.exit_code == 0, j.output
    summary = json.loads(j.stdout)
    assert summary["file"] == str(out) and summary["cases"] == 4 and summary["resumed"] == 4
    assert summary["probed"] == 0 and summary["outcomes"] == {}
    assert len(out.read_text().splitlines()) == 4


# --- generate / check ----------------------------------------------------------------------------


def _tree(tmp_path: Path) -> Path:
    """A copy of what generate/check need from the checkout: mkdocs.yml, site/, matrix/data/, the selector."""
    root = tmp_path / "tree"
    (root / "matrix").mkdir(parents=True)
    shutil.copytree(REPO / "matrix" / "data", root / "matrix" / "data")  # the one checkout read and written
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    if (REPO / "site").is_dir():
        shutil.copytree(REPO / "site", root / "site")
    (root / "attnmatrix").mkdir()
    if (REPO / "attnmatrix" / "selector.py").is_file():
        shutil.copy(REPO / "attnmatrix" / "selector.py", root / "attnmatrix" / "selector.py")
    assert project.find_root(root) == root.resolve()  # never falls through to the real checkout
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def generator():
    gen = pytest.importorskip("attnmatrix.generator")
    if not hasattr(gen, "render_all"):
        pytest.skip("attnmatrix.generator.render_all does not exist yet")
    return gen


def test_root_outside_a_checkout_is_refused(tmp_path: Path) -> None:
    real = sha(REPO / "mkdocs.yml")
    r = run("generate", "--root", tmp_path)
    assert r.exit_code == 2 and "no attnmatrix checkout" in r.output
    assert run("check", "--root", tmp_path).exit_code == 2
    assert sha(REPO / "mkdocs.yml") == real


@pytest.mark.slow
def test_generate_is_deterministic(tmp_path: Path, generator) -> None:
    root = _tree(tmp_path)
    r = run("generate", "--root", root)
    assert r.exit_code == 0, r.output
    first = _snapshot(root)
    assert "attnmatrix/selector.py" in first
    r2 = run("generate", "--root", root)
    assert r2.exit_code == 0 and "; 0 changed" in r2.stdout
    assert _snapshot(root) == first
    other = _tree(tmp_path / "other")
    assert run("generate", "--root", other).exit_code == 0
    assert _snapshot(other) == first


@pytest.mark.slow
def test_check_clean_then_one_flipped_byte(tmp_path: Path, generator) -> None:
    root = _tree(tmp_path)
    assert run("generate", "--root", root).exit_code == 0
    r = run("check", "--root", root)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("ok: ")

    rel = generator.SUPPORT_MATRIX_PATH
    target = root / rel
    data = bytearray(target.read_bytes())
    # an ASCII letter in the second half, away from the header
    i = next(k for k in range(len(data) // 2, len(data)) if data[k] < 0x80 and chr(data[k]).isalpha())
    data[i] ^= 0x20  # one byte: swap the letter's case
    target.write_bytes(bytes(data))
    changed_line = data[data.rfind(b"\n", 0, i) + 1: data.find(b"\n", i)].decode()
    r = run("check", "--root", root)
    assert r.exit_code == 1, r.output
    out = r.stdout.splitlines()
    assert f"--- {rel} (on disk)" in out and f"+++ {rel} (generated)" in out
    assert "-" + changed_line in out
    assert f"1 generated file(s) are stale: {rel}" in r.stderr


def test_check_invalid_matrix_lists_every_problem(tmp_path: Path, make_record, write_jsonl,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path)
    no_error = make_record(head_dim=64)
    del no_error["error"]
    f = write_jsonl(root / "matrix" / "data" / "results" / "bad.jsonl", [make_record(backend="fa9"), "{", no_error])
    before = _snapshot(root)
    r = run("check", "--root", root)
    assert r.exit_code == 2, r.output  # a line that is not JSON: unreadable input
    assert f"{f}:1 [sm_90/fa9/prefill/bfloat16/128x128/causal]: case.backend" in r.stderr
    assert f"{f}:2: (json)" in r.stderr
    assert f"{f}:3 [sm_90/fa2/prefill/bfloat16/64x64/causal]: error" in r.stderr
    assert "3 problem(s) found" in r.stderr
    g = run("generate", "--root", root)
    assert g.exit_code == 2 and "not generated" in g.stderr
    assert _snapshot(root) == before


@pytest.mark.slow
def test_generate_refuses_a_workload_file_that_would_drop_a_ranking_and_writes_nothing(tmp_path: Path, generator,
                                                                                      monkeypatch) -> None:
    from attnmatrix.matrix import workloads as W

    root = _tree(tmp_path)
    before = _snapshot(root)
    # the committed timings, then a later file that re-checks one of vllm_fa3's layer calls in another call and
    # times it at a held-out shape alone: that call's grid would be dropped from the ranking without a word
    timings = tmp_path / "workloads"
    shutil.copytree(W.WORKLOADS_DIR, timings)
    check = next(r for r in W.load_rows() if r["set"] == "check" and r["backend"] == "vllm_fa3")
    later = [{**check, "profile": "another call"}, {**check, "set": "held_out", "profile": "another call",
                                                     "batch": 5, "length": 3000, "ms": 0.1}]
    (timings / "zz-later.jsonl").write_text("".join(json.dumps(r) + "\n" for r in later), encoding="utf-8")
    monkeypatch.setattr(W, "WORKLOADS_DIR", timings)
    r = run("generate", "--root", root)
    assert r.exit_code == 2, r.output
    assert "error: vllm_fa3 on " in r.output and "('another call') timed no bucket point" in r.output
    assert _snapshot(root) == before
