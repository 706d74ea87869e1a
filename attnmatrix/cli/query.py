"""Commands that read the resolved matrix: show and explain."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import click
from tabulate import tabulate

from attnmatrix.matrix.cases import CaseError, normalize_arch
from attnmatrix.matrix.policy import ResolvedMatrix, describe, resolve
from attnmatrix.vocabulary import (
    DTYPES,
    FEATURE_INFO,
    FLAG,
    OPS,
    STATUSES,
    SUPPORTED,
    TIERS,
    arch_sort_key,
    features_of,
)

from .common import (
    UsageError,
    count_callback,
    head_size_callback,
    load_for_reading,
    locate,
    page_size_callback,
    refuse_conflicts,
)
from .engine_names import add_names, backend_label, check_engine, names_option, order_line
from .group import main
from .workload_hints import (
    SHAPE_HINTS,
    add_hints,
    bucket_notes,
    check_hints,
    hint_options,
    hints_line,
    take_hints,
)

# --- reading the matrix ------------------------------------------------------------------------


def _filters(f):
    opts = [
        click.option("--arch", help="e.g. sm_90, sm_100 (a/f suffixes and 9.0 accepted)."),
        click.option("--backend"),
        click.option("--op", type=click.Choice(OPS)),
        click.option("--dtype", type=click.Choice(DTYPES)),
        click.option("--head-dim", type=int, callback=head_size_callback),
        click.option("--head-dim-v", type=int, callback=head_size_callback),
        click.option("--feature", "features", multiple=True, help="Cells whose features include this token."),
        click.option("--status", type=click.Choice(STATUSES)),
        click.option("--tier", type=click.Choice(TIERS)),
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


STATUS_MARK = dict(zip(STATUSES, ("yes", "no", "?"), strict=True))


def _feature_options(f):
    """One option per query parameter of the vocabulary: `--causal/--no-causal` for a mask mode, a flag for
    the other flags, an int for a sized feature (`--page-size`)."""
    for feat in reversed([x for x in FEATURE_INFO if x.param]):
        name = "--" + feat.param.replace("_", "-")
        if feat.kind != FLAG:
            opt = click.option(name, feat.param, type=int, default=None, callback=page_size_callback,
                               help=f"{feat.doc[0].upper()}{feat.doc[1:]}: {feat.arg_doc}.")
        elif feat.mask:
            opt = click.option(f"{name}/--no-{name[2:]}", feat.param, default=True, show_default=True, help=feat.doc)
        else:
            opt = click.option(name, feat.param, is_flag=True, help=feat.doc[0].upper() + feat.doc[1:] + ".")
        f = opt(f)
    return f


@main.command()
@_filters
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table",
              show_default=True, help="json prints one JSON object per cell (JSON Lines).")
@click.option("--limit", type=int, default=None, callback=count_callback, help="Show at most this many cells.")
def show(arch, backend, op, dtype, head_dim, head_dim_v, features, status, tier, extra, fmt, limit) -> None:
    """The resolved matrix: one row per cell, filtered. `--backend trtllm` matches every trtllm_* backend."""
    m = resolve(load_for_reading(locate(say=fmt != "json"), extra))
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
@click.option("--head-size", type=int, default=None, callback=head_size_callback,
              help="Query/key head size (required unless --model).")
@click.option("--head-size-v", type=int, default=None, callback=head_size_callback,
              help="V head size if different (MLA: 128 for 192).")
@click.option("--op", type=click.Choice(OPS), default="prefill", show_default=True, help="The attention operation.")
@click.option("--dtype", type=click.Choice(DTYPES), default="bfloat16", show_default=True,
              help="The query/key/value dtype.")
@_feature_options
@click.option("--results", "extra", multiple=True, type=click.Path(path_type=Path),
              help="Extra result files or folders to answer from, beside the matrix.")
@click.option("--json", "as_json", is_flag=True, help="The whole answer as JSON, every reason in full.")
@click.option("-v", "--verbose", is_flag=True,
              help="Every reason and source in full (wrapped), machine paths and environment notes included.")
@click.option("--model", default=None, help="A model preset (matrix/data/models.json): answer for each of its "
              "attention layer types instead of one query (no --head-size or feature options).")
@click.option("--tp", type=int, default=None, help="With --model: the tensor-parallel split (heads per GPU); "
              "default the preset's typical one.")
@hint_options()
@names_option
@click.option("--full", is_flag=True, help="Read and resolve the whole matrix: every cell's raw reasons, sources "
              "and conflicts (otherwise answered from the generated selector's data while it is current).")
def explain(arch, capability, head_size, head_size_v, op, dtype, extra, as_json, verbose, model, tp, engine, full,
            **features) -> None:
    """For one query: the backends in order, and for every other backend every reason and its evidence.

    Supported backends come first, numbered in the selector's order (how that order is decided is said once
    at the top), then the others. Lines are wrapped to the terminal's width; long reasons and sources are cut
    to one line (--verbose or --json gives them in full). With --model: the same for each attention layer
    type of a real model (its heads, head dims, window, softcap, sinks, MLA dims).

    Workload hints (--num-heads, --num-kv-heads, --num-tokens or --batch-size, --seq-len or --context-len) order
    the supported backends by their timings at that shape (a timed bucket's or interpolated from those around
    it), and each backend says its time there; without them, or where no workload was timed for the cell, the
    answer is unchanged. With --model, the batch and length hints apply to every layer type, each with its own
    head counts. With --names vllm the order is also given in vLLM's backend names, and each backend says its name.

    \b
    Examples:
      attnmatrix explain --arch sm_90 --head-size 128
      attnmatrix explain --arch sm_100 --head-size 256 --sliding-window
      attnmatrix explain --capability 9.0 --head-size 192 --head-size-v 128 --op mla_prefill
      attnmatrix explain --arch sm_90 --head-size 128 --page-size 16 --op decode --verbose
      attnmatrix explain --arch sm_90 --model gemma-2-9b --tp 2
      attnmatrix explain --arch sm_90 --head-size 128 --gqa --op decode --num-heads 32 --num-kv-heads 8 \\
          --batch-size 64 --context-len 4096
      attnmatrix explain --arch sm_90 --model llama-3.1-8b --batch-size 64 --context-len 4096
      attnmatrix explain --arch sm_90 --head-size 128 --json
      attnmatrix explain --arch sm_90 --head-size 128 --names vllm
    """
    if not arch and not capability:
        raise UsageError("give --arch or --capability")
    refuse_conflicts(click.get_current_context(), excludes=(("arch", "capability"),))
    try:
        arch = normalize_arch(arch or capability)
    except CaseError as e:
        raise UsageError(str(e)) from None
    hints = take_hints(features)
    if model is not None or tp is not None:
        _explain_model(arch, model, tp, op, dtype, extra, as_json, hints, engine)
        return
    if head_size is None:
        raise UsageError("give --head-size (or --model)")
    try:
        feats = features_of(**features)
    except ValueError as e:
        raise UsageError(str(e)) from None
    check_hints(hints, op, feats)
    hdv = head_size if head_size_v is None else head_size_v
    proj = locate(say=False)
    if not full and not extra:
        from .fast_explain import current_selector, explain_from_selector

        sel, why = current_selector(proj)
        if sel is not None and explain_from_selector(sel, arch, op, dtype, head_size, hdv, feats, as_json,
                                                       verbose, hints, engine):
            return
        if why:
            click.echo(f"{why}: answering from the matrix", err=True)
    check_engine(engine)
    from attnmatrix.generator import tables as T
    from attnmatrix.generator.capabilities import engine_for

    if not as_json:
        click.echo(proj.describe(), err=True)
    q = T.Query(arch, op, dtype, head_size, hdv, feats)
    m = resolve(load_for_reading(proj, extra))
    ordered, answers = T.query(m, q, hints)
    eng = engine_for(m)
    notes = bucket_notes(eng, arch, op, dtype, head_size, hdv, feats, hints)
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
    add_hints(result, hints, notes)
    add_names(result, eng, engine, op)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False))
        return
    _echo_explain(arch, op, dtype, head_size, hdv, feats, ordered, answers, ranking, verbose, hints, notes,
                  result.get("names"))



# How an order is decided, said once per answer instead of a bare "default rank N" on every line.
ORDER_BASIS = ("How the order is decided: backends measured on this machine class come first, by latency "
               "(like for like, on the timing shapes they share); then a declared ranking where one applies (an "
               "upstream source's order); then the default rank, a fixed preference per arch in "
               "matrix/data/backends.json (lower first) used only where nothing is measured or declared.")

# Text of this machine rather than of the kernel: a cache path, a temporary folder, an environment variable's
# setting. Shortened in the terminal (they are kept in full under --verbose and --json).
_MACHINE_PATH = re.compile(r"(?:<cache>|/root|/home/[^/\s]+|/tmp|/var/tmp)(?:/[^\s:;,)'\"]+)+")
_ENV_NOTE = re.compile(r",? and [A-Z][A-Z0-9_]+ is set(?=[,;.)]| so|$)|\(?[A-Z][A-Z0-9_]+ is set\)?[;,]? ?")


def without_machine_artefacts(text: str) -> str:
    """`text` with this machine's paths and environment notes shortened: they say nothing about the kernel."""
    text = _MACHINE_PATH.sub(lambda m: "…/" + m.group(0).rsplit("/", 1)[-1], text)
    return _ENV_NOTE.sub("", text).strip()


