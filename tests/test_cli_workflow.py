"""Every workflow ends in a true state: `run` leaves `check` green, GPU backends are refused on a CPU before
anything starts, `check --reprobe` re-checks installed backends on a sample, re-running `xcompile` validates,
foreign files are never truncated, one checkout is read and written, and the exit-code contract holds
(0 ok, 1 check failed, 2 bad usage or unreadable input, 130 interrupted)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result
from conftest import checkout_copy

from attnmatrix import project
from attnmatrix.cli import main

REPO = Path(project.__file__).resolve().parent.parent
NO_GPU = not torch.cuda.is_available()


def run(*args) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tree_of(tmp_path: Path) -> Path:
    """A copy of the checkout's matrix, docs and selector: a checkout of its own."""
    return checkout_copy(tmp_path / "tree")


def files_of(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): sha(p) for p in sorted(root.rglob("*")) if p.is_file()}


NOTES = "my notes\nline two\n"
BINARY = bytes(range(256)) * 16  # 4 KiB, not UTF-8


# --- probe refuses GPU backends on a CPU ---------------------------------------------------------------------


@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without a GPU")
def test_probe_refuses_gpu_backends_without_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = run("probe", "--backends", "fa4,sdpa_cudnn,sdpa_cpu", "--head-dims", "128,192x128")
    assert r.exit_code == 2, r.output
    assert "fa4, sdpa_cudnn need(s) an NVIDIA GPU" in r.stderr and "sdpa_cpu" in r.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, not even attnmatrix-results/
    r = run("probe", "--backends", "fa2", "-o", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and not (tmp_path / "x.jsonl").exists()
    assert run("probe", "--device", "cuda", "--backends", "sdpa_cpu").exit_code == 2


def test_probe_refuses_a_named_backend_that_is_not_installed(tmp_path: Path, monkeypatch) -> None:
    from attnmatrix.kernels import registry
    from attnmatrix.kernels.base import Backend

    b = Backend("fake_absent", "no-such-dist", "cpu", ("attnmatrix_no_such_module",), lambda p: None, lambda c: "x")
    registry.register(b, label="test fake: not installed")
    try:
        monkeypatch.chdir(tmp_path)
        r = run("probe", "--device", "cpu", "--backends", "fake_absent", "--head-dims", "64")
        assert r.exit_code == 2 and "not installed here: fake_absent (cannot import attnmatrix_no_such_module" \
            in r.stderr
        assert list(tmp_path.iterdir()) == []
    finally:
        registry.unregister("fake_absent")


# --- no foreign file is truncated -------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [NOTES.encode(), BINARY, b'{"json": "but not a record"}\n'])
@pytest.mark.parametrize("command", [
    ["probe", "--device", "cpu", "--backends", "sdpa_cpu", "--head-dims", "64", "--features", "causal",
     "--ops", "prefill", "--dtypes", "bfloat16", "--no-timing"],
    ["xcompile", "--arch", "sm_90a", "--head-dims", "64", "--features", "causal", "--ops", "prefill",
     "--dtypes", "bfloat16"],
])
def test_outputs_that_are_not_our_result_files_are_refused_untouched(tmp_path: Path, command, content) -> None:
    out = tmp_path / "notes.txt"
    out.write_bytes(content)
    r = run(*command, "-o", out)
    assert r.exit_code == 2, r.output
    assert "not an attnmatrix result file" in r.stderr and str(out) in r.stderr
    assert out.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("content", [NOTES.encode(), BINARY])
def test_merge_refuses_to_overwrite_a_foreign_file(tmp_path: Path, make_record, write_jsonl, content) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [make_record()])
    out = tmp_path / "README.md"
    out.write_bytes(content)
    r = run("merge", a, "-o", out)
    assert r.exit_code == 2 and "refusing to write into it" in r.stderr
    assert out.read_bytes() == content


def test_merge_drops_unavailable_records_and_says_so(tmp_path: Path, make_record, write_jsonl) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [make_record(), make_record(head_dim=64, backend="fa3",
                                                                       outcome="unavailable", reason="no module")])
    out = tmp_path / "m.jsonl"
    r = run("merge", a, "-o", out)
    assert r.exit_code == 0 and "dropped 1 `unavailable` record(s)" in r.stdout
    assert len(out.read_text().splitlines()) == 1


def test_a_last_record_without_its_newline_is_valid_and_kept(tmp_path: Path, make_record) -> None:
    f = tmp_path / "r.jsonl"
    lines = [json.dumps(make_record(head_dim=64)), json.dumps(make_record(head_dim=128))]
    f.write_text("\n".join(lines))  # no trailing newline
    r = run("validate", "--no-embedded", f)
    assert r.exit_code == 0, r.output
    from attnmatrix.matrix.storage import ResultStore

    with ResultStore(f) as store:
        assert store.repaired_bytes == 0 and len(store.done) == 2
    assert f.read_text() == "\n".join(lines) + "\n"


# --- exit codes ---------------------------------------------------------------------------------------------------


def test_xcompile_unknown_arch_is_usage(tmp_path: Path) -> None:
    r = run("xcompile", "--arch", "sm_999", "-o", tmp_path / "x.jsonl")
    assert r.exit_code == 2 and "--arch" in r.output and "sm_999" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("args", [
    ["--head-size", "-1"], ["--head-size", "0"], ["--head-size", "99999999999999999999999"],
    ["--head-size", "128", "--head-size-v", "0"],
    ["--head-size", "128", "--page-size", "0"], ["--head-size", "128", "--page-size", "-16"],
    ["--head-size", "128", "--page-size", "99999999999"],
])
def test_explain_validates_head_and_page_sizes(args) -> None:
    r = run("explain", "--arch", "sm_90", *args)
    assert r.exit_code == 2, r.output
    assert "is not a head size" in r.output or "is not a page size" in r.output


