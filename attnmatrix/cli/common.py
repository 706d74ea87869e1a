"""What every command shares: the exit-code contract, loading the matrix, option parsing and validation.

Exit codes, in every command:
  0  ok
  1  a check failed (validate found problems, check found stale files or broken claims, merge found
     contradictions, a sweep left cases without a record)
  2  bad usage or unreadable input (an unknown option value, a head size out of range, a result file that
     cannot be read, is not JSON Lines of records, or is not ours to overwrite)
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from attnmatrix import project as project_mod
from attnmatrix.matrix.cases import (
    DTYPES,
    FEATURE_SETS,
    HEAD_DIMS,
    OPS,
    CaseError,
    canonical_features,
    case_space,
    check_count,
    check_duration,
    check_head_size,
    check_page_size,
    parse_head_dims,
)
from attnmatrix.matrix.evidence import Evidence, load_evidence
from attnmatrix.matrix.storage import InputError, Problem

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_RESULTS = Path("attnmatrix-results")

UsageError = click.UsageError  # click exits 2 with it, as the contract wants for bad usage


def fail_input(problems: list[Problem]) -> NoReturn:
    """Unreadable input: every problem, then exit 2."""
    for p in problems:
        click.echo(f"error: {p}", err=True)
    sys.exit(EXIT_USAGE)


# Problems that mean a file could not be read as JSON Lines of records at all (a truncated write, another
# file's text), as opposed to records that were read and are wrong: unreadable input, exit 2 in every command.
UNREADABLE_FIELDS = {"(file)", "(json)"}


def exit_code_for(problems: list[Problem]) -> int:
    """2 if an input could not be read as records, else 1 if there are problems, else 0."""
    if any(p.field in UNREADABLE_FIELDS for p in problems):
        return EXIT_USAGE
    return EXIT_FAILED if problems else EXIT_OK


def report(problems: list[Problem]) -> None:
    for p in problems:
        click.echo(f"problem: {p}", err=True)
    if problems:
        click.echo(f"{len(problems)} problem(s) found", err=True)


def locate(root: str | None = None, *, need_checkout: bool = False, say: bool = True) -> project_mod.Project:
    """The one place a command reads and writes (project.py), said on stderr."""
    try:
        p = project_mod.locate(root, need_checkout=need_checkout)
    except project_mod.ProjectNotFound as e:
        raise UsageError(str(e)) from None
    if say:
        click.echo(p.describe(), err=True)
    return p


def load(proj: project_mod.Project, paths: tuple[str, ...] = (), *, embedded: bool = True
         ) -> tuple[Evidence, list[Problem]]:
    """The evidence of `proj` (and extra result files), with every problem found. A file that cannot be read
    at all exits 2 here."""
    problems: list[Problem] = []
    try:
        ev = load_evidence(list(paths), include_embedded=embedded, problems=problems, data_dir=proj.data_dir)
    except InputError as e:
        fail_input(e.problems)
    from attnmatrix.matrix.validate import validate_evidence

    problems += validate_evidence(ev)
    return ev, problems


def load_for_reading(proj: project_mod.Project, extra: tuple) -> Evidence:
    """For commands that answer from the matrix (show, explain, diff): a problem in the input means the answer
    cannot be trusted, so it is listed and the command exits 2 instead of answering."""
    ev, problems = load(proj, tuple(str(e) for e in extra))
    if problems:
        report(problems)
        click.echo("error: the input has problems (listed above); fix or leave out the file", err=True)
        sys.exit(EXIT_USAGE)
    return ev


def render(ev: Evidence, proj: project_mod.Project, *, matrix_id: str) -> dict[str, str]:
    """Every generated file (path relative to the checkout -> text) from `ev`, whose id (project.matrix_id: a hash of
    every record, seconds) the caller has already computed for its own message."""
    from attnmatrix.engines import render_all
    from attnmatrix.matrix.history import load_snapshot
    from attnmatrix.matrix.policy import resolve

    m = resolve(ev)
    meta = {"matrix_id": matrix_id,
            "kernel_versions": project_mod.kernel_versions(ev), "files": project_mod.relative_files(ev, proj),
            "source_digest": project_mod.source_digest([*ev.files, *project_mod.source_files(proj.data_dir)])}
    from attnmatrix.engines.vllm.module import profile_file
    from attnmatrix.engines.vllm.names import answers_file

    if (proj.data_dir / "models.json").exists():
        meta["models"] = str(proj.data_dir / "models.json")
    if answers_file(proj.data_dir).exists():
        meta["vllm_answers"] = str(answers_file(proj.data_dir))
    if profile_file(proj.data_dir).exists():
        meta["vllm_profile"] = str(profile_file(proj.data_dir))
    if proj.snapshot_file.exists():
        try:
            prev_id, prev = load_snapshot(proj.snapshot_file, ev.backends)
        except InputError as e:
            fail_input(e.problems)
        meta["previous"] = {"matrix_id": prev_id, "matrix": prev, "source": "matrix/data/history/previous.jsonl"}
    from attnmatrix.matrix.workloads import PresetError

    try:
        return render_all(m, meta)
    except PresetError as e:  # a model preset or workload timing file that cannot be read as it stands
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_USAGE)


# --- option values ---------------------------------------------------------------------------------------------


def _validated(check):
    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is None:
            return None
        try:
            return check(value, "--" + param.name.replace("_", "-"))
        except CaseError as e:
            raise click.BadParameter(str(e).partition(": ")[2] or str(e)) from None

    return callback


# Head and page sizes are checked by the same functions in every command and in the case space
# (matrix/cases.py check_head_size / check_page_size): 0, negatives and absurd sizes are usage errors (2).
head_size_callback = _validated(check_head_size)
page_size_callback = _validated(check_page_size)
# Times and counts the same way (matrix/cases.py check_duration / check_count), shared with the runner's and
# prober's configurations: `--timeout -1` or `--limit -5` is a usage error, not a sweep of `timeout` records.
duration_callback = _validated(check_duration)
count_callback = _validated(check_count)
count_or_zero_callback = _validated(lambda v, name: check_count(v, name, minimum=0))


def refuse_conflicts(ctx: click.Context, needs: dict[str, str] | None = None,
                     excludes: tuple[tuple[str, str], ...] = ()) -> None:
    """Options that make no sense together are refused, not one of them silently ignored.

    `needs` maps an option (its parameter name) to the one it only applies with; `excludes` lists pairs that
    cannot both be given. Only options given on the command line count (defaults never conflict)."""
    given = {name for name in ctx.params
             if ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)}
    spelled = {p.name: max(p.opts, key=len) for p in ctx.command.params}

    def flag(name: str) -> str:
        return spelled.get(name, "--" + name.replace("_", "-"))

    for opt, base in (needs or {}).items():
        if opt in given and base not in given:
            raise UsageError(f"{flag(opt)} applies only with {flag(base)}")
    for one, other in excludes:
        if one in given and other in given:
            raise UsageError(f"{flag(one)} and {flag(other)} cannot be given together")


def csv(spec: str | None, allowed: list[str], name: str) -> list[str]:
    if not spec:
        return list(allowed)
    items = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad:
        raise UsageError(f"{name}: unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
    return items


def parse_feature_sets(spec: str | None) -> list[tuple[str, ...]]:
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


def space_options(f):
    opts = [
        click.option("--backends", help="Comma-separated backends (default: every installed backend for this "
                                        "device)."),
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


def build_space(arch: str, backends: list[str], head_dims, features_spec, ops, dtypes) -> list:
    try:
        hds = parse_head_dims(head_dims) if head_dims else list(HEAD_DIMS)
    except CaseError as e:
        raise UsageError(f"--head-dims: {e}") from None
    return list(case_space([arch], backends, head_dims=hds, dtypes=csv(dtypes, DTYPES, "--dtypes"),
                           feature_sets=parse_feature_sets(features_spec), ops=csv(ops, OPS, "--ops")))


class BackendListsCommand(click.Command):
    """A command whose help names the product's backends by device, as matrix/data/backends.json declares them
    when the help is shown: `{cuda_backends}` and `{cpu_backends}` in its docstring become those lists, so the
    help cannot drift from the registry."""

    def format_help_text(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from attnmatrix import workflow

        written = self.help
        if written:
            self.help = written.replace("{cuda_backends}", ", ".join(workflow.backends_for("cuda"))).replace(
                "{cpu_backends}", ", ".join(workflow.backends_for("cpu")))
        try:
            super().format_help_text(ctx, formatter)
        finally:
            self.help = written


def parse_backends(spec: str | None) -> list[str] | None:
    """The backends named by --backends (None when not given); unknown names are a usage error."""
    from attnmatrix.matrix import backends as registry

    if not spec:
        return None
    names = [s.strip() for s in spec.split(",") if s.strip()]
    known = registry.names()
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(f"--backends: unknown backend(s) {', '.join(bad)} (known: {', '.join(known)})")
    return names
