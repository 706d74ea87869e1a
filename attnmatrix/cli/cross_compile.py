"""`attnmatrix xcompile`: compile-only evidence for GPUs that are not present (a CPU is enough)."""

from __future__ import annotations

from pathlib import Path

import click

from attnmatrix import workflow
from attnmatrix.matrix.cases import normalize_arch
from attnmatrix.matrix.evidence import load_evidence
from attnmatrix.matrix.storage import InputError

from .common import (
    DEFAULT_RESULTS,
    UsageError,
    build_space,
    duration_callback,
    fail_input,
    parse_backends,
    space_options,
)
from .group import main
from .sweeping import check_out, duration_text, print_summary


def xcompile_plan(cases: list, targets: list[str], workers: int) -> str:
    """What xcompile is about to do, said before it starts: cases, compiles, and about how long, from the
    compile times the matrix's own compiled records carry (extra.compile_s)."""
    from statistics import median

    compiles = len(cases) * len(targets)
    ev = load_evidence([], declared=None)
    seconds = [r.extra["compile_s"] for r in ev.records
               if r.tier == "compiled" and isinstance((r.extra or {}).get("compile_s"), (int, float))]
    head = f"xcompile: {len(cases)} case(s) x {len(targets)} target(s) = {compiles} compile(s), {workers} worker(s) " \
           f"per target"
    if not seconds:
        return head
    each = median(seconds)
    total = each * compiles / workers
    return (f"{head}; about {duration_text(total)} at the matrix's median {each:.0f} s per compile "
            f"(first compiles of a target are slower; cases already recorded are skipped)")


@main.command()
@click.option("--arch", "archs", multiple=True,
              help="Target(s) to compile for, repeatable: sm_80, sm_90a, sm_100a, sm_103a, sm_110a, sm_120 "
                   "(default: all of them).")
@space_options
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Result file, resumed if it exists; a file that is not a result file is refused, untouched "
                   "(default: attnmatrix-results/xcompile.jsonl).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Compiling processes per target.")
@click.option("--timeout", type=float, default=900.0, show_default=True, callback=duration_callback,
              help="Seconds per compile.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Keep the compiled kernels in FA4's persistent cache here (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR).")
@click.option("--json", "as_json", is_flag=True)
def xcompile(archs, backends, head_dims, features_spec, ops, dtypes, out, workers, timeout, cache_dir,
             as_json) -> None:
    """Compile-only probes for GPUs that are not present (FlashAttention 4's CuTe DSL: upstream `fa4` and vLLM's
    copy `vllm_fa4`; a CPU is enough).

    Each target runs in its own worker processes with FLASH_ATTENTION_ARCH, CUTE_DSL_ARCH and
    FLASH_ATTENTION_NUM_SMS set; the forward kernel is built under FakeTensorMode and not launched.
    A build is recorded `compiled` (tier `compiled`, with compile time and cubin size); FA4's own
    refusal is recorded `rejected` with its message; a crash is contained and recorded. Compiling
    is not running: the policy ranks a cited upstream negative above a compile. Every invocation has
    its own run id, so compiling the same cases again adds evidence, never a contradiction.

    \b
    Example:
      attnmatrix xcompile --arch sm_100a --head-dims 128,192x128,256,512 --features causal --dtypes bfloat16
    """
    names = parse_backends(backends) or ["fa4"]
    cannot = workflow.not_cross_compilable(names)
    if cannot:
        can = workflow.cross_compilable_backends()
        raise UsageError(f"--backends: {', '.join(cannot)} cannot be cross-compiled (only {', '.join(can)} compile "
                         "without a GPU)")
    try:
        targets = workflow.compile_targets(archs)
    except ValueError as e:
        raise UsageError(f"--arch: {e}") from None
    cases = build_space(normalize_arch(targets[0]), names, head_dims, features_spec, ops, dtypes)
    path = out or DEFAULT_RESULTS / "xcompile.jsonl"
    check_out(path)
    if not as_json:
        click.echo(xcompile_plan(cases, targets, workers), err=True)

    def show(rec) -> None:
        if not as_json:
            ex = rec.extra or {}
            took = f"{ex['compile_s']:>7} s" if isinstance(ex.get("compile_s"), (int, float)) else " " * 9
            click.echo(f"{rec.provenance.get('target', rec.case.arch):8} {rec.outcome:9} {took}  {rec.case.key}"
                       + (f"  | {rec.reason[:120]}" if rec.reason else ""), err=True)

    try:
        summaries = workflow.cross_compile(cases, path, targets, workers=workers, timeout_s=timeout,
                                           cache_dir=cache_dir, progress=show)
    except InputError as e:
        fail_input(e.problems)
    for target, summary in summaries.items():
        if not as_json:
            click.echo(f"\n{target}")
        print_summary(summary, path, as_json)
