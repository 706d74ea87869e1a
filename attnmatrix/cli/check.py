"""`attnmatrix check`, the CI gate: the matrix is valid, every generated file is current, and (--reprobe, on a GPU)
this machine's validated claims still hold."""

from __future__ import annotations

import difflib
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import click
from tabulate import tabulate

from attnmatrix import ci_format as ci
from attnmatrix import project as project_mod
from attnmatrix import workflow
from attnmatrix.matrix.evidence import Evidence
from attnmatrix.matrix.policy import resolve
from attnmatrix.matrix.storage import read_records

from .ci_reports import print_report, validity
from .common import (
    EXIT_FAILED,
    EXIT_OK,
    count_or_zero_callback,
    duration_callback,
    exit_code_for,
    load,
    locate,
    refuse_conflicts,
    render,
    report,
)
from .group import main


@main.command()
@click.option("--root", type=click.Path(file_okay=False),
              help="Checkout to check (default: the one the current directory is in).")
@click.option("--reprobe", is_flag=True, help="Also re-probe this machine's validated claims for the backends "
                                              "installed here, and fail if one no longer holds.")
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="--reprobe: re-check at most N claims, spread evenly over backends, head dims and features "
                   "(default: all of them).")
@click.option("--seed", type=int, default=0, show_default=True, help="--reprobe --sample: which sample.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="--reprobe: worker processes (default: one per CPU core).")
@click.option("--timeout", type=float, default=180.0, show_default=True, callback=duration_callback,
              help="--reprobe: seconds per case.")
@click.option("--max-diff-lines", type=int, default=60, show_default=True, callback=count_or_zero_callback,
              help="Diff lines printed per stale file.")
@click.option("--format", "fmt", type=click.Choice(ci.FORMATS), default="text", show_default=True,
              help="text, or a report for CI on stdout: junit (JUnit XML), github (GitHub Actions annotations).")
def check(root, reprobe, sample, seed, workers, timeout, max_diff_lines, fmt) -> None:
    """CI gate: the matrix is valid and every generated file is byte-identical to a fresh generation.

    With --reprobe (GPU CI; it needs the kernels installed): re-run the matrix's validated claims about this
    machine's arch for the backends installed here, with a progress bar, and fail (exit 1) if one no longer
    holds. --sample N keeps a GPU CI job short: `check --reprobe --sample 200` on one H200.

    --format junit prints a JUnit XML report (one test case for the matrix's validity, one per generated file,
    one per re-probed claim); --format github prints `::error file=...,line=...::` annotations on the record
    or generated line that failed. Either way the exit code is the same, and the text goes to stderr.

    \b
    Examples:
      attnmatrix check
      attnmatrix check --format junit > attnmatrix-check.xml
      attnmatrix check --format github
      attnmatrix check --reprobe --sample 200          # GPU CI
    """
    refuse_conflicts(click.get_current_context(),
                     needs={"sample": "reprobe", "seed": "reprobe", "workers": "reprobe", "timeout": "reprobe"})
    say = _sayer(fmt)
    proj = locate(root, need_checkout=True)
    t0 = time.monotonic()
    ev, problems = load(proj)
    outcomes = [validity("attnmatrix.check.matrix", "matrix is valid", problems, time.monotonic() - t0)]
    failed = bool(problems)
    if problems:
        report(problems)
        outcomes.append(ci.Outcome("attnmatrix.check.generated", "generated files",
                                   skipped="the matrix is invalid: nothing generated from it"))
    else:
        t0 = time.monotonic()
        mid = project_mod.matrix_id(ev, proj.data_dir)
        files = render(ev, proj, matrix_id=mid)
        per_file = (time.monotonic() - t0) / max(1, len(files))
        stale = []
        for p, text in sorted(files.items()):
            path = proj.root / p
            current = path.read_text(encoding="utf-8") if path.exists() else None
            outcome = ci.Outcome("attnmatrix.check.generated", p, seconds=per_file)
            outcomes.append(outcome)
            if current == text:
                continue
            stale.append(p)
            diff = list(difflib.unified_diff((current or "").splitlines(), text.splitlines(),
                                             f"{p} (on disk)", f"{p} (generated)", lineterm=""))
            shown = diff[:max_diff_lines] + ([f"... {len(diff) - max_diff_lines} more diff lines"]
                                             if len(diff) > max_diff_lines else [])
            for line in shown:
                say(line)
            line_no = _first_difference(current or "", text)
            what = "missing" if current is None else f"stale from line {line_no}"
            outcome.failures.append(ci.Failure(
                f"{p} is {what}: it differs from a fresh generation of matrix {mid}; run `attnmatrix generate` "
                "and commit the result",
                file=ci.relative(path), line=None if current is None else line_no, detail="\n".join(shown)))
        if stale:
            click.echo(f"{len(stale)} generated file(s) are stale: {', '.join(stale)}; run `attnmatrix generate`",
                       err=True)
            failed = True
        else:
            say(f"ok: {len(files)} generated files match matrix {mid}")
    if reprobe and not failed:
        claims = _reprobe(ev, sample=sample, seed=seed, workers=workers, timeout=timeout, say=say)
        outcomes += claims
        failed = any(o.failed for o in claims)
    print_report(fmt, "attnmatrix check", outcomes)
    sys.exit(exit_code_for(problems) if problems else EXIT_FAILED if failed else EXIT_OK)


def _sayer(fmt: str):
    """Where a command's text goes: stdout, or stderr when stdout carries a CI report."""
    return click.echo if fmt == "text" else (lambda msg="": click.echo(msg, err=True))


def _first_difference(a: str, b: str) -> int:
    """The 1-based number of the first line where `a` and `b` differ (one past the end if one is a prefix)."""
    al, bl = a.splitlines(), b.splitlines()
    return next((i + 1 for i, (x, y) in enumerate(zip(al, bl, strict=False)) if x != y), min(len(al), len(bl)) + 1)


def _reprobe(ev: Evidence, *, sample: int | None, seed: int, workers: int | None, timeout: float,
             say=click.echo) -> list[ci.Outcome]:
    """Re-run the claims `workflow.reprobe_claims` picks: one outcome per claim, failed if it no longer holds
    (located on the record that made the claim)."""
    from .sweeping import local_device, local_sweep

    dev = local_device()
    arch = workflow.local_arch(dev)
    plan = workflow.plan_backends(workflow.backends_for(dev), dev)
    for n, why in sorted(plan.not_installed.items()):
        click.echo(f"reprobe: not installed here, its claims not re-checked: {n} ({why})", err=True)
    claims = workflow.reprobe_claims(resolve(ev), arch, plan.ready)
    if not claims:
        say(f"reprobe: no validated claims for {arch} by the backends installed here "
            f"({', '.join(plan.ready) or 'none'}); nothing to re-check")
        return []
    chosen = workflow.stratified_sample(claims, sample, seed=seed) if sample else claims
    per_backend = Counter(c.case.backend for c in chosen)
    click.echo(f"reprobe: {len(chosen)} of {len(claims)} validated claims for {arch} "
               f"({', '.join(f'{b} {n}' for b, n in sorted(per_backend.items()))})", err=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "reprobe.jsonl"
        local_sweep([c.case for c in chosen], out, device=dev, workers=workers or workflow.default_workers(),
                    timeout=timeout, timing=False, label="reprobing")
        now = {rec.key: rec for _, rec in read_records(out)}
    broken = workflow.broken_claims(chosen, now)
    wall = time.monotonic() - t0
    where = {id(r): w for r, w in zip(ev.records, ev.where, strict=True)}
    outcomes = {c.case.key: ci.Outcome("attnmatrix.check.reprobe", c.case.key, seconds=wall / len(chosen))
                for c in chosen}
    for c, rec in broken:
        src = next((where[id(r)] for r in c.evidence if id(r) in where and r.tier == "validated"), "")
        file, _, line = src.rpartition(":")
        outcomes[c.case.key].failures.append(ci.Failure(
            f"claimed {c.outcome}, now {rec.outcome if rec else 'no record'}"
            + (f": {(rec.reason or '')[:200]}" if rec and rec.reason else ""),
            file=ci.relative(file) if file else None, line=int(line) if line.isdigit() else None))
    if broken:
        say(tabulate([[c.case.key, c.outcome, rec.outcome if rec else "missing",
                       ((rec.reason or "") if rec else "")[:80]] for c, rec in broken],
                     headers=["cell", "claimed", "now", "reason"]))
        click.echo(f"reprobe: {len(broken)} of {len(chosen)} claims no longer hold ({wall:.0f} s)", err=True)
    else:
        say(f"reprobe: all {len(chosen)} re-checked validated claims for {arch} still hold ({wall:.0f} s)")
    return list(outcomes.values())
