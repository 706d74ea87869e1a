"""`attnmatrix stats`: what a matrix or a set of result files holds, and where a sweep's time went."""

from __future__ import annotations

import json
from pathlib import Path

import click
from tabulate import tabulate

from attnmatrix.matrix import stats as S
from attnmatrix.matrix.evidence import load_evidence
from attnmatrix.matrix.storage import InputError, Problem
from attnmatrix.vocabulary import STATUSES, TIERS

from .common import fail_input, locate
from .group import main

SCHEMA = "attnmatrix.stats/1"


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--section", "sections", multiple=True, type=click.Choice(S.SECTIONS),
              help="Show only this section (repeatable). Default: every section that has something to show.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="table: one table per section, for people; json: one object keyed by section, for scripts.")
@click.option("--root", type=click.Path(file_okay=False),
              help="Checkout whose matrix to read (default: the one the current directory is in).")
def stats(paths, sections, fmt, root) -> None:
    """Counts and times of a matrix or of result files: cells, records per file, a sweep's time, compiles.

    Without PATHS: the matrix (every committed result file and the declared facts). With PATHS (result files
    or folders of them): those records only, e.g. one sweep's file.

    \b
    Sections (--section):
      cells    per arch and backend: cells by status (supported / unsupported / unknown) and by the tier of
               the evidence that decided them (validated / compiled / shipped / declared)
      files    per file: records by tier and by outcome
      time     per backend, where a sweep's worker time went (extra.seconds of each record): first calls
               (JIT compiles or cache loads; over 1 s counted as slow), checks, the timing phase and its wait
               for the GPU's timing lock; and the best TFLOP/s, with the matmul peak recorded in the same run.
               Sums are over workers: with W workers the sweep's wall time is at least the largest / W.
      compile  per compile target and backend, the cross-compile records (tier compiled): outcomes, kernels
               built, wall and CPU seconds per compile (wall includes waiting for a CPU), outcomes by head dims

    \b
    Examples:
      attnmatrix stats                                        # the matrix, every section
      attnmatrix stats --section cells --format json          # for a script
      attnmatrix stats --section time matrix/data/results/sm_90-flashinfer-0.7.4-h200-20261130.jsonl
      attnmatrix stats --section compile attnmatrix-results/xcompile.jsonl
    """
    proj = locate(root)
    problems: list[Problem] = []
    try:
        if paths:  # those files alone: neither the committed results nor the declared facts
            ev = load_evidence([str(p) for p in paths], include_embedded=False, declared=None, problems=problems,
                               data_dir=proj.data_dir)
        else:
            ev = load_evidence([], problems=problems, data_dir=proj.data_dir)
    except InputError as e:
        fail_input(e.problems)
    if problems:  # counts of a file read in part would be wrong without saying so
        fail_input(problems)
    if not ev.records:
        raise click.UsageError("no records in " + (", ".join(map(str, paths)) or str(proj.results_dir)))
    out: dict = {}
    wanted = sections or S.SECTIONS
    if "cells" in wanted:
        from attnmatrix.matrix.policy import resolve

        out["cells"] = S.cell_counts(resolve(ev))
    if "files" in wanted:
        out["files"] = S.file_counts(ev.records, ev.where, name=proj.relative)
    if "time" in wanted:
        timed = S.sweep_time(ev.records)
        if sections or any(row["without_seconds"] < row["records"] for row in timed.values()):
            out["time"] = timed
    if "compile" in wanted:
        compiled = S.compile_counts(ev.records)
        if sections or compiled:
            out["compile"] = compiled
    if fmt == "json":
        click.echo(json.dumps({"schema": SCHEMA, **out}, indent=1))  # every section is built in a fixed order
        return
    printers = {"cells": _cells_table, "files": _files_table, "time": _time_tables, "compile": _compile_tables}
    click.echo("\n\n".join(printers[name](value) for name, value in out.items()))


