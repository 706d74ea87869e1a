"""The `attnmatrix` command line. Exit codes: 0 ok, 1 a check failed, 2 bad usage or unreadable input."""

from __future__ import annotations

import contextlib
import difflib
import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import click
from tabulate import tabulate

from attnmatrix.matrix.cases import (
    DTYPES,
    FEATURE_SETS,
    HEAD_DIMS,
    OPS,
    CaseError,
    canonical_features,
    case_space,
    normalize_arch,
    parse_head_dims,
)
from attnmatrix.matrix.evidence import Evidence, load_evidence
from attnmatrix.matrix.policy import SUPPORTED, ResolvedMatrix, arch_sort_key, describe, resolve
from attnmatrix.matrix.storage import InputError, Problem, ResultStore, atomic_write_text, write_records

from . import project

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_RESULTS = Path("attnmatrix-results")


UsageError = click.UsageError  # click exits 2 with it, as the contract wants for bad usage

def _fail_input(e: InputError) -> None:
    for p in e.problems:
        click.echo(f"error: {p}", err=True)
    sys.exit(EXIT_USAGE)


def _load(paths: tuple[str, ...] = (), *, embedded: bool = True) -> tuple[Evidence, list[Problem]]:
    problems: list[Problem] = []
    try:
        ev = load_evidence(list(paths), include_embedded=embedded, problems=problems)
    except InputError as e:
        _fail_input(e)
    from attnmatrix.matrix.validate import validate_evidence

    problems += validate_evidence(ev)
    return ev, problems


def _report(problems: list[Problem]) -> None:
    for p in problems:
        click.echo(f"problem: {p}", err=True)
    if problems:
        click.echo(f"{len(problems)} problem(s) found", err=True)


def _root(root: str | None) -> Path:
    try:
        return project.find_root(Path(root) if root else None)
    except project.ProjectNotFound as e:
        raise UsageError(str(e)) from None


def _render(ev: Evidence, root: Path) -> dict[str, str]:
    from attnmatrix.generator import render_all
    from attnmatrix.matrix.history import SNAPSHOT_FILE, load_snapshot

    m = resolve(ev)
    meta = {"matrix_id": project.matrix_id(ev), "kernel_versions": project.kernel_versions(ev),
            "files": project.relative_files(ev, root)}
    if SNAPSHOT_FILE.exists():
        try:
            prev_id, prev = load_snapshot(SNAPSHOT_FILE, ev.backends)
        except InputError as e:
            _fail_input(e)
        meta["previous"] = {"matrix_id": prev_id, "matrix": prev, "source": "matrix/data/history/previous.jsonl"}
    return render_all(m, meta)


def _parse_feature_sets(spec: str | None) -> list[tuple[str, ...]]:
    if not spec:
        return list(FEATURE_SETS)
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(() if item == "none" else canonical_features(item.split("+")))
        except CaseError as e:
            raise UsageError(f"--features: {e}") from None
    return out


def _csv(spec: str | None, allowed: list[str], name: str) -> list[str]:
    if not spec:
        return list(allowed)
    items = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad:
        raise UsageError(f"{name}: unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
    return items


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="attnmatrix")
def main() -> None:
    """Probe attention kernels, keep an evidence-backed compatibility matrix, generate selector and docs.

    \b
    Typical flows:
      attnmatrix run                         probe this machine, merge, validate, regenerate, summarize
      attnmatrix probe --backends fa4,fa2    sweep kernels on the local GPU (resumable JSONL)
      attnmatrix xcompile --arch sm_100a     compile-only evidence for a GPU you do not have
      attnmatrix explain --arch sm_90 --head-size 256 --sliding-window
      attnmatrix check                       CI gate: matrix valid and generated files current

    Evidence tiers, strongest first: validated (ran here, checked against a float32 reference),
    compiled (built for the arch without running), declared (an upstream source says so).
    """


# --- probing -----------------------------------------------------------------------------------


def _local_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _local_backends(device: str) -> list[str]:
    from attnmatrix.kernels.base import BACKEND_MODULES, load_backend

    names = [n for n in sorted(BACKEND_MODULES) if not n.startswith("fake_")]
    return [n for n in names if load_backend(n).device == device]