def _echo_explain(arch, op, dtype, head_size, hdv, feats, ordered, answers, ranking, verbose: bool,
                  hints: dict[str, int] | None = None, notes: dict[str, str] | None = None,
                  names: dict | None = None) -> None:
    """The answer for a terminal: supported backends in their order, numbered, then the others; every line
    wrapped to the terminal's width; long reasons and sources cut to one line (in full with --verbose). `names`:
    the answer in an engine's names (cli/engine_names.py), under --names."""
    width = max(60, shutil.get_terminal_size((100, 24)).columns)

    def out(text: str, indent: int = 0, *, full: bool = True) -> None:
        pad = " " * indent
        if not verbose:
            text = without_machine_artefacts(text)
            if not full and len(pad) + len(text) > width:
                text = text[: width - len(pad) - 1].rstrip() + "…"
        click.echo(textwrap.fill(text, width, initial_indent=pad, subsequent_indent=pad + "  ",
                                 break_on_hyphens=False) if text else "")

    out(f"query: {arch} {op} {dtype}, head size {head_size}x{hdv}, features {'+'.join(feats) or 'none'}")
    if not answers:
        out(f"no evidence at all for {arch}: nothing can be recommended (conservative answer: [])")
        return
    out("order: " + (", ".join(a.backend for a in ordered) or "(no supported backend)"))
    if names is not None:
        out(order_line(names))
    out(ORDER_BASIS)
    if hints:
        out(hints_line(hints, notes is not None))
    if ranking:
        out(f"declared ranking {ranking.id}: {' > '.join(ranking.order)} ({'; '.join(ranking.sources)})")
    position = {a.backend: i for i, a in enumerate(ordered)}
    rest = sorted((a for a in answers if a.backend not in position),
                  key=lambda a: (STATUSES.index(a.status) if a.status in STATUSES else 9, a.backend))
    for a in [*ordered, *rest]:
        lat = f", {a.latency_ms:.4g} ms" if a.latency_ms else ""
        rank = f"{position[a.backend] + 1}. " if a.backend in position else ""
        click.echo("")
        out(f"{rank}{backend_label(names, a.backend)}: {a.status} [{a.tier or 'no evidence'}{lat}]")
        if a.basis:
            out(f"placed: {a.basis}", 2)
        if notes and a.backend in notes:
            out(notes[a.backend], 2)
        for reason in a.reasons:
            out(f"- {reason}", 2, full=False)
        for c in a.cells:
            out(f"cell {c.case.key}: {c.status} ({c.tier})", 2)
            if c.reason and c.status != SUPPORTED:
                out(f"reason: {c.reason}", 4, full=False)
            for src in c.sources:
                out(f"source: {src}", 4, full=False)
            for cf in c.conflicts:
                out(f"conflict: {cf}", 4, full=False)
    if not verbose:
        click.echo("")
        out("(long reasons and sources are cut to one line: --verbose or --json shows them in full)")