@pytest.mark.parametrize("args", [["--head-dim", "0"], ["--head-dim-v", "-3"]])
def test_show_validates_head_sizes(args) -> None:
    r = run("show", *args)
    assert r.exit_code == 2 and "is not a head size" in r.output


def test_truncated_line_is_unreadable_input_in_validate_and_diff(tmp_path: Path, make_record) -> None:
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(make_record(head_dim=64)) + "\n" + json.dumps(make_record())[:40] + "\n")
    assert run("validate", "--no-embedded", f).exit_code == 2
    assert run("diff", "embedded", f).exit_code == 2
    assert run("diff", f, "embedded").exit_code == 2


@pytest.mark.slow
def test_show_and_explain_refuse_bad_results(tmp_path: Path, make_record, write_jsonl) -> None:
    bad = write_jsonl(tmp_path / "bad.jsonl", [make_record(backend="fa9"), "{"])
    for args in (["show", "--arch", "sm_90", "--results", bad],
                 ["explain", "--arch", "sm_90", "--head-size", "128", "--results", bad]):
        r = run(*args)
        assert r.exit_code == 2, r.output
        assert f"{bad}:1" in r.stderr and f"{bad}:2" in r.stderr
    missing = run("show", "--results", tmp_path / "nope.jsonl")
    assert missing.exit_code == 2 and "cannot read" in missing.stderr


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnmatrix.cli import evidence

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(evidence, "load", interrupted)
    r = run("validate")
    assert r.exit_code == 130 and "interrupted" in r.stderr


# --- one checkout -----------------------------------------------------------------------------------------------


def test_commands_read_and_write_the_checkout_they_stand_in(tmp_path: Path, monkeypatch, make_record,
                                                            write_jsonl) -> None:
    root = tree_of(tmp_path)
    write_jsonl(root / "matrix" / "data" / "results" / "extra.jsonl", [make_record(backend="fa9")])
    monkeypatch.chdir(root / "site")
    r = run("validate")
    assert r.exit_code == 1  # the tree's own matrix was read: its unknown backend is found
    assert f"matrix: the checkout at {root.resolve()}" in r.stderr and "extra.jsonl:1" in r.stderr
    monkeypatch.chdir(tmp_path)
    outside = run("validate")
    assert "installed package's data" in outside.stderr and "extra.jsonl" not in outside.stderr
    g = run("generate")
    assert g.exit_code == 2 and "no attnmatrix checkout" in g.stderr


# --- run leaves check green ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_leaves_check_green(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tree_of(tmp_path)
    before = files_of(root)
    monkeypatch.chdir(root)
    results = tmp_path / "results"
    r = run("run", "--backends", "sdpa_cpu", "--head-dims", "64", "--features", "causal", "--ops", "prefill",
            "--dtypes", "bfloat16", "--results-dir", results, "--reprobe")
    assert r.exit_code == 0, r.output
    assert "new evidence: 1 record(s)" in r.stdout and "attnmatrix merge" in r.stdout
    assert "the selector and docs were not changed" in r.stdout
    assert files_of(root) == before  # nothing in the checkout was touched
    assert len((results / "cpu.jsonl").read_text().splitlines()) == 1
    c = run("check")
    assert c.exit_code == 0, c.output
    # Merging it explicitly, then generating, is the way in; check is green again after that.
    m = run("merge", results / "cpu.jsonl", "-o", root / "matrix" / "data" / "results" / "cpu-mine.jsonl")
    assert m.exit_code == 0, m.output
    assert run("generate").exit_code == 0
    assert run("check").exit_code == 0


# --- check --reprobe ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_check_reprobe_samples_installed_backends_with_progress(tmp_path: Path) -> None:
    root = tree_of(tmp_path)
    r = run("check", "--root", root, "--reprobe", "--sample", "3", "--workers", "2")
    assert r.exit_code == 0, r.output
    arch = "cpu" if NO_GPU else None
    if arch == "cpu":
        assert "reprobe: 3 of " in r.stderr and "validated claims for cpu (sdpa_cpu 3)" in r.stderr
        assert "reprobing" in r.stderr  # the progress bar
        assert "reprobe: all 3 re-checked validated claims for cpu still hold" in r.stdout


# --- xcompile twice validates ----------------------------------------------------------------------------------


def _have_fa4() -> bool:
    from attnmatrix.kernels.base import load_backend

    return load_backend("fa4").availability() is None


@pytest.mark.slow
@pytest.mark.skipif(not _have_fa4(), reason="needs flash-attn-4 and nvidia-cutlass-dsl")
def test_xcompile_twice_then_validate_and_merge_cleanly(tmp_path: Path) -> None:
    args = ["xcompile", "--arch", "sm_90a", "--head-dims", "64", "--features", "causal", "--ops", "prefill",
            "--dtypes", "bfloat16", "--workers", "1"]
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    for out in (one, two):
        r = run(*args, "-o", out)
        assert r.exit_code == 0, r.output
    recs = [json.loads(line) for f in (one, two) for line in f.read_text().splitlines()]
    assert len(recs) == 2 and all(r["run_id"] for r in recs) and recs[0]["run_id"] != recs[1]["run_id"]
    assert recs[0]["outcome"] == recs[1]["outcome"] == "compiled"
    v = run("validate", one, two)
    assert v.exit_code == 0, v.output
    m = run("merge", one, two, "-o", tmp_path / "merged.jsonl")
    assert m.exit_code == 0 and "into 2" in m.stdout