def _probe(cases: list, out: Path, *, workers: int, timeout: float, memory_limit: int | None, device: str,
           gpus: list[int] | None, timing: bool, quiet: bool, skip: set[str] | None = None,
           timed_dtypes: tuple[str, ...] = tuple(DTYPES), budget_ms: float = 40.0):
    from attnmatrix.kernels.probe import ProbeConfig
    from attnmatrix.kernels.runner import RunnerConfig, run_cases

    env = {}
    if device == "cuda" and timing:
        from attnmatrix.kernels.timing import matmul_peak_tflops

        peak = matmul_peak_tflops("cuda")
        env["ATTNMATRIX_MATMUL_PEAK_TFLOPS"] = f"{peak:.1f}"
        if not quiet:
            click.echo(f"measured bf16 matmul peak: {peak:.1f} TFLOP/s", err=True)
    probe_cfg = ProbeConfig(timing=timing, run_id=f"{time.strftime('%Y%m%d')}-{uuid.uuid4().hex[:8]}",
                            timed_dtypes=timed_dtypes, budget_ms=budget_ms)
    cfg = RunnerConfig(workers=workers, timeout_s=timeout, memory_limit_mb=memory_limit, device=device, gpus=gpus,
                       probe=probe_cfg, extra_env=env)
    if skip:
        cases = [c for c in cases if c.key not in skip]
    with ResultStore(out) as store:
        if store.repaired_bytes:
            click.echo(f"note: cut a torn last line ({store.repaired_bytes} bytes) from {out}", err=True)
        todo = sum(1 for c in cases if c.key not in store)
        if not quiet:
            click.echo(f"{len(cases)} cases, {len(cases) - todo} already recorded in {out}, {todo} to probe",
                       err=True)
        with click.progressbar(length=todo, label="probing", file=sys.stderr,
                               show_pos=True, show_eta=True, item_show_func=lambda s: s) as bar:
            def progress(rec) -> None:
                bar.update(1, f"{rec.case.backend} {rec.case.head_dim}x{rec.case.head_dim_v} {rec.outcome}")

            summary = run_cases(cases, store, cfg, progress=None if quiet else progress)
    return summary


def _probe_fleet(*, backends, head_dims, features_spec, ops, dtypes, out: Path | None, workers: int | None,
                 timeout: float, memory_limit: int | None, timing: bool, timed_dtypes: tuple[str, ...],
                 budget_ms: float, device: str, address: str | None, archs: tuple[str, ...], chunk_size: int | None,
                 as_json: bool) -> None:
    """`probe --executor ray`: the case space of the cluster's archs, probed by Ray tasks (kernels/ray_executor.py)."""
    from attnmatrix.kernels import ray_executor as rx
    from attnmatrix.kernels.probe import ProbeConfig
    from attnmatrix.kernels.runner import RunnerConfig

    try:
        rx.import_ray()
    except rx.RayMissing as e:
        raise UsageError(str(e)) from None
    # Usage errors before Ray starts (seconds): the space is built again per arch once the lanes are known.
    _build_space("cpu", _check_backends(backends, "cpu"), head_dims, features_spec, ops, dtypes)
    cpus_per_task = workers or 1
    with contextlib.ExitStack() as stack:
        try:
            ray = stack.enter_context(rx.ray_session(address))
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(f"--address {address or '(local)'}: cannot connect to Ray: {e}") from None
        lanes, notes = rx.live_lanes(ray, cpus_per_task=cpus_per_task)
        for n in notes:
            click.echo(f"note: {n}", err=True)
        dev = rx.fleet_device(lanes, device)
        offered = rx.fleet_archs(lanes, dev)
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
            arch_dev = "cpu" if arch == "cpu" else "cuda"
            cases += _build_space(arch, _check_backends(backends, arch_dev), head_dims, features_spec, ops, dtypes)
        out = out or DEFAULT_RESULTS / (f"{targets[0]}.jsonl" if len(targets) == 1 else "fleet.jsonl")
        probe_cfg = ProbeConfig(timing=timing, run_id=f"{time.strftime('%Y%m%d')}-{uuid.uuid4().hex[:8]}",
                                timed_dtypes=timed_dtypes, budget_ms=budget_ms)
        cfg = RunnerConfig(workers=workers or 2, timeout_s=timeout, memory_limit_mb=memory_limit, device=dev,
                           probe=probe_cfg)
        fleet = rx.FleetConfig(chunk_size=chunk_size, cpus_per_task=cpus_per_task)
        with ResultStore(out) as store:
            if store.repaired_bytes:
                click.echo(f"note: cut a torn last line ({store.repaired_bytes} bytes) from {out}", err=True)
            todo = sum(1 for c in cases if c.key not in store)
            if not as_json:
                click.echo(f"ray lanes: {lane_list}", err=True)
                click.echo(f"{len(cases)} cases on {', '.join(targets)}, {len(cases) - todo} already recorded in "
                           f"{out}, {todo} to probe", err=True)
            with click.progressbar(length=todo, label="probing", file=sys.stderr,
                                   show_pos=True, show_eta=True, item_show_func=lambda s: s) as bar:
                def progress(rec) -> None:
                    bar.update(1, f"{rec.case.arch} {rec.case.backend} {rec.case.head_dim}x{rec.case.head_dim_v} "
                                  f"{rec.outcome}")

                def on_event(kind: str, info: dict) -> None:
                    if kind == "task_lost":
                        node = (info["node"] or "?")[:8]
                        click.echo(f"\nnote: lost a task on node {node} ({info['error']}); {info['requeued']} "
                                   f"unfinished case(s) re-queued, {info['given_up']} given up", err=True)

                try:
                    summary = rx.run_cases_ray(cases, store, cfg, fleet, progress=None if as_json else progress,
                                               ray=ray, on_event=on_event)
                except rx.FleetError as e:
                    click.echo(f"error: {e}", err=True)
                    sys.exit(EXIT_FAILED)
    _print_probe_summary(summary, out, as_json)
    if summary.unprobed:
        for key, why in sorted(summary.unprobed.items())[:20]:
            click.echo(f"not probed: {key}: {why}", err=True)
        more = len(summary.unprobed) - 20
        click.echo(("" if more <= 0 else f"... and {more} more; ") + f"{len(summary.unprobed)} case(s) have no "
                   f"record; run the same command again to probe them (recorded cases are skipped)", err=True)
        sys.exit(EXIT_FAILED)


