"""Commands over the evidence: validate, merge, generate, snapshot, diff, ingest-cubins (the CI gate, `check`, is
check.py)."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import click
from tabulate import tabulate

from attnmatrix import ci_format as ci
from attnmatrix import project as project_mod
from attnmatrix.matrix.evidence import Evidence, load_evidence
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.records import UNINFORMATIVE_OUTCOMES
from attnmatrix.matrix.storage import (
    InputError,
    Problem,
    atomic_write_text,
    check_result_file,
    iter_result_files,
    read_records,
    write_records,
)

from .ci_reports import print_report, validity
from .common import (
    EXIT_FAILED,
    EXIT_USAGE,
    UsageError,
    exit_code_for,
    fail_input,
    load,
    load_for_reading,
    locate,
    render,
    report,
)
from .group import main


@main.command()
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--no-embedded", is_flag=True, help="Check only FILES, not the embedded matrix.")
@click.option("--json", "as_json", is_flag=True, help="Print problems as JSON Lines.")
@click.option("--format", "fmt", type=click.Choice(ci.FORMATS), default="text", show_default=True,
              help="text, or a report for CI on stdout: junit (JUnit XML, one test case per result file), "
                   "github (GitHub Actions annotations on the record that failed).")
def validate(files, no_embedded, as_json, fmt) -> None:
    """Check result files (and the matrix): schema, known backends, contradictions.

    Every problem is listed with its file, line, record and field. Exit 1 if a record is wrong; exit 2 if
    a line is not JSON at all (a truncated write, another file's text): the input is unreadable; exit 2
    too if a named file or folder holds no record: there was nothing to validate.
    """
    if as_json and fmt != "text":
        raise UsageError("--json and --format cannot be given together")
    proj = locate(say=not as_json)
    ev, problems = load(proj, tuple(str(f) for f in files), embedded=not no_embedded)
    problems = _nothing_to_validate(files, ev, no_embedded, problems) + problems
    if fmt != "text":
        report(problems)
        print_report(fmt, "attnmatrix validate", _per_file(ev, problems))
    elif as_json:
        for p in problems:
            click.echo(json.dumps({"file": p.file, "line": p.line, "record": p.record, "field": p.field,
                                   "message": p.message}, sort_keys=True))
    else:
        report(problems)
        if not problems:
            click.echo(f"ok: {len(ev.records)} records from {len(ev.files)} file(s), no problems")
    sys.exit(exit_code_for(problems))


def _per_file(ev: Evidence, problems: list[Problem]) -> list[ci.Outcome]:
    """One test case per file read (result files, the declared facts), failed by the problems located in it;
    problems of no file read (an argument naming nothing) are a test case of their own."""
    names = list(dict.fromkeys([*ev.files, *(p.file for p in problems)]))
    return [validity("attnmatrix.validate", ci.relative(n), [p for p in problems if p.file == n]) for n in names]


def _nothing_to_validate(files: tuple[Path, ...], ev: Evidence, no_embedded: bool,
                         problems: list[Problem]) -> list[Problem]:
    """A named file or folder without a single record is not "ok": there was nothing to check (exit 2). One whose
    lines are all broken had something to check: its problems say what (exit 1)."""
    out = []
    for f in files:
        paths = [str(p) for p in iter_result_files([f])]
        prefixes = tuple(p + ":" for p in paths)
        if prefixes and any(w.startswith(prefixes) for w in ev.where):
            continue
        if any(p.file in paths for p in problems):
            continue
        what = "holds no *.jsonl result file" if f.is_dir() and not prefixes else "holds no records"
        out.append(Problem(str(f), None, "(file)", f"{what}: nothing to validate"))
    if no_embedded and not files:
        out.append(Problem("(arguments)", None, "(file)", "--no-embedded and no FILES: nothing to validate"))
    return out


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Merged JSON Lines file (written atomically; untouched on failure). An existing result file "
                   "is refused unless --append is given; any other existing file is refused, untouched.")
@click.option("--append", is_flag=True,
              help="OUT may already hold records: they are merged with FILES (nothing of OUT is dropped).")
def merge(files, out, append) -> None:
    """Merge result files into one: exact duplicates dropped, contradictions refused (exit 1).

    Evidence that merely disagrees (two machines, two versions) is kept: the resolution policy decides
    later, and `explain` shows both. Records of backends that could not be imported (`unavailable`) are
    not evidence about a kernel: they are dropped, and counted. An OUT that already holds records is never
    replaced: without --append it is refused (exit 2, untouched); with --append its records are merged in.

    \b
    Examples:
      attnmatrix merge attnmatrix-results/sm_90.jsonl -o matrix/data/results/sm_90-h100-20260101.jsonl
      attnmatrix merge more.jsonl -o matrix/data/results/sm_90-h100-20260101.jsonl --append
    """
    from attnmatrix.matrix.merge import merge_records

    problems: list[Problem] = []
    try:
        ev = load_evidence(list(files), include_embedded=False, declared=None, problems=problems)
        existing = check_result_file(out)  # before anything is written: a file that is not ours is refused
        if existing.strip() and not append:
            click.echo(f"error: {out} already holds result records; merging would replace them. Give --append "
                       "to merge FILES into it, or name a new -o file", err=True)
            click.echo(f"not written: {out}", err=True)
            sys.exit(EXIT_USAGE)
        if existing.strip() and not any(Path(f).resolve() == out.resolve() for f in files):
            ev.extend(load_evidence([out], include_embedded=False, declared=None, problems=problems))
    except InputError as e:
        fail_input(e.problems)
    if exit_code_for(problems) == EXIT_USAGE:
        report(problems)
        click.echo(f"not written: {out}", err=True)
        sys.exit(EXIT_USAGE)
    # OUT's own records are all kept (--append never drops a record of the file it extends).
    own = str(out) + ":"
    located = [(r, w) for r, w in zip(ev.records, ev.where, strict=True)
               if r.outcome not in UNINFORMATIVE_OUTCOMES or w.startswith(own)]
    dropped = len(ev.records) - len(located)
    merged, contradictions = merge_records(located)
    problems += contradictions
    if problems:
        report(problems)
        click.echo(f"not written: {out}", err=True)
        sys.exit(EXIT_FAILED)
    try:
        write_records(out, merged)
    except OSError as e:
        click.echo(f"error: {out}: cannot write: {e.strerror or e}", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(f"merged {len(ev.records)} records from {len(ev.files)} file(s) into {len(merged)} in {out}"
               + (f"; dropped {dropped} `unavailable` record(s) (the backend did not import)" if dropped else ""))


@main.command()
@click.option("--root", type=click.Path(file_okay=False),
              help="Checkout to read and write (default: the one the current directory is in).")
@click.option("--results", "extra", multiple=True, type=click.Path(path_type=Path),
              help="Extra result files or folders to include beside the matrix (the output then no longer "
                   "matches the committed matrix: `check` fails until they are merged into it).")
def generate(root, extra) -> None:
    """Write the selector module and the docs pages from the matrix (byte-identical for the same matrix)."""
    proj = locate(root, need_checkout=True)
    ev, problems = load(proj, tuple(str(e) for e in extra))
    if problems:
        report(problems)
        click.echo("not generated: the matrix is invalid", err=True)
        sys.exit(exit_code_for(problems))
    mid = project_mod.matrix_id(ev, proj.data_dir)
    files = render(ev, proj, matrix_id=mid)
    changed = [p for p, text in sorted(files.items()) if atomic_write_text(proj.root / p, text)]
    click.echo(f"generated {len(files)} file(s) from matrix {mid}; {len(changed)} changed")
    for p in changed:
        click.echo(f"  wrote {p}")


@main.command()
@click.option("--root", type=click.Path(file_okay=False), help="Checkout to snapshot (default: the current one).")
@click.option("--json", "as_json", is_flag=True)
def snapshot(root, as_json) -> None:
    """Record the current matrix as the previous version, before adding new evidence.

    The docs' changelog page is the diff from this snapshot (matrix/data/history/previous.jsonl) to
    the matrix being generated. Take one when a matrix version is published, then commit new results.
    The order that keeps `check` green: snapshot, merge the new evidence, generate, check (a snapshot taken
    after `generate` changes the changelog page, so `generate` must run again).
    """
    from attnmatrix.matrix.history import dump_snapshot

    proj = locate(root, need_checkout=True, say=not as_json)
    ev, problems = load(proj)
    if problems:
        report(problems)
        sys.exit(exit_code_for(problems))
    mid = project_mod.matrix_id(ev, proj.data_dir)
    atomic_write_text(proj.snapshot_file, dump_snapshot(resolve(ev), mid))
    msg = {"matrix_id": mid, "file": str(proj.snapshot_file)}
    click.echo(json.dumps(msg) if as_json else f"snapshot of matrix {mid} written to {proj.snapshot_file}; the "
               "changelog page diffs against it: merge new evidence, then `attnmatrix generate`")


def _load_side(spec: str) -> Evidence:
    if spec == "embedded":
        return load_for_reading(locate(say=False), ())
    problems: list[Problem] = []
    try:
        # the file's own records (no declared facts): what it says, to compare with the matrix's cells at its keys
        ev = load_evidence([spec], include_embedded=False, declared=None, problems=problems,
                           data_dir=locate(say=False).data_dir)
    except InputError as e:
        fail_input(e.problems)
    if problems:
        report(problems)
        sys.exit(EXIT_USAGE)
    return ev


@main.command()
@click.argument("a")
@click.argument("b")
@click.option("--threshold", type=click.FloatRange(min=0), default=0.10, show_default=True,
              help="Relative latency change to report.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--first-choice", is_flag=True, help="Instead of cell changes: every measured query class whose "
              "first choice changed (asked through the query engine, per arch), by backend pair.")
def diff(a, b, threshold, as_json, first_choice) -> None:
    """What changed from matrix A to matrix B (result files or folders; `embedded` for the committed one).

    Like is compared with like: `diff embedded FILE` (or `diff FILE embedded`) compares the file's cells with
    the matrix's cells at the same keys, not the file with the whole matrix (whose other cells would all read
    as removed). A file with problems is unusable input: they are listed and the exit code is 2.

    \b
    Examples:
      attnmatrix diff embedded matrix/data/results/cpu-sdpa-torch2.13.0-cpu-amd-epyc-20261130.jsonl
      attnmatrix diff old-results/ new-results/ --threshold 0.2
    """
    from attnmatrix.matrix.diff import diff_matrices

    locate(say=not as_json)
    before, after = resolve(_load_side(a)), resolve(_load_side(b))
    if first_choice:
        _first_choice(before, after, as_json)
        return
    if (a == "embedded") != (b == "embedded"):
        covered = set((after if a == "embedded" else before).cells)
        for m in (before, after):
            m.cells = {k: c for k, c in m.cells.items() if k in covered}
        if not as_json:
            click.echo(f"comparing the {len(covered)} cell(s) of {b if a == 'embedded' else a} with the matrix's "
                       "cells at the same keys", err=True)
    changes = diff_matrices(before, after, speed_threshold=threshold)
    if as_json:
        for c in changes:
            click.echo(json.dumps(c.to_json(), sort_keys=True))
        return
    counts = Counter(c.kind for c in changes)
    click.echo(tabulate([[c.kind, c.key, c.before, c.after] for c in changes],
                        headers=["change", "cell", "before", "after"]))
    click.echo("\n" + (", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no changes"))


def _first_choice(before, after, as_json: bool) -> None:
    from attnmatrix.generator.capabilities import engine_data
    from attnmatrix.generator.first_choice import shifts

    out = shifts(engine_data(before, include_cpu=True), engine_data(after, include_cpu=True))
    if as_json:
        for s in out:
            click.echo(json.dumps(s, sort_keys=True))
        return
    for s in out:
        click.echo(f"{s['arch']}: {s['first_choice_changed']} of {s['classes_compared']} measured query classes "
                   f"changed their first choice" + "".join(f"; {p}: {n}" for p, n in s["changed_pairs"].items()))
        for c in s["changed"]:
            b, a = c["before"], c["after"]
            click.echo(f"  {c['op']} {c['dtype']} {c['head_dim']}x{c['head_dim_v']} {c['features']}: "
                       f"{b['backend']} ({b['latency_ms']} ms) -> {a['backend']} ({a['latency_ms']} ms)")


@main.command("ingest-cubins")
@click.argument("wheel", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Evidence file to write (default: matrix/data/results/sm_100+sm_103-trtllm-flashinfer-cubin"
                   "<version>-shipped-<date>.jsonl in the checkout).")
@click.option("--root", type=click.Path(file_okay=False), help="Checkout to write into (default: found from cwd).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the summary (kernels per arch, cells per head dims) as JSON.")
def ingest_cubins(wheel, out, root, as_json) -> None:
    """Shipped-binary evidence from a flashinfer-cubin wheel: which trtllm-gen kernels exist for sm_100/sm_103.

    Reads the kernel table fmha/trtllm-gen/include/flashInferMetaInfo.h out of WHEEL (nothing in the
    wheel is executed) and writes one record per cell of trtllm_ragged, trtllm_context and
    trtllm_decode on sm_100 and sm_103 (tier `shipped`): `shipped` with the matching kernel's name, or
    `rejected` with FlashInfer's lookup ("Trtllm-gen kernels not found: ...") and what the table has
    instead. The same wheel always gives the same file. An existing OUT is replaced only if it holds
    shipped records of flashinfer-cubin alone.

    \b
    Example:
      pip download --no-deps flashinfer-cubin==0.6.13 -d /tmp/dl
      attnmatrix ingest-cubins /tmp/dl/flashinfer_cubin-0.6.13-py3-none-any.whl
    """
    from attnmatrix import workflow

    try:
        shipped = workflow.read_cubin_wheel(wheel)
    except workflow.CubinError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_USAGE)
    table, records = shipped.table, shipped.records
    path = out or locate(root, need_checkout=True).results_dir / shipped.file_name
    if path.exists():
        try:
            old = read_records(path)
        except InputError as e:
            fail_input(e.problems)
        foreign = [r for _, r in old if r.tier != "shipped" or r.provenance.get("library") != "flashinfer-cubin"]
        if foreign:
            click.echo(f"error: {path} holds records that are not flashinfer-cubin shipped evidence (first: "
                       f"{foreign[0].key}, tier {foreign[0].tier}); not overwriting it", err=True)
            sys.exit(EXIT_USAGE)
    changed = write_records(path, records)
    if as_json:
        click.echo(shipped.summary_json())
        return
    n_ok = sum(r.outcome == "shipped" for r in records)
    click.echo(f"flashinfer-cubin {table.version} ({len(table.kernels)} kernels, artifact {table.artifact}): "
               f"{len(records)} cells, {n_ok} shipped, {len(records) - n_ok} without a kernel")
    click.echo(f"{'wrote' if changed else 'unchanged'} {path}")
