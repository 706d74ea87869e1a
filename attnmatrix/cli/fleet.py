"""`probe --executor ray`: the case space of a Ray cluster's archs, probed by Ray tasks on nodes of each arch,
records streamed back into one result file (the executor: kernels/ray_executor.py, through the workflow layer)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click

from attnmatrix import workflow
from attnmatrix.matrix.cases import CaseError, normalize_arch

from .common import DEFAULT_RESULTS, EXIT_FAILED, UsageError, build_space
from .sweeping import check_out, describe_record, print_summary, progress_bar, sweep_banner


def probe_fleet(*, names, head_dims, features_spec, ops, dtypes, out: Path | None, workers: int | None,
                 timeout: float, memory_limit: int | None, timing: bool, timed_dtypes: tuple[str, ...],
                 budget_ms: float, device: str, address: str | None, archs: tuple[str, ...], chunk_size: int | None,
                 as_json: bool) -> None:
    """`probe --executor ray`: the case space of the cluster's archs, probed by Ray tasks (kernels/ray_executor.py).
    Installation is checked on the nodes (a backend missing there is recorded `unavailable` by its node)."""
    try:
        workflow.require_ray()
    except workflow.RayMissing as e:
        raise UsageError(str(e)) from None

    def backends_of(dev: str) -> list[str]:
        return workflow.plan_backends(names or workflow.backends_for(dev), dev, check_installed=False).ready

    # Usage errors before Ray starts (seconds): the space is built again per arch once the lanes are known. With
    # only GPU backends named, the product's CPU backends (backends.json) stand in to check the other options.
    build_space("cpu", backends_of("cpu") or workflow.backends_for("cpu"), head_dims, features_spec, ops, dtypes)
    if out is not None:
        check_out(out)
    cpus_per_task = workers or 1
    with contextlib.ExitStack() as stack:
        try:
            ray = stack.enter_context(workflow.ray_session(address))
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(f"--address {address or '(local)'}: cannot connect to Ray: {e}") from None
        fleet = workflow.read_fleet(ray, device, cpus_per_task=cpus_per_task)
        for n in fleet.notes:
            click.echo(f"note: {n}", err=True)
        dev = fleet.device
        if archs:
            try:
                targets = sorted({normalize_arch(a) for a in archs})
            except CaseError as e:
                raise UsageError(f"--arch: {e}") from None
            clash = [a for a in targets if device != "auto" and (a == "cpu") != (device == "cpu")]
            if clash:
                raise UsageError(f"--arch {', '.join(clash)} is not probed with --device {device}")
        else:
            targets = fleet.archs
        have = {lane.arch for lane in fleet.lanes}
        missing = [a for a in targets if a not in have]
        lane_list = fleet.describe()
        if missing or not targets:
            what = f"arch {', '.join(missing)}" if missing else f"--device {dev}"
            raise UsageError(f"the Ray cluster has no node for {what} (its lanes: {lane_list})")
        cases = []
        for arch in targets:
            cases += build_space(arch, backends_of("cpu" if arch == "cpu" else "cuda"), head_dims, features_spec,
                                 ops, dtypes)
        out = out or DEFAULT_RESULTS / (f"{targets[0]}.jsonl" if len(targets) == 1 else "fleet.jsonl")
        check_out(out)
        cfg = workflow.runner_config(workers=workers or 2, timeout_s=timeout, memory_limit_mb=memory_limit,
                                     device=dev, timing=timing, timed_dtypes=timed_dtypes, budget_ms=budget_ms)
        executor = workflow.RayExecutor(cfg, ray, chunk_size=chunk_size, cpus_per_task=cpus_per_task)

        def describe(rec) -> str:
            return f"{rec.case.arch} {describe_record(rec)}"

        on_open, bar = progress_bar("probing", as_json, describe)

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
            except workflow.FleetError as e:
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
