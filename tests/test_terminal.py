"""The CLI reads well in a terminal: `explain` ranked, wrapped to the terminal's width, long reasons cut to a line
(in full under --verbose), machine artefacts left out, the order's basis said once; every option documented
with examples; every command that reads the matrix names it on stderr."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from conftest import build_record, dump_jsonl

from attnmatrix.cli import main
from attnmatrix.cli.query import without_machine_artefacts

ARTEFACT = ("FlashInfer's kernels are not installed (/root/.cache/flashinfer/cubins/f50085/fmha/checksums.txt is "
            "missing) and FLASHINFER_NO_DOWNLOAD is set, so the kernel cannot be loaded here")


def test_machine_artefacts_are_shortened():
    short = without_machine_artefacts(ARTEFACT)
    assert "/root/.cache" not in short and "is set" not in short and "checksums.txt" in short
    assert "<cache>" not in without_machine_artefacts(ARTEFACT.replace("/root/.cache", "<cache>"))
    assert without_machine_artefacts("head_dim must be a multiple of 8") == "head_dim must be a multiple of 8"


@pytest.mark.slow
def test_explain_reads_well_in_100_columns(tmp_path):
    stored = ARTEFACT.replace("/root/.cache", "<cache>")  # as result files keep it (matrix/storage.py)
    extra = dump_jsonl(tmp_path / "r.jsonl", [build_record(backend="flashinfer", outcome="rejected", reason=stored,
                                                           arch="sm_90", head_dim=128, features=("causal",))])
    args = ["explain", "--arch", "sm_90", "--head-size", "128", "--results", str(extra)]
    r = CliRunner(env={"COLUMNS": "100"}).invoke(main, args)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 100
    assert r.stdout.count("How the order is decided") == 1
    order = " ".join(re.search(r"^order: (.+?)\nHow the order", r.stdout, re.M | re.S).group(1).split()).split(", ")
    numbered = re.findall(r"^(\d+)\. (\S+):", r.stdout, re.M)
    assert [b for _, b in numbered] == order and [int(n) for n, _ in numbered] == list(range(1, len(order) + 1))
    assert r.stdout.index(f"1. {order[0]}:") < r.stdout.index("\nflashinfer:")  # supported first, then the rest
    assert "<cache>" not in r.stdout and "FLASHINFER_NO_DOWNLOAD" not in r.stdout
    assert "matrix:" in r.stderr  # it names the matrix it read
    v = CliRunner(env={"COLUMNS": "100"}).invoke(main, args + ["--verbose"])
    assert v.exit_code == 0 and max(map(len, v.stdout.splitlines())) <= 100
    assert "FLASHINFER_NO_DOWNLOAD is set" in " ".join(v.stdout.split())


def test_explain_help_documents_every_option_with_examples():
    r = CliRunner().invoke(main, ["explain", "--help"])
    assert r.exit_code == 0 and "Examples:" in r.output and "attnmatrix explain --arch" in r.output
    undocumented = [p.name for p in main.commands["explain"].params if isinstance(p, __import__("click").Option)
                    and not p.help and p.name != "help"]
    assert undocumented == []


def test_probe_help_names_every_backend_backends_json_declares(monkeypatch):
    from attnmatrix.matrix import backends as registry

    r = CliRunner().invoke(main, ["probe", "--help"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    gpu = [n for n in registry.names(include_plugins=False) if registry.info(n).device == "cuda"]
    cpu = [n for n in registry.names(include_plugins=False) if registry.info(n).device == "cpu"]
    assert len(gpu) > 10 and f"GPU backends ({', '.join(gpu)}) need an NVIDIA GPU" in text
    assert f"{', '.join(cpu)} runs anywhere" in text and "{cuda_backends}" not in text
    # read from the registry when the help is shown: a backend declared later is listed too
    monkeypatch.setattr("attnmatrix.workflow.backends_for", lambda device: [f"new_{device}_backend"])
    again = " ".join(CliRunner().invoke(main, ["probe", "--help"]).output.split())
    assert "GPU backends (new_cuda_backend)" in again and "new_cpu_backend runs anywhere" in again


@pytest.mark.parametrize("args", [["show", "--arch", "sm_90", "--backend", "fa2", "--limit", "1"],
                                  ["diff", "embedded", "embedded"]])
def test_commands_that_read_the_matrix_name_it_on_stderr(args):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert re.search(r"^matrix: ", r.stderr, re.M), r.stderr


# --- small text flaws ----------------------------------------------------------------------------------------------


def test_a_json_error_says_at_once(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"schema": 1, "reason": "unterminated\n')
    r = CliRunner().invoke(main, ["validate", "--no-embedded", str(bad)])
    assert r.exit_code == 2 and "at column" in r.stderr and "at at" not in r.stderr, r.stderr


def test_a_compiled_record_is_described_once():
    from attnmatrix.matrix.policy import describe
    from attnmatrix.matrix.records import parse_record

    rec = parse_record(build_record(tier="compiled", arch="sm_100", backend="fa4", features=(),
                                    provenance={"target": "sm_100a", "device": "none (cross-compiled on CPU)"}))
    text = describe(rec)
    assert "compiled compiled" not in text and "on none" not in text and text.startswith("compiled for sm_100a")


def test_the_sweep_banner_adds_up(tmp_path):
    from attnmatrix.matrix.records import parse_record
    from attnmatrix.matrix.storage import ResultStore

    from attnmatrix.cli.sweeping import sweep_banner

    recs = [parse_record(build_record(arch="cpu", backend="sdpa_cpu", head_dim=h, features=(), device="cpu"))
            for h in (64, 96, 128)]
    path = dump_jsonl(tmp_path / "r.jsonl", [build_record(arch="cpu", backend="sdpa_cpu", head_dim=h, features=(),
                                                          device="cpu") for h in (64, 256, 512)])
    with ResultStore(path) as store:
        banner = sweep_banner([r.case for r in recs], store, todo=2)
    assert banner.startswith("3 cases, 1 already recorded in ") and ", 2 to probe" in banner
    assert "2 other record(s) in the file are kept" in banner


def test_progress_in_a_log_is_lines_with_counts_and_an_estimate(capsys):
    from attnmatrix.cli.sweeping import LineProgress

    progress = LineProgress("probing", 20, lambda rec: f"case {rec}")
    for i in range(20):
        progress(i)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 10 and lines[0].startswith("probing: 2/20 (10%)") and lines[-1].startswith("probing: 20/20")
    assert all("cases/min, about " in x and " left; last: case " in x for x in lines)


def test_xcompile_says_up_front_how_many_compiles_and_about_how_long():
    from attnmatrix.cli.cross_compile import xcompile_plan

    plan = xcompile_plan([object()] * 6, ["sm_100a", "sm_90a"], 2)
    assert plan.startswith("xcompile: 6 case(s) x 2 target(s) = 12 compile(s)") and "about " in plan
