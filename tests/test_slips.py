"""A slip of the hand loses nothing and invents nothing: existing result files survive every command that writes,
option values are checked where they enter (CLI and library alike), conflicting options are refused, and
`validate` of nothing is not "ok"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attnmatrix.matrix.cases import CaseError, check_count, check_duration
from attnmatrix.matrix.storage import dump_record, read_records
from click.testing import CliRunner
from conftest import build_record, dump_jsonl

from attnmatrix.cli import main
from attnmatrix.cli.group import load_all_commands

# --- merge -o onto an existing result file -----------------------------------------------------------------------


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _existing(tmp_path: Path, n: int = 5) -> Path:
    return dump_jsonl(tmp_path / "existing.jsonl",
                      [build_record(backend="fa2", head_dim=64 + 8 * i, features=()) for i in range(n)])


def test_merge_refuses_to_replace_an_existing_result_file(tmp_path):
    existing = _existing(tmp_path)
    before = existing.read_bytes()
    new = dump_jsonl(tmp_path / "new.jsonl", [build_record(backend="fa2", head_dim=256, features=())])
    r = CliRunner().invoke(main, ["merge", str(new), "-o", str(existing)])
    assert r.exit_code == 2, r.output
    assert "--append" in r.output and existing.read_bytes() == before


def test_merge_append_keeps_every_record_of_the_file_it_extends(tmp_path):
    existing = _existing(tmp_path)
    old = _records(existing)
    unavailable = build_record(backend="fa3", head_dim=64, features=(), outcome="unavailable", reason="no module")
    existing.write_text(existing.read_text() + json.dumps(unavailable) + "\n")
    new = dump_jsonl(tmp_path / "new.jsonl", [build_record(backend="fa2", head_dim=256, features=())])
    r = CliRunner().invoke(main, ["merge", str(new), "-o", str(existing), "--append"])
    assert r.exit_code == 0, r.output
    after = _records(existing)
    key = lambda d: json.dumps(d, sort_keys=True)  # noqa: E731
    assert {key(d) for d in old + [unavailable]} <= {key(d) for d in after} and len(after) == len(old) + 2


# --- every write path of every command ---------------------------------------------------------------------------

# What each command writes. A command added without an entry here fails the completeness test below.
WRITES_RESULT_FILES = {"merge", "probe", "run", "xcompile", "ingest-cubins", "vllm-answers"}
WRITES_GENERATED_FILES_ONLY = {"generate", "snapshot"}  # fixed paths of the checkout, no file of the user's
READS_ONLY = {"check", "diff", "explain", "show", "stats", "validate"}  # check --reprobe writes a temporary file only
# A file of the user's that is not a result file; refusing to replace a foreign one is tests/test_vllm_patch.py's.
WRITES_OTHER_FILES = {"vllm-patch"}
OUTPUT_PARAMS = {"out", "output", "results_dir"}


def test_every_command_is_classified_by_what_it_writes():
    load_all_commands()  # commands register when their module is imported
    assert set(main.commands) == WRITES_RESULT_FILES | WRITES_GENERATED_FILES_ONLY | READS_ONLY | WRITES_OTHER_FILES
    for name in READS_ONLY | WRITES_GENERATED_FILES_ONLY:
        assert not OUTPUT_PARAMS & {p.name for p in main.commands[name].params}, name
    for name in WRITES_RESULT_FILES:
        assert OUTPUT_PARAMS & {p.name for p in main.commands[name].params}, name


def _canonical(path: Path) -> set[str]:
    """The records of a result file, each in its one canonical form (merge rewrites lines canonically)."""
    return {dump_record(rec) for _, rec in read_records(path)}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(WRITES_RESULT_FILES))
def test_no_command_loses_a_record_of_an_existing_result_file(tmp_path, monkeypatch, command):
    """Point each command's output at a result file that already holds records: it resumes it, extends it or
    refuses it; every record it held is still there."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "results" / "cpu.jsonl"
    target.parent.mkdir()
    held = [build_record(backend="fa2", head_dim=64 + 8 * i, features=()) for i in range(4)]
    # xcompile's one case is recorded already: resuming it compiles nothing (a compile takes minutes).
    held.append(build_record(tier="compiled", arch="sm_100", backend="fa4", head_dim=64, features=(),
                             provenance={"target": "sm_100a"}))
    dump_jsonl(target, held)
    before = _canonical(target)
    space = ["--head-dims", "64", "--features", "none", "--ops", "prefill", "--dtypes", "bfloat16"]
    if command == "merge":
        new = dump_jsonl(tmp_path / "new.jsonl", [build_record(backend="fa2", head_dim=256, features=())])
        args = [["merge", str(new), "-o", str(target)], ["merge", str(new), "-o", str(target), "--append"]]
    elif command == "probe":
        args = [["probe", "--backends", "sdpa_cpu", *space, "--no-timing", "-o", str(target)]]
    elif command == "run":
        args = [["run", "--backends", "sdpa_cpu", *space, "--reprobe", "--results-dir", str(target.parent)]]
    elif command == "xcompile":
        pytest.importorskip("flash_attn.cute")
        args = [["xcompile", "--arch", "sm_100a", *space, "-o", str(target)]]
    elif command == "ingest-cubins":
        from test_trtllm_cubins import make_wheel

        args = [["ingest-cubins", str(make_wheel(tmp_path / "flashinfer_cubin-0.6.13-py3-none-any.whl")),
                 "-o", str(target)]]
    else:
        assert command == "vllm-answers"
        from test_vllm_oracle import write_tree

        args = [["vllm-answers", "--wheel", str(write_tree(tmp_path / "tree")), "-o", str(target)]]
    for a in args:
        r = CliRunner().invoke(main, a)
        assert r.exit_code in (0, 1, 2), r.output
        assert before <= _canonical(target), (a, r.output)


