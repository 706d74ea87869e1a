"""A sweep on this machine as the commands show it: which device it probes, the progress on stderr (a bar on a
terminal, a line every tenth of the work in a log), the banner before it starts and the summary after. Used by
`probe`, `run`, `check --reprobe` and (the progress and summary) by `xcompile` and `probe --executor ray`."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click
from tabulate import tabulate

from attnmatrix import workflow
from attnmatrix.matrix.cases import DTYPES
from attnmatrix.matrix.storage import InputError, ResultStore, check_result_file

from .common import UsageError, fail_input


def local_device(requested: str = "auto") -> str:
    """The device a local sweep probes: `cuda` if a GPU is visible (refused if asked for and none is), else `cpu`."""
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible")
    if requested != "auto":
        return requested
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_out(path: Path) -> None:
    """Refuse (exit 2, untouched) a result file to write into that is not a result file."""
    try:
        check_result_file(path)
    except InputError as e:
        fail_input(e.problems)


def duration_text(seconds: float) -> str:
    """Seconds as a reader estimates them: "90 s", "25 min"."""
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


class LineProgress:
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
                   f"{rate * 60:.1f} cases/min, about {duration_text(left)} left; last: {self.describe(rec)}", err=True)


def progress_bar(label: str, quiet: bool, describe):
    """A progress bar on stderr; returns `on_open(store, todo)` for workflow.probe_into."""
    stack = contextlib.ExitStack()

    def on_open(store: ResultStore, todo: int):
        if store.repaired_bytes:
            click.echo(f"note: cut a torn last line ({store.repaired_bytes} bytes) from {store.path}", err=True)
        if quiet:
            return None
        if not sys.stderr.isatty():  # a log (CI, nohup, a pipe): a bar would print its label once and nothing else
            return LineProgress(label, todo, describe)
        bar = stack.enter_context(click.progressbar(length=todo, label=label, file=sys.stderr, show_pos=True,
                                                    show_eta=True, item_show_func=lambda s: s))
        return lambda rec: bar.update(1, describe(rec))

    return on_open, stack


def describe_record(rec) -> str:
    return f"{rec.case.backend} {rec.case.head_dim}x{rec.case.head_dim_v} {rec.outcome}"


def local_sweep(cases: list, out: Path, *, device: str, workers: int | None, timeout: float,
                memory_limit: int | None = None, gpus: list[int] | None = None, timing: bool = True,
                quiet: bool = False, timed_dtypes: tuple[str, ...] = tuple(DTYPES), budget_ms: float = 40.0,
                label: str = "probing"):
    """Probe `cases` on this machine into `out` with the local executor; prints progress on stderr."""
    env: dict[str, str] = {}
    if device == "cuda" and gpus is None:
        import torch

        gpus = list(range(torch.cuda.device_count()))
    if device == "cuda" and timing:
        env, peak = workflow.matmul_peak(gpus[0] if gpus else None)
        if not quiet:
            click.echo(f"measured bf16 matmul peak: {peak}" if peak
                       else "the bf16 matmul peak could not be measured; records will carry none", err=True)
    # Default: one worker per GPU, at least 2 (timed loops take turns on a GPU, so more workers mostly add
    # memory pressure during timing); `check --reprobe`, which times nothing, passes one per core.
    cfg = workflow.runner_config(workers=workers or max(2, len(gpus or ())), timeout_s=timeout,
                                 memory_limit_mb=memory_limit, device=device, gpus=gpus, timing=timing,
                                 timed_dtypes=timed_dtypes, budget_ms=budget_ms, extra_env=env)
    on_open, bar = progress_bar(label, quiet, describe_record)

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
