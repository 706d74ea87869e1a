"""Commands that probe kernels: probe (local or Ray), xcompile, and run (the main job)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click
from tabulate import tabulate

from attnmatrix import workflow
from attnmatrix.matrix.cases import DTYPES, CaseError, normalize_arch
from attnmatrix.matrix.evidence import Evidence, load_evidence
from attnmatrix.matrix.storage import InputError, ResultStore, check_result_file

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


def _local_device(requested: str = "auto") -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible")
    if requested != "auto":
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


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


def _check_out(path: Path) -> None:
    try:
        check_result_file(path)
    except InputError as e:
        fail_input(e.problems)


def _xcompile_plan(cases: list, targets: list[str], workers: int) -> str:
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
    return (f"{head}; about {_duration(total)} at the matrix's median {each:.0f} s per compile "
            f"(first compiles of a target are slower; cases already recorded are skipped)")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


class _LineProgress:
    """Progress for a log rather than a terminal: a line every tenth of the work (and at least every 30 s),
    with counts, the rate and an estimate of what is left."""

    def __init__(self, label: str, total: int, describe):
        import time

        self.label, self.total, self.describe, self.done = label, total, describe, 0
        self.t0 = self.last = time.monotonic()
        self.step = max(1, total // 10)

    def __call__(self, rec) -> None:
        import time

        self.done += 1
        now = time.monotonic()
        if self.done % self.step and self.done != self.total and now - self.last < 30:
            return
        self.last = now
        rate = self.done / max(now - self.t0, 1e-9)
        left = (self.total - self.done) / rate if rate else 0
        click.echo(f"{self.label}: {self.done}/{self.total} ({100 * self.done // max(self.total, 1)}%), "
                   f"{rate * 60:.1f} cases/min, about {_duration(left)} left; last: {self.describe(rec)}", err=True)


def _progress_bar(label: str, quiet: bool, describe):
    """A progress bar on stderr; returns `on_open(store, todo)` for workflow.probe_into."""
    stack = contextlib.ExitStack()

    def on_open(store: ResultStore, todo: int):
        if store.repaired_bytes:
            click.echo(f"note: cut a torn last line ({store.repaired_bytes} bytes) from {store.path}", err=True)
        if quiet:
            return None
        if not sys.stderr.isatty():  # a log (CI, nohup, a pipe): a bar would print its label once and nothing else
            return _LineProgress(label, todo, describe)
        bar = stack.enter_context(click.progressbar(length=todo, label=label, file=sys.stderr, show_pos=True,
                                                    show_eta=True, item_show_func=lambda s: s))
        return lambda rec: bar.update(1, describe(rec))

    return on_open, stack


def _describe(rec) -> str:
    return f"{rec.case.backend} {rec.case.head_dim}x{rec.case.head_dim_v} {rec.outcome}"


def local_sweep(cases: list, out: Path, *, device: str, workers: int | None, timeout: float,
                memory_limit: int | None = None, gpus: list[int] | None = None, timing: bool = True,
                quiet: bool = False, timed_dtypes: tuple[str, ...] = tuple(DTYPES), budget_ms: float = 40.0,
                label: str = "probing"):
    """Probe `cases` on this machine into `out` with the local executor; prints progress on stderr."""
    from attnmatrix.kernels.probe import ProbeConfig
    from attnmatrix.kernels.runner import RunnerConfig

    env: dict[str, str] = {}
    if device == "cuda" and gpus is None:
        import torch

        gpus = list(range(torch.cuda.device_count()))
    if device == "cuda" and timing:
        from attnmatrix.kernels.timing import PEAK_ENV, PEAK_METHOD_ENV, peak_env

        # Measured in a subprocess: this process must not hold a CUDA context its workers inherit.
        env = peak_env(gpus[0] if gpus else None)
        if not quiet:
            click.echo(f"measured bf16 matmul peak: {env[PEAK_ENV]} TFLOP/s ({env[PEAK_METHOD_ENV]})" if env
                       else "the bf16 matmul peak could not be measured; records will carry none", err=True)
    probe_cfg = ProbeConfig(timing=timing, run_id=workflow.new_run_id(), timed_dtypes=timed_dtypes,
                            budget_ms=budget_ms)
    # Default: one worker per GPU, at least 2 (timed loops take turns on a GPU, so more workers mostly add
    # memory pressure during timing); `check --reprobe`, which times nothing, passes one per core.
    cfg = RunnerConfig(workers=workers or max(2, len(gpus or ())), timeout_s=timeout,
                       memory_limit_mb=memory_limit, device=device, gpus=gpus, probe=probe_cfg, extra_env=env)
    on_open, bar = _progress_bar(label, quiet, _describe)

    def opened(store, todo):
        if not quiet:
            click.echo(sweep_banner(cases, store, todo), err=True)
        return on_open(store, todo)

    with bar:
        try:
            return workflow.probe_into(cases, out, workflow.LocalExecutor(cfg), on_open=opened)
        except InputError as e:
            fail_input(e.problems)


def sweep_banner(cases: list, store: ResultStore, todo: int) -> str:
    """"N cases, A already recorded in FILE, T to probe", with A + T = N: records in the file for cases outside
    this sweep are counted apart, not as cases of it."""
    keys = {c.key for c in cases}
    already = len(keys & set(store.done))
    other = len(store.done) - already
    return (f"{len(keys)} cases, {already} already recorded in {store.path}, {todo} to probe"
            + (f" ({other} other record(s) in the file are kept)" if other else ""))


def print_summary(summary, out: Path, as_json: bool) -> None:
    data = summary.to_json(str(out))
    if as_json:
        click.echo(json.dumps(data, sort_keys=True))
    else:
        click.echo(tabulate([[k, v] for k, v in data.items()], tablefmt="simple"))


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
        _probe_fleet(names=names, head_dims=head_dims, features_spec=features_spec, ops=ops, dtypes=dtypes,
                     out=out, workers=workers, timeout=timeout, memory_limit=memory_limit, timing=not no_timing,
                     timed_dtypes=timed, budget_ms=budget_ms, device=device, address=address, archs=archs,
                     chunk_size=chunk_size, as_json=as_json)
        return
    for name, value in (("--address", address), ("--arch", archs), ("--chunk-size", chunk_size)):
        if value:
            raise UsageError(f"{name} needs --executor ray (the local executor probes this machine's own arch)")
    from attnmatrix.kernels.env import local_arch

    dev = _local_device(device)
    ready = _plan(names, dev)
    if not ready:
        raise UsageError(f"no backend to probe on this machine ({dev})")
    arch = local_arch(dev)
    cases = build_space(arch, ready, head_dims, features_spec, ops, dtypes)
    gpu_list = None
    if dev == "cuda" and gpus:
        try:
            gpu_list = [int(g) for g in gpus.split(",")]
        except ValueError:
            raise UsageError(f"--gpus: {gpus!r} is not a comma-separated list of GPU indices") from None
    out = out or DEFAULT_RESULTS / f"{arch}.jsonl"
    _check_out(out)
    summary = local_sweep(cases, out, device=dev, workers=workers, timeout=timeout, memory_limit=memory_limit,
                          gpus=gpu_list, timing=not no_timing, quiet=as_json, timed_dtypes=timed,
                          budget_ms=budget_ms)
    print_summary(summary, out, as_json)


def _probe_fleet(*, names, head_dims, features_spec, ops, dtypes, out: Path | None, workers: int | None,
                 timeout: float, memory_limit: int | None, timing: bool, timed_dtypes: tuple[str, ...],
                 budget_ms: float, device: str, address: str | None, archs: tuple[str, ...], chunk_size: int | None,
                 as_json: bool) -> None:
    """`probe --executor ray`: the case space of the cluster's archs, probed by Ray tasks (kernels/ray_executor.py).
    Installation is checked on the nodes (a backend missing there is recorded `unavailable` by its node)."""
    from attnmatrix.kernels import ray_cluster as rc
    from attnmatrix.kernels import ray_executor as rx
    from attnmatrix.kernels.probe import ProbeConfig
    from attnmatrix.kernels.runner import RunnerConfig

    try:
        rc.import_ray()
    except rc.RayMissing as e:
        raise UsageError(str(e)) from None

    def backends_of(dev: str) -> list[str]:
        return workflow.plan_backends(names or workflow.backends_for(dev), dev, check_installed=False).ready

    # Usage errors before Ray starts (seconds): the space is built again per arch once the lanes are known.
    build_space("cpu", backends_of("cpu") or ["sdpa_cpu"], head_dims, features_spec, ops, dtypes)
    if out is not None:
        _check_out(out)
    cpus_per_task = workers or 1
    with contextlib.ExitStack() as stack:
        try:
            ray = stack.enter_context(rc.ray_session(address))
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(f"--address {address or '(local)'}: cannot connect to Ray: {e}") from None
        lanes, notes = rc.live_lanes(ray, cpus_per_task=cpus_per_task)
        for n in notes:
            click.echo(f"note: {n}", err=True)
        dev = rc.fleet_device(lanes, device)
        offered = rc.fleet_archs(lanes, dev)
        if archs:
            try:
                targets = sorted({normalize_arch(a) for a in archs})
            except CaseError as e:
                raise UsageError(f"--arch: {e}") from None
            clash = [a for a in targets if device != "auto" and (a == "cpu") != (device == "cpu")]
            if clash:
                raise UsageError(f"--arch {', '.join(clash)} is not probed with --device {device}")
        else:
            targets = offered
        have = {lane.arch for lane in lanes}
        missing = [a for a in targets if a not in have]
        lane_list = "; ".join(lane.describe() for lane in lanes) or "none"
        if missing or not targets:
            what = f"arch {', '.join(missing)}" if missing else f"--device {dev}"
            raise UsageError(f"the Ray cluster has no node for {what} (its lanes: {lane_list})")
        cases = []
        for arch in targets:
            cases += build_space(arch, backends_of("cpu" if arch == "cpu" else "cuda"), head_dims, features_spec,
                                 ops, dtypes)
        out = out or DEFAULT_RESULTS / (f"{targets[0]}.jsonl" if len(targets) == 1 else "fleet.jsonl")
        _check_out(out)
        probe_cfg = ProbeConfig(timing=timing, run_id=workflow.new_run_id(), timed_dtypes=timed_dtypes,
                                budget_ms=budget_ms)
        cfg = RunnerConfig(workers=workers or 2, timeout_s=timeout, memory_limit_mb=memory_limit, device=dev,
                           probe=probe_cfg)
        executor = workflow.RayExecutor(cfg, rx.FleetConfig(chunk_size=chunk_size, cpus_per_task=cpus_per_task), ray)

        def describe(rec) -> str:
            return f"{rec.case.arch} {_describe(rec)}"

        on_open, bar = _progress_bar("probing", as_json, describe)

        def opened(store, todo):
            if not as_json:
                click.echo(f"ray lanes: {lane_list}", err=True)
                click.echo(f"{', '.join(targets)}: {sweep_banner(cases, store, todo)}", err=True)
            return on_open(store, todo)

        def on_event(kind: str, info: dict) -> None:
            if kind == "task_lost":
                node = (info["node"] or "?")[:8]
                click.echo(f"\nnote: lost a task on node {node} ({info['error']}); {info['requeued']} "
                           f"unfinished case(s) re-queued, {info['given_up']} given up", err=True)

        with bar:
            try:
                summary = workflow.probe_into(cases, out, executor, on_open=opened, on_event=on_event)
            except rx.FleetError as e:
                click.echo(f"error: {e}", err=True)
                sys.exit(EXIT_FAILED)
    print_summary(summary, out, as_json)
    if summary.unprobed:
        for key, why in sorted(summary.unprobed.items())[:20]:
            click.echo(f"not probed: {key}: {why}", err=True)
        more = len(summary.unprobed) - 20
        click.echo(("" if more <= 0 else f"... and {more} more; ") + f"{len(summary.unprobed)} case(s) have no "
                   f"record; run the same command again to probe them (recorded cases are skipped)", err=True)
        sys.exit(EXIT_FAILED)


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
    from attnmatrix.kernels import xcompile as xc
    from attnmatrix.kernels.base import load_backend

    names = parse_backends(backends) or ["fa4"]
    cannot = [n for n in names if load_backend(n).compile_only is None]
    if cannot:
        can = [n for n in workflow.backends_for("cuda") if load_backend(n).compile_only is not None]
        raise UsageError(f"--backends: {', '.join(cannot)} cannot be cross-compiled (only {', '.join(can)} compile "
                         "without a GPU)")
    try:
        targets = [xc.normalize_target(a) for a in (archs or xc.DEFAULT_TARGETS)]
    except (CaseError, ValueError) as e:
        known = ", ".join(xc.DEFAULT_TARGETS)
        raise UsageError(f"--arch: {str(e).removeprefix('arch: ')} (compile targets: {known})") from None
    # The CLI compiles for the known GPUs only: each target's SM count is part of the compiled kernel.
    unknown = [t for t in targets if normalize_arch(t) not in xc.TARGETS]
    if unknown:
        raise UsageError(f"--arch: {', '.join(unknown)} is not a compile target this command knows the SM count "
                         f"of (compile targets: {', '.join(xc.DEFAULT_TARGETS)})")
    cases = build_space(normalize_arch(targets[0]), names, head_dims, features_spec, ops, dtypes)
    path = out or DEFAULT_RESULTS / "xcompile.jsonl"
    _check_out(path)
    if not as_json:
        click.echo(_xcompile_plan(cases, targets, workers), err=True)

    def show(rec) -> None:
        if not as_json:
            ex = rec.extra or {}
            took = f"{ex['compile_s']:>7} s" if isinstance(ex.get("compile_s"), (int, float)) else " " * 9
            click.echo(f"{rec.provenance.get('target', rec.case.arch):8} {rec.outcome:9} {took}  {rec.case.key}"
                       + (f"  | {rec.reason[:120]}" if rec.reason else ""), err=True)

    try:
        summaries = xc.xcompile_cases(cases, path, targets, workers=workers, timeout_s=timeout, cache_dir=cache_dir,
                                      run_id=workflow.new_run_id(), progress=show)
    except InputError as e:
        fail_input(e.problems)
    for target, summary in summaries.items():
        if not as_json:
            click.echo(f"\n{target}")
        print_summary(summary, path, as_json)


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
        from attnmatrix.kernels.env import device_provenance, local_arch

        dev = _local_device()
        names = parse_backends(backends)
        ready = _plan(names, dev)
        arch = local_arch(dev)
        out = results_dir / f"{arch}.jsonl"
        _check_out(out)
        if not ready:
            click.echo(f"no installed backend to probe on this machine ({dev})")
        else:
            cases = build_space(arch, ready, head_dims, features_spec, ops, dtypes)
            skip = set() if reprobe else workflow.recorded_here(base, arch, device_provenance(dev))
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
