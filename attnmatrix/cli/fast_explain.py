"""`attnmatrix explain` from the generated selector's data: the same engine and data the selector ships.

Reading and resolving the whole matrix takes seconds; the generated selector (`attnmatrix/selector.py`) holds the
engine's data for every GPU arch, so a query is answered from it in a fraction of that, with the evidence id and
short reason of every cell it rests on. It answers only while the selector is current for the matrix being read:
the selector records a hash of the bytes of the files it was generated from (`SOURCE_DIGEST`), and the files of
the checkout must still hash to it. Otherwise, or with extra result files, for an arch the selector does not
carry (`cpu`), or with `--full`, explain reads and resolves the matrix and shows every cell's raw reasons,
sources and conflicts.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType, SimpleNamespace

import click

from attnmatrix import project as project_mod
from attnmatrix.selector_engine import SUPPORTED, fset_label


def checkout_selector(proj: project_mod.Project) -> ModuleType:
    """The generated selector of `proj`: the checkout's own file, else the installed package's module."""
    if proj.root is None:
        return importlib.import_module("attnmatrix.selector")
    path = proj.root / "attnmatrix" / "selector.py"
    installed = importlib.import_module("attnmatrix").__file__
    if installed and Path(installed).resolve().parent == path.parent.resolve():
        return importlib.import_module("attnmatrix.selector")
    spec = importlib.util.spec_from_file_location("attnmatrix._checkout_selector", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "attnmatrix"  # its `from .selector_engine import Engine` is the installed engine
    spec.loader.exec_module(mod)
    return mod


def current_selector(proj: project_mod.Project) -> tuple[ModuleType | None, str]:
    """(the selector, "") when its data is current for `proj`'s files, else (None, why not)."""
    try:
        sel = checkout_selector(proj)
    except (OSError, SyntaxError, ImportError) as e:
        return None, f"the generated selector cannot be read ({type(e).__name__}: {e})"
    digest = getattr(sel, "SOURCE_DIGEST", None)
    if digest is None:
        return None, "the generated selector does not record which files it was generated from"
    if project_mod.source_digest(project_mod.source_files(proj.data_dir)) != digest:
        return None, "the generated selector is not current for the matrix files (run `attnmatrix generate`)"
    return sel, ""


def explain_from_selector(sel: ModuleType, arch: str, op: str, dtype: str, head_dim: int, head_dim_v: int,
                          feats: tuple[str, ...], as_json: bool, verbose: bool = False,
                          hints: dict[str, int] | None = None, engine: str | None = None) -> bool:
    """Print the answer from the selector's engine; False (nothing printed) where its data does not cover `arch`.
    `hints`: the engine's workload hints (cli/workload_hints.py); `engine`: answer also in that inference
    engine's names (cli/engine_names.py)."""
    from .engine_names import add_names
    from .workload_hints import add_hints, bucket_notes

    eng = sel._ENGINE
    if arch not in eng.archs:
        return False
    hints = hints or {}
    ordered, answers, ranking = eng.query(arch, op, dtype, head_dim, head_dim_v, feats, hints=hints)
    told = eng.explain_query(arch, op, dtype, head_dim, head_dim_v, feats, hints=hints)
    notes = bucket_notes(eng, arch, op, dtype, head_dim, head_dim_v, feats, hints)
    query = {"arch": arch, "op": op, "dtype": dtype, "head_size": head_dim, "head_size_v": head_dim_v,
             "features": list(feats)}
    result: dict = {"query": query, "order": [a.backend for a in ordered], "backends": {},
                    "from": {"selector": sel.MATRIX_ID, "source_digest": sel.SOURCE_DIGEST}}
    for a in answers:
        result["backends"][a.backend] = {
            "status": a.status, "tier": a.tier, "latency_ms": a.latency_ms, "reasons": list(a.reasons),
            "basis": eng.basis(arch, a, ranking) if a.status == SUPPORTED else "", "ranked_on_fewer_shapes": a.marked,
            "explanation": told[a.backend],
            "cells": [{"features": fset_label(f), "status": v.status, "tier": v.tier, "evidence": v.evidence,
                       "reason": v.reason} for f, v in a.cells],
        }
    if ranking is not None:
        result["declared_ranking"] = {"id": ranking[0], "order": list(ranking[5]), "sources": list(ranking[6])}
    add_hints(result, hints, notes)
    add_names(result, eng, engine, op)
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False))
        return True
    from .query import _echo_explain  # the terminal layout is the one explain has for the matrix's answer

    def cell(backend: str, feats_: tuple, v) -> SimpleNamespace:
        key = f"{arch}/{backend}/{op}/{dtype}/{head_dim}x{head_dim_v}/{fset_label(feats_)}"
        return SimpleNamespace(case=SimpleNamespace(key=key), status=v.status, tier=v.tier, reason=v.reason,
                               sources=[f"evidence {v.evidence}"], conflicts=[])

    def view(a) -> SimpleNamespace:
        b = result["backends"][a.backend]
        return SimpleNamespace(backend=a.backend, status=a.status, tier=a.tier, latency_ms=a.latency_ms,
                               basis=b["basis"], reasons=list(a.reasons), cells=[cell(a.backend, f, v)
                                                                                 for f, v in a.cells])

    views = {a.backend: view(a) for a in answers}
    declared = None if ranking is None else SimpleNamespace(id=ranking[0], order=ranking[5], sources=ranking[6])
    _echo_explain(arch, op, dtype, head_dim, head_dim_v, feats, [views[a.backend] for a in ordered],
                  list(views.values()), declared, verbose, hints, notes, result.get("names"))
    click.echo(f"(from the generated selector's data, matrix {sel.MATRIX_ID}; `--full` for every cell's raw "
               "reasons, sources and conflicts)", err=True)
    return True