def _cells_table(rows: list[dict]) -> str:
    body = [[r["arch"], r["backend"], r["cells"], *(r["status"][s] for s in STATUSES),
             *(r["tier"].get(t, 0) for t in TIERS)] for r in rows]
    total = ["all", "", sum(r["cells"] for r in rows), *(sum(r["status"][s] for r in rows) for s in STATUSES),
             *(sum(r["tier"].get(t, 0) for r in rows) for t in TIERS)]
    return "cells by status and by the tier of the deciding evidence\n" + tabulate(
        [*body, total], headers=["arch", "backend", "cells", *STATUSES, *TIERS], tablefmt="simple")


def _files_table(rows: list[dict]) -> str:
    body = [[r["file"], r["records"], *(r["tier"].get(t, 0) for t in TIERS),
             ", ".join(f"{o} {n}" for o, n in r["outcome"].items())] for r in rows]
    return "records per file\n" + tabulate(body, headers=["file", "records", *TIERS, "outcomes"], tablefmt="simple")


def _time_tables(per_backend: dict[str, dict]) -> str:
    cols = ["records", "without_seconds", "first_call_s", "check_s", "timing_s", "gpu_lock_wait_s",
            "slow_first_calls", "slow_first_call_s", "median_slow_first_call_s"]
    parts = ["where the time went, in worker seconds\n"
             + tabulate([[b, *(row[c] for c in cols)] for b, row in per_backend.items()], headers=["backend", *cols],
                        tablefmt="simple")]
    by_op = [[b, op, t["cases"], t["median"], t["max"]] for b, row in per_backend.items()
             for op, t in row["timing_s_per_case"].items()]
    if by_op:
        parts.append("timing phase per timed case, seconds\n"
                     + tabulate(by_op, headers=["backend", "op", "cases", "median", "max"], tablefmt="simple"))
    slow = [[b, op, t["cases"], t["min"], t["median"], t["max"]] for b, row in per_backend.items()
            for op, t in row["slow_first_call_s_per_case"].items()]
    if slow:
        parts.append(f"slow first calls (over {S.SLOW_FIRST_CALL_S:g} s: compiles) per case, seconds\n"
                     + tabulate(slow, headers=["backend", "op", "cases", "min", "median", "max"], tablefmt="simple"))
    best = [[b, x["tflops"], x["peak_tflops"], x["fraction_of_peak"], x["arch"], x["cell"], x["shape"]]
            for b, row in per_backend.items() if (x := row["best_tflops"])]
    if best:
        parts.append("best TFLOP/s per backend, against the bf16 matmul peak recorded in the same run\n"
                     + tabulate(best, headers=["backend", "TFLOP/s", "peak", "of peak", "arch", "cell", "shape"],
                                tablefmt="simple", floatfmt=("", ".1f", ".1f", ".2f")))
    return "\n\n".join(parts)


def _compile_tables(rows: list[dict]) -> str:
    def spread(s: dict) -> str:
        return f"{s['sum']} (median {s['median']}, max {s['max']})" if s["cases"] else "-"

    head = [[r["target"], r["backend"], r["library"], r["cutlass_dsl"] or "-",
             ", ".join(f"{o} {n}" for o, n in r["outcome"].items()), r["kernels_built"], spread(r["compile_wall_s"]),
             spread(r["compile_cpu_s"])] for r in rows]
    dims = [[r["target"], r["backend"], hd, ", ".join(f"{o} {n}" for o, n in v.items())]
            for r in rows for hd, v in r["by_head_dims"].items()]
    return ("cross-compiles (tier compiled), seconds per compile\n"
            + tabulate(head, headers=["target", "backend", "library", "CuTe DSL", "outcomes", "kernels",
                                      "wall s", "CPU s"], tablefmt="simple")
            + "\n\nby head dims\n" + tabulate(dims, headers=["target", "backend", "head dims", "outcomes"],
                                              tablefmt="simple"))