def _space_options(f):
    opts = [
        click.option("--backends", help="Comma-separated backends (default: every backend for this device)."),
        click.option("--head-dims", help="Comma-separated N or NxNv, e.g. 64,128,192x128 (default: the standard "
                                         "list)."),
        click.option("--features", "features_spec",
                     help="Comma-separated feature sets, each `none` or tokens joined by +, e.g. "
                          "none,causal,causal+softcap,causal+paged_kv:64 (default: the standard sets)."),
        click.option("--ops", help=f"Comma-separated ops from {', '.join(OPS)}."),
        click.option("--dtypes", help=f"Comma-separated dtypes from {', '.join(DTYPES)}."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _build_space(arch: str, backends: list[str], head_dims, features_spec, ops, dtypes) -> list:
    try:
        hds = parse_head_dims(head_dims) if head_dims else list(HEAD_DIMS)
    except CaseError as e:
        raise UsageError(f"--head-dims: {e}") from None
    return list(case_space([arch], backends, head_dims=hds, dtypes=_csv(dtypes, DTYPES, "--dtypes"),
                           feature_sets=_parse_feature_sets(features_spec), ops=_csv(ops, OPS, "--ops")))


def _check_backends(spec: str | None, device: str) -> list[str]:
    from attnmatrix.kernels.base import BACKEND_MODULES

    if not spec:
        return _local_backends(device)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in BACKEND_MODULES]
    if bad:
        raise UsageError(f"--backends: unknown backend(s) {', '.join(bad)} "
                         f"(known: {', '.join(sorted(BACKEND_MODULES))})")
    return names


@main.command()
@_space_options
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Result file (JSON Lines). Re-running with the same file resumes. "
                   "Default: attnmatrix-results/<arch>.jsonl")
@click.option("--workers", type=int, default=None,
              help="Worker processes, spread over the GPUs (default: one per GPU, at least 2). On one GPU, "
                   "several workers compile in parallel and take turns for timed loops. With --executor ray: "
                   "workers per GPU task (default 2), or CPUs (and workers) per task when probing CPUs (default 1).")
@click.option("--gpus", help="Comma-separated GPU indices, one worker each (default: every visible GPU).")
@click.option("--timeout", type=float, default=180.0, show_default=True,
              help="Seconds a case may run (first calls JIT-compile) before its worker is killed.")
@click.option("--memory-limit", type=int, default=None, help="Address-space cap per CPU worker, MiB.")
@click.option("--no-timing", is_flag=True, help="Validate only; skip the timed shapes.")
@click.option("--timed-dtypes", default="bfloat16,float16", show_default=True,
              help="Time passing cases of these dtypes only (the others are validated, not timed).")