def _explain_model(arch: str, model: str | None, tp: int | None, op: str, dtype: str, extra, as_json: bool,
                   hints: dict[str, int], engine: str | None) -> None:
    """`explain --model`: refuses the one-query options, then answers per layer type (cli/model_explain.py), with
    the batch and length hints for every layer type and each layer's own head counts."""
    from click.core import ParameterSource

    from attnmatrix.matrix.models import ModelError

    from .model_explain import echo_model_answers, load_model, model_answers

    if model is None:
        raise UsageError("--tp goes with --model")
    ctx = click.get_current_context()
    answers_opts = {"arch", "capability", "op", "dtype", "extra", "as_json", "model", "tp", "engine", *SHAPE_HINTS}
    query_opts = [p for p in ctx.params if p not in answers_opts]
    given = [p for p in query_opts if ctx.get_parameter_source(p) == ParameterSource.COMMANDLINE]
    if given:
        names = ", ".join("--" + p.replace("_", "-") for p in given)
        raise UsageError(f"--model answers from the preset's layers; leave out {names}")
    proj = locate(say=False)
    preset = load_model(model, proj.data_dir)
    try:
        split = preset.check_tp(preset.tp if tp is None else tp)
    except ModelError as e:
        raise UsageError(f"--tp: {e}") from None
    only_op = op if ctx.get_parameter_source("op") == ParameterSource.COMMANDLINE else None
    check_hints(hints, only_op, None)
    check_engine(engine)
    m = resolve(load_for_reading(proj, extra))
    echo_model_answers(model_answers(m, preset, split, arch, dtype, only_op, hints, engine), as_json)