# --- validate of nothing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, text", [("empty.jsonl", ""), ("blank.jsonl", "\n\n"), ("folder", None)])
def test_validate_of_nothing_is_exit_2(tmp_path, name, text):
    path = tmp_path / name
    if text is None:
        path.mkdir()
    else:
        path.write_text(text)
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 2 and "nothing to validate" in r.output and "no problems" not in r.output


def test_validate_no_embedded_and_no_files_is_exit_2():
    r = CliRunner().invoke(main, ["validate", "--no-embedded"])
    assert r.exit_code == 2 and "nothing to validate" in r.output


# --- option values checked where they enter ----------------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["probe", "--backends", "sdpa_cpu", "--timeout", "-1"], "--timeout"),
    (["probe", "--backends", "sdpa_cpu", "--timeout", "0"], "--timeout"),
    (["probe", "--backends", "sdpa_cpu", "--timeout", "nan"], "--timeout"),
    (["probe", "--backends", "sdpa_cpu", "--budget-ms", "-5"], "--budget-ms"),
    (["probe", "--backends", "sdpa_cpu", "--memory-limit", "0"], "--memory-limit"),
    (["run", "--timeout", "-1"], "--timeout"),
    (["xcompile", "--timeout", "-1"], "--timeout"),
    (["check", "--reprobe", "--timeout", "-1"], "--timeout"),
    (["check", "--max-diff-lines", "-1"], "--max-diff-lines"),
    (["show", "--limit", "-5"], "--limit"),
    (["diff", "embedded", "embedded", "--threshold", "-0.1"], "--threshold"),
    (["xcompile", "--arch", "sm_999"], "sm_999"),
])
def test_bad_option_values_are_refused_before_anything_runs(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and says in r.output, r.output
    assert "num_sms" not in r.output  # no option of that name exists
    assert not list(tmp_path.rglob("*.jsonl"))


@pytest.mark.parametrize("args, says", [
    (["explain", "--arch", "sm_90", "--capability", "10.0", "--head-size", "128"], "--capability"),
    (["check", "--sample", "5"], "--reprobe"),
    (["check", "--workers", "2"], "--reprobe"),
    (["probe", "--no-timing", "--budget-ms", "5", "--backends", "sdpa_cpu"], "--budget-ms"),
    (["probe", "--no-timing", "--timed-dtypes", "float16", "--backends", "sdpa_cpu"], "--timed-dtypes"),
    (["run", "--no-probe", "--reprobe"], "--reprobe"),
    (["run", "--no-probe", "--backends", "sdpa_cpu"], "--backends"),
])
def test_conflicting_options_are_refused(tmp_path, monkeypatch, args, says):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and says in r.output, r.output


def test_the_runner_and_prober_share_the_clis_checks():
    from attnmatrix.kernels.probe import ProbeConfig
    from attnmatrix.kernels.runner import RunnerConfig

    for bad in (-1, 0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(CaseError):
            check_duration(bad, "t")
        with pytest.raises(CaseError, match="timeout_s"):
            RunnerConfig(timeout_s=bad)
        with pytest.raises(CaseError, match="budget_ms"):
            ProbeConfig(budget_ms=bad)
    for bad in (0, -5, 1.5, True):
        with pytest.raises(CaseError):
            check_count(bad, "n")
        with pytest.raises(CaseError, match="workers"):
            RunnerConfig(workers=bad)
    assert RunnerConfig(timeout_s=2).timeout_s == 2.0 and check_count(0, "n", minimum=0) == 0


@pytest.mark.parametrize("call, says", [
    (lambda S: S.select_backends((9, 0), 128, page_size=0), "page_size"),
    (lambda S: S.get_flash_attn_version((9, 0), head_size=-1), "head_size"),
    (lambda S: S.get_flash_attn_version((9, 0), head_size=128, kv_cache_block_size=0), "kv_cache_block_size"),
    (lambda S: S.select_backends((1, 10), 128), "capability minor"),
    (lambda S: S.get_flash_attn_version((0, 9)), "capability major"),
])
def test_the_selector_refuses_what_the_cli_refuses(call, says):
    from attnmatrix import selector

    with pytest.raises(ValueError, match=says):
        call(selector)
    assert selector.get_flash_attn_version((9, 0), head_size=128) in (2, 3, 4)


# --- a rerun's timing noise is not evidence ------------------------------------------------------------------------


def test_the_rerun_noise_band_is_the_committed_measurement():
    from attnmatrix.matrix.diff import RERUN_NOISE

    measured = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "rerun_variance.json").read_text())
    assert RERUN_NOISE == (measured["latency_ratio"]["p05"], measured["latency_ratio"]["p95"])


def test_a_rerun_reports_timing_changes_only_beyond_the_measured_noise(make_rec):
    from attnmatrix.matrix.diff import RERUN_NOISE, diff_matrices
    from attnmatrix.matrix.evidence import Evidence
    from attnmatrix.matrix.policy import resolve

    def matrix(*latencies):
        ev = Evidence()
        for i, ms in enumerate(latencies):
            ev.add(make_rec(head_dim=64 + 32 * i, latency_ms=ms), f"r.jsonl:{i + 1}")
        return resolve(ev)

    before, after = matrix(1.0, 1.0, 1.0), matrix(1.15, 0.86, 1.5)  # two within the noise, one beyond it
    assert len([c for c in diff_matrices(before, after) if c.kind in ("faster", "slower")]) == 3
    changes = [c for c in diff_matrices(before, after, noise=RERUN_NOISE) if c.kind in ("faster", "slower")]
    assert [(c.kind, c.after) for c in changes] == [("slower", "1.5 ms")]