@click.option("--budget-ms", type=float, default=40.0, show_default=True,
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

    Each case runs in a worker subprocess: a crash or hang is recorded (`crash`, `timeout`) and the
    worker replaced. Kill the sweep at any point and run the same command again: recorded cases
    are skipped, none is lost or duplicated. Cases are checked against a float32 reference and, if
    they pass, timed on three shapes (median of many runs; CUDA events on a GPU).

    With --executor ray the case space is built for every arch the cluster has (its nodes' accelerator
    types, or an `attnmatrix_arch_<arch>` resource on a node), cut into small chunks, and each chunk
    runs as a Ray task on a node of its arch, one GPU per task, through the same isolated runner. Records
    stream back to this process, which writes the result file. A node that dies loses only its cases in
    flight: they are re-queued, none is duplicated. Exit code 1 if cases are left without a record.

    \b
    Examples:
      attnmatrix probe --backends fa4,sdpa_cudnn --head-dims 128,256,192x128 --features none,causal
      attnmatrix probe --backends fake_segfault,sdpa_cpu --device cpu --timeout 10
      ray start --head && attnmatrix probe --executor ray --address auto -o fleet.jsonl
      attnmatrix probe --executor ray --address auto --arch sm_90 --arch sm_100 --backends fa4
      attnmatrix probe --executor ray --device cpu --backends sdpa_cpu      # a local Ray on this machine
    """
    if executor == "ray":
        if gpus:
            raise UsageError("--gpus: with --executor ray, Ray assigns each task its GPU")
        _probe_fleet(backends=backends, head_dims=head_dims, features_spec=features_spec, ops=ops, dtypes=dtypes,
                     out=out, workers=workers, timeout=timeout, memory_limit=memory_limit, timing=not no_timing,
                     timed_dtypes=tuple(_csv(timed_dtypes, DTYPES, "--timed-dtypes")), budget_ms=budget_ms,
                     device=device, address=address, archs=archs, chunk_size=chunk_size, as_json=as_json)
        return
    for name, value in (("--address", address), ("--arch", archs), ("--chunk-size", chunk_size)):
        if value:
            raise UsageError(f"{name} needs --executor ray (the local executor probes this machine's own arch)")
    import torch

    dev = _local_device() if device == "auto" else device
    if dev == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible")
    from attnmatrix.kernels.env import local_arch

    arch = local_arch(dev)
    names = _check_backends(backends, dev)
    cases = _build_space(arch, names, head_dims, features_spec, ops, dtypes)
    gpu_list = None
    if dev == "cuda":
        gpu_list = [int(g) for g in gpus.split(",")] if gpus else list(range(torch.cuda.device_count()))
    out = out or DEFAULT_RESULTS / f"{arch}.jsonl"
    summary = _probe(cases, out, workers=workers or max(2, len(gpu_list or ())), timeout=timeout,
                     memory_limit=memory_limit, device=dev, gpus=gpu_list, timing=not no_timing, quiet=as_json,
                     timed_dtypes=tuple(_csv(timed_dtypes, DTYPES, "--timed-dtypes")), budget_ms=budget_ms)
    _print_probe_summary(summary, out, as_json)


def _print_probe_summary(summary, out: Path, as_json: bool) -> None:
    data = {"file": str(out), "cases": summary.total, "resumed": summary.skipped, "probed": summary.ran,
            "outcomes": dict(sorted(summary.outcomes.items())), "wall_s": round(summary.wall_s, 2),
            "cases_per_min": round(summary.ran / summary.wall_s * 60, 1) if summary.wall_s else None,
            "workers_replaced": summary.workers_replaced}
    if hasattr(summary, "tasks"):  # the ray executor's FleetSummary
        data.update({"executor": "ray", "ray_tasks": summary.tasks, "ray_tasks_lost": summary.tasks_lost,
                     "requeued": summary.requeued, "unprobed": len(summary.unprobed),
                     "nodes": len(summary.nodes)})
    if as_json:
        click.echo(json.dumps(data, sort_keys=True))
    else:
        click.echo(tabulate([[k, v] for k, v in data.items()], tablefmt="simple"))


@main.command()
@click.option("--arch", "archs", multiple=True,
              help="Target(s) to compile for, repeatable: sm_80, sm_90a, sm_100a, sm_103a, sm_110a, sm_120 "
                   "(default: all of them).")
@_space_options
@click.option("-o", "--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Result file, resumed if it exists (default: attnmatrix-results/xcompile.jsonl).")
@click.option("--workers", type=int, default=2, show_default=True, help="Compiling processes per target.")
@click.option("--timeout", type=float, default=900.0, show_default=True, help="Seconds per compile.")
@click.option("--cache-dir", type=click.Path(file_okay=False),
              help="Keep the compiled kernels in FA4's persistent cache here (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR).")
@click.option("--json", "as_json", is_flag=True)
def xcompile(archs, backends, head_dims, features_spec, ops, dtypes, out, workers, timeout, cache_dir,
             as_json) -> None:
    """Compile-only probes for GPUs that are not present (FlashAttention 4's CuTe DSL, no GPU needed).

    Each target runs in its own worker processes with FLASH_ATTENTION_ARCH, CUTE_DSL_ARCH and
    FLASH_ATTENTION_NUM_SMS set; the forward kernel is built under FakeTensorMode and not launched.
    A build is recorded `compiled` (tier `compiled`, with compile time and cubin size); FA4's own
    refusal is recorded `rejected` with its message; a crash is contained and recorded. Compiling
    is not running: the policy ranks a cited upstream negative above a compile.

    \b
    Example:
      attnmatrix xcompile --arch sm_100a --head-dims 128,192x128,256,512 --features causal --dtypes bfloat16
    """
    from attnmatrix.kernels import xcompile as xc

    names = _check_backends(backends or "fa4", "cuda")
    if names != ["fa4"]:
        raise UsageError("--backends: only fa4 can be cross-compiled (its CuTe DSL compiles without a GPU)")
    try:
        targets = [xc.normalize_target(a) for a in (archs or xc.DEFAULT_TARGETS)]
    except (CaseError, ValueError) as e:
        raise UsageError(f"--arch: {e}") from None
    cases = _build_space(normalize_arch(targets[0]), names, head_dims, features_spec, ops, dtypes)
    path = out or DEFAULT_RESULTS / "xcompile.jsonl"

    def show(rec) -> None:
        if not as_json:
            ex = rec.extra or {}
            click.echo(f"{rec.provenance.get('target', rec.case.arch):8} {rec.outcome:9} "
                       f"{ex.get('compile_s', ''):>7} s  {rec.case.key}"
                       + (f"  | {rec.reason[:120]}" if rec.reason else ""), err=True)

    summaries = xc.xcompile_cases(cases, path, targets, workers=workers, timeout_s=timeout, cache_dir=cache_dir,
                                  progress=show)
    for target, summary in summaries.items():
        if not as_json:
            click.echo(f"\n{target}")
        _print_probe_summary(summary, path, as_json)


# --- evidence ----------------------------------------------------------------------------------


@main.command()
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--no-embedded", is_flag=True, help="Check only FILES, not the embedded matrix.")
@click.option("--json", "as_json", is_flag=True, help="Print problems as JSON Lines.")
def validate(files, no_embedded, as_json) -> None:
    """Check result files (and the embedded matrix): schema, known backends, contradictions.

    Every problem is listed with its file, line, record and field. Exit 1 if any.
    """
    ev, problems = _load(tuple(str(f) for f in files), embedded=not no_embedded)
    if as_json:
        for p in problems:
            click.echo(json.dumps({"file": p.file, "line": p.line, "record": p.record, "field": p.field,
                                   "message": p.message}, sort_keys=True))
    else:
        _report(problems)
        if not problems:
            click.echo(f"ok: {len(ev.records)} records from {len(ev.files)} file(s), no problems")
    sys.exit(EXIT_FAILED if problems else EXIT_OK)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Merged JSON Lines file (written atomically; untouched on failure).")
def merge(files, out) -> None:
    """Merge result files into one: exact duplicates dropped, contradictions refused (exit 1).

    Evidence that merely disagrees (two machines, two versions) is kept: the resolution policy
    decides later, and `explain` shows both.
    """
    from attnmatrix.matrix.merge import merge_records

    problems: list[Problem] = []
    try:
        ev = load_evidence(list(files), include_embedded=False, declared=None, problems=problems)
    except InputError as e:
        _fail_input(e)
    merged, contradictions = merge_records(list(zip(ev.records, ev.where, strict=True)))
    problems += contradictions
    if problems:
        _report(problems)
        click.echo(f"not written: {out}", err=True)
        sys.exit(EXIT_FAILED)
    try:
        write_records(out, merged)
    except OSError as e:
        click.echo(f"error: {out}: cannot write: {e.strerror or e}", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(f"merged {len(ev.records)} records from {len(ev.files)} file(s) into {len(merged)} in {out}")


@main.command()
@click.option("--root", type=click.Path(file_okay=False), help="Checkout to write into (default: found from cwd).")
@click.option("--results", "extra", multiple=True, type=click.Path(path_type=Path),
              help="Extra result files or folders to include beside the embedded matrix.")
def generate(root, extra) -> None:
    """Write the selector module and the docs pages from the matrix (byte-identical for the same matrix)."""
    r = _root(root)
    ev, problems = _load(tuple(str(e) for e in extra))
    if problems:
        _report(problems)
        click.echo("not generated: the matrix is invalid", err=True)
        sys.exit(EXIT_FAILED)
    files = _render(ev, r)
    changed = [p for p, text in sorted(files.items()) if atomic_write_text(r / p, text)]
    click.echo(f"generated {len(files)} file(s) from matrix {project.matrix_id(ev)}; {len(changed)} changed")
    for p in changed:
        click.echo(f"  wrote {p}")


@main.command()
@click.option("--root", type=click.Path(file_okay=False))
@click.option("--reprobe", is_flag=True, help="Also re-run this GPU's validated cells and fail if a claim no "
                                              "longer holds for the installed kernels.")
@click.option("--max-diff-lines", type=int, default=60, show_default=True)
def check(root, reprobe, max_diff_lines) -> None:
    """CI gate: the matrix is valid and every generated file is byte-identical to a fresh generation."""
    r = _root(root)
    ev, problems = _load()
    failed = False
    if problems:
        _report(problems)
        failed = True
    else:
        files = _render(ev, r)
        stale = []
        for p, text in sorted(files.items()):
            path = r / p
            current = path.read_text(encoding="utf-8") if path.exists() else None
            if current != text:
                stale.append(p)
                diff = list(difflib.unified_diff((current or "").splitlines(), text.splitlines(),
                                                 f"{p} (on disk)", f"{p} (generated)", lineterm=""))
                for line in diff[:max_diff_lines]:
                    click.echo(line)
                if len(diff) > max_diff_lines:
                    click.echo(f"... {len(diff) - max_diff_lines} more diff lines")
        if stale:
            click.echo(f"{len(stale)} generated file(s) are stale: {', '.join(stale)}; run `attnmatrix generate`",
                       err=True)
            failed = True
        else:
            click.echo(f"ok: {len(files)} generated files match matrix {project.matrix_id(ev)}")
    if reprobe and not failed:
        failed = _reprobe(ev)
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


def _reprobe(ev: Evidence) -> bool:
    import tempfile

    from attnmatrix.kernels.env import local_arch

    dev = _local_device()
    arch = local_arch(dev)
    m = resolve(ev)
    claims = [c for c in m.cells.values() if c.case.arch == arch and c.tier == "validated"]
    if not claims:
        click.echo(f"reprobe: no validated claims for {arch} in the matrix; nothing to re-check")
        return False
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "reprobe.jsonl"
        _probe([c.case for c in claims], out, workers=2, timeout=180, memory_limit=None, device=dev,
               gpus=None, timing=False, quiet=True)
        from attnmatrix.matrix.storage import read_records

        now = {rec.key: rec for _, rec in read_records(out)}
    broken = []
    for c in claims:
        rec = now.get(c.case.key)
        held = rec is not None and (rec.outcome == "pass") == (c.status == SUPPORTED)
        if not held:
            broken.append([c.case.key, c.outcome, rec.outcome if rec else "missing", (rec.reason or "")[:80]
                           if rec else ""])
    if broken:
        click.echo(tabulate(broken, headers=["cell", "claimed", "now", "reason"]))
        click.echo(f"reprobe: {len(broken)} of {len(claims)} claims no longer hold", err=True)
        return True
    click.echo(f"reprobe: all {len(claims)} validated claims for {arch} still hold")
    return False


@main.command()
@click.option("--json", "as_json", is_flag=True)
def snapshot(as_json) -> None:
    """Record the current matrix as the previous version, before adding new evidence.

    The docs' changelog page is the diff from this snapshot (matrix/data/history/previous.jsonl) to
    the matrix being generated. Take one when a matrix version is published, then commit new results.
    """
    from attnmatrix.matrix.history import SNAPSHOT_FILE, dump_snapshot

    ev, problems = _load()
    if problems:
        _report(problems)
        sys.exit(EXIT_FAILED)
    mid = project.matrix_id(ev)
    atomic_write_text(SNAPSHOT_FILE, dump_snapshot(resolve(ev), mid))
    msg = {"matrix_id": mid, "file": str(SNAPSHOT_FILE)}
    click.echo(json.dumps(msg) if as_json else f"snapshot of matrix {mid} written to {SNAPSHOT_FILE}")


# --- reading the matrix ------------------------------------------------------------------------


def _filters(f):
    opts = [
        click.option("--arch", help="e.g. sm_90, sm_100 (a/f suffixes and 9.0 accepted)."),
        click.option("--backend"),
        click.option("--op", type=click.Choice(OPS)),
        click.option("--dtype", type=click.Choice(DTYPES)),
        click.option("--head-dim", type=int),
        click.option("--head-dim-v", type=int),
        click.option("--feature", "features", multiple=True, help="Cells whose features include this token."),
        click.option("--status", type=click.Choice(["supported", "unsupported", "unknown"])),
        click.option("--tier", type=click.Choice(["validated", "compiled", "declared"])),
        click.option("--results", "extra", multiple=True, type=click.Path(path_type=Path),
                     help="Extra result files/folders beside the embedded matrix."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _select(m: ResolvedMatrix, arch, backend, op, dtype, head_dim, head_dim_v, features, status, tier):
    try:
        arch = normalize_arch(arch) if arch else None
    except CaseError as e:
        raise UsageError(f"--arch: {e}") from None
    if backend and not any(b == backend or b.startswith(backend + "_") for b in m.backends):
        raise UsageError(f"--backend: unknown backend {backend!r} (known: {', '.join(sorted(m.backends))})")
    cells = [c for c in m.cells.values()
             if (arch is None or c.case.arch == arch)
             and (backend is None or c.case.backend == backend or c.case.backend.startswith(backend + "_"))
             and (op is None or c.case.op == op) and (dtype is None or c.case.dtype == dtype)
             and (head_dim is None or c.case.head_dim == head_dim)
             and (head_dim_v is None or c.case.head_dim_v == head_dim_v)
             and all(f in c.case.features for f in features)
             and (status is None or c.status == status) and (tier is None or c.tier == tier)]
    return sorted(cells, key=lambda c: (arch_sort_key(c.case.arch), c.case))


STATUS_MARK = {"supported": "yes", "unsupported": "no", "unknown": "?"}


@main.command()
@_filters
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True, help="json prints one JSON object per cell (JSON Lines).")
@click.option("--limit", type=int, default=None, help="Show at most this many cells.")
def show(arch, backend, op, dtype, head_dim, head_dim_v, features, status, tier, extra, fmt, limit) -> None:
    """The resolved matrix: one row per cell, filtered. `--backend trtllm` matches every trtllm_* backend."""
    ev, problems = _load(tuple(str(e) for e in extra))
    if problems:
        _report(problems)
    m = resolve(ev)
    cells = _select(m, arch, backend, op, dtype, head_dim, head_dim_v, features, status, tier)[:limit]
    if fmt == "json":
        for c in cells:
            click.echo(json.dumps(c.to_json(), sort_keys=True, ensure_ascii=False))
        return
    rows = [[c.case.arch, c.case.backend, c.case.op, c.case.dtype, f"{c.case.head_dim}x{c.case.head_dim_v}",
             "+".join(c.case.features) or "-", STATUS_MARK[c.status], c.tier or "-",
             f"{c.latency_ms:.4g}" if c.latency_ms else "", f"{c.tflops:.1f}" if c.tflops else "",
             (c.reason or "").replace("\n", " ")[:70]] for c in cells]
    headers = ["arch", "backend", "op", "dtype", "dims", "features", "ok", "tier", "ms", "TFLOP/s", "reason"]
    click.echo(tabulate(rows, headers=headers, tablefmt="github" if fmt == "markdown" else "simple"))
    if fmt == "table":
        click.echo(f"\n{len(cells)} cell(s)", err=True)


@main.command()
@click.option("--arch", help="e.g. sm_90 or sm_100a.")
@click.option("--capability", help="Compute capability, e.g. 9.0 (alternative to --arch).")
@click.option("--head-size", type=int, required=True)
@click.option("--head-size-v", type=int, default=None, help="V head size if different (MLA: 128 for 192).")
@click.option("--op", type=click.Choice(OPS), default="prefill", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True)
@click.option("--causal/--no-causal", default=True, show_default=True)
@click.option("--sliding-window", is_flag=True)
@click.option("--softcap", is_flag=True)
@click.option("--alibi", is_flag=True)
@click.option("--sinks", is_flag=True)
@click.option("--gqa", is_flag=True)
@click.option("--varlen", is_flag=True)
@click.option("--page-size", type=int, default=None, help="Paged KV block size.")
@click.option("--fp8", is_flag=True)
@click.option("--results", "extra", multiple=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True)
def explain(arch, capability, head_size, head_size_v, op, dtype, causal, sliding_window, softcap, alibi, sinks,
            gqa, varlen, page_size, fp8, extra, as_json) -> None:
    """For one query: the backends in order, and for every other backend every reason and its evidence."""
    if not arch and not capability:
        raise UsageError("give --arch or --capability")
    try:
        arch = normalize_arch(arch or capability)
    except CaseError as e:
        raise UsageError(str(e)) from None
    from attnmatrix.generator import tables as T

    try:
        q = T.make_query(arch, head_size, head_size_v, op=op, dtype=dtype, causal=causal,
                         sliding_window=sliding_window, softcap=softcap, alibi=alibi, sinks=sinks, gqa=gqa,
                         varlen=varlen, page_size=page_size, fp8=fp8)
    except ValueError as e:
        raise UsageError(str(e)) from None
    hdv, feats = q.head_dim_v, q.features
    ev, problems = _load(tuple(str(e) for e in extra))
    if problems:
        _report(problems)
    m = resolve(ev)
    ordered, answers = T.query(m, q)
    backends = [a.backend for a in answers]
    ranking = T.applicable_ranking(m, q)
    query = {"arch": arch, "op": op, "dtype": dtype, "head_size": head_size, "head_size_v": hdv,
             "features": list(feats)}
    result = {"query": query, "order": [a.backend for a in ordered], "backends": {}}
    for a in answers:
        result["backends"][a.backend] = {
            "status": a.status, "tier": a.tier, "latency_ms": a.latency_ms, "reasons": a.reasons, "basis": a.basis,
            "ranked_on_fewer_shapes": a.marked,
            "cells": [{"cell": c.case.key, "status": c.status, "tier": c.tier, "sources": c.sources,
                       "conflicts": c.conflicts, "evidence": [describe(r) for r in c.evidence]} for c in a.cells],
        }
    if ranking:
        result["declared_ranking"] = {"id": ranking.id, "order": list(ranking.order), "sources": list(ranking.sources),
                                      "statement": ranking.statement}
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False))
        return
    click.echo(f"query: {arch} {op} {dtype} head {head_size}x{hdv} features {'+'.join(feats) or 'none'}")
    if not backends:
        click.echo(f"no evidence at all for {arch}: nothing can be recommended (conservative answer: [])")
        return
    click.echo("order: " + (", ".join(a.backend for a in ordered) or "(no supported backend)"))
    if ranking:
        click.echo(f"declared ranking {ranking.id}: {' > '.join(ranking.order)} ({'; '.join(ranking.sources)})")
    for a in sorted(answers, key=lambda a: (a.status != SUPPORTED, a.backend)):
        lat = f", {a.latency_ms:.4g} ms" if a.latency_ms else ""
        click.echo(f"\n{a.backend}: {a.status} [{a.tier or 'no evidence'}{lat}]")
        if a.basis:
            click.echo(f"  order: {a.basis}")
        for reason in a.reasons:
            click.echo(f"  - {reason}")
        for c in a.cells:
            click.echo(f"  cell {c.case.key}: {c.status} ({c.tier})")
            if c.reason and c.status != SUPPORTED:
                click.echo(f"    reason: {c.reason}")
            for s in c.sources:
                click.echo(f"    source: {s}")
            for cf in c.conflicts:
                click.echo(f"    conflict: {cf}")


def _load_side(spec: str) -> Evidence:
    if spec == "embedded":
        ev, _ = _load()
        return ev
    problems: list[Problem] = []
    try:
        ev = load_evidence([spec], include_embedded=False, problems=problems)
    except InputError as e:
        _fail_input(e)
    if problems:
        _report(problems)
        sys.exit(EXIT_USAGE)
    return ev


@main.command()
@click.argument("a")
@click.argument("b")
@click.option("--threshold", type=float, default=0.10, show_default=True, help="Relative latency change to report.")
@click.option("--json", "as_json", is_flag=True)
def diff(a, b, threshold, as_json) -> None:
    """What changed from matrix A to matrix B (result files or folders; `embedded` for the committed one)."""
    from attnmatrix.matrix.diff import diff_matrices

    changes = diff_matrices(resolve(_load_side(a)), resolve(_load_side(b)), speed_threshold=threshold)
    if as_json:
        for c in changes:
            click.echo(json.dumps(c.to_json(), sort_keys=True))
        return
    counts = Counter(c.kind for c in changes)
    click.echo(tabulate([[c.kind, c.key, c.before, c.after] for c in changes],
                        headers=["change", "cell", "before", "after"]))
    click.echo("\n" + (", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "no changes"))


# --- the main job ------------------------------------------------------------------------------


@main.command()
@click.option("--root", type=click.Path(file_okay=False))
@click.option("--results-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_RESULTS,
              show_default=True, help="Where this machine's probe results go (resumable).")
@click.option("--reprobe", is_flag=True, help="Probe cases even if the embedded matrix already has them from "
                                              "identical hardware and kernel versions.")
@click.option("--no-probe", is_flag=True, help="Skip probing; only merge, validate and regenerate.")
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--timeout", type=float, default=180.0, show_default=True)
def run(root, results_dir, reprobe, no_probe, workers, timeout) -> None:
    """The main job: probe what this machine can, merge with the embedded matrix, validate, regenerate, summarize.

    On a machine whose hardware and kernel versions are already in the embedded matrix, recorded
    cases are not probed again (use --reprobe to re-measure), so the generated files only change
    when there is new evidence.
    """
    r = _root(root)
    base, problems = _load()
    if problems:
        _report(problems)
        sys.exit(EXIT_FAILED)
    extra: list[str] = []
    if not no_probe:
        from attnmatrix.kernels.env import device_provenance, local_arch

        dev = _local_device()
        arch = local_arch(dev)
        names = _local_backends(dev)
        cases = list(case_space([arch], names))
        here = device_provenance(dev)
        skip = set() if reprobe else {
            rec.key for rec in base.records
            if rec.tier == "validated" and rec.case.arch == arch and rec.provenance.get("device") == here["device"]
            and rec.provenance.get("torch") == here["torch"]
        }
        out = results_dir / f"{arch}.jsonl"
        click.echo(f"probing {len(cases)} cases for {arch} ({', '.join(names)}); "
                   f"{len(skip & {c.key for c in cases})} already in the embedded matrix from this hardware")
        import torch

        gpus = list(range(torch.cuda.device_count())) if dev == "cuda" else None
        summary = _probe(cases, out, workers=workers, timeout=timeout, memory_limit=None, device=dev, gpus=gpus,
                         timing=True, quiet=False, skip=skip)
        if out.exists() and out.stat().st_size:  # only records count: an empty file is no evidence
            extra.append(str(out))
        elif summary.total == summary.skipped:
            click.echo("nothing new to probe on this machine")
    ev, problems = _load(tuple(extra))
    if problems:
        _report(problems)
        sys.exit(EXIT_FAILED)
    files = _render(ev, r)
    changed = [p for p, text in sorted(files.items()) if atomic_write_text(r / p, text)]
    m = resolve(ev)
    _summary_table(m)
    click.echo(f"\nmatrix {project.matrix_id(ev)}: {len(ev.records)} records, {len(m.cells)} cells; "
               f"generated {len(files)} files, {len(changed)} changed")
    for p in changed:
        click.echo(f"  wrote {p}")
    if extra:
        click.echo(f"\nnew evidence in {', '.join(extra)}: contribute it with "
                   f"`attnmatrix merge {' '.join(extra)} -o matrix/data/results/<name>.jsonl`")


def _summary_table(m: ResolvedMatrix) -> None:
    counts: dict[tuple, Counter] = {}
    for c in m.cells.values():
        counts.setdefault((c.case.arch, c.case.backend), Counter())[(c.status, c.tier)] += 1
    rows = []
    for (arch, backend), cnt in sorted(counts.items(), key=lambda kv: (arch_sort_key(kv[0][0]), kv[0][1])):
        sup = sum(v for (s, _), v in cnt.items() if s == SUPPORTED)
        rows.append([arch, backend, sup, sum(v for (s, _), v in cnt.items() if s == "unsupported"),
                     sum(v for (s, _), v in cnt.items() if s == "unknown"),
                     cnt[(SUPPORTED, "validated")], cnt[(SUPPORTED, "compiled")], cnt[(SUPPORTED, "declared")]])
    click.echo(tabulate(rows, headers=["arch", "backend", "supported", "unsupported", "unknown", "validated",
                                       "compiled", "declared"]))


if __name__ == "__main__":
    main()
