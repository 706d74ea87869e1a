"""Commands that probe kernels on this machine: probe (or, with --executor ray, on a Ray fleet: fleet.py) and run
(the main job). Cross-compiling is cross_compile.py; how a sweep shows its progress, sweeping.py."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from attnmatrix import workflow
from attnmatrix.matrix.cases import DTYPES
from attnmatrix.matrix.evidence import Evidence, load_evidence
from attnmatrix.matrix.storage import InputError

from .common import (
    DEFAULT_RESULTS,
    EXIT_FAILED,
    BackendListsCommand,
    UsageError,
    build_space,
    count_callback,
    csv,
    duration_callback,
    exit_code_for,
    fail_input,
    load,
    locate,
    parse_backends,
    refuse_conflicts,
    report,
    space_options,
)
from .group import main
from .sweeping import check_out, local_device, local_sweep, print_summary


def _plan(names: list[str] | None, device: str, *, explicit_what: str = "--backends") -> list[str]:
    """The backends a local sweep probes. Named backends must all be usable here (else exit 2, nothing
    written); by default every installed backend of the device, the others reported."""
    plan = workflow.plan_backends(names if names is not None else workflow.backends_for(device), device)
    if names is not None and plan.wrong_device:
        raise UsageError(f"{explicit_what}: {', '.join(plan.wrong_device)} need(s) an NVIDIA GPU and this machine "
                         f"has none (torch.cuda.is_available() is False); on the CPU probe "
                         f"{', '.join(workflow.backends_for('cpu'))}, or use `attnmatrix xcompile` for FA4")
    if names is not None and plan.not_installed:
        raise UsageError(f"{explicit_what}: not installed here: " + "; ".join(
            f"{n} ({why})" for n, why in sorted(plan.not_installed.items())))
    for n, why in sorted(plan.not_installed.items()):
        click.echo(f"not installed, not probed: {n} ({why})", err=True)
    return plan.ready


@main.command(cls=BackendListsCommand)
@space_options
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Result file (JSON Lines). Re-running with the same file resumes; a file that is not a result "
                   "file is refused, untouched. Default: attnmatrix-results/<arch>.jsonl")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes, spread over the GPUs (default: one per GPU, at least 2). On one GPU, several "
                   "workers compile in parallel and take turns for timed loops. With --executor ray: workers per "
                   "GPU task (default 2), or CPUs (and workers) per task when probing CPUs (default 1).")
@click.option("--gpus", help="Comma-separated GPU indices, one worker each (default: every visible GPU).")
@click.option("--timeout", type=float, default=180.0, show_default=True, callback=duration_callback,
              help="Seconds a case may run (first calls JIT-compile) before its worker is killed.")
@click.option("--memory-limit", type=int, default=None, callback=count_callback,
              help="Address-space cap per CPU worker, MiB.")
@click.option("--no-timing", is_flag=True, help="Validate only; skip the timed shapes.")
@click.option("--timed-dtypes", default="bfloat16,float16", show_default=True,
              help="Time passing cases of these dtypes only (the others are validated, not timed).")
@click.option("--budget-ms", type=float, default=40.0, show_default=True, callback=duration_callback,
              help="Timing budget per shape after warm-up (at least 5 runs; the median is kept).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="What to probe. With --executor ray, `auto` is the fleet's GPUs if it has any, else its CPUs.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="`local`: this machine's GPUs (or CPU). `ray`: every node of a Ray cluster, cases split by GPU "
                   "type, records streamed back into the one result file (needs: pip install 'attnmatrix[ray]').")
@click.option("--address", metavar="ADDR",
              help="--executor ray: the Ray cluster to use, `auto` for the one `ray start --head` runs here, or "
                   "HOST:PORT (default: start a local Ray instance on this machine).")
@click.option("--arch", "archs", multiple=True,
              help="--executor ray: probe only these archs, repeatable (default: every arch the cluster's nodes "
                   "offer for --device).")
@click.option("--chunk-size", type=click.IntRange(min=1), default=None,
              help="--executor ray: cases per Ray task (default: about two tasks per GPU or CPU slot, 16 to 64 "
                   "cases each).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def probe(backends, head_dims, features_spec, ops, dtypes, out, workers, gpus, timeout, memory_limit, no_timing,
          timed_dtypes, budget_ms, device, executor, address, archs, chunk_size, as_json) -> None:
    """Sweep kernels on this machine, or on a fleet through Ray; every case gets an outcome, written as it finishes.

    GPU backends ({cuda_backends}) need an NVIDIA GPU: on a machine without one they are refused before anything
    starts (exit 2, nothing written); {cpu_backends} runs anywhere. A named backend that is not installed is
    refused the same way; by default every installed backend of the device is probed and the others are listed as
    not installed.

    Each case runs in a worker subprocess: a crash or hang is recorded (`crash`, `timeout`) and the
    worker replaced. Kill the sweep at any point and run the same command again: recorded cases
    are skipped, none is lost or duplicated. Cases are checked against a float32 reference and, if
    they pass, timed on three shapes (on a GPU: GPU time from a replayed CUDA graph, host time per call beside it).

    With --executor ray the case space is built for every arch the cluster has (its nodes' accelerator
    types, or an `attnmatrix_arch_<arch>` resource on a node), cut into small chunks, and each chunk
    runs as a Ray task on a node of its arch, one GPU per task, through the same isolated runner. Records
    stream back to this process, which writes the result file. A node that dies loses only its cases in
    flight: they are re-queued, none is duplicated. Exit code 1 if cases are left without a record.

    \b
    Examples:
      attnmatrix probe --backends fa4,sdpa_cudnn --head-dims 128,256,192x128 --features none,causal   # GPU
      attnmatrix probe --backends sdpa_cpu --head-dims 64,128 --features causal                       # CPU
      ray start --head && attnmatrix probe --executor ray --address auto -o fleet.jsonl
      attnmatrix probe --executor ray --address auto --arch sm_90 --arch sm_100 --backends fa4
    """
    refuse_conflicts(click.get_current_context(), excludes=(("no_timing", "timed_dtypes"), ("no_timing", "budget_ms")))
    names = parse_backends(backends)
    timed = tuple(csv(timed_dtypes, DTYPES, "--timed-dtypes"))
    if executor == "ray":
        if gpus:
            raise UsageError("--gpus: with --executor ray, Ray assigns each task its GPU")
        from .fleet import probe_fleet

        probe_fleet(names=names, head_dims=head_dims, features_spec=features_spec, ops=ops, dtypes=dtypes,
                     out=out, workers=workers, timeout=timeout, memory_limit=memory_limit, timing=not no_timing,
                     timed_dtypes=timed, budget_ms=budget_ms, device=device, address=address, archs=archs,
                     chunk_size=chunk_size, as_json=as_json)
        return
    for name, value in (("--address", address), ("--arch", archs), ("--chunk-size", chunk_size)):
        if value:
            raise UsageError(f"{name} needs --executor ray (the local executor probes this machine's own arch)")
    dev = local_device(device)
    ready = _plan(names, dev)
    if not ready:
        raise UsageError(f"no backend to probe on this machine ({dev})")
    arch = workflow.local_arch(dev)
    cases = build_space(arch, ready, head_dims, features_spec, ops, dtypes)
    gpu_list = None
    if dev == "cuda" and gpus:
        try:
            gpu_list = [int(g) for g in gpus.split(",")]
        except ValueError:
            raise UsageError(f"--gpus: {gpus!r} is not a comma-separated list of GPU indices") from None
    out = out or DEFAULT_RESULTS / f"{arch}.jsonl"
    check_out(out)
    summary = local_sweep(cases, out, device=dev, workers=workers, timeout=timeout, memory_limit=memory_limit,
                          gpus=gpu_list, timing=not no_timing, quiet=as_json, timed_dtypes=timed,
                          budget_ms=budget_ms)
    print_summary(summary, out, as_json)


@main.command()
@click.option("--root", type=click.Path(file_okay=False), help="Checkout whose matrix to compare with (default: the "
                                                               "one the current directory is in).")
@space_options
@click.option("--results-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_RESULTS,
              show_default=True, help="Where this machine's probe results go (resumable).")
@click.option("--reprobe", is_flag=True, help="Probe cases even if the matrix already has them from identical "
                                              "hardware and torch build.")
@click.option("--no-probe", is_flag=True, help="Skip probing; only validate and summarize what is in --results-dir.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes (default: one per GPU, at least 2).")
@click.option("--timeout", type=float, default=180.0, show_default=True, callback=duration_callback,
              help="Seconds a case may run before its worker is killed.")
def run(root, backends, head_dims, features_spec, ops, dtypes, results_dir, reprobe, no_probe, workers,
        timeout) -> None:
    """The main job: probe what this machine can, validate it, and show what it would change in the matrix.

    Probes every installed backend of this machine's device (GPU backends need an NVIDIA GPU; a backend
    that is not installed is listed and not probed: it says nothing about the kernel). Cases the matrix
    already has from identical hardware and torch build are skipped (--reprobe re-measures them).

    `run` never rewrites the selector or the docs: they are generated from the committed matrix only, so
    `attnmatrix check` stays green. To contribute the new evidence, merge it into the matrix and regenerate
    (the command is printed at the end), then commit both.
    """
    from attnmatrix.matrix.diff import diff_matrices
    from attnmatrix.matrix.policy import resolve

    refuse_conflicts(click.get_current_context(), excludes=tuple(
        ("no_probe", o) for o in ("reprobe", "backends", "head_dims", "features_spec", "ops", "dtypes", "workers",
                                  "timeout")))
    proj = locate(root)
    base, problems = load(proj)
    if problems:
        report(problems)
        click.echo("the matrix itself has problems; fix them first (`attnmatrix validate`)", err=True)
        sys.exit(EXIT_FAILED)
    out: Path | None = None
    if not no_probe:
        dev = local_device()
        names = parse_backends(backends)
        ready = _plan(names, dev)
        arch = workflow.local_arch(dev)
        out = results_dir / f"{arch}.jsonl"
        check_out(out)
        if not ready:
            click.echo(f"no installed backend to probe on this machine ({dev})")
        else:
            cases = build_space(arch, ready, head_dims, features_spec, ops, dtypes)
            skip = set() if reprobe else workflow.recorded_here(base, arch, workflow.device_provenance(dev))
            todo = [c for c in cases if c.key not in skip]
            click.echo(f"{len(cases)} cases for {arch} ({', '.join(ready)}); {len(cases) - len(todo)} already in the "
                       f"matrix from this hardware, not probed again", err=True)
            local_sweep(todo, out, device=dev, workers=workers, timeout=timeout)
    else:
        found = sorted(results_dir.glob("*.jsonl")) if results_dir.is_dir() else []
        out = found[0] if len(found) == 1 else None
        if len(found) > 1:
            raise UsageError(f"--no-probe: {results_dir} holds {len(found)} result files; merge or name one")
    if out is None or not out.exists() or not out.stat().st_size:
        click.echo("no new evidence from this machine; the matrix is unchanged")
        return
    problems = []
    try:  # this machine's records alone: no committed results, no declared facts
        new = load_evidence([out], include_embedded=False, declared=None, problems=problems,
                            data_dir=proj.data_dir)
    except InputError as e:
        fail_input(e.problems)
    if problems:
        report(problems)
        sys.exit(exit_code_for(problems))
    useless = sum(1 for r in new.records if r.outcome == "unavailable")
    if useless:
        click.echo(f"{useless} record(s) in {out} are `unavailable` (the backend did not import): not evidence "
                   "about a kernel, left out", err=True)
    merged = Evidence(records=list(base.records), where=list(base.where), rankings=base.rankings,
                      backends=base.backends, files=base.files)
    for rec, where in zip(new.records, new.where, strict=True):
        if rec.outcome != "unavailable":
            merged.add(rec, where)
    fresh = len(merged.records) - len(base.records)
    from attnmatrix.matrix.diff import RERUN_NOISE

    # A re-timing of cells the matrix holds is a rerun: a latency moving less than a rerun's measured noise is
    # not a change (a busy machine would otherwise offer "faster: 40" as evidence).
    loose = diff_matrices(resolve(base), resolve(merged))
    changes = diff_matrices(resolve(base), resolve(merged), noise=RERUN_NOISE)
    within = sum(c.kind in ("faster", "slower") for c in loose) - sum(c.kind in ("faster", "slower") for c in changes)
    counts: dict[str, int] = {}
    for c in changes:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    click.echo(f"\nnew evidence: {fresh} record(s) in {out}")
    click.echo("what it would change in the matrix: "
               + (", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "nothing"))
    if within:
        click.echo(f"({within} latency difference(s) within a rerun's measured noise, {RERUN_NOISE[0]:g}x to "
                   f"{RERUN_NOISE[1]:g}x, not counted as changes)")
    name = out.stem + "-" + workflow.new_run_id().split("-")[0] + ".jsonl"
    click.echo("\nthe selector and docs were not changed (they follow the committed matrix). To contribute:\n"
               f"  attnmatrix merge {out} -o matrix/data/results/{name}\n"
               "  attnmatrix generate && attnmatrix check\n"
               "  git add matrix/data/results attnmatrix/selector.py site && git commit")
